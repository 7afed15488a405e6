package health

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// target is one backend's checks and their result.
type target struct {
	p       *Prober
	key     key
	spec    spec
	checker *checker // HTTP and gRPC; nil for TCP
	// tcpDone takes a TCP check's result: complete, made once.
	tcpDone func(error)

	mu          sync.Mutex
	state       vipdv1.HealthState
	since       time.Time
	lastErr     string
	lastPass    bool
	consecutive uint32
	inFlight    bool
	stopped     bool

	// reported is the failing state last handed to the submitter, acked
	// the one the reconciler took, and retired is set once the target is
	// stopped; under p.subMu.
	reported, acked, retired bool
}

func newTarget(p *Prober, k key, s spec) *target {
	t := &target{p: p, key: k, spec: s, state: vipdv1.HealthState_HEALTH_STATE_UNKNOWN, since: time.Now()}
	t.tcpDone = func(err error) { t.complete(describe(err)) }
	if s.protocol == vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_HTTP || s.protocol == vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_GRPC {
		t.checker = newChecker(s, p.dial)
	}
	return t
}

func (t *target) interval() time.Duration { return time.Duration(t.spec.interval) * time.Millisecond }

// stop ends t's checks: none starts any more, and the result of one in
// flight is dropped.
func (t *target) stop() {
	t.mu.Lock()
	t.stopped = true
	closeChecker := !t.inFlight && t.checker != nil
	t.mu.Unlock()
	// The scheduler drops t when it is due (begin).
	if closeChecker {
		t.checker.close()
	}
}

func (t *target) isStopped() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stopped
}

// begin marks a check started; false when t is stopped.
func (t *target) begin() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return false
	}
	t.inFlight = true
	return true
}

// complete takes the result of the check begin started: it records it,
// tells the prober's listener of a transition and then the submitter of a
// change of the backend's effective health, and schedules the next check,
// one interval (5% either side) from now.
func (t *target) complete(err error) {
	t.mu.Lock()
	t.inFlight = false
	if t.stopped || t.p.runCtx.Err() != nil {
		closeChecker := t.stopped && t.checker != nil
		t.mu.Unlock()
		if closeChecker {
			t.checker.close()
		}
		return
	}
	tr := t.record(err)
	failing := t.state == vipdv1.HealthState_HEALTH_STATE_FAILING
	t.mu.Unlock()

	if tr != nil && t.p.events != nil {
		t.p.events(*tr)
	}
	t.p.report(t, failing)
	iv := t.interval()
	t.p.sched.add(t, iv-iv/20+rand.N(iv/10+1))
}

// record takes one check's result; t.mu is held. It returns the
// transition it caused, if any.
func (t *target) record(err error) *Transition {
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
	if t.state == prev {
		return nil
	}
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
	// Unknown to passing changes nothing: an unknown backend is treated
	// as passing already.
	if prev == vipdv1.HealthState_HEALTH_STATE_UNKNOWN && t.state == vipdv1.HealthState_HEALTH_STATE_PASSING {
		return nil
	}
	return &Transition{Service: t.key.service, Backend: t.spec.addr, Time: t.since, Health: t.viewLocked()}
}

func (t *target) view() *vipdv1.BackendHealth {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.viewLocked()
}

func (t *target) viewLocked() *vipdv1.BackendHealth {
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
