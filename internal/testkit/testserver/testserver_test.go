package testserver_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/fake"
	"github.com/vipd/vipd/internal/testkit/testserver"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
)

// dial connects to target, or through dialer when it is not nil.
func dial(t *testing.T, target string, dialer func(context.Context, string) (net.Conn, error)) *grpc.ClientConn {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if dialer != nil {
		opts = append(opts, grpc.WithContextDialer(dialer))
	}
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func web(backends ...string) *vipdv1.Service {
	svc := &vipdv1.Service{Name: "default/web", Vips: []string{"10.96.0.10"}, Ports: []*vipdv1.Port{{Port: 80}}}
	for _, b := range backends {
		svc.Backends = append(svc.Backends, &vipdv1.Backend{Ip: b})
	}
	return svc
}

func TestServes(t *testing.T) {
	srv := testserver.Start(t, testserver.WithVersion("v9.9.9"))
	if n := len(srv.Socket()); n > 107 {
		t.Errorf("socket path %s is %d bytes; sun_path holds 107", srv.Socket(), n)
	}
	if want := "unix://" + srv.Socket(); srv.Target() != want {
		t.Errorf("Target() = %q, want %q", srv.Target(), want)
	}
	fi, err := os.Stat(srv.Socket())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o660 {
		t.Errorf("socket mode %v, want a socket with 0660", fi.Mode())
	}

	conn := dial(t, srv.Target(), nil)
	h, err := healthpb.NewHealthClient(conn).Check(ctxT(t), &healthpb.HealthCheckRequest{})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health = %v, %v; want SERVING as soon as Start returns", h, err)
	}
	st, err := vipdv1.NewStatusServiceClient(conn).GetStatus(ctxT(t), &vipdv1.GetStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetDataplane() != fake.Name || st.GetVersion() != "v9.9.9" || !st.GetReady() {
		t.Errorf("GetStatus = %v; want the fake dataplane, ready, at version v9.9.9", st)
	}

	resp, err := vipdv1.NewLoadBalancerServiceClient(conn).UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: web("10.0.0.1")})
	if err != nil {
		t.Fatal(err)
	}
	applied, gen := srv.Dataplane().Applied()
	if applied["default/web"] == nil || gen != resp.GetService().GetGeneration() {
		t.Errorf("dataplane has %v at generation %d; want default/web at %d", applied, gen, resp.GetService().GetGeneration())
	}
	// The initial apply of the empty state, then the upsert.
	if n := len(srv.Dataplane().Records()); n != 2 {
		t.Errorf("%d applies, want 2", n)
	}
	// The state file, or the journal of changes since it was written.
	if size := fileSize(srv.StateDir(), "state") + fileSize(srv.StateDir(), "journal"); size == 0 {
		t.Errorf("the upsert was not saved in the state directory")
	}
}

// fileSize is the size of dir/name, 0 if there is none.
func fileSize(dir, name string) int64 {
	fi, err := os.Stat(filepath.Join(dir, name))
	if err != nil {
		return 0
	}
	return fi.Size()
}

func TestClose(t *testing.T) {
	srv, err := testserver.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := srv.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	for _, path := range []string{srv.Socket(), srv.StateDir()} {
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is left behind: %v", path, err)
		}
	}
	if _, err := net.Dial("unix", srv.Socket()); err == nil {
		t.Errorf("the socket still answers after Close")
	}
}

func TestDataplaneFailure(t *testing.T) {
	srv := testserver.Start(t)
	lb := vipdv1.NewLoadBalancerServiceClient(dial(t, srv.Target(), nil))
	srv.Dataplane().FailNext(errors.New("iptables-restore: exit status 1"))
	_, err := lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: web()})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "rolled back") {
		t.Errorf("UpsertService with a failing dataplane: %v, want Unavailable, rolled back", err)
	}
	if _, err := lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: web()}); err != nil {
		t.Errorf("UpsertService after the failure: %v", err)
	}
}

func TestOptions(t *testing.T) {
	tcpOnly := fake.New(fake.WithCapabilities(dataplane.Capabilities{
		LoadBalancing: []dataplane.LoadBalancing{dataplane.LoadBalancingRandom},
		Protocols:     []dataplane.Protocol{dataplane.TCP},
	}))
	bufnet := bufconn.Listen(1 << 20)
	srv := testserver.Start(t,
		testserver.WithDataplane(tcpOnly),
		testserver.WithLimits(validation.Limits{MaxBackends: 1}),
		testserver.WithListener(bufnet))
	if srv.Dataplane() != tcpOnly {
		t.Errorf("Dataplane() is not the one passed to WithDataplane")
	}
	conn := dial(t, "passthrough:///bufnet", func(ctx context.Context, _ string) (net.Conn, error) { return bufnet.DialContext(ctx) })
	lb := vipdv1.NewLoadBalancerServiceClient(conn)

	_, err := lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: web("10.0.0.1", "10.0.0.2")})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "service.backends: has 2 backends; at most 1") {
		t.Errorf("UpsertService over the backend limit: %v, want InvalidArgument about service.backends", err)
	}
	udp := web()
	udp.Ports[0].Protocol = vipdv1.Protocol_PROTOCOL_UDP
	if _, err := lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: udp}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("UpsertService of UDP on a TCP-only dataplane: %v, want FailedPrecondition", err)
	}
}

// TestStartFailure checks that New releases what it made, the listeners it
// was given included, when the server cannot start.
func TestStartFailure(t *testing.T) {
	long := filepath.Join(t.TempDir(), strings.Repeat("d", 100))
	if err := os.Mkdir(long, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", long)
	extra := bufconn.Listen(1 << 10)
	srv, err := testserver.New(testserver.WithListener(extra))
	if err == nil {
		srv.Close()
		t.Fatalf("New with a socket path over 107 bytes succeeded")
	}
	if !strings.Contains(err.Error(), "at most 107 fit") {
		t.Errorf("New: %v, want the socket path's length", err)
	}
	if entries, err := os.ReadDir(long); err != nil || len(entries) != 0 {
		t.Errorf("New left %v behind in TMPDIR (%v)", entries, err)
	}
	// A dial of an open bufconn waits for an Accept; of a closed one, it fails at once.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := extra.DialContext(ctx); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the WithListener listener is still open (dial: %v)", err)
	}
}

// TestNoHealthChecks checks that the test vipd, which runs in the
// machine's own network namespace, never probes backends: a service with a
// health check gets no backend health at all (a prober reports each
// backend "unknown" within its 200 ms sync period). The check interval is
// an hour, and the first check of a backend comes at a random point in
// it, so that even a prober would almost surely send no probe before the
// test ends.
func TestNoHealthChecks(t *testing.T) {
	srv := testserver.Start(t)
	c := vipdv1.NewLoadBalancerServiceClient(dial(t, srv.Target(), nil))
	svc := web("198.18.0.1")
	svc.HealthCheck = &vipdv1.HealthCheck{Protocol: vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_TCP, IntervalMs: 3_600_000}
	if _, err := c.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: svc}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		got, err := c.GetService(ctxT(t), &vipdv1.GetServiceRequest{Name: svc.Name})
		if err != nil {
			t.Fatal(err)
		}
		if h := got.GetBackendHealth(); len(h) != 0 {
			t.Fatalf("backend health %v: the test vipd runs health checks from the machine's own namespace", h)
		}
	}
}
