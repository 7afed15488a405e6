package kubeadapter_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/kubeadapter"
	"github.com/vipd/vipd/internal/testkit/testserver"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// gated is the vipd client with holds a test switches: watches holds
// every new health Watch before it reaches vipd, as if the adapter's
// watcher were waiting to reconnect; answers holds what the open health
// streams receive; syncs holds every SyncServices.
type gated struct {
	*client.Client
	mu      sync.Mutex
	watches chan struct{} // nil: open; else closed when released
	answers chan struct{}
	syncs   chan struct{}
}

func (g *gated) hold(which *chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	*which = make(chan struct{})
}

func (g *gated) release(which *chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if *which != nil {
		close(*which)
		*which = nil
	}
}

func (g *gated) wait(ctx context.Context, which *chan struct{}) error {
	g.mu.Lock()
	c := *which
	g.mu.Unlock()
	if c == nil {
		return nil
	}
	select {
	case <-c:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *gated) HealthClient() healthpb.HealthClient {
	return gatedHealth{HealthClient: g.Client.HealthClient(), g: g}
}

func (g *gated) SyncServices(ctx context.Context, owner string, svcs []*vipdv1.Service) (*vipdv1.SyncServicesResponse, error) {
	if err := g.wait(ctx, &g.syncs); err != nil {
		return nil, err
	}
	return g.Client.SyncServices(ctx, owner, svcs)
}

type gatedHealth struct {
	healthpb.HealthClient
	g *gated
}

func (h gatedHealth) Watch(ctx context.Context, in *healthpb.HealthCheckRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[healthpb.HealthCheckResponse], error) {
	if err := h.g.wait(ctx, &h.g.watches); err != nil {
		return nil, err
	}
	s, err := h.HealthClient.Watch(ctx, in, opts...)
	if err != nil {
		return nil, err
	}
	return gatedStream{ServerStreamingClient: s, ctx: ctx, g: h.g}, nil
}

type gatedStream struct {
	grpc.ServerStreamingClient[healthpb.HealthCheckResponse]
	ctx context.Context
	g   *gated
}

// Recv passes on an answer, or the stream's end, only while answers are
// not held.
func (s gatedStream) Recv() (*healthpb.HealthCheckResponse, error) {
	resp, err := s.ServerStreamingClient.Recv()
	if werr := s.g.wait(s.ctx, &s.g.answers); werr != nil {
		return nil, werr
	}
	return resp, err
}

// healthz asks the adapter's /healthz.
func healthz(t *testing.T, a *kubeadapter.Adapter) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	a.Healthz().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	var b struct{ Reason string }
	if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil {
		t.Fatalf("healthz body %q: %v", rec.Body.String(), err)
	}
	return rec.Code, b.Reason
}

func waitHealthz(t *testing.T, a *kubeadapter.Adapter, code int, reason string) {
	t.Helper()
	eventually(t, fmt.Sprintf("/healthz %d %q", code, reason), func() error {
		if got, why := healthz(t, a); got != code || !strings.Contains(why, reason) {
			return fmt.Errorf("/healthz %d %q", got, why)
		}
		return nil
	})
}

// instanceOf is the instance ID vipd reports, once the client reaches it.
func (e *env) instanceOf(srv *testserver.Server) string {
	e.t.Helper()
	want := srv.API().InstanceID()
	eventually(e.t, "the client reaches the new vipd", func() error {
		st, err := e.vipd.Status(context.Background())
		if err != nil {
			return err
		}
		if st.GetInstanceId() != want {
			return fmt.Errorf("vipd is instance %q, want %q", st.GetInstanceId(), want)
		}
		return nil
	})
	return want
}

func twoServices() ([]runtime.Object, map[string]string) {
	var objs []runtime.Object
	objs = append(objs, simple("shop", "web", "198.19.0.10", "198.18.1.1")...)
	objs = append(objs, simple("shop", "api", "198.19.0.11", "198.18.1.2")...)
	return objs, map[string]string{
		"shop/web": simpleSummary("198.19.0.10", "198.18.1.1"),
		"shop/api": simpleSummary("198.19.0.11", "198.18.1.2"),
	}
}

// TestVIPDRestartsTwiceInsideReconnectWait is issue 19's bug: vipd
// restarts twice while the adapter's health watch waits to reconnect,
// first with its state (the adapter's full sync after the first restart
// reaches it) and then without. The watch, once back, sees an instance it
// has not synced: /healthz fails at once, and a full sync gives the empty
// vipd every Service.
func TestVIPDRestartsTwiceInsideReconnectWait(t *testing.T) {
	objs, want := twoServices()
	e := newEnv(t, objs...)
	stateDir := t.TempDir()
	e.setServer(testserver.Start(t, testserver.WithStateDir(stateDir)))
	g := &gated{}
	e.wrap = func(c *client.Client) kubeadapter.VIPD { g.Client = c; return g }
	a := e.start(kubeadapter.WithFullSyncPeriod(0))
	e.waitState(want)
	waitHealthz(t, a.Adapter, http.StatusOK, "")

	// From now on the watch cannot reconnect: the restarts happen inside
	// its wait.
	g.hold(&g.watches)
	syncs := e.calls.get("SyncServices")
	if err := e.srv.Close(); err != nil {
		t.Fatal(err)
	}
	e.setServer(testserver.Start(t, testserver.WithStateDir(stateDir)))
	e.instanceOf(e.srv)
	e.waitState(want)
	// The first restart is handled: a full sync reached the restarted vipd.
	eventually(t, "a full sync with the first restarted vipd", func() error {
		if n := e.calls.get("SyncServices"); n <= syncs {
			return fmt.Errorf("SyncServices calls: %d, as before the restart", n)
		}
		return nil
	})
	waitHealthz(t, a.Adapter, http.StatusOK, "")

	// The second restart, without state.
	if err := e.srv.Close(); err != nil {
		t.Fatal(err)
	}
	e.setServer(testserver.Start(t))
	id := e.instanceOf(e.srv)
	if got := e.state(); len(got) != 0 {
		t.Fatalf("the vipd restarted without state has %v", got)
	}
	g.hold(&g.syncs)
	g.release(&g.watches)
	// Not healthy while the new vipd is empty...
	waitHealthz(t, a.Adapter, http.StatusServiceUnavailable, "vipd restarted (instance "+id)
	// ...until the full sync succeeds.
	g.release(&g.syncs)
	e.waitState(want)
	waitHealthz(t, a.Adapter, http.StatusOK, "")
	// And the adapter keeps up with changes after that.
	e.updateSlice(slice("shop", "web", "web-a", v4, ports(slicePort("", corev1.ProtocolTCP, 8080)), endpoint("198.18.1.5", ready, "")))
	want["shop/web"] = simpleSummary("198.19.0.10", "198.18.1.5")
	e.waitState(want)
}

// TestPassAfterUnseenRestartIsFull: a restart the health watch has not
// reported (it cannot reconnect) is found before the next pass's writes,
// which then are a full sync: a change to one Service gives the empty
// vipd every Service.
func TestPassAfterUnseenRestartIsFull(t *testing.T) {
	objs, want := twoServices()
	e := newEnv(t, objs...)
	g := &gated{}
	e.wrap = func(c *client.Client) kubeadapter.VIPD { g.Client = c; return g }
	a := e.start(kubeadapter.WithFullSyncPeriod(0))
	e.waitState(want)
	waitHealthz(t, a.Adapter, http.StatusOK, "")

	// The watcher hears nothing of the restart.
	g.hold(&g.watches)
	g.hold(&g.answers)
	if err := e.srv.Close(); err != nil {
		t.Fatal(err)
	}
	e.setServer(testserver.Start(t))
	e.instanceOf(e.srv)
	e.updateSlice(slice("shop", "web", "web-a", v4, ports(slicePort("", corev1.ProtocolTCP, 8080)), endpoint("198.18.1.5", ready, "")))
	want["shop/web"] = simpleSummary("198.19.0.10", "198.18.1.5")
	e.waitState(want)
	waitHealthz(t, a.Adapter, http.StatusOK, "")
}
