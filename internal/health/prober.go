package health

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"math/rand/v2"
	"net/netip"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/reconcile"
	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
)

// Submitter takes changes of backends' effective health:
// reconcile.Reconciler.
type Submitter interface {
	SetHealth(ctx context.Context, changes []reconcile.HealthChange) error
}

// Observer is told every check's result and every backend's health;
// internal/metrics implements it.
type Observer interface {
	// ObserveCheck counts one finished check: result is "pass" or "fail".
	ObserveCheck(result string)
	// SetBackendHealth sets a probed backend's health: 1 passing or not
	// known yet (treated as passing), 0 failing.
	SetBackendHealth(service, backend string, value float64)
	// DeleteBackendHealth forgets a backend that is no longer probed.
	DeleteBackendHealth(service, backend string)
}

type nopObserver struct{}

func (nopObserver) ObserveCheck(string)                      {}
func (nopObserver) SetBackendHealth(string, string, float64) {}
func (nopObserver) DeleteBackendHealth(string, string)       {}

// DefaultConcurrency bounds the TCP checks in flight at once, and the
// HTTP and gRPC checks in flight at once.
const DefaultConcurrency = 256

// Option configures a Prober.
type Option func(*Prober)

// WithNetNS makes the checks dial from the network namespace at path
// (vipd's --netns); empty is the process's own.
func WithNetNS(path string) Option { return func(p *Prober) { p.netns = path } }

// WithConcurrency bounds the TCP checks in flight at once, and the HTTP
// and gRPC checks in flight at once, to n each; n < 1 means
// DefaultConcurrency.
func WithConcurrency(n int) Option {
	return func(p *Prober) {
		if n > 0 {
			p.sem = make(chan struct{}, n)
		}
	}
}

// WithObserver reports results to o.
func WithObserver(o Observer) Option { return func(p *Prober) { p.obs = o } }

// WithSyncPeriod is how often the prober looks for a new desired state
// (a new generation) to start and stop checks by; default 200 ms.
func WithSyncPeriod(d time.Duration) Option { return func(p *Prober) { p.syncEvery = d } }

// Prober checks backends and reports their health. Create it with New and
// run it with Run; Health and Explain are safe to call at any time.
//
// One scheduler goroutine starts every check when it is due (see
// scheduler and schedule); TCP checks run on raw sockets from that same
// goroutine (see tcpChecker), HTTP and gRPC checks on a goroutine each; at
// most the concurrency bound of TCP checks, and as many HTTP and gRPC
// checks, wait for an answer at once. Changes of health go to the
// reconciler in batches from one submitter goroutine.
type Prober struct {
	log       hclog.Logger
	snapshot  func() *store.Snapshot
	sub       Submitter
	obs       Observer
	events    func(Transition)
	netns     string
	dial      dialer
	sem       chan struct{}
	syncEvery time.Duration

	sched   *scheduler
	tcp     *tcpChecker
	workers sync.WaitGroup
	// runCtx is Run's context: results that come in after it ends are
	// dropped.
	runCtx context.Context

	mu      sync.Mutex
	targets map[key]*target
	// configs caches the health_check, with defaults, of each service
	// that has one, by generation: decoding a stored spec costs a copy of
	// every backend. Run's goroutine only.
	configs map[string]config
	// synced is the snapshot of the last sync: targets holds what it
	// needs checked, and configs its services' health_checks. Run's
	// goroutine only.
	synced *store.Snapshot

	// subMu guards pending and every target's reported, acked and
	// retired: what the reconciler is told (see submit.go).
	subMu   sync.Mutex
	pending map[key]pendingChange
	kick    chan struct{}
}

type config struct {
	generation uint64
	hc         *vipdv1.HealthCheck
}

type key struct {
	service string
	ip      netip.Addr
}

// Transition is a change of a backend's health that changes what the
// dataplane does with it: passing to failing, failing to passing, or a
// new backend's first result when that is failing. A new backend's first
// passing result is no transition: it was treated as passing already.
type Transition struct {
	Service string
	// Backend is the probed address and port.
	Backend netip.AddrPort
	// Time is when the transition happened.
	Time time.Time
	// Health is the backend's health after the transition.
	Health *vipdv1.BackendHealth
}

// WithTransitions has f called with every health transition, after the
// log line that marks it; f must not block (the flow hub's PublishHealth
// does not).
func WithTransitions(f func(Transition)) Option { return func(p *Prober) { p.events = f } }

// New returns a prober that follows snapshot (the reconciler's current
// desired state) and submits to sub.
func New(log hclog.Logger, snapshot func() *store.Snapshot, sub Submitter, opts ...Option) *Prober {
	p := &Prober{log: log, snapshot: snapshot, sub: sub, obs: nopObserver{}, syncEvery: 200 * time.Millisecond,
		targets: map[key]*target{}, configs: map[string]config{}, pending: map[key]pendingChange{},
		kick: make(chan struct{}, 1), sched: newScheduler()}
	WithConcurrency(DefaultConcurrency)(p)
	for _, o := range opts {
		o(p)
	}
	return p
}

// Run checks backends until ctx ends, following each new desired state,
// then stops every check and returns ctx's error. It lifts nothing on the
// way out: the dataplane keeps what it was given, as on any stop.
func (p *Prober) Run(ctx context.Context) error {
	newSocket := ownSocket
	if p.netns != "" {
		p.dial.ns = startNSSockets(p.netns)
		defer p.dial.ns.close()
		newSocket = p.dial.ns.socket
	}
	tcp, err := newTCPChecker(newSocket)
	if err != nil {
		return fmt.Errorf("health checks: %w", err)
	}
	p.tcp = tcp
	ctx, cancel := context.WithCancel(ctx)
	p.runCtx = ctx
	var bg sync.WaitGroup
	bg.Go(func() { p.schedule(ctx) })
	bg.Go(func() { p.submit(ctx) })
	defer func() {
		cancel()
		// The scheduler loop closes the TCP checker on its way out.
		bg.Wait()
		// No check starts any more; the ones in flight end with ctx.
		p.workers.Wait()
		p.mu.Lock()
		targets := p.targets
		p.targets = map[key]*target{}
		p.mu.Unlock()
		for _, t := range targets {
			t.stop()
		}
	}()

	tick := time.NewTicker(p.syncEvery)
	defer tick.Stop()
	p.synced = nil // the first sync walks every service
	for {
		if snap := p.snapshot(); p.synced == nil || snap.Revision() != p.synced.Revision() {
			p.sync(snap)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// sync starts checks for the backends of snap that need them and stops
// the others, lifting what those had made NOT_SERVING. It looks only at
// the services that changed since the snapshot of the last sync, when
// snap can tell which (store.Snapshot.ChangedSince), and at every service
// on the first sync or when snap cannot: a change of one service among
// thousands costs microseconds, not a walk of them all.
func (p *Prober) sync(snap *store.Snapshot) {
	prev := p.synced
	p.synced = snap
	if prev != nil {
		if names, ok := snap.ChangedSince(prev); ok {
			p.syncChanged(prev, snap, names)
			return
		}
	}
	want := map[key]spec{}
	// In no particular order: the name order would cost a sort and, at
	// 100,000 services, 2.4 MB kept by snap.
	for name, e := range snap.Each() {
		p.wantService(want, name, e)
	}
	for name := range p.configs {
		if _, ok := snap.Get(name); !ok {
			delete(p.configs, name)
		}
	}
	p.update(want, maps.Keys(p.targets))
}

// syncChanged is sync of the services names, the only ones that may
// differ between prev, the snapshot of the last sync, and snap: the
// targets of the others stay as they are.
func (p *Prober) syncChanged(prev, snap *store.Snapshot, names []string) {
	want := map[key]spec{}
	for _, name := range names {
		if e, ok := snap.Get(name); ok {
			p.wantService(want, name, e)
		} else {
			delete(p.configs, name)
		}
	}
	// The targets of a service are among the backends it had at the last
	// sync; those it has now are looked at too, which costs little.
	p.update(want, func(yield func(key) bool) {
		for _, name := range names {
			for _, s := range [2]*store.Snapshot{prev, snap} {
				e, ok := s.Get(name)
				if !ok {
					continue
				}
				for i := range e.Dataplane.Backends {
					if !yield(key{name, e.Dataplane.Backends[i].IP}) {
						return
					}
				}
			}
		}
	})
}

// wantService adds to want the checks that service name, stored as e,
// needs: one for each backend not NOT_SERVING, when it has a
// health_check. It keeps the health_check, with defaults, in p.configs.
func (p *Prober) wantService(want map[key]spec, name string, e *store.Entry) {
	c, ok := p.configs[name]
	if !ok || c.generation != e.Generation() {
		hc := e.HealthCheck()
		if hc == nil {
			// Only services with a health_check are cached: an entry for
			// each of 100,000 services without one costs ~10 MB, and
			// finding that a spec has none reads it without allocating.
			delete(p.configs, name)
			return
		}
		c = config{generation: e.Generation(), hc: validation.HealthDefaults(hc)}
		p.configs[name] = c
	}
	svc := e.Dataplane
	port, hasPort := probePort(c.hc, svc)
	for i := range svc.Backends {
		b := &svc.Backends[i]
		if b.State == dataplane.BackendNotServing {
			continue
		}
		s := spec{protocol: c.hc.Protocol, path: c.hc.Path, grpcService: c.hc.GrpcService,
			interval: int64(c.hc.IntervalMs), timeout: int64(c.hc.TimeoutMs),
			healthy: c.hc.HealthyThreshold, unhealthy: c.hc.UnhealthyThreshold}
		if c.hc.Port != 0 {
			s.addr = netip.AddrPortFrom(b.IP, uint16(c.hc.Port))
		} else if hasPort {
			s.addr = netip.AddrPortFrom(b.IP, b.TargetPort(port))
		}
		want[key{name, b.IP}] = s
	}
}

// update stops the targets of candidates (keys without a target are
// skipped) whose check want lacks or has with another spec, and starts a
// target for each check of want that has none. Every target whose check
// may have changed must be among candidates.
func (p *Prober) update(want map[key]spec, candidates iter.Seq[key]) {
	p.mu.Lock()
	var stopped []*target
	for k := range candidates {
		t, ok := p.targets[k]
		if !ok {
			continue
		}
		if s, ok := want[k]; !ok || s != t.spec {
			stopped = append(stopped, t)
			delete(p.targets, k)
		}
	}
	var started []*target
	for k, s := range want {
		if _, ok := p.targets[k]; !ok {
			t := newTarget(p, k, s)
			p.targets[k] = t
			started = append(started, t)
		}
	}
	live := len(p.targets)
	p.mu.Unlock()

	for _, t := range stopped {
		t.stop()
		p.obs.DeleteBackendHealth(t.key.service, t.key.ip.String())
		p.retire(t)
	}
	if len(stopped) > 0 {
		p.sched.compact(live)
	}
	for _, t := range started {
		p.obs.SetBackendHealth(t.key.service, t.key.ip.String(), 1)
		// Jitter: the first check somewhere in the first interval, and
		// every later one 5% either side of the interval (see complete),
		// so that checks of many backends spread out and stay spread.
		p.sched.add(t, rand.N(t.interval()))
	}
}

// pollEvery is how often the scheduler loop collects the results of TCP
// checks in flight: results wait up to this long, so that one wake-up
// collects many.
const pollEvery = 10 * time.Millisecond

// schedule is the scheduler loop: on each wake-up it collects the results
// of the TCP checks in flight, starts the checks that are due (TCP checks
// here, each HTTP and gRPC check on a goroutine of its own), and sleeps
// until the next is due, or pollEvery while TCP checks are in flight. At
// most cap(p.sem) TCP checks are in flight; checks due meanwhile wait.
func (p *Prober) schedule(ctx context.Context) {
	defer p.tcp.close()
	limit := cap(p.sem)
	more := func() bool { return p.tcp.inFlight() < limit }
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var due []*target
	for {
		if p.tcp.inFlight() > 0 {
			p.tcp.poll(0)
		}
		now := p.sched.now()
		due = p.sched.popDue(now, due[:0], more)
		for i, t := range due {
			p.dispatch(ctx, t)
			due[i] = nil
		}
		bound := now + int64(time.Hour)
		n := p.tcp.inFlight()
		if n > 0 {
			bound = now + int64(pollEvery)
			if at, ok := p.tcp.nextDeadline(); ok {
				bound = min(bound, now+int64(time.Until(at)))
			}
		}
		// With the bound reached, checks wait for a free place: the next
		// poll makes some.
		wait := max(time.Duration(p.sched.sleepUntil(bound, n >= limit)-p.sched.now()), 0)
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-p.sched.wake:
		}
	}
}

// dispatch starts t's check; the scheduler loop's goroutine.
func (p *Prober) dispatch(ctx context.Context, t *target) {
	if !t.begin() {
		return
	}
	timeout := time.Duration(t.spec.timeout) * time.Millisecond
	if t.checker == nil { // TCP
		if !t.spec.addr.IsValid() {
			t.complete(errors.New("no port to probe"))
			return
		}
		if done, err := p.tcp.check(ctx, t.spec.addr, timeout, t.tcpDone); done {
			t.tcpDone(err)
		}
		return
	}
	p.workers.Go(func() {
		select {
		case p.sem <- struct{}{}:
		case <-ctx.Done():
			t.complete(context.Canceled)
			return
		}
		cctx, cancel := context.WithTimeout(ctx, timeout)
		err := t.checker.check(cctx)
		cancel()
		<-p.sem
		t.complete(err)
	})
}

// probePort is the service port whose target port a check probes:
// port_name's, or the first.
func probePort(hc *vipdv1.HealthCheck, svc *dataplane.Service) (dataplane.Port, bool) {
	for _, pt := range svc.Ports {
		if hc.PortName == "" || pt.Name == hc.PortName {
			return pt, true
		}
	}
	return dataplane.Port{}, false
}

// Health returns the health of service's probed backends, in the order of
// its backends; nil when none is probed.
func (p *Prober) Health(service string) []*vipdv1.BackendHealth {
	e, ok := p.snapshot().Get(service)
	if !ok {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*vipdv1.BackendHealth
	for _, b := range e.Dataplane.Backends {
		if t, ok := p.targets[key{service, b.IP}]; ok {
			out = append(out, t.view())
		}
	}
	return out
}

// Explain says in words why health checks keep a backend out, such as
// "failing health check (connection refused, 3 in a row)"; false when the
// backend is not failing its checks.
func (p *Prober) Explain(service string, ip netip.Addr) (string, bool) {
	p.mu.Lock()
	t, ok := p.targets[key{service, ip}]
	p.mu.Unlock()
	if !ok {
		return "", false
	}
	v := t.view()
	return v.Detail, v.State == vipdv1.HealthState_HEALTH_STATE_FAILING
}
