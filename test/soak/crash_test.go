package soak

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/connectivity"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/testkit/netlab"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// TestCrashDuringApply kills vipd with SIGKILL at random points while a
// client loops UpsertService and SyncServices, and sometimes again while
// the restarted vipd loads and applies its state. After each restart:
//   - the desired state (ListServices) is the last state acknowledged to
//     the client, or that state plus the change whose call the kill cut
//     short (its outcome unknown to the client);
//   - the kernel holds exactly the desired state (CheckKernel);
//   - a background client making new connections all along to services
//     that never change counts no failure.
//
// Short form: at least 20 kills. Full form: 30 s and at least 20 kills.
func TestCrashDuringApply(t *testing.T) {
	forEachDataplane(t, testCrashDuringApply)
}

const (
	// crashChurnServices is how many services the client churns.
	crashChurnServices = 8
	// crashMinKills is the fewest kills a run makes.
	crashMinKills = 20
)

// crashOp is one call of the client: its RPC, and the change it makes to
// the desired state once acknowledged.
type crashOp struct {
	desc   string
	call   func(ctx context.Context, api *client.Client) error
	change func(model map[string]*vipdv1.Service)
	// err and failedAt are set when the call failed.
	err      error
	failedAt time.Time
}

// mutator is the client that loops changes. After a failed call (the kill)
// it hands the call to the test and waits to be resumed.
type mutator struct {
	api    *client.Client
	rng    *rand.Rand
	pods   []*netlab.Pod
	failed chan crashOp
	resume chan struct{}
	// reconnected says, after a resume, that the client is connected
	// again and goes on with its calls: the next kill then lands on a
	// call, not on the reconnect (gRPC's backoff can outlast a restart).
	reconnected chan struct{}
	stop        chan struct{}
	done        chan struct{}

	mu    sync.Mutex // guards model and acked
	model map[string]*vipdv1.Service
	acked int
}

func (m *mutator) run() {
	defer close(m.done)
	for {
		select {
		case <-m.stop:
			return
		default:
		}
		op := m.next()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := op.call(ctx, m.api)
		cancel()
		if err == nil {
			m.mu.Lock()
			op.change(m.model)
			m.acked++
			m.mu.Unlock()
			continue
		}
		op.err, op.failedAt = err, time.Now()
		select {
		case m.failed <- op:
		case <-m.stop:
			return
		}
		select {
		case <-m.resume:
		case <-m.stop:
			return
		}
		// Calls fail fast while the connection is down: reconnect first.
		if err := waitConnected(m.api, 30*time.Second); err != nil {
			op := crashOp{desc: "reconnect", err: err, failedAt: time.Now()}
			select {
			case m.failed <- op:
			case <-m.stop:
			}
			return
		}
		select {
		case m.reconnected <- struct{}{}:
		case <-m.stop:
			return
		}
	}
}

// waitConnected waits until api's connection to vipd is up.
func waitConnected(api *client.Client, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn := api.Conn()
	conn.Connect()
	for st := conn.GetState(); st != connectivity.Ready; st = conn.GetState() {
		if !conn.WaitForStateChange(ctx, st) {
			return fmt.Errorf("no connection to vipd within %v (state %v)", timeout, st)
		}
	}
	return nil
}

func churnName(i int) string { return fmt.Sprintf("churn/c%d", i) }

// next picks an UpsertService of one churned service (7 in 10) or a
// SyncServices of the churned owner to a random subset of them.
func (m *mutator) next() crashOp {
	if m.rng.IntN(10) < 7 {
		i := m.rng.IntN(crashChurnServices)
		svc := randomService(m.rng, churnName(i), "churn", VIP(0x100+i), m.pods)
		return crashOp{
			desc: "UpsertService " + svc.Name,
			call: func(ctx context.Context, api *client.Client) error {
				_, err := api.UpsertService(ctx, svc, 0)
				return err
			},
			change: func(model map[string]*vipdv1.Service) { model[svc.Name] = svc },
		}
	}
	var svcs []*vipdv1.Service
	for i := range crashChurnServices {
		if m.rng.IntN(2) == 0 {
			svcs = append(svcs, randomService(m.rng, churnName(i), "churn", VIP(0x100+i), m.pods))
		}
	}
	return crashOp{
		desc: fmt.Sprintf("SyncServices of %d services", len(svcs)),
		call: func(ctx context.Context, api *client.Client) error {
			_, err := api.SyncServices(ctx, "churn", svcs)
			return err
		},
		change: func(model map[string]*vipdv1.Service) {
			for name, svc := range model {
				if svc.Owner == "churn" {
					delete(model, name)
				}
			}
			for _, svc := range svcs {
				model[svc.Name] = svc
			}
		},
	}
}

func testCrashDuringApply(t *testing.T, dp string) {
	rng := newRand(t)
	duration := Pick(time.Duration(0), 30*time.Second)
	e := NewEnv(t, vipdBin, dp, Spec{Clients: []string{"c1"}, Backends: []string{"be1", "be2", "be3"}})
	pods := []*netlab.Pod{e.Pod("be1"), e.Pod("be2"), e.Pod("be3")}

	// Services that never change, and traffic to them all along.
	model := map[string]*vipdv1.Service{}
	var targets []Target
	for i := range 3 {
		svc := service(fmt.Sprintf("stable/s%d", i), "stable", VIP(1+i), backend(pods[0]), backend(pods[1]))
		e.Upsert(svc)
		model[svc.Name] = svc
		targets = append(targets, Target{Addr: ap(VIP(1+i), 80), Backends: []string{"be1", "be2"}})
	}
	traffic := StartTraffic(e.Pod("c1").NS, TrafficConfig{Workers: 2, Pause: 5 * time.Millisecond}, targets...)
	defer traffic.Stop()

	m := &mutator{
		api: e.NewClient(), rng: rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64())), pods: pods,
		failed: make(chan crashOp), resume: make(chan struct{}), reconnected: make(chan struct{}),
		stop: make(chan struct{}), done: make(chan struct{}),
		model: model,
	}
	go m.run()
	var stopOnce sync.Once
	stopMutator := func() { stopOnce.Do(func() { close(m.stop) }); <-m.done }
	defer stopMutator()

	var kills, startupKills, inflightApplied, inflightLost int
	start := time.Now()
	for kills < crashMinKills || time.Since(start) < duration {
		time.Sleep(time.Duration(20+rng.IntN(230)) * time.Millisecond)
		killed := time.Now()
		e.Vipd.Kill9()
		kills++
		var op crashOp
		select {
		case op = <-m.failed:
		case <-time.After(20 * time.Second):
			t.Fatalf("kill %d: the client's call did not fail within 20 s of vipd's death", kills)
		}
		if op.failedAt.Before(killed) {
			t.Fatalf("kill %d: %s failed before vipd was killed: %v", kills, op.desc, op.err)
		}
		// Sometimes kill it again while it restores and applies its state.
		if rng.IntN(4) == 0 {
			if err := e.Vipd.Start(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Duration(rng.IntN(150)) * time.Millisecond)
			e.Vipd.Kill9()
			kills++
			startupKills++
		}
		e.StartVipd()

		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		got, err := e.API.ListServices(ctx, "")
		cancel()
		if err != nil {
			t.Fatalf("kill %d: ListServices after the restart: %v", kills, err)
		}
		m.mu.Lock()
		acked := maps.Clone(m.model)
		m.mu.Unlock()
		withOp := maps.Clone(acked)
		op.change(withOp)
		switch {
		case diffServices(t, acked, got) == "":
			inflightLost++
		case diffServices(t, withOp, got) == "":
			inflightApplied++
			m.mu.Lock()
			m.model = withOp
			m.mu.Unlock()
		default:
			t.Fatalf("kill %d (while %s, which failed with %v): the desired state after the restart is neither the acknowledged state "+
				"nor that plus the cut call.\nagainst the acknowledged state (-want +got):\n%s\nagainst it plus the call (-want +got):\n%s",
				kills, op.desc, op.err, diffServices(t, acked, got), diffServices(t, withOp, got))
		}
		if err := e.CheckKernel(); err != nil {
			t.Fatalf("kill %d: the kernel does not hold the desired state after the restart: %v", kills, err)
		}
		ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
		status, err := e.API.Status(ctx)
		cancel()
		if err != nil || !status.GetReady() || status.GetLastError() != "" || int(status.GetServices()) != len(got) {
			t.Fatalf("kill %d: GetStatus after the restart: %v, %v; want ready, no error and %d services", kills, status, err, len(got))
		}
		if st := traffic.Stats(); st.Failed > 0 {
			t.Fatalf("kill %d: connections to the services that never changed failed: %v", kills, st)
		}
		m.resume <- struct{}{}
		select {
		case <-m.reconnected:
		case op := <-m.failed:
			t.Fatalf("kill %d: the client did not reconnect after the restart: %v", kills, op.err)
		}
	}
	stopMutator()
	st := traffic.Stop()
	m.mu.Lock()
	acked := m.acked
	m.mu.Unlock()
	t.Logf("%s: %s", dp, summary("kills", kills, "startup_kills", startupKills, "acked_calls", acked,
		"cut_calls_applied", inflightApplied, "cut_calls_lost", inflightLost, "elapsed", time.Since(start).Round(time.Millisecond)))
	t.Logf("%s: background traffic to the unchanged services: %v", dp, st)
	if st.Failed > 0 {
		t.Fatalf("connections to the services that never changed failed: %v", st)
	}
	if st.OK < 100 {
		t.Fatalf("the background client made only %d connections: too few to tell", st.OK)
	}
	if acked < kills {
		t.Fatalf("only %d calls were acknowledged between %d kills: the kills did not land among applies", acked, kills)
	}
}
