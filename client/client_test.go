package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/fake"
	"github.com/vipd/vipd/internal/testkit/testserver"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/reconcile"
	"github.com/vipd/vipd/server/store"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
)

func newClient(t *testing.T, target string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(target, opts...)
	if err != nil {
		t.Fatalf("New(%q): %v", target, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// web is a valid service.
func web() *vipdv1.Service {
	return &vipdv1.Service{
		Name: "default/web", Owner: "ctl", Vips: []string{"10.96.0.10"},
		Ports:    []*vipdv1.Port{{Name: "http", Port: 80, TargetPort: 8080}},
		Backends: []*vipdv1.Backend{{Ip: "10.0.0.1"}},
	}
}

// attempts counts the attempts of a client's calls, retries included: gRPC
// reports each attempt to a stats handler with a Begin. Transparent retries,
// of attempts that never reached the server, are not counted.
type attempts struct{ n atomic.Int64 }

func (a *attempts) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context   { return ctx }
func (a *attempts) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (a *attempts) HandleConn(context.Context, stats.ConnStats)                       {}
func (a *attempts) HandleRPC(_ context.Context, s stats.RPCStats) {
	if b, ok := s.(*stats.Begin); ok && !b.IsTransparentRetryAttempt {
		a.n.Add(1)
	}
}

func TestTargetForms(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := testserver.Start(t, testserver.WithListener(tcp))

	for _, target := range []string{
		srv.Target(),
		"unix:" + srv.Socket(),
		srv.Socket(),
		tcp.Addr().String(),
		"dns:///" + tcp.Addr().String(),
	} {
		t.Run(target, func(t *testing.T) {
			c := newClient(t, target)
			st, err := c.Status(context.Background())
			if err != nil {
				t.Fatalf("Status: %v", err)
			}
			if st.GetDataplane() != fake.Name {
				t.Errorf("Status().Dataplane = %q, want %s", st.GetDataplane(), fake.Name)
			}
		})
	}
}

func TestBadTargets(t *testing.T) {
	for _, target := range []string{"", "vipd.sock", "./vipd.sock", "localhost"} {
		if c, err := client.New(target); err == nil {
			c.Close()
			t.Errorf("New(%q) succeeded, want an error", target)
		}
	}
}

func TestBadOptions(t *testing.T) {
	for name, opt := range map[string]client.Option{
		"negative timeout": client.WithTimeout(-time.Second),
		"zero attempts":    client.WithMaxAttempts(0),
	} {
		if c, err := client.New("/run/vipd/vipd.sock", opt); err == nil {
			c.Close()
			t.Errorf("New with %s succeeded, want an error", name)
		}
	}
}

// TestNewDoesNotConnect checks that New succeeds while vipd is down, and that
// a call then fails with Unavailable after the retries.
func TestNewDoesNotConnect(t *testing.T) {
	c := newClient(t, "/nonexistent/vipd.sock", client.WithMaxAttempts(2))
	_, err := c.Status(context.Background())
	if got := status.Code(err); got != codes.Unavailable {
		t.Errorf("Status with no daemon: code %v (%v), want Unavailable", got, err)
	}
}

func TestWaitServingWithoutDaemon(t *testing.T) {
	c := newClient(t, "/nonexistent/vipd.sock", client.WithMaxAttempts(1))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := c.WaitServing(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitServing with no daemon = %v, want an error wrapping DeadlineExceeded", err)
	}
}

func TestDefaultDeadline(t *testing.T) {
	srv := testserver.Start(t)
	// deadlines receives how far away each call's deadline was as the call
	// left the client, or -1 for none. The client's own interceptors run
	// before those added with WithDialOptions.
	deadlines := make(chan time.Duration, 1)
	seeDeadline := client.WithDialOptions(grpc.WithChainUnaryInterceptor(
		func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			d := time.Duration(-1)
			if dl, ok := ctx.Deadline(); ok {
				d = time.Until(dl)
			}
			deadlines <- d
			return invoker(ctx, method, req, reply, cc, opts...)
		}))

	t.Run("applied without a caller deadline", func(t *testing.T) {
		// The dataplane blocks the upsert until the client has given up.
		release := make(chan struct{})
		defer close(release)
		srv.Dataplane().SetHook(func(ctx context.Context, _ *dataplane.State) error {
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		defer srv.Dataplane().SetHook(nil)
		c := newClient(t, srv.Target(), client.WithTimeout(200*time.Millisecond), seeDeadline)
		start := time.Now()
		_, err := c.UpsertService(context.Background(), web(), 0)
		if got := status.Code(err); got != codes.DeadlineExceeded {
			t.Errorf("UpsertService: code %v (%v), want DeadlineExceeded", got, err)
		}
		if d := <-deadlines; d <= 0 || d > 200*time.Millisecond {
			t.Errorf("the call had a deadline %v away, want (0, 200ms]", d)
		}
		if elapsed := time.Since(start); elapsed > 5*time.Second {
			t.Errorf("UpsertService took %v, want about 200ms", elapsed)
		}
	})
	t.Run("caller deadline kept", func(t *testing.T) {
		c := newClient(t, srv.Target(), client.WithTimeout(200*time.Millisecond), seeDeadline)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := c.GetService(ctx, "x")
		if got := status.Code(err); got != codes.NotFound {
			t.Errorf("GetService: code %v (%v), want NotFound", got, err)
		}
		if d := <-deadlines; d < 30*time.Second {
			t.Errorf("the call had a deadline %v away, want the caller's minute", d)
		}
	})
	t.Run("zero disables", func(t *testing.T) {
		c := newClient(t, srv.Target(), client.WithTimeout(0), seeDeadline)
		if _, err := c.GetService(context.Background(), "x"); status.Code(err) != codes.NotFound {
			t.Errorf("GetService: %v, want NotFound", err)
		}
		if d := <-deadlines; d != -1 {
			t.Errorf("the call had a deadline %v away, want none", d)
		}
	})
}

// TestRetry checks which answers the client retries. vipd answers
// Unavailable when the dataplane fails an apply, so each retry of an upsert
// reaches the dataplane again.
func TestRetry(t *testing.T) {
	applyFailed := errors.New("iptables-restore: exit status 1")
	invalid := web()
	invalid.Vips = []string{"10.0.0.256"}

	for _, tc := range []struct {
		name     string
		opts     []client.Option
		failures int // applies the dataplane fails, then succeeds
		svc      *vipdv1.Service
		expected uint64 // the expected generation
		// unsaved makes saving the state fail: the change is applied, rolled
		// back, and answered with Internal.
		unsaved      bool
		wantAttempts int
		wantApplies  int
		wantCode     codes.Code
	}{
		{name: "unavailable twice then ok", failures: 2, wantAttempts: 3, wantApplies: 3, wantCode: codes.OK},
		{name: "unavailable beyond max attempts", opts: []client.Option{client.WithMaxAttempts(3)},
			failures: 4, wantAttempts: 3, wantApplies: 3, wantCode: codes.Unavailable},
		{name: "max attempts 1 disables retries", opts: []client.Option{client.WithMaxAttempts(1)},
			failures: 1, wantAttempts: 1, wantApplies: 1, wantCode: codes.Unavailable},
		{name: "more than gRPC's default cap of 5", opts: []client.Option{client.WithMaxAttempts(6)},
			failures: 5, wantAttempts: 6, wantApplies: 6, wantCode: codes.OK},
		{name: "invalid argument is not retried", svc: invalid, wantAttempts: 1, wantApplies: 0, wantCode: codes.InvalidArgument},
		{name: "aborted is not retried", expected: 7, wantAttempts: 1, wantApplies: 0, wantCode: codes.Aborted},
		{name: "internal is not retried", unsaved: true, wantAttempts: 1, wantApplies: 2, wantCode: codes.Internal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // the backoff between attempts takes seconds
			var srvOpts []testserver.Option
			if tc.unsaved {
				srvOpts = append(srvOpts, testserver.WithPersister(func(*store.Dir) reconcile.Persister { return failingSaves{} }))
			}
			srv := testserver.Start(t, srvOpts...)
			dp := srv.Dataplane()
			for range tc.failures {
				dp.FailNext(applyFailed)
			}
			svc := tc.svc
			if svc == nil {
				svc = web()
			}
			var n attempts
			opts := append([]client.Option{client.WithDialOptions(grpc.WithStatsHandler(&n))}, tc.opts...)
			c := newClient(t, srv.Target(), opts...)
			before := len(dp.Records())
			_, err := c.UpsertService(context.Background(), svc, tc.expected)
			if got := status.Code(err); got != tc.wantCode {
				t.Errorf("UpsertService: code %v (%v), want %v", got, err, tc.wantCode)
			}
			if got := n.n.Load(); got != int64(tc.wantAttempts) {
				t.Errorf("the client made %d attempts, want %d", got, tc.wantAttempts)
			}
			if got := len(dp.Records()) - before; got != tc.wantApplies {
				t.Errorf("the dataplane saw %d applies, want %d", got, tc.wantApplies)
			}
		})
	}
}

// failingSaves is a state directory whose saves all fail.
type failingSaves struct{}

func (failingSaves) Save(*store.Snapshot) error {
	return errors.New("write state: no space left on device")
}

func TestMethods(t *testing.T) {
	c := newClient(t, testserver.Start(t).Target())
	ctx := context.Background()

	svc := web()
	got, err := c.UpsertService(ctx, svc, 0)
	if err != nil {
		t.Fatalf("UpsertService: %v", err)
	}
	if got.GetGeneration() != 1 {
		t.Errorf("UpsertService generation = %d, want 1", got.GetGeneration())
	}
	if _, err := c.UpsertService(ctx, svc, 7); status.Code(err) != codes.Aborted {
		t.Errorf("UpsertService with a stale generation: %v, want Aborted", err)
	}
	if got, err = c.GetService(ctx, "default/web"); err != nil || got.GetGeneration() != 1 {
		t.Errorf("GetService = %v, %v; want generation 1", got, err)
	}
	if _, err := c.GetService(ctx, "nope"); !client.IsNotFound(err) {
		t.Errorf("GetService(nope) = %v, want NotFound", err)
	}
	invalid := web()
	invalid.Vips = []string{"10.0.0.256"}
	_, err = c.UpsertService(ctx, invalid, 0)
	wantViolations := []*errdetails.BadRequest_FieldViolation{{Field: "service.vips[0]", Description: `"10.0.0.256" is not an IP address`}}
	if diff := cmp.Diff(wantViolations, client.FieldViolations(err), protocmp.Transform()); status.Code(err) != codes.InvalidArgument || diff != "" {
		t.Errorf("UpsertService of an invalid service: %v; field violations (-want +got):\n%s", err, diff)
	}

	got, err = c.UpdateBackends(ctx, "default/web", []*vipdv1.Backend{{Ip: "10.0.0.2", Weight: 3}}, []string{"10.0.0.1"}, 1)
	if err != nil {
		t.Fatalf("UpdateBackends: %v", err)
	}
	want := []*vipdv1.Backend{{Ip: "10.0.0.2", Weight: 3, State: vipdv1.BackendState_BACKEND_STATE_READY}}
	if diff := cmp.Diff(want, got.GetBackends(), protocmp.Transform()); diff != "" {
		t.Errorf("UpdateBackends backends (-want +got):\n%s", diff)
	}

	sync, err := c.SyncServices(ctx, "ctl", []*vipdv1.Service{{
		Name: "default/dns", Vips: []string{"10.96.0.53"}, Ports: []*vipdv1.Port{{Protocol: vipdv1.Protocol_PROTOCOL_UDP, Port: 53}},
	}})
	if err != nil {
		t.Fatalf("SyncServices: %v", err)
	}
	wantSync := &vipdv1.SyncServicesResponse{Created: []string{"default/dns"}, Deleted: []string{"default/web"}}
	if diff := cmp.Diff(wantSync, sync, protocmp.Transform()); diff != "" {
		t.Errorf("SyncServices (-want +got):\n%s", diff)
	}

	if _, err := c.UpsertService(ctx, &vipdv1.Service{
		Name: "other/x", Owner: "other", Vips: []string{"10.96.0.11"}, Ports: []*vipdv1.Port{{Port: 80}},
	}, 0); err != nil {
		t.Fatal(err)
	}
	for owner, wantNames := range map[string][]string{"ctl": {"default/dns"}, "": {"default/dns", "other/x"}} {
		svcs, err := c.ListServices(ctx, owner)
		if err != nil {
			t.Fatalf("ListServices(%q): %v", owner, err)
		}
		var names []string
		for _, s := range svcs {
			names = append(names, s.GetName())
		}
		if diff := cmp.Diff(wantNames, names); diff != "" {
			t.Errorf("ListServices(%q) names (-want +got):\n%s", owner, diff)
		}
	}

	if err := c.DeleteService(ctx, "default/dns", 0); err != nil {
		t.Errorf("DeleteService: %v", err)
	}
	if err := c.DeleteService(ctx, "default/dns", 0); !client.IsNotFound(err) {
		t.Errorf("second DeleteService = %v, want NotFound", err)
	}

	st, err := c.Status(ctx)
	if err != nil || st.GetServices() != 1 {
		t.Errorf("Status = %v, %v; want 1 service", st, err)
	}
	h, err := c.Health(ctx)
	if err != nil || h != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("Health = %v, %v; want SERVING", h, err)
	}
	if err := c.WaitServing(ctx); err != nil {
		t.Errorf("WaitServing = %v", err)
	}

	// The raw clients share the connection.
	if _, err := c.LoadBalancerClient().ListServices(ctx, &vipdv1.ListServicesRequest{}); err != nil {
		t.Errorf("LoadBalancerClient().ListServices: %v", err)
	}
	if _, err := c.StatusClient().GetStatus(ctx, &vipdv1.GetStatusRequest{}); err != nil {
		t.Errorf("StatusClient().GetStatus: %v", err)
	}
	if _, err := c.HealthClient().Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("HealthClient().Check: %v", err)
	}
}

// TestDialOptions checks that extra dial options reach gRPC, here a bufconn
// dialer as a test of another package might use.
func TestDialOptions(t *testing.T) {
	l := bufconn.Listen(1 << 20)
	testserver.Start(t, testserver.WithListener(l))
	c := newClient(t, "passthrough:///bufnet", client.WithDialOptions(
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return l.DialContext(ctx) }),
	))
	if _, err := c.Status(context.Background()); err != nil {
		t.Errorf("Status over bufconn: %v", err)
	}
}

func TestFieldViolations(t *testing.T) {
	fv := []*errdetails.BadRequest_FieldViolation{
		{Field: "service.vips[0]", Description: `"10.0.0.256" is not an IP address`},
		{Field: "service.ports[1].port", Description: "must be 1-65535"},
	}
	st, err := status.New(codes.InvalidArgument, "invalid service").WithDetails(&errdetails.BadRequest{FieldViolations: fv})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		err  error
		want []*errdetails.BadRequest_FieldViolation
	}{
		{"nil", nil, nil},
		{"plain error", errors.New("boom"), nil},
		{"status without details", status.Error(codes.InvalidArgument, "bad"), nil},
		{"bad request", st.Err(), fv},
		{"wrapped bad request", fmt.Errorf("apply service web: %w", st.Err()), fv},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, client.FieldViolations(tc.err), protocmp.Transform()); diff != "" {
				t.Errorf("FieldViolations (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSyncServicesStream: the client sends a list longer than a chunk in
// chunks of SyncChunk, and vipd syncs it as one list; an invalid service
// in a later chunk fails it all, naming the service by its place in the
// list.
func TestSyncServicesStream(t *testing.T) {
	srv := testserver.Start(t)
	c := newClient(t, srv.Target())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n := 2*client.SyncChunk + 10
	svcs := make([]*vipdv1.Service, n)
	for i := range svcs {
		svcs[i] = &vipdv1.Service{
			Name:  fmt.Sprintf("default/s%04d", i),
			Vips:  []string{fmt.Sprintf("198.19.%d.%d", i/250, i%250+1)},
			Ports: []*vipdv1.Port{{Port: 80}},
		}
	}
	bad := proto.Clone(svcs[n-1]).(*vipdv1.Service)
	bad.Vips = []string{"10.0.0.256"}
	_, err := c.SyncServicesStream(ctx, "ctl", append(slices.Clone(svcs[:n-1]), bad))
	if status.Code(err) != codes.InvalidArgument || len(client.FieldViolations(err)) != 1 ||
		client.FieldViolations(err)[0].Field != fmt.Sprintf("services[%d].vips[0]", n-1) {
		t.Fatalf("SyncServicesStream with an invalid last service: %v, want InvalidArgument naming services[%d].vips[0]", err, n-1)
	}
	if got, err := c.ListServices(ctx, "ctl"); err != nil || len(got) != 0 {
		t.Fatalf("after a refused stream: %d services (%v), want none", len(got), err)
	}

	resp, err := c.SyncServicesStream(ctx, "ctl", svcs)
	if err != nil {
		t.Fatalf("SyncServicesStream: %v", err)
	}
	if len(resp.GetCreated()) != n {
		t.Errorf("created %d services, want %d", len(resp.GetCreated()), n)
	}
	if got, err := c.ListServices(ctx, "ctl"); err != nil || len(got) != n {
		t.Errorf("ListServices after the stream: %d services (%v), want %d", len(got), err, n)
	}
}
