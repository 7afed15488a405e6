package reconcile_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/fake"
	"github.com/vipd/vipd/server/reconcile"
	"github.com/vipd/vipd/server/store"
)

// holding returns a mutation that puts a service and holds a megabyte,
// and a channel that is closed once the collector has taken the megabyte.
func holding() (reconcile.Mutation, <-chan struct{}) {
	big := new([1 << 20]byte)
	collected := make(chan struct{})
	runtime.AddCleanup(big, func(ch chan struct{}) { close(ch) }, collected)
	m := put("a", "10.96.0.1", "10.0.0.1")
	return func(tx *store.Txn) (any, error) {
		big[0]++
		return m(tx)
	}, collected
}

// TestMutationCollectedDuringApply checks that the reconciler drops a
// change's mutation once it has run it for the last time (a batch of
// one), so that what the mutation holds, such as a big SyncServices'
// validated list, is not kept while the change is applied and saved.
func TestMutationCollectedDuringApply(t *testing.T) {
	dp := fake.New()
	h := run(t, dp, store.Empty())
	mut, collected := holding()
	during := make(chan bool, 1)
	dp.SetHook(func(context.Context, *dataplane.State) error {
		// Cleanups run on a goroutine of their own after a collection.
		for range 50 {
			runtime.GC()
			select {
			case <-collected:
				during <- true
				return nil
			case <-time.After(10 * time.Millisecond):
			}
		}
		during <- false
		return nil
	})
	if err := h.do(t, mut); err != nil {
		t.Fatal(err)
	}
	if !<-during {
		t.Error("what a change's mutation holds was still reachable while the change was applied")
	}
}
