package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/testkit/netlab"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/validation"
)

// TestConcurrentControlPlanes runs 16 control planes at once, each on a
// connection of its own and owning its own services: they upsert, update
// backends, delete and sync at random. Each keeps the state it intends and
// the generation vipd acknowledged for each of its services. Afterwards
// ListServices of each owner must equal that state, generations included:
// a SyncServices (or anything else) of one owner that touched another
// owner's service would have changed its generation or removed it. Every
// SyncServices answer must name only its own owner's services, and traffic
// to a service of an owner no control plane touches never fails.
//
// Short form: 8 s. Full form: 30 s.
func TestConcurrentControlPlanes(t *testing.T) {
	forEachDataplane(t, testConcurrentControlPlanes)
}

const (
	controlPlanes    = 16
	servicesPerOwner = 5
)

// controlPlane is one of the clients, with the state it intends.
type controlPlane struct {
	owner string
	api   *client.Client
	rng   *rand.Rand
	pods  []*netlab.Pod
	// model is the intended state, gens the acknowledged generations.
	model map[string]*vipdv1.Service
	gens  map[string]uint64
	ops   map[string]int
}

func (cp *controlPlane) name(j int) string { return fmt.Sprintf("%s/s%d", cp.owner, j) }

func (cp *controlPlane) vip(index, j int) netip.Addr { return VIP(0x1000 + index<<4 + j) }

// run makes random changes until the deadline and returns the first
// discrepancy it finds.
func (cp *controlPlane) run(index int, deadline time.Time) error {
	for time.Now().Before(deadline) {
		if err := cp.step(index); err != nil {
			return fmt.Errorf("control plane %s: %w", cp.owner, err)
		}
	}
	return nil
}

func (cp *controlPlane) step(index int) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	j := cp.rng.IntN(servicesPerOwner)
	name := cp.name(j)
	cur, exists := cp.model[name]
	switch op := cp.rng.IntN(10); {
	case op < 4 || !exists && op < 8: // upsert
		svc := randomService(cp.rng, name, cp.owner, cp.vip(index, j), cp.pods)
		got, err := cp.api.UpsertService(ctx, svc, 0)
		if err != nil {
			return fmt.Errorf("UpsertService %s: %w", name, err)
		}
		if err := sameSpec(svc, got); err != nil {
			return fmt.Errorf("UpsertService %s answered %w", name, err)
		}
		cp.model[name], cp.gens[name] = svc, got.GetGeneration()
		cp.ops["upsert"]++
	case op < 6: // update backends: replace or add one, remove one
		up := &vipdv1.Backend{Ip: cp.pods[cp.rng.IntN(len(cp.pods))].IPv4().String(), Weight: uint32(cp.rng.IntN(3) + 1)}
		var remove []string
		if len(cur.Backends) > 0 && cp.rng.IntN(2) == 0 {
			if r := cur.Backends[cp.rng.IntN(len(cur.Backends))].Ip; r != up.Ip {
				remove = append(remove, r)
			}
		}
		want := proto.Clone(cur).(*vipdv1.Service)
		want.Backends = slices.DeleteFunc(want.Backends, func(b *vipdv1.Backend) bool {
			return b.Ip == up.Ip || slices.Contains(remove, b.Ip)
		})
		want.Backends = append(want.Backends, up)
		got, err := cp.api.UpdateBackends(ctx, name, []*vipdv1.Backend{up}, remove, 0)
		if err != nil {
			return fmt.Errorf("UpdateBackends %s: %w", name, err)
		}
		if err := sameSpec(want, got); err != nil {
			return fmt.Errorf("UpdateBackends %s answered %w", name, err)
		}
		cp.model[name], cp.gens[name] = want, got.GetGeneration()
		cp.ops["update_backends"]++
	case op < 8: // delete
		if err := cp.api.DeleteService(ctx, name, 0); err != nil {
			return fmt.Errorf("DeleteService %s: %w", name, err)
		}
		delete(cp.model, name)
		delete(cp.gens, name)
		cp.ops["delete"]++
	default: // sync to a random subset
		want := map[string]*vipdv1.Service{}
		var list []*vipdv1.Service
		for j := range servicesPerOwner {
			if cp.rng.IntN(2) == 0 {
				continue
			}
			svc := randomService(cp.rng, cp.name(j), cp.owner, cp.vip(index, j), cp.pods)
			if old, ok := cp.model[svc.Name]; ok && cp.rng.IntN(3) == 0 {
				svc = old // unchanged
			}
			want[svc.Name] = svc
			list = append(list, svc)
		}
		resp, err := cp.api.SyncServices(ctx, cp.owner, list)
		if err != nil {
			return fmt.Errorf("SyncServices: %w", err)
		}
		if err := cp.checkSync(resp, want); err != nil {
			return err
		}
		cp.model = want
		// The answer has no generations: read them, once the sync is in.
		for name, svc := range want {
			got, err := cp.api.GetService(ctx, name)
			if err != nil {
				return fmt.Errorf("GetService %s after SyncServices: %w", name, err)
			}
			if err := sameSpec(svc, got); err != nil {
				return fmt.Errorf("GetService %s after SyncServices: %w", name, err)
			}
			if slices.Contains(resp.GetUnchanged(), name) && got.GetGeneration() != cp.gens[name] {
				return fmt.Errorf("SyncServices left %s unchanged, but its generation went from %d to %d", name, cp.gens[name], got.GetGeneration())
			}
			cp.gens[name] = got.GetGeneration()
		}
		for name := range cp.gens {
			if _, ok := want[name]; !ok {
				delete(cp.gens, name)
			}
		}
		cp.ops["sync"]++
	}
	return nil
}

// checkSync checks a SyncServices answer against the state before it
// (cp.model) and the one asked for: every name is the owner's, and each is
// in the class the change puts it in.
func (cp *controlPlane) checkSync(resp *vipdv1.SyncServicesResponse, want map[string]*vipdv1.Service) error {
	classes := map[string][]string{"created": resp.GetCreated(), "updated": resp.GetUpdated(), "deleted": resp.GetDeleted(), "unchanged": resp.GetUnchanged()}
	wantClass := map[string]string{}
	for name, svc := range want {
		old, ok := cp.model[name]
		switch {
		case !ok:
			wantClass[name] = "created"
		case proto.Equal(old, svc):
			wantClass[name] = "unchanged"
		default:
			wantClass[name] = "updated" // or unchanged, when the random spec repeats
		}
	}
	for name := range cp.model {
		if _, ok := want[name]; !ok {
			wantClass[name] = "deleted"
		}
	}
	seen := map[string]bool{}
	for class, names := range classes {
		for _, name := range names {
			if _, ok := wantClass[name]; !ok {
				return fmt.Errorf("SyncServices of owner %s answered that it %s %s, which is not the owner's", cp.owner, class, name)
			}
			if w := wantClass[name]; w != class && !(w == "updated" && class == "unchanged") {
				return fmt.Errorf("SyncServices of owner %s put %s in %s, want %s", cp.owner, name, class, w)
			}
			seen[name] = true
		}
	}
	for name, class := range wantClass {
		if !seen[name] {
			return fmt.Errorf("SyncServices of owner %s did not mention %s (want %s)", cp.owner, name, class)
		}
	}
	return nil
}

// sameSpec reports how got, as vipd answered, differs from the intended want.
func sameSpec(want, got *vipdv1.Service) error {
	lim := validation.Limits{MaxPorts: -1}
	w, _, v := validation.Service(want, lim, "service")
	if len(v) > 0 {
		return fmt.Errorf("the intended service %s does not validate: %w", want.GetName(), v)
	}
	g, _, v := validation.Service(got, lim, "service")
	if len(v) > 0 {
		return fmt.Errorf("service %s does not validate: %w", got.GetName(), v)
	}
	w.Generation, g.Generation = 0, 0
	if !proto.Equal(w, g) {
		return fmt.Errorf("%v, want %v", g, w)
	}
	return nil
}

func testConcurrentControlPlanes(t *testing.T, dp string) {
	rng := newRand(t)
	duration := Pick(8*time.Second, 30*time.Second)
	e := NewEnv(t, vipdBin, dp, Spec{Clients: []string{"c1"}, Backends: []string{"be1", "be2", "be3"}})
	pods := []*netlab.Pod{e.Pod("be1"), e.Pod("be2"), e.Pod("be3")}

	// A service no control plane owns, and traffic to it all along.
	e.Upsert(service("bystander/web", "bystander", VIP(1), backend(pods[0]), backend(pods[1])))
	traffic := StartTraffic(e.Pod("c1").NS, TrafficConfig{Workers: 2, Pause: 10 * time.Millisecond},
		Target{Addr: ap(VIP(1), 80), Backends: []string{"be1", "be2"}})
	defer traffic.Stop()

	cps := make([]*controlPlane, controlPlanes)
	for i := range cps {
		cps[i] = &controlPlane{
			owner: fmt.Sprintf("cp%02d", i), api: e.NewClient(), pods: pods,
			rng:   rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64())),
			model: map[string]*vipdv1.Service{}, gens: map[string]uint64{}, ops: map[string]int{},
		}
	}
	deadline := time.Now().Add(duration)
	errs := make([]error, len(cps))
	var wg sync.WaitGroup
	for i, cp := range cps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = cp.run(i, deadline)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	total, ops := 0, map[string]int{}
	for _, cp := range cps {
		got, err := e.API.ListServices(ctx, cp.owner)
		if err != nil {
			t.Fatal(err)
		}
		if d := diffServices(t, cp.model, got); d != "" {
			t.Errorf("owner %s: ListServices differs from the state its control plane intended (-want +got):\n%s", cp.owner, d)
		}
		for _, svc := range got {
			if g := cp.gens[svc.GetName()]; svc.GetGeneration() != g {
				t.Errorf("owner %s: %s has generation %d, but its control plane was last acknowledged generation %d: something else changed it",
					cp.owner, svc.GetName(), svc.GetGeneration(), g)
			}
			if svc.GetOwner() != cp.owner {
				t.Errorf("owner %s: listed %s of owner %s", cp.owner, svc.GetName(), svc.GetOwner())
			}
		}
		total += len(got)
		for k, n := range cp.ops {
			ops[k] += n
		}
	}
	all, err := e.API.ListServices(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != total+1 {
		t.Errorf("ListServices of all owners lists %d services, want the %d of the control planes and the bystander", len(all), total)
	}
	if err := e.CheckKernel(); err != nil {
		t.Errorf("the kernel does not hold the desired state: %v", err)
	}
	st := traffic.Stop()
	t.Logf("%s: %s", dp, summary("control_planes", len(cps), "upserts", ops["upsert"], "update_backends", ops["update_backends"],
		"deletes", ops["delete"], "syncs", ops["sync"], "services_at_end", total, "elapsed", duration))
	t.Logf("%s: traffic to the bystander service: %v", dp, st)
	if st.Failed > 0 || st.OK < 50 {
		t.Errorf("traffic to the bystander service: %v; want no failure among at least 50 connections", st)
	}
}
