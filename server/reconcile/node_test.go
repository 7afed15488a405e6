package reconcile_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/fake"
	"github.com/vipd/vipd/server/reconcile"
)

// testNode is a Node whose only node-port address is addr, on eth0.
func testNode(addr string) dataplane.Node {
	a := netip.MustParseAddr(addr)
	return dataplane.Node{
		NodePortAddresses: []netip.Addr{a},
		Interfaces:        []dataplane.Interface{{Name: "eth0", Index: 2, Addrs: []netip.Addr{a}, External: true}},
	}
}

func setNode(t *testing.T, rec *reconcile.Reconciler, n dataplane.Node) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return rec.SetNode(ctx, n)
}

func lastRecord(t *testing.T, dp *fake.Dataplane) fake.Record {
	t.Helper()
	recs := dp.Records()
	if len(recs) == 0 {
		t.Fatal("no apply")
	}
	return recs[len(recs)-1]
}

// TestNodeInitialApply: the initial full apply already carries WithNode's
// Node.
func TestNodeInitialApply(t *testing.T) {
	n := testNode("198.18.0.1")
	h := run(t, fake.New(), snapshotOf(t, put("a", "10.96.0.1", "10.0.0.1")), reconcile.WithNode(n))
	recs := h.dp.Records()
	if len(recs) != 1 || recs[0].State.Changed != nil {
		t.Fatalf("%d applies, first changed=%v; want one full apply", len(recs), recs[0].State.Changed)
	}
	if got := recs[0].State.Node; !got.Equal(&n) {
		t.Fatalf("initial apply's Node %+v, want %+v", got, n)
	}
}

// TestSetNode: a changed Node is applied at once, with an empty (not nil)
// Changed and no new generation; an equal Node applies nothing; later
// changes and full resyncs carry the current Node.
func TestSetNode(t *testing.T) {
	n1, n2 := testNode("198.18.0.1"), testNode("198.18.0.2")
	h := run(t, fake.New(), snapshotOf(t, put("a", "10.96.0.1", "10.0.0.1")), reconcile.WithNode(n1))
	gen := h.rec.Snapshot().Revision()
	if err := setNode(t, h.rec, n2); err != nil {
		t.Fatal(err)
	}
	last := lastRecord(t, h.dp)
	if last.State.Changed == nil || len(last.State.Changed) != 0 {
		t.Errorf("a Node-only apply has changed=%#v, want empty and not nil (no service changed, no full sync)", last.State.Changed)
	}
	if !last.State.Node.Equal(&n2) || last.State.Generation != gen || len(last.State.Services) != 1 {
		t.Errorf("Node apply: node %+v generation %d services %d; want %+v, %d, 1", last.State.Node, last.State.Generation, len(last.State.Services), n2, gen)
	}
	if h.rec.Snapshot().Revision() != gen {
		t.Error("a Node change used up a generation")
	}
	n := len(h.dp.Records())
	if err := setNode(t, h.rec, testNode("198.18.0.2")); err != nil {
		t.Fatal(err)
	}
	if len(h.dp.Records()) != n {
		t.Error("an equal Node was applied again")
	}
	if err := h.do(t, put("b", "10.96.0.2", "10.0.0.2")); err != nil {
		t.Fatal(err)
	}
	if last := lastRecord(t, h.dp); !slices.Equal(last.State.Changed, []string{"b"}) || !last.State.Node.Equal(&n2) {
		t.Errorf("a later change: changed=%v node %+v, want [b] and %+v", last.State.Changed, last.State.Node, n2)
	}
	checkSyncsMatchApplies(t, h)
}

// TestSetNodeResync: a periodic full resync carries the current Node.
func TestSetNodeResync(t *testing.T) {
	n2 := testNode("198.18.0.2")
	h := run(t, fake.New(), snapshotOf(t, put("a", "10.96.0.1", "10.0.0.1")), reconcile.WithResyncPeriod(5*time.Millisecond))
	if err := setNode(t, h.rec, n2); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a full resync after SetNode", func() bool {
		recs := h.dp.Records()
		for _, r := range recs[1:] {
			if r.State.Changed == nil && r.State.Node.Equal(&n2) {
				return true
			}
		}
		return false
	})
}

// TestSetNodeAllOrNothing: a Node the dataplane refuses is an error, and
// the previous Node stays in force for later applies until SetNode is
// called again.
func TestSetNodeAllOrNothing(t *testing.T) {
	n1, n2 := testNode("198.18.0.1"), testNode("198.18.0.2")
	h := run(t, fake.New(), snapshotOf(t, put("a", "10.96.0.1", "10.0.0.1")), reconcile.WithNode(n1))
	h.dp.FailNext(errors.New("boom"))
	if err := setNode(t, h.rec, n2); err == nil {
		t.Fatal("SetNode succeeded over a failing apply")
	}
	if got := h.dp.AppliedNode(); !got.Equal(&n1) {
		t.Fatalf("applied Node %+v after a refused SetNode, want %+v", got, n1)
	}
	if err := h.do(t, put("b", "10.96.0.2", "10.0.0.2")); err != nil {
		t.Fatal(err)
	}
	if last := lastRecord(t, h.dp); !last.State.Node.Equal(&n1) {
		t.Fatalf("a later change carried Node %+v: the refused Node was kept", last.State.Node)
	}
	// Submitting it again is the retry.
	if err := setNode(t, h.rec, n2); err != nil {
		t.Fatal(err)
	}
	if got := h.dp.AppliedNode(); !got.Equal(&n2) {
		t.Fatalf("applied Node %+v after the retry, want %+v", got, n2)
	}
}

// TestSetNodeBatched: a Node change queued with a service change rides on
// the same apply, and Changed names only the service.
func TestSetNodeBatched(t *testing.T) {
	n2 := testNode("198.18.0.2")
	dp := fake.New()
	h := run(t, dp, snapshotOf(t, put("a", "10.96.0.1", "10.0.0.1")))
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	dp.SetHook(func(context.Context, *dataplane.State) error {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
		return nil
	})
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	wg.Add(1)
	go func() { defer wg.Done(); errs <- h.do(t, put("x", "10.96.0.9", "10.0.0.9")) }()
	<-entered // the reconciler is busy: what follows queues up
	n := len(dp.Records())
	wg.Add(2)
	go func() { defer wg.Done(); errs <- h.do(t, put("b", "10.96.0.2", "10.0.0.2")) }()
	go func() { defer wg.Done(); errs <- setNode(t, h.rec, n2) }()
	time.Sleep(50 * time.Millisecond) // both queue up behind the blocked apply
	dp.SetHook(nil)
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	recs := dp.Records()[n:]
	var found bool
	for _, r := range recs {
		if r.State.Node.Equal(&n2) && slices.Contains(r.State.Changed, "b") {
			found = true
			if slices.Contains(r.State.Changed, "") || len(r.State.Changed) != 1 {
				t.Errorf("batched apply changed=%v, want [b]", r.State.Changed)
			}
		}
	}
	if !found || len(recs) != 2 {
		t.Errorf("applies after the blocked one: %d (want 2: the blocked one and one batch carrying b and the Node)", len(recs))
	}
}

// TestSetNodeWhileHeld: a Node submitted while the reconciler holds is
// taken without touching the dataplane, and the releasing sync carries it.
func TestSetNodeWhileHeld(t *testing.T) {
	n := testNode("198.18.0.1")
	dp := fake.New()
	rec := runHeld(t, dp, &persister{})
	if err := rec.SetNode(ctx10(t), n); err != nil {
		t.Fatalf("SetNode while held: %v", err)
	}
	if len(dp.Records()) != 0 {
		t.Fatal("SetNode reached the dataplane while held")
	}
	if _, err := rec.Release(ctx10(t), put("a", "10.96.0.1", "10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	if last := lastRecord(t, dp); last.State.Changed != nil || !last.State.Node.Equal(&n) {
		t.Fatalf("releasing sync: changed=%v node %+v, want a full sync with %+v", last.State.Changed, last.State.Node, n)
	}
}

// TestAppliedHook: the hook sees every State the dataplane accepted, with
// its Node and the health overlay, and never a refused one.
func TestAppliedHook(t *testing.T) {
	var mu sync.Mutex
	var seen []*dataplane.State
	hook := func(s *dataplane.State) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, s)
	}
	last := func() *dataplane.State {
		mu.Lock()
		defer mu.Unlock()
		return seen[len(seen)-1]
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(seen)
	}
	n1, n2 := testNode("198.18.0.1"), testNode("198.18.0.2")
	h := run(t, fake.New(), snapshotOf(t, put("a", "10.96.0.1", "10.0.0.1", "10.0.0.2")), reconcile.WithNode(n1), reconcile.WithAppliedHook(hook))
	if count() != 1 || !last().Node.Equal(&n1) {
		t.Fatalf("after the initial apply the hook saw %d states", count())
	}
	if err := setHealth(t, h, reconcile.HealthChange{Service: "a", Backend: netip.MustParseAddr("10.0.0.2"), Failing: true}); err != nil {
		t.Fatal(err)
	}
	svc, _ := last().Get("a")
	if svc.Backends[1].State != dataplane.BackendNotServing {
		t.Errorf("the hook's state has backend states %v %v, want the health overlay", svc.Backends[0].State, svc.Backends[1].State)
	}
	h.dp.FailNext(errors.New("boom"))
	before := count()
	if err := setNode(t, h.rec, n2); err == nil {
		t.Fatal("SetNode succeeded over a failing apply")
	}
	if count() != before {
		t.Error("the hook saw a state the dataplane refused")
	}
	if err := setNode(t, h.rec, n2); err != nil {
		t.Fatal(err)
	}
	if !last().Node.Equal(&n2) {
		t.Errorf("hook's last Node %+v, want %+v", last().Node, n2)
	}
}
