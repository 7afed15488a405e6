package server_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/fake"
	"github.com/vipd/vipd/internal/testkit/testserver"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server"
	"github.com/vipd/vipd/server/authz"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// identityKey is request metadata that the tests' own interceptor turns
// into an authz.Principal, standing in for a client certificate
// (internal/daemon's tests cover the certificates themselves).
const identityKey = "x-test-identity"

func withTestIdentities(policy *authz.Policy) server.Option {
	attach := func(ctx context.Context) context.Context {
		if ids := metadata.ValueFromIncomingContext(ctx, identityKey); len(ids) == 1 {
			return authz.NewContext(ctx, authz.NewPrincipal(ids[0], policy))
		}
		return ctx
	}
	return server.WithInterceptors(
		[]grpc.UnaryServerInterceptor{func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			return h(attach(ctx), req)
		}}, nil)
}

func as(t *testing.T, id string) context.Context {
	return metadata.AppendToOutgoingContext(ctxT(t), identityKey, id)
}

// blockNextApply makes the fake's next Apply wait until the returned
// function is called; entered is signalled when it starts waiting.
func blockNextApply(t *testing.T, dp *fake.Dataplane) (entered <-chan struct{}, release func()) {
	in, gate := make(chan struct{}), make(chan struct{})
	var once, releaseOnce sync.Once
	dp.SetHook(func(context.Context, *dataplane.State) error {
		once.Do(func() {
			close(in)
			<-gate
		})
		return nil
	})
	release = func() { releaseOnce.Do(func() { close(gate) }) }
	// Released at the latest before the instance stops (cleanups run last
	// first), so that a failed test cannot leave its stop waiting for the
	// blocked apply.
	t.Cleanup(release)
	return in, release
}

// TestOwnerCheckIsAtomicWithTheChange checks that an owner check cannot be
// raced: while an admin's change of a service's owner is being applied,
// calls by the old owner's controller are already queued behind it. They
// must be judged against the new owner (denied), not against the owner
// they saw when they arrived.
func TestOwnerCheckIsAtomicWithTheChange(t *testing.T) {
	policy, err := authz.Parse([]byte("ctrl-a: [team-a]\nadmin: \"*\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	dp := fake.New()
	in := start(t, config{dp: dp, serverOps: []server.Option{withTestIdentities(policy)}})
	upsert(t, in, &vipdv1.Service{Name: "s", Owner: "team-a", Vips: []string{"198.19.0.1"}, Ports: []*vipdv1.Port{{Port: 80}},
		Backends: []*vipdv1.Backend{{Ip: "198.18.1.1"}}})

	entered, release := blockNextApply(t, dp)
	adminDone := make(chan error, 1)
	go func() {
		_, err := in.lb.UpsertService(as(t, "admin"), &vipdv1.UpsertServiceRequest{Service: &vipdv1.Service{
			Name: "s", Owner: "team-b", Vips: []string{"198.19.0.1"}, Ports: []*vipdv1.Port{{Port: 80}}}, TakeOwnership: true})
		adminDone <- err
	}()
	<-entered
	// The admin's change is in the dataplane; the controller's calls come
	// in now, while the stored owner still reads team-a.
	calls := map[string]func() error{
		"UpsertService": func() error {
			_, err := in.lb.UpsertService(as(t, "ctrl-a"), &vipdv1.UpsertServiceRequest{Service: &vipdv1.Service{
				Name: "s", Owner: "team-a", Vips: []string{"198.19.0.1"}, Ports: []*vipdv1.Port{{Port: 80}}}})
			return err
		},
		"UpdateBackends": func() error {
			_, err := in.lb.UpdateBackends(as(t, "ctrl-a"), &vipdv1.UpdateBackendsRequest{Name: "s", Upsert: []*vipdv1.Backend{{Ip: "198.18.1.2"}}})
			return err
		},
		"DeleteService": func() error {
			_, err := in.lb.DeleteService(as(t, "ctrl-a"), &vipdv1.DeleteServiceRequest{Name: "s"})
			return err
		},
	}
	results := make(map[string]chan error)
	for name, call := range calls {
		res := make(chan error, 1)
		results[name] = res
		go func() { res <- call() }()
	}
	time.Sleep(100 * time.Millisecond) // let them queue behind the admin's change
	release()
	if err := <-adminDone; err != nil {
		t.Fatalf("admin's upsert: %v", err)
	}
	for name, res := range results {
		t.Run(name, func(t *testing.T) {
			wantCode(t, <-res, codes.PermissionDenied, `"ctrl-a"`, `owner "team-b"`)
		})
	}
	got, err := in.lb.GetService(ctxT(t), &vipdv1.GetServiceRequest{Name: "s"})
	if err != nil || got.Service.GetOwner() != "team-b" || len(got.Service.GetBackends()) != 0 {
		t.Fatalf("service after the race: %v %v; want the admin's, owner team-b without backends", got, err)
	}
}

// TestMaxInflightRequests checks the global limit at its edge: with the
// limit's worth of calls in progress, one more is refused at once with
// ResourceExhausted (health checks and GetStatus are not), and the calls
// within the limit all succeed.
func TestMaxInflightRequests(t *testing.T) {
	const limit = 3
	dp := fake.New()
	in := start(t, config{dp: dp, serverOps: []server.Option{server.WithMaxInflightRequests(limit)}})
	entered, release := blockNextApply(t, dp)
	done := make(chan error, limit)
	for i := range limit {
		go func() {
			_, err := in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: web(fmt.Sprintf("s%d", i), fmt.Sprintf("198.19.0.%d", i+1))})
			done <- err
		}()
	}
	<-entered
	// The limit's calls are in progress once one more is refused; until
	// then some may not have reached the server yet (on a loaded 2-CPU
	// machine running the race detector, that can take seconds).
	deadline := time.Now().Add(30 * time.Second)
	for {
		start := time.Now()
		_, err := in.lb.ListServices(ctxT(t), &vipdv1.ListServicesRequest{})
		if status.Code(err) == codes.ResourceExhausted {
			if d := time.Since(start); d > time.Second {
				t.Errorf("the refusal took %v; it must come at once", d)
			}
			wantCode(t, err, codes.ResourceExhausted, "--max-inflight-requests")
			break
		}
		if err != nil {
			t.Fatalf("call beyond the limit: %v; want ResourceExhausted", err)
		}
		if time.Now().After(deadline) {
			var finished []error
			for len(done) > 0 {
				finished = append(finished, <-done)
			}
			t.Fatalf("calls beyond the limit of %d still succeed after 30 s; the limit's upserts should be in progress, but %d of them returned: %v", limit, len(finished), finished)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := in.lb.GetService(ctxT(t), &vipdv1.GetServiceRequest{Name: "s0"}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("GetService beyond the limit: %v", err)
	}
	if st, err := in.health.Check(ctxT(t), &healthpb.HealthCheckRequest{}); err != nil || st.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health check at the limit: %v %v", st, err)
	}
	if _, err := in.status.GetStatus(ctxT(t), &vipdv1.GetStatusRequest{}); err != nil {
		t.Fatalf("GetStatus at the limit: %v", err)
	}
	release()
	for range limit {
		if err := <-done; err != nil {
			t.Errorf("a call within the limit: %v", err)
		}
	}
	if resp, err := in.lb.ListServices(ctxT(t), &vipdv1.ListServicesRequest{}); err != nil || len(resp.Services) != limit {
		t.Fatalf("after the limit's calls ended: %v %v", resp, err)
	}
}

// watch opens a WatchFlows stream on conn and reports whether vipd
// subscribed it (it sends headers once subscribed); a refused stream's
// error is returned.
func watch(ctx context.Context, conn *grpc.ClientConn) (grpc.ServerStreamingClient[vipdv1.WatchFlowsResponse], error) {
	s, err := vipdv1.NewFlowServiceClient(conn).WatchFlows(ctx, &vipdv1.WatchFlowsRequest{})
	if err != nil {
		return nil, err
	}
	md, err := s.Header()
	if err != nil {
		return nil, err
	}
	if md == nil {
		// Ended without headers: the status comes with Recv.
		_, err := s.Recv()
		return nil, err
	}
	return s, nil
}

func waitSubscribers(t *testing.T, srv *testserver.Server, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for srv.Flows().Subscribers() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d WatchFlows subscribers, want %d", srv.Flows().Subscribers(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestMaxFlowWatchers checks the WatchFlows limit at its edge: the limit's
// streams, over several connections, are subscribed; one more gets
// ResourceExhausted; once one ends, another may start.
func TestMaxFlowWatchers(t *testing.T) {
	const limit = 3
	env := startFlows(t, testserver.WithServerOptions(server.WithMaxFlowWatchers(limit)))
	before := env.srv.Flows().Subscribers()
	conns := []*grpc.ClientConn{env.dial(t), env.dial(t)}
	var cancels []context.CancelFunc
	for i := range limit {
		ctx, cancel := context.WithCancel(ctxT(t))
		cancels = append(cancels, cancel)
		if _, err := watch(ctx, conns[i%2]); err != nil {
			t.Fatalf("stream %d of %d: %v", i+1, limit, err)
		}
	}
	waitSubscribers(t, env.srv, before+limit)
	for _, conn := range conns {
		_, err := watch(ctxT(t), conn)
		wantCode(t, err, codes.ResourceExhausted, "--max-flow-watchers")
	}
	if env.srv.Flows().Subscribers() != before+limit {
		t.Fatalf("refused streams subscribed: %d", env.srv.Flows().Subscribers())
	}
	// Other calls are not limited by it.
	if _, err := env.flows.ListFlows(ctxT(t), &vipdv1.ListFlowsRequest{}); err != nil {
		t.Fatalf("ListFlows at the watcher limit: %v", err)
	}
	cancels[0]()
	waitSubscribers(t, env.srv, before+limit-1)
	deadline := time.Now().Add(5 * time.Second)
	for {
		// The limit is released when the handler returns, just after the
		// unsubscription.
		_, err := watch(ctxT(t), conns[0])
		if err == nil {
			break
		}
		if status.Code(err) != codes.ResourceExhausted || time.Now().After(deadline) {
			t.Fatalf("a stream after one ended: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, c := range cancels {
		c()
	}
}

// TestMaxConcurrentStreams checks the per-connection limit at its edge: a
// connection with the limit's calls open waits to start one more (HTTP/2
// flow control: the call is not refused, it waits), while another
// connection is not affected; when one call ends, the waiting one starts.
func TestMaxConcurrentStreams(t *testing.T) {
	const limit = 2
	env := startFlows(t, testserver.WithServerOptions(server.WithMaxConcurrentStreams(limit)))
	before := env.srv.Flows().Subscribers()
	conn := env.dial(t)
	var cancels []context.CancelFunc
	for i := range limit {
		ctx, cancel := context.WithCancel(ctxT(t))
		cancels = append(cancels, cancel)
		if _, err := watch(ctx, conn); err != nil {
			t.Fatalf("stream %d of %d: %v", i+1, limit, err)
		}
	}
	waitSubscribers(t, env.srv, before+limit)

	ctx, cancel := context.WithTimeout(ctxT(t), 300*time.Millisecond)
	_, err := watch(ctx, conn)
	cancel()
	wantCode(t, err, codes.DeadlineExceeded)
	if _, err := vipdv1.NewStatusServiceClient(conn).GetStatus(ctx300(t), &vipdv1.GetStatusRequest{}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a unary call on the full connection: %v, want it to wait", err)
	}
	if n := env.srv.Flows().Subscribers(); n != before+limit {
		t.Fatalf("%d subscribers, want %d", n, before+limit)
	}
	// Another connection is not affected.
	other := env.dial(t)
	ctx, cancelOther := context.WithCancel(ctxT(t))
	defer cancelOther()
	if _, err := watch(ctx, other); err != nil {
		t.Fatalf("a stream on another connection: %v", err)
	}

	waiting := make(chan error, 1)
	go func() {
		_, err := vipdv1.NewStatusServiceClient(conn).GetStatus(ctxT(t), &vipdv1.GetStatusRequest{})
		waiting <- err
	}()
	select {
	case err := <-waiting:
		t.Fatalf("a call beyond the connection's limit did not wait: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	cancels[0]()
	select {
	case err := <-waiting:
		if err != nil {
			t.Fatalf("the waiting call, once a stream ended: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting call did not start when a stream ended")
	}
	for _, c := range cancels {
		c()
	}
}

func ctx300(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	t.Cleanup(cancel)
	return ctx
}

// TestLimitOptionsRejectNegative checks that a negative limit is a
// configuration error rather than a server that refuses everything (0
// means no limit).
func TestLimitOptionsRejectNegative(t *testing.T) {
	for name, opt := range map[string]server.Option{
		"inflight": server.WithMaxInflightRequests(-1),
		"watchers": server.WithMaxFlowWatchers(-1),
		"recv":     server.WithMaxRecvMsgSize(-1),
	} {
		if _, err := testserver.New(testserver.WithServerOptions(opt)); err == nil {
			t.Errorf("%s: a negative limit was accepted", name)
		}
	}
}

// TestLimitOptionsZeroIsUnlimited checks that 0 means no limit for every
// limit option, as the --max-* flags document: the server starts, and a
// call gets through (a zero receive size would refuse every request body).
func TestLimitOptionsZeroIsUnlimited(t *testing.T) {
	in := start(t, config{serverOps: []server.Option{
		server.WithMaxConcurrentStreams(0),
		server.WithMaxInflightRequests(0),
		server.WithMaxFlowWatchers(0),
		server.WithMaxRecvMsgSize(0),
	}})
	if _, err := in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: web("s", "198.19.0.1", "198.18.0.1")}); err != nil {
		t.Fatalf("a call with every limit 0 (no limit): %v", err)
	}
}
