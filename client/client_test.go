package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vipd/vipd/client"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
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

func TestTargetForms(t *testing.T) {
	m := newMemServer()
	sock := startUnix(t, m)
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(serve(m, tcp))

	for _, target := range []string{
		"unix://" + sock,
		"unix:" + sock,
		sock,
		tcp.Addr().String(),
		"dns:///" + tcp.Addr().String(),
	} {
		t.Run(target, func(t *testing.T) {
			c := newClient(t, target)
			st, err := c.Status(context.Background())
			if err != nil {
				t.Fatalf("Status: %v", err)
			}
			if st.GetDataplane() != "fake" {
				t.Errorf("Status().Dataplane = %q, want fake", st.GetDataplane())
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

func TestDefaultDeadline(t *testing.T) {
	m := newMemServer()
	sock := startUnix(t, m)
	// deadlines receives how far away the handler's deadline was, or -1 for none.
	deadlines := make(chan time.Duration, 1)
	m.setHook(func(ctx context.Context, _ string) error {
		d, ok := ctx.Deadline()
		if !ok {
			deadlines <- -1
			return nil
		}
		deadlines <- time.Until(d)
		if time.Until(d) < time.Second {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	})

	t.Run("applied without a caller deadline", func(t *testing.T) {
		c := newClient(t, sock, client.WithTimeout(200*time.Millisecond))
		start := time.Now()
		_, err := c.GetService(context.Background(), "x")
		if got := status.Code(err); got != codes.DeadlineExceeded {
			t.Errorf("GetService: code %v (%v), want DeadlineExceeded", got, err)
		}
		if d := <-deadlines; d <= 0 || d > 200*time.Millisecond {
			t.Errorf("server saw a deadline %v away, want (0, 200ms]", d)
		}
		if elapsed := time.Since(start); elapsed > 5*time.Second {
			t.Errorf("GetService took %v, want about 200ms", elapsed)
		}
	})
	t.Run("caller deadline kept", func(t *testing.T) {
		c := newClient(t, sock, client.WithTimeout(200*time.Millisecond))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := c.GetService(ctx, "x")
		if got := status.Code(err); got != codes.NotFound {
			t.Errorf("GetService: code %v (%v), want NotFound", got, err)
		}
		if d := <-deadlines; d < 30*time.Second {
			t.Errorf("server saw a deadline %v away, want the caller's minute", d)
		}
	})
	t.Run("zero disables", func(t *testing.T) {
		c := newClient(t, sock, client.WithTimeout(0))
		if _, err := c.GetService(context.Background(), "x"); status.Code(err) != codes.NotFound {
			t.Errorf("GetService: %v, want NotFound", err)
		}
		if d := <-deadlines; d != -1 {
			t.Errorf("server saw a deadline %v away, want none", d)
		}
	})
}

func TestRetry(t *testing.T) {
	invalid, err := status.New(codes.InvalidArgument, "invalid service").WithDetails(&errdetails.BadRequest{
		FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "service.vips[0]", Description: `"10.0.0.256" is not an IP address`}},
	})
	if err != nil {
		t.Fatal(err)
	}
	unavailable := status.Error(codes.Unavailable, "dataplane: iptables-restore failed; the change was rolled back")

	for _, tc := range []struct {
		name         string
		opts         []client.Option
		errs         []error // the server's answers to successive attempts, then OK
		wantAttempts int
		wantCode     codes.Code
	}{
		{name: "unavailable twice then ok", errs: []error{unavailable, unavailable}, wantAttempts: 3, wantCode: codes.OK},
		{name: "unavailable beyond max attempts", opts: []client.Option{client.WithMaxAttempts(3)},
			errs: []error{unavailable, unavailable, unavailable, unavailable}, wantAttempts: 3, wantCode: codes.Unavailable},
		{name: "max attempts 1 disables retries", opts: []client.Option{client.WithMaxAttempts(1)},
			errs: []error{unavailable}, wantAttempts: 1, wantCode: codes.Unavailable},
		{name: "more than gRPC's default cap of 5", opts: []client.Option{client.WithMaxAttempts(6)},
			errs: []error{unavailable, unavailable, unavailable, unavailable, unavailable}, wantAttempts: 6, wantCode: codes.OK},
		{name: "invalid argument is not retried", errs: []error{invalid.Err()}, wantAttempts: 1, wantCode: codes.InvalidArgument},
		{name: "aborted is not retried", errs: []error{status.Error(codes.Aborted, "generation mismatch")}, wantAttempts: 1, wantCode: codes.Aborted},
		{name: "internal is not retried", errs: []error{status.Error(codes.Internal, "save failed")}, wantAttempts: 1, wantCode: codes.Internal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // the backoff between attempts takes seconds
			m := newMemServer()
			errs := tc.errs
			m.setHook(func(context.Context, string) error {
				if len(errs) == 0 {
					return nil
				}
				err := errs[0]
				errs = errs[1:]
				return err
			})
			c := newClient(t, startUnix(t, m), tc.opts...)
			_, err := c.UpsertService(context.Background(), &vipdv1.Service{Name: "web"}, 0)
			if got := status.Code(err); got != tc.wantCode {
				t.Errorf("UpsertService: code %v (%v), want %v", got, err, tc.wantCode)
			}
			if got := m.callCount("UpsertService"); got != tc.wantAttempts {
				t.Errorf("server saw %d attempts, want %d", got, tc.wantAttempts)
			}
		})
	}
}

func TestMethods(t *testing.T) {
	m := newMemServer()
	c := newClient(t, startUnix(t, m))
	ctx := context.Background()

	web := &vipdv1.Service{
		Name: "default/web", Owner: "ctl", Vips: []string{"10.96.0.10"},
		Ports:    []*vipdv1.Port{{Name: "http", Port: 80, TargetPort: 8080}},
		Backends: []*vipdv1.Backend{{Ip: "10.0.0.1"}},
	}
	got, err := c.UpsertService(ctx, web, 0)
	if err != nil {
		t.Fatalf("UpsertService: %v", err)
	}
	if got.GetGeneration() != 1 {
		t.Errorf("UpsertService generation = %d, want 1", got.GetGeneration())
	}
	if _, err := c.UpsertService(ctx, web, 7); status.Code(err) != codes.Aborted {
		t.Errorf("UpsertService with a stale generation: %v, want Aborted", err)
	}
	if got, err = c.GetService(ctx, "default/web"); err != nil || got.GetGeneration() != 1 {
		t.Errorf("GetService = %v, %v; want generation 1", got, err)
	}
	if _, err := c.GetService(ctx, "nope"); !client.IsNotFound(err) {
		t.Errorf("GetService(nope) = %v, want NotFound", err)
	}

	got, err = c.UpdateBackends(ctx, "default/web", []*vipdv1.Backend{{Ip: "10.0.0.2", Weight: 3}}, []string{"10.0.0.1"}, 1)
	if err != nil {
		t.Fatalf("UpdateBackends: %v", err)
	}
	want := []*vipdv1.Backend{{Ip: "10.0.0.2", Weight: 3}}
	if diff := cmp.Diff(want, got.GetBackends(), protocmp.Transform()); diff != "" {
		t.Errorf("UpdateBackends backends (-want +got):\n%s", diff)
	}

	sync, err := c.SyncServices(ctx, "ctl", []*vipdv1.Service{{Name: "default/dns", Vips: []string{"10.96.0.53"}}})
	if err != nil {
		t.Fatalf("SyncServices: %v", err)
	}
	wantSync := &vipdv1.SyncServicesResponse{Created: []string{"default/dns"}, Deleted: []string{"default/web"}}
	if diff := cmp.Diff(wantSync, sync, protocmp.Transform()); diff != "" {
		t.Errorf("SyncServices (-want +got):\n%s", diff)
	}

	if _, err := c.UpsertService(ctx, &vipdv1.Service{Name: "other/x", Owner: "other"}, 0); err != nil {
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
	t.Cleanup(serve(newMemServer(), l))
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
