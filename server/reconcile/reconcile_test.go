package reconcile_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/fake"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/reconcile"
	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
)

type syncEvent struct {
	kind string
	d    time.Duration
	err  error
}

// observer records what the reconciler reports.
type observer struct {
	mu          sync.Mutex
	syncs       []syncEvent
	programming []time.Duration
	states      [][2]int
	repairs     []string // dataplane/what
}

func (o *observer) ObserveSync(kind string, d time.Duration, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.syncs = append(o.syncs, syncEvent{kind, d, err})
}

func (o *observer) ObserveProgramming(d time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.programming = append(o.programming, d)
}

func (o *observer) SetState(services, backends int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.states = append(o.states, [2]int{services, backends})
}

func (o *observer) ObserveDriftRepair(dp, what string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.repairs = append(o.repairs, dp+"/"+what)
}

func (o *observer) driftRepairs() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.repairs)
}

func (o *observer) get() ([]syncEvent, []time.Duration, [][2]int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.syncs), slices.Clone(o.programming), slices.Clone(o.states)
}

func kinds(syncs []syncEvent) []string {
	var k []string
	for _, s := range syncs {
		if s.err != nil {
			k = append(k, s.kind+"!")
		} else {
			k = append(k, s.kind)
		}
	}
	return k
}

// persister saves nothing, or fails while fail is set.
type persister struct {
	mu   sync.Mutex
	fail error
}

func (p *persister) Save(*store.Snapshot) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fail
}

func (p *persister) setFail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fail = err
}

// put upserts a service named name on vip with the given backends.
func put(name, vip string, backends ...string) reconcile.Mutation {
	return func(tx *store.Txn) (any, error) {
		svc := &vipdv1.Service{Name: name, Vips: []string{vip}, Ports: []*vipdv1.Port{{Port: 80}}}
		for _, b := range backends {
			svc.Backends = append(svc.Backends, &vipdv1.Backend{Ip: b})
		}
		out, dp, v := validation.Service(svc, validation.Limits{}, "service")
		if v != nil {
			return nil, v
		}
		return tx.Put(out, dp)
	}
}

func noop(*store.Txn) (any, error) { return "unchanged", nil }

func snapshotOf(t *testing.T, muts ...reconcile.Mutation) *store.Snapshot {
	t.Helper()
	tx := store.Empty().Begin()
	for _, m := range muts {
		if _, err := m(tx); err != nil {
			t.Fatal(err)
		}
	}
	return tx.Commit()
}

type harness struct {
	rec *reconcile.Reconciler
	dp  *fake.Dataplane
	obs *observer
	p   *persister
}

// run starts a reconciler over dp from initial and, unless dp fails it
// first, waits for the initial apply.
func run(t *testing.T, dp *fake.Dataplane, initial *store.Snapshot, opts ...reconcile.Option) *harness {
	t.Helper()
	h := &harness{dp: dp, obs: &observer{}, p: &persister{}}
	h.rec = reconcile.New(hclog.NewNullLogger(), dp, h.p, initial, append(opts, reconcile.WithObserver(h.obs))...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.rec.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	select {
	case <-h.rec.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("initial apply did not succeed")
	}
	return h
}

func (h *harness) do(t *testing.T, m reconcile.Mutation) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := h.rec.Do(ctx, m)
	return err
}

// checkSyncsMatchApplies checks that every Apply the fake saw was reported
// once, as full exactly when it carried no change hint, with its outcome.
func checkSyncsMatchApplies(t *testing.T, h *harness) {
	t.Helper()
	syncs, _, _ := h.obs.get()
	recs := h.dp.Records()
	if len(syncs) != len(recs) {
		t.Fatalf("observer saw %d syncs %v; the dataplane saw %d applies", len(syncs), kinds(syncs), len(recs))
	}
	for i, r := range recs {
		want := reconcile.SyncPartial
		if r.State.Changed == nil {
			want = reconcile.SyncFull
		}
		if syncs[i].kind != want || (syncs[i].err == nil) != (r.Err == nil) {
			t.Errorf("sync %d: observed %s (err %v), the dataplane applied changed=%v (err %v)", i, syncs[i].kind, syncs[i].err, r.State.Changed, r.Err)
		}
	}
}

func TestObserverFullSyncAtStart(t *testing.T) {
	initial := snapshotOf(t, put("a", "10.96.0.1", "10.0.0.1", "10.0.0.2"), put("b", "10.96.0.2", "10.0.0.3"))
	h := run(t, fake.New(), initial)
	syncs, prog, states := h.obs.get()
	if got := kinds(syncs); !slices.Equal(got, []string{"full"}) {
		t.Fatalf("syncs %v, want [full]", got)
	}
	if syncs[0].d <= 0 {
		t.Errorf("initial sync took %v", syncs[0].d)
	}
	if len(prog) != 0 {
		t.Errorf("programming durations %v for the initial apply; want none, no RPC asked for it", prog)
	}
	if !slices.Equal(states, [][2]int{{2, 3}}) {
		t.Errorf("states %v, want [[2 3]]", states)
	}
	checkSyncsMatchApplies(t, h)
}

func TestObserverInitialFailureIsAnErrorThenFull(t *testing.T) {
	dp := fake.New()
	dp.FailNext(errors.New("boom"))
	h := run(t, dp, store.Empty())
	syncs, _, states := h.obs.get()
	if got := kinds(syncs); !slices.Equal(got, []string{"full!", "full"}) {
		t.Fatalf("syncs %v, want [full! full]", got)
	}
	if !slices.Equal(states, [][2]int{{0, 0}}) {
		t.Errorf("states %v, want only the successful apply's [[0 0]]", states)
	}
	checkSyncsMatchApplies(t, h)
}

func TestObserverPartialSyncsAndProgramming(t *testing.T) {
	dp := fake.New()
	h := run(t, dp, store.Empty())

	if err := h.do(t, put("a", "10.96.0.1", "10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	syncs, prog, states := h.obs.get()
	if got := kinds(syncs); !slices.Equal(got, []string{"full", "partial"}) {
		t.Fatalf("syncs %v, want [full partial]", got)
	}
	if len(prog) != 1 || prog[0] <= 0 {
		t.Fatalf("programming %v, want one positive duration", prog)
	}
	if states[len(states)-1] != [2]int{1, 1} {
		t.Errorf("state %v, want [1 1]", states[len(states)-1])
	}

	// A change that changes nothing is not applied and not programmed.
	if err := h.do(t, noop); err != nil {
		t.Fatal(err)
	}
	if syncs, prog, _ := h.obs.get(); len(syncs) != 2 || len(prog) != 1 {
		t.Fatalf("after a no-op change: syncs %v, programming %v; want both unchanged", kinds(syncs), prog)
	}

	// Hold the next apply, so that the changes submitted meanwhile queue
	// up behind it: each of them gets its own programming duration,
	// measured from its own submission, whether or not they are merged.
	const hold = 50 * time.Millisecond
	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	dp.SetHook(func(ctx context.Context, _ *dataplane.State) error {
		once.Do(func() {
			close(entered)
			<-release
		})
		return nil
	})
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	submit := func(m reconcile.Mutation) {
		wg.Go(func() { errs <- h.do(t, m) })
	}
	submit(put("b", "10.96.0.2", "10.0.0.2", "10.0.0.3"))
	<-entered
	submit(put("c", "10.96.0.3", "10.0.0.4"))
	submit(put("d", "10.96.0.4", "10.0.0.5"))
	submit(noop)
	time.Sleep(hold)
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	elapsed := time.Since(start)

	syncs, prog, states = h.obs.get()
	if len(prog) != 4 {
		t.Fatalf("programming %v, want 4 (a, b, c, d; not the no-op)", prog)
	}
	for _, d := range prog[1:] {
		if d <= 0 || d > elapsed {
			t.Errorf("programming duration %v outside (0, %v]", d, elapsed)
		}
	}
	// b was submitted before the hold began, and waited through it.
	if slices.Max(prog[1:]) < hold {
		t.Errorf("programming %v: b waited at least %v", prog[1:], hold)
	}
	for _, s := range syncs[1:] {
		if s.kind != reconcile.SyncPartial || s.err != nil {
			t.Errorf("sync %v, want successful partial syncs after the first", s)
		}
	}
	if states[len(states)-1] != [2]int{4, 5} {
		t.Errorf("state %v, want [4 5]", states[len(states)-1])
	}
	checkSyncsMatchApplies(t, h)
}

func TestObserverCountsFailedApply(t *testing.T) {
	dp := fake.New()
	h := run(t, dp, store.Empty())
	if err := h.do(t, put("a", "10.96.0.1", "10.0.0.1")); err != nil {
		t.Fatal(err)
	}

	dp.FailNext(errors.New("kernel says no"))
	var applyErr *reconcile.ApplyError
	if err := h.do(t, put("b", "10.96.0.2", "10.0.0.2")); !errors.As(err, &applyErr) {
		t.Fatalf("got %v, want an ApplyError", err)
	}
	syncs, prog, states := h.obs.get()
	if got := kinds(syncs); !slices.Equal(got, []string{"full", "partial", "partial!"}) {
		t.Fatalf("syncs %v, want [full partial partial!]", got)
	}
	if len(prog) != 1 {
		t.Errorf("programming %v: a refused change must not be counted", prog)
	}
	if states[len(states)-1] != [2]int{1, 1} {
		t.Errorf("state %v, want [1 1], still a's", states[len(states)-1])
	}

	if err := h.do(t, put("b", "10.96.0.2", "10.0.0.2")); err != nil {
		t.Fatal(err)
	}
	syncs, prog, _ = h.obs.get()
	if got := kinds(syncs); !slices.Equal(got, []string{"full", "partial", "partial!", "partial"}) {
		t.Fatalf("syncs %v, want [full partial partial! partial]", got)
	}
	if len(prog) != 2 {
		t.Errorf("programming %v, want 2", prog)
	}
	checkSyncsMatchApplies(t, h)
}

func TestObserverSaveFailureRollsBackState(t *testing.T) {
	dp := fake.New()
	h := run(t, dp, store.Empty())
	if err := h.do(t, put("a", "10.96.0.1", "10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	h.p.setFail(errors.New("disk full"))
	var saveErr *reconcile.SaveError
	if err := h.do(t, put("b", "10.96.0.2", "10.0.0.2")); !errors.As(err, &saveErr) {
		t.Fatalf("got %v, want a SaveError", err)
	}
	_, prog, states := h.obs.get()
	if len(prog) != 1 {
		t.Errorf("programming %v: a rolled-back change must not be counted", prog)
	}
	// Applied b, then rolled back to a alone.
	if got := states[len(states)-2:]; !slices.Equal(got, [][2]int{{2, 2}, {1, 1}}) {
		t.Errorf("last states %v, want [[2 2] [1 1]]", got)
	}
	checkSyncsMatchApplies(t, h)
}

func TestObserverResyncIsFull(t *testing.T) {
	dp := fake.New()
	h := run(t, dp, store.Empty(), reconcile.WithResyncPeriod(10*time.Millisecond))
	if err := h.do(t, put("a", "10.96.0.1", "10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		syncs, _, _ := h.obs.get()
		if i := slices.IndexFunc(syncs, func(s syncEvent) bool { return s.kind == reconcile.SyncPartial }); i >= 0 &&
			slices.ContainsFunc(syncs[i:], func(s syncEvent) bool { return s.kind == reconcile.SyncFull }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no full resync after the change: %v", kinds(syncs))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, prog, _ := h.obs.get(); len(prog) != 1 {
		t.Errorf("programming %v: resyncs are not programming", prog)
	}
}
