package kubeadapter_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/internal/kubeadapter"
	"github.com/vipd/vipd/internal/testkit/testserver"
	"github.com/vipd/vipd/server/validation"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// createAll creates the Services and EndpointSlices objs.
func (e *env) createAll(objs []runtime.Object) {
	e.t.Helper()
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.Service:
			e.createService(o)
		case *discoveryv1.EndpointSlice:
			e.createSlice(o)
		}
	}
}

// TestVIPReusedInOnePass: a Service deleted and a new one taking its
// cluster IP, seen in the same pass (the new one sorts first), end with
// the new one programmed: a pass deletes before it creates.
func TestVIPReusedInOnePass(t *testing.T) {
	e := newEnv(t, simple("shop", "b", "198.19.0.10", "198.18.1.1")...)
	a := e.start(kubeadapter.WithMinSyncPeriod(time.Second), kubeadapter.WithFullSyncPeriod(0))
	e.waitState(map[string]string{"shop/b": simpleSummary("198.19.0.10", "198.18.1.1")})
	// Within the min sync period after the full sync: one pass takes both.
	e.deleteService("shop", "b")
	e.deleteSlice("shop", "b-a")
	e.createAll(simple("shop", "a", "198.19.0.10", "198.18.1.2"))
	e.waitState(map[string]string{"shop/a": simpleSummary("198.19.0.10", "198.18.1.2")})
	waitMetric(t, a.reg, 0, "vipd_k8s_services_left_out", "reason", kubeadapter.ReasonConflict)
	if n := e.calls.get(createOnly); n != 1 {
		t.Errorf("creates: %d, want 1 (no refused create of shop/a)", n)
	}
}

// TestOverLimitIsLeftOut: with more Services than vipd's --max-services,
// the full sync programs what fits, leaves the rest out as over-limit and
// succeeds (/healthz 200); a deleted Service makes room for one left out.
func TestOverLimitIsLeftOut(t *testing.T) {
	var objs []runtime.Object
	objs = append(objs, simple("shop", "a", "198.19.0.10", "198.18.1.1")...)
	objs = append(objs, simple("shop", "b", "198.19.0.11", "198.18.1.2")...)
	objs = append(objs, simple("shop", "c", "198.19.0.12", "198.18.1.3")...)
	e := newEnv(t, objs...)
	e.setServer(testserver.Start(t, testserver.WithLimits(validation.Limits{MaxServices: 2})))
	a := e.start(kubeadapter.WithHealthTimeout(200*time.Millisecond), kubeadapter.WithFullSyncPeriod(0))
	srv := httptest.NewServer(a.Healthz())
	t.Cleanup(srv.Close)
	eventually(t, "healthz 200", func() error {
		resp, err := http.Get(srv.URL + "/healthz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return &statusErr{resp.StatusCode}
		}
		return nil
	})
	waitMetric(t, a.reg, 1, "vipd_k8s_syncs_total", "kind", "full", "result", "ok")
	waitMetric(t, a.reg, 1, "vipd_k8s_services_left_out", "reason", kubeadapter.ReasonOverLimit)
	if v, _ := metric(t, a.reg, "vipd_k8s_syncs_total", "kind", "full", "result", "error"); v != 0 {
		t.Errorf("failed full syncs: %v", v)
	}
	e.waitState(map[string]string{
		"shop/a": simpleSummary("198.19.0.10", "198.18.1.1"),
		"shop/b": simpleSummary("198.19.0.11", "198.18.1.2"),
	})
	// Room is made: the Service left out goes in.
	e.deleteService("shop", "a")
	e.waitState(map[string]string{
		"shop/b": simpleSummary("198.19.0.11", "198.18.1.2"),
		"shop/c": simpleSummary("198.19.0.12", "198.18.1.3"),
	})
	waitMetric(t, a.reg, 0, "vipd_k8s_services_left_out", "reason", kubeadapter.ReasonOverLimit)
}

type statusErr struct{ code int }

func (e *statusErr) Error() string { return http.StatusText(e.code) }

// TestPeriodicFullSyncUnderLoad: the periodic full sync runs even while
// changes keep coming faster than vipd applies them, so that there is
// always work when a pass ends.
func TestPeriodicFullSyncUnderLoad(t *testing.T) {
	e := newEnv(t, simple("shop", "web", "198.19.0.10", "198.18.1.1")...)
	a := e.start(kubeadapter.WithFullSyncPeriod(150 * time.Millisecond))
	e.waitState(map[string]string{"shop/web": simpleSummary("198.19.0.10", "198.18.1.1")})
	// Every apply takes 20ms; the backend changes every 2ms, to a new one.
	e.srv.Dataplane().SetHook(func(ctx context.Context, _ *dataplane.State) error {
		return sleepCtx(ctx, 20*time.Millisecond)
	})
	full, _ := metric(t, a.reg, "vipd_k8s_syncs_total", "kind", "full", "result", "ok")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			ip := fmt.Sprintf("198.18.%d.%d", 2+i/250%10, 1+i%250)
			sl := slice("shop", "web", "web-a", v4, ports(slicePort("", corev1.ProtocolTCP, 8080)), endpoint(ip, ready, ""))
			e.kube.DiscoveryV1().EndpointSlices("shop").Update(ctx, sl, metav1.UpdateOptions{})
			time.Sleep(2 * time.Millisecond)
		}
	}()
	time.Sleep(time.Second)
	got, _ := metric(t, a.reg, "vipd_k8s_syncs_total", "kind", "full", "result", "ok")
	partial, _ := metric(t, a.reg, "vipd_k8s_syncs_total", "kind", "partial", "result", "ok")
	cancel()
	wg.Wait()
	if got-full < 2 {
		t.Errorf("full syncs in 1s of steady changes (%v partial passes) with a 150ms period: %v, want at least 2", partial, got-full)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
