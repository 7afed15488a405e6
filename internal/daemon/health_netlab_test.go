package daemon_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/dataplane/ebpf"
	"github.com/vipd/vipd/dataplane/ebpf/maglev"
	"github.com/vipd/vipd/internal/daemon"
	"github.com/vipd/vipd/internal/testkit/cgroup2test"
	"github.com/vipd/vipd/internal/testkit/netlab"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/grpc"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// labDataplane sets up cfg for dp in a lab: for eBPF a test cgroup and a
// private bpffs, unmounted after vipd stops.
func labDataplane(t *testing.T, cfg *daemon.Config, dp string) {
	t.Helper()
	cfg.Dataplane = dp
	if dp != daemon.DataplaneEBPF {
		return
	}
	dir, err := os.MkdirTemp("", "vipdh")
	if err != nil {
		t.Fatal(err)
	}
	cfg.EBPF.CgroupPath = cgroup2test.New(t)
	cfg.EBPF.BPFFS = filepath.Join(dir, "bpf")
	cfg.EBPF.TCAttach = ebpf.TCAttachTCX
	cfg.EBPF.Maps = ebpf.DefaultMapSizes
	cfg.EBPF.ConntrackTimeouts = ebpf.DefaultConntrackTimeouts
	cfg.EBPF.GCInterval = 30 * time.Second
	cfg.EBPF.MaglevTableSize = maglev.DefaultTableSize
	t.Cleanup(func() {
		if err := ebpf.UnmountBPFFS(cfg.EBPF.BPFFS); err != nil {
			t.Errorf("%v (leaving %s)", err, dir)
			return
		}
		os.RemoveAll(dir)
	})
}

// TestHealthChecksRealTraffic runs vipd on each real dataplane in a lab
// node, with TCP health checks, and checks with real connections that:
// a backend whose server stops gets no new connection after
// interval × unhealthy_threshold + one interval, with no failed client
// connection after that, and gets them again when its server is back
// (tightest, short and default settings, each failover time logged); a
// control-plane NOT_SERVING is never overridden by a passing check; and
// when every backend fails, new connections are refused (the ClusterIP
// way: failing backends are NOT_SERVING), while an established connection
// to a failing backend goes on; and an HTTP check answered 500 and a gRPC
// check answered NOT_SERVING fail, refusing new connections.
func TestHealthChecksRealTraffic(t *testing.T) {
	netlab.RequireRoot(t)
	for _, dp := range []string{daemon.DataplaneIPTables, daemon.DataplaneEBPF} {
		t.Run(dp, func(t *testing.T) { testHealthChecksRealTraffic(t, dp) })
	}
}

func testHealthChecksRealTraffic(t *testing.T, dp string) {
	lab := netlab.New(t, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: []string{"client", "be1", "be2", "be3"}}}})
	node := lab.Node(1)
	cl, be1, be2, be3 := node.Pod("client"), node.Pod("be1"), node.Pod("be2"), node.Pod("be3")
	echo1, err := be1.StartEcho("", 8080)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := be2.StartEcho("", 8080); err != nil {
		t.Fatal(err)
	}
	cfg := config(t)
	cfg.NetNS = node.Path()
	labDataplane(t, &cfg, dp)
	r := start(t, cfg, healthpb.HealthCheckResponse_SERVING)

	vip := netip.MustParseAddrPort("198.19.0.10:80")
	web := func(hc *vipdv1.HealthCheck, be2State vipdv1.BackendState) *vipdv1.Service {
		return &vipdv1.Service{Name: "web", Vips: []string{vip.Addr().String()},
			Ports:       []*vipdv1.Port{{Name: "http", Port: uint32(vip.Port()), TargetPort: 8080}},
			Backends:    []*vipdv1.Backend{{Ip: be1.IPv4().String()}, {Ip: be2.IPv4().String(), State: be2State}},
			HealthCheck: hc}
	}
	// A refused connection (to a stopped server) fails at once; the
	// timeout only covers a loaded machine's stalls, which are no failure.
	request := func(to netip.AddrPort) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		rep, err := cl.Request(ctx, "tcp", to.String())
		return rep.Backend, err
	}
	// reaches waits until a request reaches backend.
	reaches := func(backend string, within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			if got, err := request(vip); err == nil && got == backend {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("no request reached %s within %v\nlog:\n%s", backend, within, r.log)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	healthOf := func(name string) map[string]*vipdv1.BackendHealth {
		resp, err := r.local.LoadBalancerClient().GetService(ctxT(t), &vipdv1.GetServiceRequest{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]*vipdv1.BackendHealth{}
		for _, h := range resp.BackendHealth {
			out[h.Ip] = h
		}
		return out
	}

	for _, tc := range []struct {
		name                string
		interval, unhealthy uint32
		healthy             uint32
	}{
		{"tightest", 50, 1, 1},
		{"short", 200, 2, 2},
		{"default", 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hc := &vipdv1.HealthCheck{Protocol: vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_TCP,
				IntervalMs: tc.interval, UnhealthyThreshold: tc.unhealthy, HealthyThreshold: tc.healthy}
			if _, err := r.local.UpsertService(ctxT(t), web(hc, vipdv1.BackendState_BACKEND_STATE_READY), 0); err != nil {
				t.Fatal(err)
			}
			d := validationDefaults(hc)
			interval := time.Duration(d.IntervalMs) * time.Millisecond
			reaches("be1", 10*time.Second)
			reaches("be2", 10*time.Second)
			// A WatchFlows stream of be1's health transitions.
			transitions := watchHealth(t, r.local, "web", be1.IPv4().String())

			echo1.Close()
			stopped := time.Now()
			// The bound; the tightest settings (50 ms) are below
			// what an apply takes on a loaded 2-CPU machine (iptables-restore
			// runs 40-100 ms), so there the apply gets 250 ms on top.
			bound := interval*time.Duration(d.UnhealthyThreshold) + interval
			if tc.name == "tightest" {
				bound += 250 * time.Millisecond
			}
			var lastBe1 time.Time
			var failures, after int
			for time.Since(stopped) < bound+2*interval+time.Second {
				got, err := request(vip)
				now := time.Now()
				switch {
				case err != nil:
					// be1's kernel resets it: the connection went to be1.
					lastBe1 = now
					failures++
				case got == "be1":
					t.Fatalf("be1 answered after its server stopped")
				case got != "be2":
					t.Fatalf("answered by %q", got)
				}
				if now.Sub(stopped) > bound {
					after++
					if err != nil {
						t.Errorf("request %v after the server stopped, past the bound %v, failed: %v", now.Sub(stopped), bound, err)
					}
				}
				time.Sleep(5 * time.Millisecond)
			}
			failover := time.Duration(0)
			if !lastBe1.IsZero() {
				failover = lastBe1.Sub(stopped)
			}
			t.Logf("%s: interval %v, unhealthy_threshold %d: failover (server stopped → last connection to it) %v; %d failed connections before, %d good after the bound %v",
				dp, interval, d.UnhealthyThreshold, failover.Round(time.Millisecond), failures, after, bound)
			h := healthOf("web")[be1.IPv4().String()]
			if h.GetState() != vipdv1.HealthState_HEALTH_STATE_FAILING || !strings.Contains(h.GetDetail(), "connection refused") {
				t.Errorf("be1 health %v, want failing with connection refused", h)
			}
			ex, err := r.local.Explain(ctxT(t), &vipdv1.ExplainRequest{ClientIp: cl.IPv4().String(), Vip: vip.Addr().String(), Port: uint32(vip.Port())})
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range ex.Backends {
				if b.Ip == be1.IPv4().String() && (b.Eligible || !strings.HasPrefix(b.IneligibleReason, "failing health check (connection refused")) {
					t.Errorf("explain says be1 is %v", b)
				}
			}

			be1Probed := netip.AddrPortFrom(be1.IPv4(), 8080).String()
			failing := "web " + be1Probed + " failing: connection refused"
			nextTransition(t, transitions, "", failing, 5*time.Second, r.log)

			// It comes back when its server does.
			if echo1, err = be1.StartEcho("", 8080); err != nil {
				t.Fatal(err)
			}
			back := time.Now()
			reaches("be1", interval*time.Duration(d.HealthyThreshold+2)+time.Second)
			t.Logf("%s: back after %v", dp, time.Since(back).Round(time.Millisecond))
			nextTransition(t, transitions, failing, "web "+be1Probed+" passing", 5*time.Second, r.log)
		})
	}

	t.Run("control plane NOT_SERVING wins", func(t *testing.T) {
		hc := &vipdv1.HealthCheck{Protocol: vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_TCP, IntervalMs: 50, HealthyThreshold: 1}
		if _, err := r.local.UpsertService(ctxT(t), web(hc, vipdv1.BackendState_BACKEND_STATE_NOT_SERVING), 0); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // many check intervals
		for i := range 40 {
			got, err := request(vip)
			if err != nil || got != "be1" {
				t.Fatalf("request %d: %q, %v; want be1 only: be2 is NOT_SERVING", i, got, err)
			}
		}
		if _, ok := healthOf("web")[be2.IPv4().String()]; ok {
			t.Errorf("be2, NOT_SERVING in the spec, is probed")
		}
	})

	t.Run("all failing refuses; established connections go on", func(t *testing.T) {
		// be3 serves on 8080 and answers its health checks on 9090: the
		// check can fail while the served port keeps serving.
		if _, err := be3.StartEcho("", 8080); err != nil {
			t.Fatal(err)
		}
		probe, err := be3.StartEcho("", 9090)
		if err != nil {
			t.Fatal(err)
		}
		est := netip.MustParseAddrPort("198.19.0.11:80")
		if _, err := r.local.UpsertService(ctxT(t), &vipdv1.Service{Name: "est", Vips: []string{est.Addr().String()},
			Ports:    []*vipdv1.Port{{Port: uint32(est.Port()), TargetPort: 8080}},
			Backends: []*vipdv1.Backend{{Ip: be3.IPv4().String()}},
			HealthCheck: &vipdv1.HealthCheck{Protocol: vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_TCP, Port: 9090,
				IntervalMs: 50, UnhealthyThreshold: 2, HealthyThreshold: 1}}, 0); err != nil {
			t.Fatal(err)
		}
		conn, err := cl.Dial(ctxT(t), "tcp", est.String())
		if err != nil {
			t.Fatalf("dial %v: %v", est, err)
		}
		defer conn.Close()
		if rep, err := conn.Request(ctxT(t)); err != nil || rep.Backend != "be3" {
			t.Fatalf("established request: %v, %v", rep, err)
		}
		probe.Close()
		deadline := time.Now().Add(5 * time.Second)
		for healthOf("est")[be3.IPv4().String()].GetState() != vipdv1.HealthState_HEALTH_STATE_FAILING {
			if time.Now().After(deadline) {
				t.Fatalf("be3 not failing\nlog:\n%s", r.log)
			}
			time.Sleep(20 * time.Millisecond)
		}
		deadline = time.Now().Add(2 * time.Second)
		for {
			_, err := request(est)
			if err != nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("new connections to %v still served with its only backend failing", est)
			}
			time.Sleep(10 * time.Millisecond)
		}
		for i := range 5 {
			if rep, err := conn.Request(ctxT(t)); err != nil || rep.Backend != "be3" {
				t.Fatalf("established connection, request %d after be3 failed its checks: %v, %v", i, rep, err)
			}
		}
	})
	// HTTP 500 and gRPC NOT_SERVING fail: be3 (serving 8080) answers
	// its checks on 9091 (HTTP) and 9092 (gRPC health) from servers in
	// its namespace; once they answer badly, new connections are refused.
	for _, proto := range []string{"http", "grpc"} {
		t.Run(proto+" check fails", func(t *testing.T) {
			var ln net.Listener
			port := map[string]uint32{"http": 9091, "grpc": 9092}[proto]
			if err := be3.Do(func() error {
				var err error
				ln, err = net.Listen("tcp", fmt.Sprintf(":%d", port))
				return err
			}); err != nil {
				t.Fatal(err)
			}
			var bad atomic.Bool
			hc := &vipdv1.HealthCheck{Port: port, IntervalMs: 50, UnhealthyThreshold: 2, HealthyThreshold: 1}
			want := ""
			switch proto {
			case "http":
				srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if bad.Load() {
						w.WriteHeader(500)
					}
				})}
				go srv.Serve(ln)
				defer srv.Close()
				hc.Protocol, hc.Path, want = vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_HTTP, "/healthz", "HTTP 500"
			case "grpc":
				hs := grpchealth.NewServer()
				hs.SetServingStatus("web", healthpb.HealthCheckResponse_SERVING)
				srv := grpc.NewServer()
				healthpb.RegisterHealthServer(srv, hs)
				go srv.Serve(ln)
				defer srv.Stop()
				defer hs.Shutdown()
				go func() {
					for !bad.Load() {
						time.Sleep(5 * time.Millisecond)
					}
					hs.SetServingStatus("web", healthpb.HealthCheckResponse_NOT_SERVING)
				}()
				hc.Protocol, hc.GrpcService, want = vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_GRPC, "web", "gRPC health NOT_SERVING"
			}
			to := netip.MustParseAddrPort("198.19.0.12:80")
			if _, err := r.local.UpsertService(ctxT(t), &vipdv1.Service{Name: "chk-" + proto, Vips: []string{to.Addr().String()},
				Ports:    []*vipdv1.Port{{Port: uint32(to.Port()), TargetPort: 8080}},
				Backends: []*vipdv1.Backend{{Ip: be3.IPv4().String()}}, HealthCheck: hc}, 0); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for healthOf("chk-" + proto)[be3.IPv4().String()].GetState() != vipdv1.HealthState_HEALTH_STATE_PASSING {
				if time.Now().After(deadline) {
					t.Fatalf("be3 never passing: %v\nlog:\n%s", healthOf("chk-"+proto), r.log)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if got, err := request(to); err != nil || got != "be3" {
				t.Fatalf("request while passing: %q, %v", got, err)
			}
			bad.Store(true)
			deadline = time.Now().Add(5 * time.Second)
			for {
				h := healthOf("chk-" + proto)[be3.IPv4().String()]
				if h.GetState() == vipdv1.HealthState_HEALTH_STATE_FAILING {
					if h.GetLastError() != want {
						t.Errorf("last error %q, want %q", h.GetLastError(), want)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("be3 not failing: %v", h)
				}
				time.Sleep(20 * time.Millisecond)
			}
			deadline = time.Now().Add(2 * time.Second)
			for {
				if _, err := request(to); err != nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("new connections to %v still served with its only backend failing", to)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if err := r.local.DeleteService(ctxT(t), "chk-"+proto, 0); err != nil {
				t.Fatal(err)
			}
		})
	}
	if !strings.Contains(r.log.String(), "backend health changed") {
		t.Errorf("no health transition logged:\n%s", r.log)
	}
}

// watchHealth opens a WatchFlows stream of the health transitions of
// backend ip of service, and returns them as "service ip:port state" or
// "service ip:port failing: last error", until the test ends.
func watchHealth(t *testing.T, c *client.Client, service, ip string) <-chan string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := c.WatchFlows(ctx, &vipdv1.WatchFlowsRequest{
		Types:  []vipdv1.FlowEventType{vipdv1.FlowEventType_FLOW_EVENT_TYPE_HEALTH},
		Filter: &vipdv1.FlowFilter{Service: service, Backend: ip}})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	out := make(chan string, 16)
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			ev := m.GetFlow()
			if ev.GetType() != vipdv1.FlowEventType_FLOW_EVENT_TYPE_HEALTH {
				out <- fmt.Sprintf("unexpected event %v", m)
				continue
			}
			h := ev.GetHealth()
			line := fmt.Sprintf("%s %s:%d %s", ev.GetService(), ev.GetBackend().GetIp(), ev.GetBackend().GetPort(),
				strings.ToLower(strings.TrimPrefix(h.GetState().String(), "HEALTH_STATE_")))
			if h.GetState() == vipdv1.HealthState_HEALTH_STATE_FAILING {
				line += ": " + h.GetLastError()
			}
			select {
			case out <- line:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// nextTransition waits for the transition want on c. A repeat of the
// transition before it (prev) may come first: for up to one sync period
// after a change of the health check, the check of the old settings runs
// beside the new one, and each reports what it sees.
func nextTransition(t *testing.T, c <-chan string, prev, want string, within time.Duration, log fmt.Stringer) {
	t.Helper()
	timeout := time.After(within)
	for {
		select {
		case got := <-c:
			if got == want {
				return
			}
			if got != prev {
				t.Errorf("health transition %q, want %q\nlog:\n%s", got, want, log)
				return
			}
		case <-timeout:
			t.Errorf("no health transition %q on WatchFlows within %v\nlog:\n%s", want, within, log)
			return
		}
	}
}

func validationDefaults(hc *vipdv1.HealthCheck) *vipdv1.HealthCheck {
	return validation.HealthDefaults(hc)
}
