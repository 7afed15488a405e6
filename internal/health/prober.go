package health

import (
	"context"
	"fmt"
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

// DefaultConcurrency bounds the checks in flight at once.
const DefaultConcurrency = 256

// Option configures a Prober.
type Option func(*Prober)

// WithNetNS makes the checks dial from the network namespace at path
// (vipd's --netns); empty is the process's own.
func WithNetNS(path string) Option { return func(p *Prober) { p.netns = path } }

// WithConcurrency bounds the checks in flight at once; n < 1 means
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
type Prober struct {
	log       hclog.Logger
	snapshot  func() *store.Snapshot
	sub       Submitter
	obs       Observer
	netns     string
	dial      dialer
	sem       chan struct{}
	syncEvery time.Duration

	mu      sync.Mutex
	targets map[key]*target
	// configs caches each service's health_check, with defaults, by
	// generation: decoding a stored spec costs a copy of every backend.
	configs map[string]config
	// lifts are health changes that lift a failing backend no longer
	// probed, waiting for the reconciler to take them; Run's goroutine.
	lifts []reconcile.HealthChange
}

type config struct {
	generation uint64
	hc         *vipdv1.HealthCheck // nil: no health_check
}

type key struct {
	service string
	ip      netip.Addr
}

// New returns a prober that follows snapshot (the reconciler's current
// desired state) and submits to sub.
func New(log hclog.Logger, snapshot func() *store.Snapshot, sub Submitter, opts ...Option) *Prober {
	p := &Prober{log: log, snapshot: snapshot, sub: sub, obs: nopObserver{}, syncEvery: 200 * time.Millisecond,
		targets: map[key]*target{}, configs: map[string]config{}}
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
	if p.netns != "" {
		p.dial.ns = startNSSockets(p.netns)
		defer p.dial.ns.close()
	}
	t := time.NewTicker(p.syncEvery)
	defer t.Stop()
	var rev uint64
	first := true
	for {
		if snap := p.snapshot(); first || snap.Revision() != rev || len(p.lifts) > 0 {
			first, rev = false, snap.Revision()
			p.sync(ctx, snap)
		}
		select {
		case <-ctx.Done():
			p.mu.Lock()
			targets := p.targets
			p.targets = map[key]*target{}
			p.mu.Unlock()
			for _, t := range targets {
				t.stop()
			}
			return ctx.Err()
		case <-t.C:
		}
	}
}

// sync starts checks for the backends of snap that need them and stops
// the others, lifting what those had made NOT_SERVING.
func (p *Prober) sync(ctx context.Context, snap *store.Snapshot) {
	want := map[key]spec{}
	seen := map[string]bool{}
	for name, e := range snap.All() {
		seen[name] = true
		c, ok := p.configs[name]
		if !ok || c.generation != e.Generation() {
			c = config{generation: e.Generation()}
			if hc := e.Service().GetHealthCheck(); hc != nil {
				c.hc = validation.HealthDefaults(hc)
			}
			p.configs[name] = c
		}
		if c.hc == nil {
			continue
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
	for name := range p.configs {
		if !seen[name] {
			delete(p.configs, name)
		}
	}

	p.mu.Lock()
	var stopped []*target
	for k, t := range p.targets {
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
	p.mu.Unlock()

	for _, t := range stopped {
		t.stop()
		p.obs.DeleteBackendHealth(t.key.service, t.key.ip.String())
		if t.submitted {
			p.lifts = append(p.lifts, reconcile.HealthChange{Service: t.key.service, Backend: t.key.ip})
		}
	}
	for _, t := range started {
		p.obs.SetBackendHealth(t.key.service, t.key.ip.String(), 1)
		t.start(ctx)
	}
	if len(p.lifts) > 0 {
		if err := p.sub.SetHealth(ctx, p.lifts); err != nil {
			p.log.Error("lift health of backends no longer checked; retrying", "backends", len(p.lifts), "error", err)
			return
		}
		p.lifts = nil
	}
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

// target is one backend's checks and their result.
type target struct {
	p      *Prober
	key    key
	spec   spec
	cancel context.CancelFunc
	done   chan struct{}

	mu          sync.Mutex
	state       vipdv1.HealthState
	since       time.Time
	lastErr     string
	lastPass    bool
	consecutive uint32
	// submitted is whether the reconciler has this backend as failing;
	// the target's goroutine only, and sync after stop.
	submitted bool
}

func newTarget(p *Prober, k key, s spec) *target {
	return &target{p: p, key: k, spec: s, state: vipdv1.HealthState_HEALTH_STATE_UNKNOWN, since: time.Now(), done: make(chan struct{})}
}

func (t *target) start(ctx context.Context) {
	ctx, t.cancel = context.WithCancel(ctx)
	go t.run(ctx)
}

func (t *target) stop() {
	t.cancel()
	<-t.done
}

func (t *target) run(ctx context.Context) {
	defer close(t.done)
	c := newChecker(t.spec, t.p.dial)
	defer c.close()
	interval := time.Duration(t.spec.interval) * time.Millisecond
	// Jitter: the first check somewhere in the first interval, and every
	// later one 5% either side of the interval, so that checks of many
	// backends spread out and stay spread.
	timer := time.NewTimer(rand.N(interval))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		select {
		case t.p.sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		cctx, cancel := context.WithTimeout(ctx, time.Duration(t.spec.timeout)*time.Millisecond)
		err := c.check(cctx)
		cancel()
		<-t.p.sem
		if ctx.Err() != nil {
			return
		}
		failing := t.record(err)
		if failing != t.submitted {
			if err := t.p.sub.SetHealth(ctx, []reconcile.HealthChange{{Service: t.key.service, Backend: t.key.ip, Failing: failing}}); err != nil {
				if ctx.Err() == nil {
					t.p.log.Error("submit health change; retrying after the next check", "service", t.key.service, "backend", t.key.ip, "failing", failing, "error", err)
				}
			} else {
				t.submitted = failing
			}
		}
		timer.Reset(interval - interval/20 + rand.N(interval/10+1))
	}
}

// record takes one check's result and returns whether the backend is now
// failing.
func (t *target) record(err error) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	pass := err == nil
	if pass == t.lastPass && t.consecutive > 0 {
		t.consecutive++
	} else {
		t.consecutive = 1
	}
	t.lastPass = pass
	prev := t.state
	if pass {
		t.p.obs.ObserveCheck("pass")
		if prev == vipdv1.HealthState_HEALTH_STATE_UNKNOWN ||
			(prev == vipdv1.HealthState_HEALTH_STATE_FAILING && t.consecutive >= t.spec.healthy) {
			t.state = vipdv1.HealthState_HEALTH_STATE_PASSING
		}
	} else {
		t.p.obs.ObserveCheck("fail")
		t.lastErr = err.Error()
		if prev != vipdv1.HealthState_HEALTH_STATE_FAILING && t.consecutive >= t.spec.unhealthy {
			t.state = vipdv1.HealthState_HEALTH_STATE_FAILING
		}
	}
	if t.state != prev {
		t.since = time.Now()
		val := 1.0
		if t.state == vipdv1.HealthState_HEALTH_STATE_FAILING {
			val = 0
		}
		t.p.obs.SetBackendHealth(t.key.service, t.key.ip.String(), val)
		lvl := hclog.Info
		if t.state == vipdv1.HealthState_HEALTH_STATE_FAILING {
			lvl = hclog.Warn
		}
		t.p.log.Log(lvl, "backend health changed", "service", t.key.service, "backend", t.key.ip, "from", stateName(prev), "to", stateName(t.state),
			"consecutive", t.consecutive, "last_error", t.lastErr)
	}
	return t.state == vipdv1.HealthState_HEALTH_STATE_FAILING
}

func (t *target) view() *vipdv1.BackendHealth {
	t.mu.Lock()
	defer t.mu.Unlock()
	v := &vipdv1.BackendHealth{Ip: t.key.ip.String(), State: t.state, SinceUnixMs: t.since.UnixMilli(), LastError: t.lastErr, Consecutive: t.consecutive}
	switch t.state {
	case vipdv1.HealthState_HEALTH_STATE_UNKNOWN:
		v.Detail = "no health check finished yet; treated as passing"
	case vipdv1.HealthState_HEALTH_STATE_PASSING:
		v.Detail = fmt.Sprintf("passing health check (%d in a row)", t.consecutive)
		if !t.lastPass {
			v.Detail = fmt.Sprintf("passing health check (last check: %s, %d in a row)", t.lastErr, t.consecutive)
		}
	case vipdv1.HealthState_HEALTH_STATE_FAILING:
		v.Detail = fmt.Sprintf("failing health check (%s, %d in a row)", t.lastErr, t.consecutive)
		if t.lastPass {
			v.Detail = fmt.Sprintf("failing health check (recovering: %d of %d passes)", t.consecutive, t.spec.healthy)
		}
	}
	return v
}

func stateName(s vipdv1.HealthState) string {
	switch s {
	case vipdv1.HealthState_HEALTH_STATE_PASSING:
		return "passing"
	case vipdv1.HealthState_HEALTH_STATE_FAILING:
		return "failing"
	}
	return "unknown"
}
