package health

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestSchedulerOrder: targets come out of the heap in due order, only once
// due, and compact drops the stopped ones, keeping the order of the rest.
func TestSchedulerOrder(t *testing.T) {
	s := newScheduler()
	const n = 6000
	var targets []*target
	for i := range n {
		tg := &target{spec: spec{interval: 2000}, key: key{service: "svc"}}
		tg.consecutive = uint32(i) // the target's name in this test
		targets = append(targets, tg)
		s.mu.Lock()
		s.push(due{at: int64(rand.N(1_000_000)), t: tg})
		s.mu.Unlock()
	}
	// Stop two thirds; compact keeps the rest (the heap is over 2×live+1024).
	live := 0
	for i, tg := range targets {
		if i%3 != 0 {
			tg.stopped = true
		} else {
			live++
		}
	}
	s.compact(live)
	if len(s.h) != live {
		t.Fatalf("%d entries after compact, want %d", len(s.h), live)
	}
	if got := s.popDue(-1, nil, func() bool { return true }); len(got) != 0 {
		t.Fatalf("%d targets due before any is", len(got))
	}
	var ats []int64
	for len(s.h) > 0 {
		d := s.h[0]
		got := s.popDue(d.at, nil, func() bool { return true })
		if len(got) == 0 || got[0] != d.t {
			t.Fatalf("popDue(%d) = %v, want the top first", d.at, got)
		}
		for _, tg := range got {
			if tg.stopped {
				t.Fatalf("a stopped target survived compact")
			}
		}
		ats = append(ats, d.at)
	}
	if !slices.IsSorted(ats) {
		t.Errorf("targets not in due order")
	}
	// sleepUntil: the top's due plus its lateness, at most the bound.
	tg := &target{spec: spec{interval: 100}}
	s.add(tg, time.Second)
	now := s.now()
	if next := s.sleepUntil(now+int64(time.Hour), false); next < now+int64(time.Second) || next > now+int64(time.Second+6*time.Millisecond) {
		t.Errorf("sleepUntil = now+%v, want now+1s+5ms", time.Duration(next-now))
	}
	if next := s.sleepUntil(now+int64(time.Millisecond), false); next != now+int64(time.Millisecond) {
		t.Errorf("sleepUntil with a bound of 1ms = now+%v", time.Duration(next-now))
	}
}
