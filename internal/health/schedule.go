package health

import (
	"container/heap"
	"context"
	"sync"
	"time"
)

// scheduleSlack is how early a check may start: the scheduler starts every
// check due within it at once, so that at thousands of checks a second it
// wakes at most every scheduleSlack rather than for every check.
const scheduleSlack = 2 * time.Millisecond

// scheduler holds every target that waits for its next check, in a
// min-heap by due time, and runs one goroutine that hands due targets to
// a dispatch function: one timer for all targets, instead of a timer and
// a goroutine each. A target is out of the heap while its check runs, and
// goes back in when the check is over.
type scheduler struct {
	mu   sync.Mutex
	h    dueHeap
	wake chan struct{} // capacity 1: the earliest due time changed
}

func newScheduler() *scheduler { return &scheduler{wake: make(chan struct{}, 1)} }

// add schedules t's next check at due.
func (s *scheduler) add(t *target, due time.Time) {
	s.mu.Lock()
	t.due = due
	heap.Push(&s.h, t)
	first := t.index == 0
	s.mu.Unlock()
	if first {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// remove takes t out of the schedule, if it is in it.
func (s *scheduler) remove(t *target) {
	s.mu.Lock()
	if t.index >= 0 {
		heap.Remove(&s.h, t.index)
	}
	s.mu.Unlock()
}

// run calls dispatch for every target when it is due, until ctx ends.
// dispatch may block (to bound the checks in flight); the targets it gets
// are out of the schedule until added again.
func (s *scheduler) run(ctx context.Context, dispatch func(*target)) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var due []*target
	for {
		s.mu.Lock()
		now := time.Now()
		limit := now.Add(scheduleSlack)
		due = due[:0]
		for len(s.h) > 0 && !s.h[0].due.After(limit) {
			due = append(due, heap.Pop(&s.h).(*target))
		}
		wait := time.Hour
		if len(s.h) > 0 {
			wait = s.h[0].due.Sub(now)
		}
		s.mu.Unlock()
		for i, t := range due {
			dispatch(t)
			due[i] = nil
		}
		if len(due) > 0 {
			continue
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-s.wake:
			// Since Go 1.23 Reset discards a pending expiry: no drain.
		}
	}
}

// dueHeap orders targets by due time; each knows its index in it.
type dueHeap []*target

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h dueHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}

func (h *dueHeap) Push(x any) {
	t := x.(*target)
	t.index = len(*h)
	*h = append(*h, t)
}

func (h *dueHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	t.index = -1
	return t
}
