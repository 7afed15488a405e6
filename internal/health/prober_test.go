package health_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/internal/health"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/reconcile"
	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/grpc"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
)

// submitter records what the prober submits: the failing backends.
type submitter struct {
	mu      sync.Mutex
	failing map[string]bool // "service/ip"
	calls   int
	// delay makes each SetHealth take this long, as an apply does.
	delay time.Duration
}

func (s *submitter) SetHealth(_ context.Context, changes []reconcile.HealthChange) error {
	time.Sleep(s.delay)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	for _, c := range changes {
		s.failing[c.Service+"/"+c.Backend.String()] = c.Failing
	}
	return nil
}

func (s *submitter) isFailing(k string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failing[k]
}

type lab struct {
	snap atomic.Pointer[store.Snapshot]
	sub  *submitter
	p    *health.Prober

	mu          sync.Mutex
	transitions []health.Transition
}

// transitionsSeen is the transitions so far, as "service backend state
// (last error, consecutive)".
func (l *lab) transitionsSeen() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, tr := range l.transitions {
		out = append(out, fmt.Sprintf("%s %s %s (%s, %d)", tr.Service, tr.Backend, strings.ToLower(strings.TrimPrefix(tr.Health.State.String(), "HEALTH_STATE_")),
			tr.Health.LastError, tr.Health.Consecutive))
	}
	return out
}

func (l *lab) put(t *testing.T, svc *vipdv1.Service) {
	t.Helper()
	// The structural conversion only: the API refuses loopback backends,
	// and these tests probe nothing but loopback.
	svc = proto.Clone(svc).(*vipdv1.Service)
	dp, v := validation.ConvertService(svc, "service")
	if v != nil {
		t.Fatal(v)
	}
	out := svc
	tx := l.snap.Load().Begin()
	if _, err := tx.Put(out, dp); err != nil {
		t.Fatal(err)
	}
	l.snap.Store(tx.Commit())
}

func start(t *testing.T, svc *vipdv1.Service) *lab {
	t.Helper()
	return startWith(t, svc, &submitter{failing: map[string]bool{}})
}

func startWith(t *testing.T, svc *vipdv1.Service, sub *submitter) *lab {
	t.Helper()
	l := &lab{sub: sub}
	l.snap.Store(store.Empty())
	l.put(t, svc)
	l.p = health.New(hclog.NewNullLogger(), l.snap.Load, l.sub, health.WithSyncPeriod(20*time.Millisecond),
		health.WithTransitions(func(tr health.Transition) {
			l.mu.Lock()
			l.transitions = append(l.transitions, tr)
			l.mu.Unlock()
		}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.p.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return l
}

// eventually waits up to 5 s for f.
func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func service(ip string, port uint32, hc *vipdv1.HealthCheck) *vipdv1.Service {
	return &vipdv1.Service{Name: "web", Vips: []string{"10.96.0.1"}, Ports: []*vipdv1.Port{{Name: "http", Port: 80, TargetPort: port}},
		Backends: []*vipdv1.Backend{{Ip: ip}}, HealthCheck: hc}
}

func listen(t *testing.T, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func healthOf(l *lab) *vipdv1.BackendHealth {
	h := l.p.Health("web")
	if len(h) != 1 {
		return nil
	}
	return h[0]
}

func stateIs(l *lab, s vipdv1.HealthState) func() bool {
	return func() bool { h := healthOf(l); return h != nil && h.State == s }
}

// TestTCPFailsAndComesBack: a backend whose listener closes fails after
// unhealthy_threshold refused connections, is submitted as failing, is
// explained in words, and comes back after healthy_threshold passes.
func TestTCPFailsAndComesBack(t *testing.T) {
	ln := listen(t, "127.0.0.2:0")
	addr := netip.MustParseAddrPort(ln.Addr().String())
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	l := start(t, service("127.0.0.2", uint32(addr.Port()), &vipdv1.HealthCheck{
		Protocol: vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_TCP, IntervalMs: 50, UnhealthyThreshold: 3, HealthyThreshold: 2}))
	eventually(t, "the backend probed", func() bool { return len(l.p.Health("web")) == 1 })
	if h := l.p.Health("web"); len(h) != 1 || h[0].State != vipdv1.HealthState_HEALTH_STATE_UNKNOWN && h[0].State != vipdv1.HealthState_HEALTH_STATE_PASSING {
		t.Fatalf("new backend health %v, want unknown (treated as passing) or passing", h)
	}
	eventually(t, "passing", stateIs(l, vipdv1.HealthState_HEALTH_STATE_PASSING))
	ln.Close()
	eventually(t, "failing", stateIs(l, vipdv1.HealthState_HEALTH_STATE_FAILING))
	eventually(t, "submitted as failing", func() bool { return l.sub.isFailing("web/127.0.0.2") })
	h := healthOf(l)
	if h.Detail != "failing health check (connection refused, 3 in a row)" || h.LastError != "connection refused" || h.Consecutive != 3 {
		t.Errorf("failing view %v", h)
	}
	if d, failing := l.p.Explain("web", netip.MustParseAddr("127.0.0.2")); !failing || !strings.HasPrefix(d, "failing health check (connection refused") {
		t.Errorf("Explain = %q, %v", d, failing)
	}
	ln2 := listen(t, addr.String())
	go func() {
		for {
			c, err := ln2.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	eventually(t, "passing again", stateIs(l, vipdv1.HealthState_HEALTH_STATE_PASSING))
	eventually(t, "lifted", func() bool { return !l.sub.isFailing("web/127.0.0.2") })
	// Transitions: to failing and back; the first pass (unknown to
	// passing) is none.
	want := []string{"web " + addr.String() + " failing (connection refused, 3)", "web " + addr.String() + " passing (connection refused, 2)"}
	eventually(t, "two transitions", func() bool { return len(l.transitionsSeen()) >= 2 })
	if got := l.transitionsSeen(); !slices.Equal(got, want) {
		t.Errorf("transitions %q, want %q", got, want)
	}
}

// TestHTTP500Fails: an HTTP check passes on 2xx and 3xx and fails on 500.
func TestHTTP500Fails(t *testing.T) {
	var code atomic.Int32
	code.Store(302)
	ln := listen(t, "127.0.0.3:0")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			w.WriteHeader(404)
			return
		}
		if code.Load() == 302 {
			w.Header().Set("Location", "/elsewhere")
		}
		w.WriteHeader(int(code.Load()))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	port := netip.MustParseAddrPort(ln.Addr().String()).Port()
	l := start(t, service("127.0.0.3", 80, &vipdv1.HealthCheck{Protocol: vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_HTTP,
		Port: uint32(port), Path: "/healthz", IntervalMs: 50, UnhealthyThreshold: 2}))
	eventually(t, "passing on 302", stateIs(l, vipdv1.HealthState_HEALTH_STATE_PASSING))
	code.Store(500)
	eventually(t, "failing on 500", stateIs(l, vipdv1.HealthState_HEALTH_STATE_FAILING))
	if h := healthOf(l); h.LastError != "HTTP 500" {
		t.Errorf("last error %q", h.LastError)
	}
	eventually(t, "submitted", func() bool { return l.sub.isFailing("web/127.0.0.3") })
	code.Store(200)
	eventually(t, "passing on 200", stateIs(l, vipdv1.HealthState_HEALTH_STATE_PASSING))
}

// TestGRPCNotServingFails: a gRPC check of grpc_service fails while the
// server's health service says NOT_SERVING for it.
func TestGRPCNotServingFails(t *testing.T) {
	ln := listen(t, "127.0.0.4:0")
	hs := grpchealth.NewServer()
	hs.SetServingStatus("web", healthpb.HealthCheckResponse_SERVING)
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	port := netip.MustParseAddrPort(ln.Addr().String()).Port()
	l := start(t, service("127.0.0.4", uint32(port), &vipdv1.HealthCheck{Protocol: vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_GRPC,
		GrpcService: "web", IntervalMs: 50, UnhealthyThreshold: 2, HealthyThreshold: 1}))
	eventually(t, "passing", stateIs(l, vipdv1.HealthState_HEALTH_STATE_PASSING))
	hs.SetServingStatus("web", healthpb.HealthCheckResponse_NOT_SERVING)
	eventually(t, "failing on NOT_SERVING", stateIs(l, vipdv1.HealthState_HEALTH_STATE_FAILING))
	if h := healthOf(l); h.LastError != "gRPC health NOT_SERVING" {
		t.Errorf("last error %q", h.LastError)
	}
	hs.SetServingStatus("web", healthpb.HealthCheckResponse_SERVING)
	eventually(t, "passing again", stateIs(l, vipdv1.HealthState_HEALTH_STATE_PASSING))
}

// TestControlPlaneNotServingNotProbed: a backend the control plane marked
// NOT_SERVING is not probed; marking a failing one NOT_SERVING lifts what
// health had submitted, so that the control plane's state is all that
// counts when it turns READY again.
func TestControlPlaneNotServingNotProbed(t *testing.T) {
	svc := service("127.0.0.5", 1, &vipdv1.HealthCheck{Protocol: vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_TCP, IntervalMs: 50, UnhealthyThreshold: 1})
	l := start(t, svc) // nothing listens on port 1: refused
	eventually(t, "submitted as failing", func() bool { return l.sub.isFailing("web/127.0.0.5") })
	// Unknown to failing is a transition.
	if got, want := l.transitionsSeen(), []string{"web 127.0.0.5:1 failing (connection refused, 1)"}; !slices.Equal(got, want) {
		t.Errorf("transitions %q, want %q", got, want)
	}
	svc.Backends[0].State = vipdv1.BackendState_BACKEND_STATE_NOT_SERVING
	l.put(t, svc)
	eventually(t, "lifted", func() bool { return !l.sub.isFailing("web/127.0.0.5") })
	if h := l.p.Health("web"); len(h) != 0 {
		t.Errorf("a NOT_SERVING backend is probed: %v", h)
	}
	// The health check removed: nothing is probed.
	svc.Backends[0].State = vipdv1.BackendState_BACKEND_STATE_READY
	svc.HealthCheck = nil
	l.put(t, svc)
	time.Sleep(100 * time.Millisecond)
	if h := l.p.Health("web"); len(h) != 0 || l.sub.isFailing("web/127.0.0.5") {
		t.Errorf("probed without a health_check: %v", h)
	}
}

// TestChangesSubmittedInBatches: while the reconciler applies one batch,
// the changes of other backends gather and go in the next: 100 backends
// that fail at about the same time take far fewer SetHealth calls.
func TestChangesSubmittedInBatches(t *testing.T) {
	svc := service("127.0.1.1", 1, &vipdv1.HealthCheck{Protocol: vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_TCP,
		IntervalMs: 100, UnhealthyThreshold: 1})
	svc.Backends = nil
	const n = 100
	for i := range n {
		svc.Backends = append(svc.Backends, &vipdv1.Backend{Ip: fmt.Sprintf("127.0.1.%d", i+1)}) // port 1: refused
	}
	sub := &submitter{failing: map[string]bool{}, delay: 20 * time.Millisecond}
	l := startWith(t, svc, sub)
	eventually(t, "every backend submitted as failing", func() bool {
		for i := range n {
			if !l.sub.isFailing(fmt.Sprintf("web/127.0.1.%d", i+1)) {
				return false
			}
		}
		return true
	})
	sub.mu.Lock()
	calls := sub.calls
	sub.mu.Unlock()
	// The first checks spread over 100 ms, and a call takes 20 ms.
	if calls > n/4 {
		t.Errorf("%d SetHealth calls for %d backends, want batches", calls, n)
	}
	t.Logf("%d backends failing in %d SetHealth calls", n, calls)
}
