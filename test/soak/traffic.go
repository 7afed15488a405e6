package soak

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vipd/vipd/internal/testkit/netlab"
)

// Target is where Traffic connects: a VIP and port, and the backends (echo
// server names) that may answer. No backends means any.
type Target struct {
	Addr     netip.AddrPort
	Backends []string
}

// TrafficConfig shapes a Traffic.
type TrafficConfig struct {
	// Network is "tcp" (a new connection per request; the default) or
	// "udp" (a datagram from a new socket).
	Network string
	// Workers is how many requests run at once; at least 1.
	Workers int
	// Rate, if positive, caps the requests per second over all workers;
	// otherwise each worker waits Pause between its requests.
	Rate  float64
	Pause time.Duration
	// Timeout bounds one request; 0 means 3 s. A request that must succeed
	// gets that long, so that a busy machine does not count as a failure.
	Timeout time.Duration
}

// Traffic makes requests from one namespace to targets, in turn, from the
// moment it starts until Stop, and counts them: a request fails when it
// gets no answer, an error, an answer that does not come from the target
// address (the VIP), or one from a backend the target does not allow.
type Traffic struct {
	ns      *netlab.NS
	targets []Target
	cfg     TrafficConfig
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	start   time.Time

	mu       sync.Mutex
	ok       int
	failed   int
	errs     []string
	backends map[string]int
	stopped  time.Duration
}

// maxTrafficErrors bounds the failures a Traffic keeps the text of.
const maxTrafficErrors = 10

// StartTraffic starts making requests from ns to targets.
func StartTraffic(ns *netlab.NS, cfg TrafficConfig, targets ...Target) *Traffic {
	if cfg.Network == "" {
		cfg.Network = "tcp"
	}
	cfg.Workers = max(cfg.Workers, 1)
	if cfg.Timeout == 0 {
		cfg.Timeout = 3 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	t := &Traffic{ns: ns, targets: slices.Clone(targets), cfg: cfg, cancel: cancel,
		start: time.Now(), backends: map[string]int{}}
	var tokens chan struct{}
	if cfg.Rate > 0 {
		tokens = make(chan struct{})
		t.wg.Add(1)
		go t.pace(ctx, tokens)
	}
	for w := range cfg.Workers {
		t.wg.Add(1)
		go t.work(ctx, w, tokens)
	}
	return t
}

// pace hands out cfg.Rate tokens a second.
func (t *Traffic) pace(ctx context.Context, tokens chan<- struct{}) {
	defer t.wg.Done()
	interval := time.Duration(float64(time.Second) / t.cfg.Rate)
	next := time.Now()
	for {
		next = next.Add(interval)
		if d := time.Until(next); d > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
		}
		select {
		case <-ctx.Done():
			return
		case tokens <- struct{}{}:
		}
	}
}

func (t *Traffic) work(ctx context.Context, w int, tokens <-chan struct{}) {
	defer t.wg.Done()
	for i := w; ; i += t.cfg.Workers {
		if tokens != nil {
			select {
			case <-ctx.Done():
				return
			case <-tokens:
			}
		} else if i != w && t.cfg.Pause > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(t.cfg.Pause):
			}
		}
		if ctx.Err() != nil {
			return
		}
		target := t.targets[i%len(t.targets)]
		start := time.Now()
		rctx, cancel := context.WithTimeout(context.Background(), t.cfg.Timeout)
		r, err := t.ns.Request(rctx, t.cfg.Network, target.Addr.String())
		cancel()
		switch {
		case err != nil:
			t.fail(start, target, err.Error())
		case r.Remote != target.Addr:
			t.fail(start, target, fmt.Sprintf("reply from %s came from %v", r.Backend, r.Remote))
		case len(target.Backends) > 0 && !slices.Contains(target.Backends, r.Backend):
			t.fail(start, target, fmt.Sprintf("answered by %s, want one of %v", r.Backend, target.Backends))
		default:
			t.mu.Lock()
			t.ok++
			t.backends[r.Backend]++
			t.mu.Unlock()
		}
	}
}

func (t *Traffic) fail(at time.Time, target Target, msg string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failed++
	if len(t.errs) < maxTrafficErrors {
		t.errs = append(t.errs, fmt.Sprintf("%s %s %v: %s", at.Format("15:04:05.000"), t.cfg.Network, target.Addr, msg))
	}
}

// TrafficStats counts what a Traffic did.
type TrafficStats struct {
	// OK and Failed count the requests; Errors describes the first
	// failures.
	OK, Failed int
	Errors     []string
	// Backends counts the answers by backend.
	Backends map[string]int
	// Elapsed is how long the traffic ran.
	Elapsed time.Duration
}

// Rate is the requests per second, failed ones included.
func (s TrafficStats) Rate() float64 {
	if s.Elapsed <= 0 {
		return 0
	}
	return float64(s.OK+s.Failed) / s.Elapsed.Seconds()
}

func (s TrafficStats) String() string {
	var parts []string
	for _, b := range slices.Sorted(maps.Keys(s.Backends)) {
		parts = append(parts, fmt.Sprintf("%s×%d", b, s.Backends[b]))
	}
	msg := fmt.Sprintf("%d ok, %d failed in %v (%.0f/s; %s)", s.OK, s.Failed, s.Elapsed.Round(time.Millisecond), s.Rate(), strings.Join(parts, " "))
	if len(s.Errors) > 0 {
		msg += "; first failures:\n  " + strings.Join(s.Errors, "\n  ")
	}
	return msg
}

// Stats returns the counts so far.
func (t *Traffic) Stats() TrafficStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	el := t.stopped
	if el == 0 {
		el = time.Since(t.start)
	}
	return TrafficStats{OK: t.ok, Failed: t.failed, Errors: slices.Clone(t.errs), Backends: maps.Clone(t.backends), Elapsed: el}
}

// Stop ends the traffic, waits for the requests in flight, and returns the
// final counts. Calling it again returns them again.
func (t *Traffic) Stop() TrafficStats {
	t.cancel()
	t.wg.Wait()
	t.mu.Lock()
	if t.stopped == 0 {
		t.stopped = time.Since(t.start)
	}
	t.mu.Unlock()
	return t.Stats()
}
