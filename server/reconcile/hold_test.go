package reconcile_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/fake"
	"github.com/vipd/vipd/server/reconcile"
	"github.com/vipd/vipd/server/store"
)

// runHeld starts a reconciler under WithHold; it does not wait for Ready,
// which stays open until a Release.
func runHeld(t *testing.T, dp *fake.Dataplane, p *persister, opts ...reconcile.Option) *reconcile.Reconciler {
	t.Helper()
	rec := reconcile.New(hclog.NewNullLogger(), dp, p, store.Empty(), append(opts, reconcile.WithHold("testing"))...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rec.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return rec
}

func ctx10(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func isReady(rec *reconcile.Reconciler) bool {
	select {
	case <-rec.Ready():
		return true
	default:
		return false
	}
}

// TestHoldAppliesNothingUntilRelease checks that a held reconciler never
// calls the dataplane, not even for a resync, refuses Do with a HeldError
// that changes nothing, and that the first Release is applied as a full
// sync, after which everything works as usual.
func TestHoldAppliesNothingUntilRelease(t *testing.T) {
	dp := fake.New()
	rec := runHeld(t, dp, &persister{}, reconcile.WithResyncPeriod(time.Millisecond))
	for range 3 {
		_, err := rec.Do(ctx10(t), put("a", "10.96.0.1", "10.0.0.1"))
		var held *reconcile.HeldError
		if !errors.As(err, &held) || held.Reason != "testing" {
			t.Fatalf("Do while held: %v, want a HeldError", err)
		}
	}
	time.Sleep(50 * time.Millisecond) // 50 resync periods
	if n := len(dp.Records()); n != 0 {
		t.Fatalf("the dataplane saw %d applies while held", n)
	}
	if rec.Snapshot().Len() != 0 {
		t.Fatal("a refused change reached the desired state")
	}
	st := rec.Status()
	if st.Ready || st.HeldReason != "testing" || isReady(rec) {
		t.Fatalf("status while held: %+v (Ready closed: %v)", st, isReady(rec))
	}

	// A failing release keeps the hold.
	dp.FailNext(errors.New("boom"))
	if _, err := rec.Release(ctx10(t), put("a", "10.96.0.1", "10.0.0.1")); err == nil {
		t.Fatal("a release whose apply failed succeeded")
	}
	if isReady(rec) || rec.Status().HeldReason == "" || rec.Snapshot().Len() != 0 {
		t.Fatal("a failed release ended the hold")
	}
	if _, err := rec.Do(ctx10(t), noop); err == nil {
		t.Fatal("Do after a failed release succeeded")
	}

	if _, err := rec.Release(ctx10(t), put("a", "10.96.0.1", "10.0.0.1")); err != nil {
		t.Fatalf("release: %v", err)
	}
	if !isReady(rec) || rec.Status().HeldReason != "" || !rec.Status().Ready {
		t.Fatalf("after the release: ready %v, status %+v", isReady(rec), rec.Status())
	}
	recs := dp.Records()
	last := recs[len(recs)-1]
	if last.Err != nil || last.State.Changed != nil || len(last.State.Services) != 1 {
		t.Fatalf("the releasing apply: err %v, changed %v (want nil: a full sync), %d services", last.Err, last.State.Changed, len(last.State.Services))
	}
	if _, err := rec.Do(ctx10(t), put("b", "10.96.0.2", "10.0.0.2")); err != nil {
		t.Fatalf("Do after the release: %v", err)
	}
	// Resyncs run again.
	n := len(dp.Records())
	time.Sleep(50 * time.Millisecond)
	if len(dp.Records()) <= n {
		t.Error("no resync after the release")
	}
}

// TestHoldReleaseWithoutChanges checks that a Release that changes nothing
// (a sync of an owner with no services) still applies the state in full
// and ends the hold.
func TestHoldReleaseWithoutChanges(t *testing.T) {
	dp := fake.New()
	rec := runHeld(t, dp, &persister{})
	if _, err := rec.Release(ctx10(t), noop); err != nil {
		t.Fatal(err)
	}
	if !isReady(rec) || len(dp.Records()) != 1 || dp.Records()[0].State.Changed != nil {
		t.Fatalf("ready %v, applies %v", isReady(rec), dp.Records())
	}
}

// TestHoldSaveFailureKeepsDataplane checks that when the releasing sync is
// applied but cannot be saved, the dataplane is not rolled back to the
// held (empty) state, and the hold stays.
func TestHoldSaveFailureKeepsDataplane(t *testing.T) {
	dp := fake.New()
	p := &persister{}
	rec := runHeld(t, dp, p)
	p.setFail(errors.New("disk full"))
	_, err := rec.Release(ctx10(t), put("a", "10.96.0.1", "10.0.0.1"))
	var saveErr *reconcile.SaveError
	if !errors.As(err, &saveErr) {
		t.Fatalf("release with a failing save: %v", err)
	}
	applied, _ := dp.Applied()
	if len(applied) != 1 || len(dp.Records()) != 1 {
		t.Fatalf("the dataplane has %d services after %d applies; want the synced one, never rolled back", len(applied), len(dp.Records()))
	}
	if isReady(rec) || rec.Status().Ready || rec.Status().HeldReason == "" {
		t.Fatal("the hold ended without a save")
	}
	p.setFail(nil)
	if _, err := rec.Release(ctx10(t), put("a", "10.96.0.1", "10.0.0.1")); err != nil || !isReady(rec) {
		t.Fatalf("release after the disk recovered: %v, ready %v", err, isReady(rec))
	}
}

// TestHoldBatchOrder checks the order within one batch while held: a Do
// queued before the releasing change is refused, one queued after it is
// accepted, and the batch is applied as one full sync.
func TestHoldBatchOrder(t *testing.T) {
	dp := fake.New()
	block := make(chan struct{})
	entered := make(chan struct{}, 1)
	rec := runHeld(t, dp, &persister{})
	// A first release blocks in the dataplane and then fails, so that the
	// hold stays and the next three changes queue up as one batch.
	dp.SetHook(func(context.Context, *dataplane.State) error {
		entered <- struct{}{}
		<-block
		return errors.New("boom")
	})
	first := make(chan error, 1)
	go func() { _, err := rec.Release(ctx10(t), put("x", "10.96.0.9", "10.0.0.9")); first <- err }()
	<-entered
	dp.SetHook(nil)
	calls := []struct {
		release bool
		m       reconcile.Mutation
	}{{false, put("a", "10.96.0.1")}, {true, noop}, {false, put("b", "10.96.0.2")}}
	errs := make([]chan error, len(calls))
	for i, c := range calls {
		errs[i] = make(chan error, 1)
		go func() {
			var err error
			if c.release {
				_, err = rec.Release(ctx10(t), c.m)
			} else {
				_, err = rec.Do(ctx10(t), c.m)
			}
			errs[i] <- err
		}()
		time.Sleep(20 * time.Millisecond) // queue them in this order
	}
	close(block)
	if err := <-first; err == nil {
		t.Fatal("the failing release succeeded")
	}
	var held *reconcile.HeldError
	if err := <-errs[0]; !errors.As(err, &held) {
		t.Errorf("Do queued before the release: %v, want a HeldError", err)
	}
	if err := <-errs[1]; err != nil {
		t.Errorf("release: %v", err)
	}
	if err := <-errs[2]; err != nil {
		t.Errorf("Do queued after the release: %v", err)
	}
	recs := dp.Records()
	if len(recs) != 2 || recs[1].Err != nil || recs[1].State.Changed != nil || len(recs[1].State.Services) != 1 {
		t.Fatalf("applies %d; want the failed one and one full sync of b", len(recs))
	}
	if _, ok := rec.Snapshot().Get("b"); !ok || !isReady(rec) {
		t.Fatal("b is not in the desired state, or the hold did not end")
	}
}
