package health

import (
	"fmt"
	"maps"
	"runtime"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/protobuf/proto"
)

// fleet is a store of many services for the sync tests and benchmarks:
// service i has VIP 10.96.x.y and two backends, and every checkEvery-th
// one a TCP health_check.
type fleet struct {
	snap *store.Snapshot
	svcs []*vipdv1.Service
}

func newFleet(tb testing.TB, n, checkEvery int) *fleet {
	tb.Helper()
	f := &fleet{snap: store.Empty()}
	tx := f.snap.Begin()
	for i := range n {
		svc := &vipdv1.Service{Name: fmt.Sprintf("svc-%05d", i), Vips: []string{fmt.Sprintf("10.96.%d.%d", i>>8, i&255)},
			Ports: []*vipdv1.Port{{Name: "http", Port: 80, TargetPort: 8080}}}
		for j := range 2 {
			k := 2*i + j
			svc.Backends = append(svc.Backends, &vipdv1.Backend{Ip: fmt.Sprintf("10.1.%d.%d", k>>8, k&255)})
		}
		if i%checkEvery == 0 {
			svc.HealthCheck = &vipdv1.HealthCheck{Protocol: vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_TCP, IntervalMs: 3_600_000}
		}
		f.put(tb, tx, svc)
		f.svcs = append(f.svcs, svc)
	}
	f.snap = tx.Commit()
	return f
}

func (f *fleet) put(tb testing.TB, tx *store.Txn, svc *vipdv1.Service) {
	tb.Helper()
	dp, v := validation.ConvertService(svc, "service")
	if v != nil {
		tb.Fatal(v)
	}
	if _, err := tx.Put(svc, dp); err != nil {
		tb.Fatal(err)
	}
}

// change commits edit(service i) and returns the new snapshot.
func (f *fleet) change(tb testing.TB, i int, edit func(*vipdv1.Service)) *store.Snapshot {
	tb.Helper()
	edit(f.svcs[i])
	tx := f.snap.Begin()
	f.put(tb, tx, f.svcs[i])
	f.snap = tx.Commit()
	return f.snap
}

// remove commits the deletion of service i and returns the new snapshot.
func (f *fleet) remove(tb testing.TB, i int) *store.Snapshot {
	tb.Helper()
	tx := f.snap.Begin()
	if !tx.Delete(f.svcs[i].Name) {
		tb.Fatalf("service %s is not stored", f.svcs[i].Name)
	}
	f.snap = tx.Commit()
	return f.snap
}

// togglePort switches svc's health_check between ports 0 (the target
// port) and 9000.
func togglePort(svc *vipdv1.Service) {
	if svc.HealthCheck.Port == 0 {
		svc.HealthCheck.Port = 9000
	} else {
		svc.HealthCheck.Port = 0
	}
}

// toggleServing switches svc's first backend between READY and
// NOT_SERVING.
func toggleServing(svc *vipdv1.Service) {
	if svc.Backends[0].State == vipdv1.BackendState_BACKEND_STATE_NOT_SERVING {
		svc.Backends[0].State = vipdv1.BackendState_BACKEND_STATE_READY
	} else {
		svc.Backends[0].State = vipdv1.BackendState_BACKEND_STATE_NOT_SERVING
	}
}

// newSyncProber is a prober whose sync is called by hand: nothing runs
// its checks (Run is not called), and its checks are an hour apart.
func newSyncProber() *Prober {
	return New(hclog.NewNullLogger(), nil, nil)
}

// BenchmarkProberSyncOneChange: one service's change among 10,000, 10%
// of them checked, the prober following it: the checked service's
// health_check port, and an unchecked service's backend state.
func BenchmarkProberSyncOneChange(b *testing.B) {
	for _, tc := range []struct {
		name string
		i    int
		edit func(*vipdv1.Service)
	}{
		{"checked", 500, togglePort},
		{"unchecked", 501, toggleServing},
	} {
		b.Run(tc.name, func(b *testing.B) {
			f := newFleet(b, 10_000, 10)
			p := newSyncProber()
			p.sync(f.snap)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				snap := f.change(b, tc.i, tc.edit)
				b.StartTimer()
				p.sync(snap)
			}
		})
	}
}

// observed records an Observer's backend calls.
type observed struct {
	mu           sync.Mutex
	set, deleted map[string]int // "service/ip"
}

func (o *observed) ObserveCheck(string) {}

func (o *observed) SetBackendHealth(service, backend string, _ float64) {
	o.mu.Lock()
	o.set[service+"/"+backend]++
	o.mu.Unlock()
}

func (o *observed) DeleteBackendHealth(service, backend string) {
	o.mu.Lock()
	o.deleted[service+"/"+backend]++
	o.mu.Unlock()
}

func (o *observed) reset() {
	o.mu.Lock()
	o.set, o.deleted = map[string]int{}, map[string]int{}
	o.mu.Unlock()
}

// specs is what p checks: each target's spec, by backend.
func specs(p *Prober) map[key]spec {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[key]spec{}
	for k, t := range p.targets {
		out[k] = t.spec
	}
	return out
}

// sameConfigs reports whether a and b cache the same health_checks.
func sameConfigs(a, b map[string]config) bool {
	return maps.EqualFunc(a, b, func(x, y config) bool { return x.generation == y.generation && proto.Equal(x.hc, y.hc) })
}

// TestSyncFollowsChanges: a sync that follows one change, or a few commits,
// among a thousand services checks exactly what a fresh prober's full walk
// of the same snapshot checks and caches the same health_checks; it stops,
// retires (lifting what the reconciler had as failing) and reports gone
// the targets of the checks that changed or went away, starts the new
// ones, and keeps every other target, state and all. Each change below
// goes through the incremental sync, but the last, which is too far
// behind for the store to tell and walks every service.
func TestSyncFollowsChanges(t *testing.T) {
	f := newFleet(t, 1000, 10) // services 0, 10, 20, ... are checked
	obs := &observed{}
	obs.reset()
	p := New(hclog.NewNullLogger(), nil, nil, WithObserver(obs))
	p.sync(f.snap)
	if n := len(specs(p)); n != 200 {
		t.Fatalf("%d targets after the first sync, want 200", n)
	}
	added := &vipdv1.Service{Name: "added", Vips: []string{"10.97.0.1"}, Ports: []*vipdv1.Port{{Name: "http", Port: 80}},
		Backends:    []*vipdv1.Backend{{Ip: "10.2.0.1"}, {Ip: "10.2.0.2"}},
		HealthCheck: &vipdv1.HealthCheck{Protocol: vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_TCP, IntervalMs: 3_600_000}}
	for _, step := range []struct {
		name             string
		change           func() *store.Snapshot
		stopped, started int
		full             bool
	}{
		{"health_check port", func() *store.Snapshot { return f.change(t, 500, togglePort) }, 2, 2, false},
		{"backend NOT_SERVING", func() *store.Snapshot { return f.change(t, 510, toggleServing) }, 1, 0, false},
		{"backend serving again", func() *store.Snapshot { return f.change(t, 510, toggleServing) }, 0, 1, false},
		{"target port", func() *store.Snapshot {
			return f.change(t, 520, func(s *vipdv1.Service) { s.Ports[0].TargetPort = 8081 })
		}, 2, 2, false},
		{"a backend's own target port", func() *store.Snapshot {
			return f.change(t, 520, func(s *vipdv1.Service) { s.Backends[0].Ports = map[string]uint32{"http": 7070} })
		}, 1, 1, false},
		{"port_name", func() *store.Snapshot {
			return f.change(t, 530, func(s *vipdv1.Service) {
				s.Ports = append(s.Ports, &vipdv1.Port{Name: "admin", Port: 81, TargetPort: 9090})
				s.HealthCheck.PortName = "admin"
			})
		}, 2, 2, false},
		{"a port that changes no check", func() *store.Snapshot {
			return f.change(t, 530, func(s *vipdv1.Service) { s.Ports[0].TargetPort = 8082 })
		}, 0, 0, false},
		{"health_check interval", func() *store.Snapshot {
			return f.change(t, 550, func(s *vipdv1.Service) { s.HealthCheck.IntervalMs = 1_800_000 })
		}, 2, 2, false},
		{"health_check added", func() *store.Snapshot {
			return f.change(t, 501, func(s *vipdv1.Service) {
				s.HealthCheck = &vipdv1.HealthCheck{Protocol: vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_TCP, IntervalMs: 3_600_000}
			})
		}, 0, 2, false},
		{"health_check removed", func() *store.Snapshot {
			return f.change(t, 540, func(s *vipdv1.Service) { s.HealthCheck = nil })
		}, 2, 0, false},
		{"backend replaced", func() *store.Snapshot {
			return f.change(t, 560, func(s *vipdv1.Service) { s.Backends[1].Ip = "10.3.0.1" })
		}, 1, 1, false},
		{"unchecked service", func() *store.Snapshot { return f.change(t, 503, toggleServing) }, 0, 0, false},
		{"service deleted", func() *store.Snapshot { return f.remove(t, 570) }, 2, 0, false},
		{"service added", func() *store.Snapshot {
			tx := f.snap.Begin()
			f.put(t, tx, added)
			f.snap = tx.Commit()
			return f.snap
		}, 0, 2, false},
		{"three commits between syncs", func() *store.Snapshot {
			f.change(t, 580, togglePort)
			f.remove(t, 590)
			return f.change(t, 505, func(s *vipdv1.Service) {
				s.HealthCheck = &vipdv1.HealthCheck{Protocol: vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_TCP, IntervalMs: 3_600_000}
			})
		}, 4, 4, false},
		{"70 commits between syncs", func() *store.Snapshot {
			f.remove(t, 610)
			for range 69 {
				f.change(t, 600, togglePort)
			}
			return f.snap
		}, 4, 2, true},
	} {
		prev := p.synced
		before := map[key]*target{}
		p.mu.Lock()
		maps.Copy(before, p.targets)
		p.mu.Unlock()
		p.subMu.Lock()
		for _, tg := range before {
			tg.acked = true // the reconciler has them as failing
		}
		p.pending = map[key]pendingChange{}
		p.subMu.Unlock()
		obs.reset()

		snap := step.change()
		if _, ok := snap.ChangedSince(prev); ok == step.full {
			t.Fatalf("%s: the store can tell what changed: %v, want %v", step.name, ok, !step.full)
		}
		p.sync(snap)

		fresh := newSyncProber()
		fresh.sync(snap)
		if got, want := specs(p), specs(fresh); !maps.Equal(got, want) {
			t.Errorf("%s: %d checks, a full walk makes %d", step.name, len(got), len(want))
			for k, s := range want {
				if got[k] != s {
					t.Errorf("%s: %s %s: check %+v, want %+v", step.name, k.service, k.ip, got[k], s)
				}
			}
			for k := range got {
				if _, ok := want[k]; !ok {
					t.Errorf("%s: %s %s checked, a full walk does not", step.name, k.service, k.ip)
				}
			}
		}
		if !sameConfigs(p.configs, fresh.configs) {
			t.Errorf("%s: %d health_checks cached, a full walk caches %d, or others", step.name, len(p.configs), len(fresh.configs))
		}

		stopped := 0
		for k, tg := range before {
			if p.targets[k] == tg {
				if tg.isStopped() {
					t.Errorf("%s: %s %s stopped but kept", step.name, k.service, k.ip)
				}
				continue
			}
			stopped++
			name := k.service + "/" + k.ip.String()
			if !tg.isStopped() || !tg.retired || p.pending[k] != (pendingChange{}) || obs.deleted[name] != 1 {
				t.Errorf("%s: %s replaced: stopped %v, retired %v, pending %+v, reported gone %d times",
					step.name, name, tg.isStopped(), tg.retired, p.pending[k], obs.deleted[name])
			}
		}
		started := 0
		for k, tg := range p.targets {
			if before[k] != tg {
				started++
				if name := k.service + "/" + k.ip.String(); obs.set[name] != 1 {
					t.Errorf("%s: %s started, reported %d times", step.name, name, obs.set[name])
				}
			}
		}
		if stopped != step.stopped || started != step.started || len(obs.deleted) != stopped || len(obs.set) != started {
			t.Errorf("%s: %d targets stopped and %d started (observer: %d gone, %d set), want %d and %d",
				step.name, stopped, started, len(obs.deleted), len(obs.set), step.stopped, step.started)
		}
	}
}

// TestSyncUncheckedServicesAllocBudget: a full walk of services without a
// health_check keeps nothing for them and allocates almost nothing, the
// snapshot's name order included: at 100,000 services a cache entry each
// cost ~10 MB of vipd's heap, and the order 2.4 MB.
func TestSyncUncheckedServicesAllocBudget(t *testing.T) {
	const n = 10_000
	f := newFleet(t, n, n) // only service 0 is checked
	p := newSyncProber()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	p.sync(f.snap)
	runtime.ReadMemStats(&after)
	if len(p.configs) != 1 {
		t.Errorf("%d health_checks cached, want 1 (the one checked service's)", len(p.configs))
	}
	// The one checked service's target and cache entry, and slack for
	// the runtime; an entry per service would be ~100 B each.
	const budget = 8 // bytes per service
	if per := float64(after.TotalAlloc-before.TotalAlloc) / n; per > budget {
		t.Errorf("a full walk of %d services, 1 checked, allocates %.1f B per service; the budget is %d", n, per, budget)
	}
}
