package flowhub

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
)

// DefaultBuffer is how many events a subscriber's buffer holds unless
// WithBuffer says otherwise (vipd's --flow-buffer). It has to hold a
// burst: the hub reads a source as fast as the kernel hands events over,
// which is faster than a gRPC stream sends them on, so a burst moves from
// the kernel's buffer to the subscribers' at once. The kernel sends
// conntrack's DESTROY events in bursts, when a dump or a garbage
// collection pass destroys every expired entry it comes across, such as
// those of all the TCP connections whose TIME_WAIT ended since the last
// pass: 4096 events lost thousands of them at 8,500 connections a second.
// 65,536 is as many as the eBPF dataplane's event ring holds. The buffer
// grows by doubling only while its subscriber lags, to about 18 MiB when
// full.
const DefaultBuffer = 1 << 16

// maxRemembered bounds how many live flows the hub remembers the service
// of; see Hub.remember.
const maxRemembered = 1 << 18

var (
	// ErrStopped ends the subscriptions of a hub whose Run has returned, and
	// is returned by Subscribe after that.
	ErrStopped = errors.New("flow events stopped")
	// ErrClosed ends a subscription after Close.
	ErrClosed = errors.New("subscription closed")
)

// SourceError ends the subscriptions that were open when the flow source
// failed: they may have missed events that nobody counted. The hub reads
// the source again after a pause, and new subscriptions get its events.
type SourceError struct{ Err error }

func (e *SourceError) Error() string { return "reading flow events: " + e.Err.Error() }
func (e *SourceError) Unwrap() error { return e.Err }

// Resolver returns the service and port name that claim a VIP, port and
// protocol, and false when no service does. It must be fast and safe for
// concurrent use: the hub calls it for every event.
type Resolver func(p dataplane.Protocol, vip netip.AddrPort) (service, portName string, ok bool)

// Observer learns of every event the hub reads and of every lost event,
// for metrics. Its methods are called from the hub's reader goroutine and
// must not block. Flow gets the service an event resolved to ("" when
// none); Lost gets LostKernel with the count the kernel reported, or
// LostSubscriber with the number of subscriber buffers an event did not
// fit in.
type Observer interface {
	Flow(service string, t dataplane.FlowEventType)
	Lost(source string, n uint64)
}

// Hub reads one FlowSource and fans its events out to subscriptions.
// Create it with New and start it with Run; Subscribe and List may be
// called from any goroutine, before Run too.
type Hub struct {
	log      hclog.Logger
	src      dataplane.FlowSource
	resolve  Resolver
	obs      Observer
	buffer   int
	retryMin time.Duration
	retryMax time.Duration

	mu      sync.Mutex
	subs    map[*Subscription]struct{}
	stopped bool

	rememberMu sync.Mutex
	remembered map[uint64]Flow
}

// Option configures a Hub.
type Option func(*Hub)

// WithBuffer sets how many events each subscriber's buffer holds; n < 1
// means DefaultBuffer.
func WithBuffer(n int) Option {
	return func(h *Hub) {
		if n >= 1 {
			h.buffer = n
		}
	}
}

// WithResolver sets how flows are mapped to services. Without one, every
// flow's service is empty.
func WithResolver(r Resolver) Option { return func(h *Hub) { h.resolve = r } }

// WithObserver sets an observer of events and losses, for metrics.
func WithObserver(o Observer) Option { return func(h *Hub) { h.obs = o } }

// WithRetry sets the pause before the source is read again after it
// failed: first min, doubling up to max. The default is 1 s up to 30 s.
func WithRetry(min, max time.Duration) Option {
	return func(h *Hub) { h.retryMin, h.retryMax = min, max }
}

// New returns a hub over src. Nothing is read until Run.
func New(log hclog.Logger, src dataplane.FlowSource, opts ...Option) *Hub {
	h := &Hub{
		log:        log,
		src:        src,
		buffer:     DefaultBuffer,
		retryMin:   time.Second,
		retryMax:   30 * time.Second,
		subs:       map[*Subscription]struct{}{},
		remembered: map[uint64]Flow{},
	}
	for _, o := range opts {
		o(h)
	}
	return h
}

// Buffer is the size of each subscriber's buffer.
func (h *Hub) Buffer() int { return h.buffer }

// Run reads the source until ctx ends. When the source fails, the open
// subscriptions end with a *SourceError and the source is read again after
// a pause; an error wrapping dataplane.ErrUnsupported stops the hub
// instead. When Run returns, every subscription ends with ErrStopped and
// Subscribe fails with it: cancel ctx before a graceful stop of the gRPC
// server, which otherwise waits for the streams. Run returns ctx's error,
// or the source's unsupported error. Call it once.
func (h *Hub) Run(ctx context.Context) error {
	delay := h.retryMin
	for {
		started := time.Now()
		err := h.src.WatchFlows(ctx, h.emit, h.lose)
		if ctx.Err() != nil {
			h.stop()
			return ctx.Err()
		}
		if err == nil {
			err = errors.New("the flow source ended")
		}
		h.endAll(&SourceError{Err: err})
		if errors.Is(err, dataplane.ErrUnsupported) {
			h.log.Error("cannot read flow events", "error", err)
			h.stop()
			return fmt.Errorf("read flow events: %w", err)
		}
		// A source that ran for a while before failing gets the short pause again.
		if time.Since(started) > h.retryMax {
			delay = h.retryMin
		}
		h.log.Error("reading flow events failed; subscribers were cut off, retrying", "error", err, "retry_in", delay)
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			h.stop()
			return ctx.Err()
		}
		delay = min(2*delay, h.retryMax)
	}
}

// Subscribe returns a subscription to the events that match f, from now
// on. The caller must Close it. It fails with ErrStopped once Run has
// returned.
func (h *Hub) Subscribe(f Filter) (*Subscription, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return nil, ErrStopped
	}
	s := newSubscription(h, f, h.buffer)
	h.subs[s] = struct{}{}
	return s, nil
}

func (h *Hub) unsubscribe(s *Subscription) {
	h.mu.Lock()
	delete(h.subs, s)
	h.mu.Unlock()
}

// Subscribers is the number of open subscriptions.
func (h *Hub) Subscribers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

// endAll ends every open subscription with err.
func (h *Hub) endAll(err error) {
	h.mu.Lock()
	subs := h.subs
	h.subs = map[*Subscription]struct{}{}
	h.mu.Unlock()
	for s := range subs {
		s.end(err)
	}
}

func (h *Hub) stop() {
	h.mu.Lock()
	h.stopped = true
	h.mu.Unlock()
	h.endAll(ErrStopped)
}

// emit is the source's emit callback: it resolves ev once and offers it to
// every subscriber, never waiting for one.
func (h *Hub) emit(ev dataplane.FlowEvent) {
	e := Event{Type: ev.Type, Time: ev.Time, Flow: h.flowOf(ev.Type, ev.Flow)}
	if h.obs != nil {
		h.obs.Flow(e.Flow.Service, e.Type)
	}
	h.publish(&e)
}

// publish offers e to every subscriber whose filter selects it, never
// waiting for one.
func (h *Hub) publish(e *Event) {
	var dropped uint64
	h.mu.Lock()
	for s := range h.subs {
		if s.filter.MatchEvent(e) && !s.push(e) {
			dropped++
		}
	}
	h.mu.Unlock()
	if dropped > 0 && h.obs != nil {
		h.obs.Lost(LostSubscriber, dropped)
	}
}

// lose is the source's lost callback: every subscriber is told, since
// nobody knows whom the lost events were for.
func (h *Hub) lose(n uint64) {
	if n == 0 {
		return
	}
	if h.obs != nil {
		h.obs.Lost(LostKernel, n)
	}
	h.mu.Lock()
	for s := range h.subs {
		s.lose(n)
	}
	h.mu.Unlock()
}

// flowOf resolves f for an event of type t. A flow keeps the service it
// had when it began: its CLOSED event reports that service even when the
// service has since been removed (close reason service_removed) or
// changed.
func (h *Hub) flowOf(t dataplane.FlowEventType, f dataplane.Flow) Flow {
	switch t {
	case dataplane.FlowNew:
		fl := h.resolveFlow(f)
		h.remember(fl)
		return fl
	case dataplane.FlowClosed:
		if fl, ok := h.recall(f, true); ok {
			return fl
		}
	}
	return h.resolveFlow(f)
}

func (h *Hub) resolveFlow(f dataplane.Flow) Flow {
	fl := Flow{Flow: f}
	if h.resolve != nil {
		vip := netip.AddrPortFrom(f.VIP.Addr().Unmap(), f.VIP.Port())
		if svc, port, ok := h.resolve(f.Protocol, vip); ok {
			fl.Service, fl.PortName = svc, port
		}
	}
	return fl
}

// remember keeps the service of a new flow until it closes. The memory is
// bounded: CLOSED events the kernel lost leave entries behind, so when it
// is full it is cleared, and flows it forgot resolve their CLOSED events
// against the current services.
func (h *Hub) remember(fl Flow) {
	if fl.Service == "" {
		return
	}
	h.rememberMu.Lock()
	defer h.rememberMu.Unlock()
	if len(h.remembered) >= maxRemembered {
		h.log.Debug("forgetting the services of live flows", "flows", len(h.remembered))
		clear(h.remembered)
	}
	h.remembered[fl.ID] = Flow{Service: fl.Service, PortName: fl.PortName,
		Flow: dataplane.Flow{Protocol: fl.Protocol, VIP: fl.VIP}}
}

// recall returns f with the service it was remembered with, if any, and
// forgets it when forget is set. An entry for another VIP is a reused ID
// whose CLOSED event was lost.
func (h *Hub) recall(f dataplane.Flow, forget bool) (Flow, bool) {
	h.rememberMu.Lock()
	defer h.rememberMu.Unlock()
	r, ok := h.remembered[f.ID]
	if !ok || r.VIP != f.VIP || r.Protocol != f.Protocol {
		return Flow{}, false
	}
	if forget {
		delete(h.remembered, f.ID)
	}
	return Flow{Flow: f, Service: r.Service, PortName: r.PortName}, true
}

// List returns the live flows that match f (its Types ignored), oldest
// first, at most limit of them when limit > 0, and whether more matched.
func (h *Hub) List(ctx context.Context, f Filter, limit int) ([]Flow, bool, error) {
	live, err := h.src.ListFlows(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("list flows: %w", err)
	}
	var res []Flow
	for _, df := range live {
		fl, ok := h.recall(df, false)
		if !ok {
			fl = h.resolveFlow(df)
		}
		if f.Match(&fl) {
			res = append(res, fl)
		}
	}
	slices.SortFunc(res, func(a, b Flow) int {
		return cmp.Or(a.Start.Compare(b.Start), cmp.Compare(a.ID, b.ID))
	})
	if limit > 0 && len(res) > limit {
		return res[:limit:limit], true, nil
	}
	return res, false, nil
}
