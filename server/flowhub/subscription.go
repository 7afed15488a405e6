package flowhub

import (
	"context"
	"sync"
)

// Sources of lost events, as Lost.Source and Observer.Lost name them.
const (
	// LostKernel events were dropped by the kernel before the source could
	// read them (a ring buffer or netlink overrun).
	LostKernel = "kernel"
	// LostSubscriber events matched a subscriber whose buffer was full.
	LostSubscriber = "subscriber"
)

// Lost reports Count events that a subscriber missed, lost at Source.
type Lost struct {
	Source string
	Count  uint64
}

// Message is what a subscriber gets next: an event, or, when Lost is not
// nil, a report of events it missed at this point of the stream.
type Message struct {
	Event Event
	Lost  *Lost
}

// initialRing is the buffer a subscription starts with; it grows, by
// doubling, up to the hub's buffer size, so that an idle subscriber costs
// little.
const initialRing = 64

// entry is one buffered event, with the losses that happened just before
// it (after the entry ahead of it).
type entry struct {
	ev                   Event
	lostKernel, lostSubs uint64
}

// Subscription is one subscriber's view of a Hub: the events that match
// its filter, in the order the source reported them, with exact reports of
// what it missed. Next is for one goroutine; Close may be called from any.
type Subscription struct {
	hub    *Hub
	filter Filter
	wake   chan struct{} // capacity 1: something to take, or the end

	mu   sync.Mutex
	ring []entry
	head int // index of the oldest entry
	n    int // number of entries
	max  int // the most entries the buffer holds
	// lostKernel and lostSubs are losses after every buffered entry; the
	// next entry carries them, or Next reports them once the buffer is
	// drained.
	lostKernel, lostSubs uint64
	err                  error // why the subscription ended; nil while it runs
}

func newSubscription(h *Hub, f Filter, max int) *Subscription {
	return &Subscription{hub: h, filter: f, max: max, wake: make(chan struct{}, 1),
		ring: make([]entry, min(initialRing, max))}
}

// Next returns the next message. Losses are reported where they happened:
// after the events that came before them and before those that came after
// (kernel losses first, when both kinds happened between two events).
// Once the subscription has ended, Next returns what is still buffered and
// then the reason: ErrClosed after Close, ErrStopped when the hub stopped,
// or a *SourceError when the source failed. It also returns ctx's error
// when ctx ends first.
func (s *Subscription) Next(ctx context.Context) (Message, error) {
	for {
		s.mu.Lock()
		m, ok := s.take()
		err := s.err
		s.mu.Unlock()
		if ok {
			return m, nil
		}
		if err != nil {
			return Message{}, err
		}
		select {
		case <-s.wake:
		case <-ctx.Done():
			return Message{}, ctx.Err()
		}
	}
}

// take removes the next message, if there is one. s.mu is held.
func (s *Subscription) take() (Message, bool) {
	lostKernel, lostSubs := &s.lostKernel, &s.lostSubs
	if s.n > 0 {
		lostKernel, lostSubs = &s.ring[s.head].lostKernel, &s.ring[s.head].lostSubs
	}
	switch {
	case *lostKernel > 0:
		m := Message{Lost: &Lost{Source: LostKernel, Count: *lostKernel}}
		*lostKernel = 0
		return m, true
	case *lostSubs > 0:
		m := Message{Lost: &Lost{Source: LostSubscriber, Count: *lostSubs}}
		*lostSubs = 0
		return m, true
	case s.n > 0:
		m := Message{Event: s.ring[s.head].ev}
		s.ring[s.head] = entry{}
		s.head = (s.head + 1) % len(s.ring)
		s.n--
		return m, true
	}
	return Message{}, false
}

// push buffers e, or counts it as lost when the buffer is full. It never
// blocks. It reports whether e was buffered.
func (s *Subscription) push(e *Event) bool {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return true
	}
	if s.n == len(s.ring) && !s.grow() {
		s.lostSubs++
		s.mu.Unlock()
		return false
	}
	s.ring[(s.head+s.n)%len(s.ring)] = entry{ev: *e, lostKernel: s.lostKernel, lostSubs: s.lostSubs}
	s.n++
	s.lostKernel, s.lostSubs = 0, 0
	s.mu.Unlock()
	s.signal()
	return true
}

// grow doubles the ring, up to max entries; it reports whether it could.
// s.mu is held and the ring is full.
func (s *Subscription) grow() bool {
	if len(s.ring) >= s.max {
		return false
	}
	ring := make([]entry, min(2*len(s.ring), s.max))
	k := copy(ring, s.ring[s.head:])
	copy(ring[k:], s.ring[:s.head])
	s.ring, s.head = ring, 0
	return true
}

// lose counts n events the kernel dropped.
func (s *Subscription) lose(n uint64) {
	s.mu.Lock()
	if s.err == nil {
		s.lostKernel += n
	}
	s.mu.Unlock()
	s.signal()
}

// end ends the subscription with err, unless it has ended already.
func (s *Subscription) end(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
	s.signal()
}

func (s *Subscription) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Close ends the subscription and releases it from the hub. Events still
// buffered can be read; then Next returns ErrClosed. Close may be called
// more than once.
func (s *Subscription) Close() {
	s.hub.unsubscribe(s)
	s.end(ErrClosed)
}
