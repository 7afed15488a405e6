package health

import (
	"sync"
	"time"
)

// maxLate bounds how late the scheduler lets a check start so that it
// can start many together: a check may start up to min(maxLate, 5% of
// its interval) after it is due. At thousands of checks a second that
// makes the scheduler wake about 1/maxLate times a second, not once per
// check.
const maxLate = 10 * time.Millisecond

// scheduler holds every target that waits for its next check, in a
// min-heap by due time: one timer for all of them (the scheduler loop's,
// Prober.schedule), instead of a timer and a goroutine each. A target is
// out of the heap while its check runs, and goes back in when the check
// is over. Removal is lazy: a stopped target stays in the heap until it
// is due, and is dropped then (target.begin).
type scheduler struct {
	epoch time.Time

	mu sync.Mutex
	h  []due
	// wakeAt is when the loop wakes next (its clock); an add that is due
	// earlier wakes it through wake.
	wakeAt int64
	wake   chan struct{} // capacity 1
}

// due is a heap entry: the time a target is due, on the scheduler's clock
// (nanoseconds since epoch, monotonic), kept in the entry so that sifting
// does not touch the targets.
type due struct {
	at int64
	t  *target
}

func newScheduler() *scheduler {
	return &scheduler{epoch: time.Now(), wake: make(chan struct{}, 1)}
}

// now is the scheduler's clock.
func (s *scheduler) now() int64 { return int64(time.Since(s.epoch)) }

// add schedules t's next check after d from now.
func (s *scheduler) add(t *target, d time.Duration) {
	at := s.now() + int64(d)
	s.mu.Lock()
	s.push(due{at: at, t: t})
	wake := at < s.wakeAt
	if wake {
		s.wakeAt = at
	}
	s.mu.Unlock()
	if wake {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// popDue appends to out the targets due by now, while more reports that
// another may start, and returns out.
func (s *scheduler) popDue(now int64, out []*target, more func() bool) []*target {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.h) > 0 && s.h[0].at <= now && more() {
		out = append(out, s.pop().t)
	}
	return out
}

// sleepUntil returns when the loop must wake next, and records it: at
// bound at the latest, and when the earliest target is due plus the
// lateness it allows unless waiting is set (no check may start before
// bound). An add that is due earlier from now on wakes the loop.
func (s *scheduler) sleepUntil(bound int64, waiting bool) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := bound
	if len(s.h) > 0 && !waiting {
		top := s.h[0]
		next = min(next, top.at+int64(min(maxLate, top.t.interval()/20)))
	}
	s.wakeAt = next
	return next
}

// compact drops the stopped targets from the heap when they make up most
// of it: removal is lazy, and a stopped target with a long interval would
// otherwise stay until it is due (up to an hour).
func (s *scheduler) compact(live int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.h) <= 2*live+1024 {
		return
	}
	kept := s.h[:0]
	for _, d := range s.h {
		if !d.t.isStopped() {
			kept = append(kept, d)
		}
	}
	clear(s.h[len(kept):])
	s.h = kept
	for i := len(s.h)/2 - 1; i >= 0; i-- {
		s.down(i)
	}
}

func (s *scheduler) push(d due) {
	s.h = append(s.h, d)
	i := len(s.h) - 1
	for i > 0 {
		parent := (i - 1) / 2
		if s.h[parent].at <= s.h[i].at {
			break
		}
		s.h[parent], s.h[i] = s.h[i], s.h[parent]
		i = parent
	}
}

func (s *scheduler) pop() due {
	top := s.h[0]
	last := len(s.h) - 1
	s.h[0] = s.h[last]
	s.h[last] = due{}
	s.h = s.h[:last]
	s.down(0)
	return top
}

// down sifts the entry at i down to its place.
func (s *scheduler) down(i int) {
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(s.h) && s.h[l].at < s.h[m].at {
			m = l
		}
		if r < len(s.h) && s.h[r].at < s.h[m].at {
			m = r
		}
		if m == i {
			return
		}
		s.h[i], s.h[m] = s.h[m], s.h[i]
		i = m
	}
}
