package kubeadapter

import (
	"testing"
	"time"
)

func newQueue() *Adapter {
	return &Adapter{dirty: map[string]time.Time{}, triggers: map[string]time.Time{}, wake: make(chan struct{}, 1)}
}

// TestQueueTakeRequeue: a pass takes the whole dirty set and a pending
// full sync at once; what it puts back keeps when it was first marked and
// its earliest trigger, and an older mark or full sync wins over a newer.
func TestQueueTakeRequeue(t *testing.T) {
	a := newQueue()
	t0 := time.Now().Add(-time.Minute)
	a.markDirty("ns/a", t0.Add(time.Second))
	a.markDirty("ns/a", t0) // an earlier trigger wins
	a.markDirty("ns/b", time.Time{})
	a.markFull("start")
	a.markFull("later") // the first reason stays
	if !a.hasWork() {
		t.Fatal("no work after marks")
	}
	marked := a.dirty["ns/a"]

	w := a.take()
	if !w.full || w.fullReason != "start" || len(w.names) != 2 || !w.triggers["ns/a"].Equal(t0) {
		t.Fatalf("took %+v; want a full sync for start, two names, ns/a triggered at %v", w, t0)
	}
	if _, ok := w.triggers["ns/b"]; ok {
		t.Errorf("ns/b has a trigger: %v", w.triggers["ns/b"])
	}
	if a.hasWork() || len(a.dirty) != 0 || !a.fullSince.IsZero() {
		t.Fatalf("work left after take: dirty %v, full since %v", a.dirty, a.fullSince)
	}
	oldest := w.fullSince
	for _, m := range w.names {
		if m.Before(oldest) {
			oldest = m
		}
	}
	if !a.inflight.Equal(oldest) {
		t.Errorf("in flight since %v, want the oldest change %v", a.inflight, oldest)
	}

	// Meanwhile ns/a changes again, and a full sync is due for another reason.
	a.markDirty("ns/a", time.Now())
	a.markFull("periodic full sync")
	a.requeue(w, []string{"ns/a"}, true)
	if !a.dirty["ns/a"].Equal(marked) || !a.triggers["ns/a"].Equal(t0) {
		t.Errorf("requeued ns/a marked %v triggered %v; want the older %v and %v", a.dirty["ns/a"], a.triggers["ns/a"], marked, t0)
	}
	if _, ok := a.dirty["ns/b"]; ok {
		t.Errorf("ns/b requeued, though not named")
	}
	if !a.fullSince.Equal(w.fullSince) || a.fullReason != "start" {
		t.Errorf("full sync since %v for %q; want the older %v for start", a.fullSince, a.fullReason, w.fullSince)
	}

	// A partial pass that fails for good puts a full sync back as of now.
	a = newQueue()
	a.markDirty("ns/c", time.Time{})
	w = a.take()
	before := time.Now()
	a.requeue(w, nil, true)
	if a.fullSince.Before(before) || len(a.dirty) != 0 {
		t.Errorf("full sync since %v (want from %v on), dirty %v (want none)", a.fullSince, before, a.dirty)
	}
}
