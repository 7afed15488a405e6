package kubeadapter_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/fake"
	"github.com/vipd/vipd/internal/kubeadapter"
	"github.com/vipd/vipd/internal/testkit/testserver"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"
)

// metric returns the value of the gauge or counter name with labels, or
// the count and sum of the histogram name, from reg.
func metric(t *testing.T, reg prometheus.Gatherer, name string, labels ...string) (value float64, count uint64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				if !hasLabel(m, labels[i], labels[i+1]) {
					continue next
				}
			}
			switch {
			case m.Gauge != nil:
				return m.Gauge.GetValue(), 0
			case m.Counter != nil:
				return m.Counter.GetValue(), 0
			case m.Histogram != nil:
				return m.Histogram.GetSampleSum(), m.Histogram.GetSampleCount()
			}
		}
	}
	t.Fatalf("metric %s%v not found", name, labels)
	return 0, 0
}

// waitMetric waits for the gauge or counter name with labels to be want:
// metrics are updated at the end of a pass, after vipd has the change.
func waitMetric(t *testing.T, reg prometheus.Gatherer, want float64, name string, labels ...string) {
	t.Helper()
	eventually(t, fmt.Sprintf("%s%v = %v", name, labels, want), func() error {
		if v, _ := metric(t, reg, name, labels...); v != want {
			return fmt.Errorf("it is %v", v)
		}
		return nil
	})
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

func nomadService(name, vip string) *vipdv1.Service {
	return &vipdv1.Service{
		Name: name, Owner: "nomad", Vips: []string{vip},
		Ports:    []*vipdv1.Port{{Port: 80, TargetPort: 8080}},
		Backends: []*vipdv1.Backend{{Ip: "198.18.9.1"}},
	}
}

func simple(ns, name, vip, backend string) []runtime.Object {
	return []runtime.Object{
		service(ns, name, []string{vip}, svcPort("", corev1.ProtocolTCP, 80, 8080)),
		slice(ns, name, name+"-a", v4, ports(slicePort("", corev1.ProtocolTCP, 8080)), endpoint(backend, ready, "")),
	}
}

func simpleSummary(vip string, backends ...string) string {
	var bs []string
	for _, b := range backends {
		bs = append(bs, b+" READY =8080")
	}
	return fmt.Sprintf("vips=%s ports=/TCP:80 backends=[%s]", vip, strings.Join(bs, "; "))
}

// TestOtherOwnersAreNeverTouched: a name or VIP:port another owner holds is
// left out, in the full sync and afterwards, and a service another owner
// takes over is never changed or deleted again.
func TestOtherOwnersAreNeverTouched(t *testing.T) {
	ctx := context.Background()
	var objs []runtime.Object
	objs = append(objs, simple("default", "web", "198.19.0.20", "198.18.1.1")...)
	objs = append(objs, simple("default", "api", "198.19.5.5", "198.18.1.2")...) // nomad/db holds its VIP:port
	objs = append(objs, simple("default", "ok", "198.19.0.21", "198.18.1.3")...)
	e := newEnv(t, objs...)
	nomad := map[string]*vipdv1.Service{}
	for _, s := range []*vipdv1.Service{nomadService("default/web", "198.19.0.10"), nomadService("nomad/db", "198.19.5.5")} {
		got, err := e.vipd.UpsertService(ctx, s, 0)
		if err != nil {
			t.Fatal(err)
		}
		nomad[s.Name] = got
	}
	checkNomad := func(when string) {
		t.Helper()
		for name, want := range nomad {
			got, err := e.vipd.GetService(ctx, name)
			if err != nil {
				t.Fatalf("%s: nomad's %s: %v", when, name, err)
			}
			if !proto.Equal(got, want) {
				t.Fatalf("%s: nomad's %s changed:\n got %v\nwant %v", when, name, got, want)
			}
		}
	}

	a := e.start()
	e.settle()
	if err := diffState(map[string]string{"default/ok": simpleSummary("198.19.0.21", "198.18.1.3")}, e.state()); err != nil {
		t.Fatal(err)
	}
	checkNomad("after the full sync")
	waitMetric(t, a.reg, 1, "vipd_k8s_services_left_out", "reason", kubeadapter.ReasonOtherOwner)
	waitMetric(t, a.reg, 1, "vipd_k8s_services_left_out", "reason", kubeadapter.ReasonConflict)

	// Changes to the Services another owner holds leave them alone.
	e.updateSlice(slice("default", "web", "web-a", v4, ports(slicePort("", corev1.ProtocolTCP, 8080)), endpoint("198.18.1.9", ready, "")))
	e.updateSlice(slice("default", "api", "api-a", v4, ports(slicePort("", corev1.ProtocolTCP, 8080)), endpoint("198.18.1.9", ready, "")))
	e.settle()
	checkNomad("after changes to the Services")

	// nomad creates a name after the full sync; the Kubernetes Service of
	// that name, created later, is left out.
	late, err := e.vipd.UpsertService(ctx, nomadService("default/late", "198.19.0.30"), 0)
	if err != nil {
		t.Fatal(err)
	}
	nomad["default/late"] = late
	for _, o := range simple("default", "late", "198.19.0.31", "198.18.1.4") {
		switch o := o.(type) {
		case *corev1.Service:
			e.createService(o)
		case *discoveryv1.EndpointSlice:
			e.createSlice(o)
		}
	}
	e.settle()
	checkNomad("after a Service of a name nomad holds")

	// nomad takes default/ok over; the adapter's next update meets a
	// generation conflict and lets go.
	took, err := e.vipd.LoadBalancerClient().UpsertService(ctx, &vipdv1.UpsertServiceRequest{
		Service: nomadService("default/ok", "198.19.0.21"), TakeOwnership: true})
	if err != nil {
		t.Fatal(err)
	}
	nomad["default/ok"] = took.Service
	e.updateSlice(slice("default", "ok", "ok-a", v4, ports(slicePort("", corev1.ProtocolTCP, 8080)), endpoint("198.18.1.8", ready, "")))
	e.settle()
	checkNomad("after an update of a service nomad took over")
	waitMetric(t, a.reg, 3, "vipd_k8s_services_left_out", "reason", kubeadapter.ReasonOtherOwner)
	e.deleteService("default", "ok")
	e.deleteService("default", "web")
	e.settle()
	checkNomad("after the Kubernetes Services are deleted")
	if got := e.state(); len(got) != 0 {
		t.Errorf("kubernetes services left: %v", got)
	}
	waitMetric(t, a.reg, 1, "vipd_k8s_services_left_out", "reason", kubeadapter.ReasonOtherOwner)
}

// TestBurstsCoalesce: N slice updates within --min-sync-period become far
// fewer than N upserts, and the last one wins.
func TestBurstsCoalesce(t *testing.T) {
	const n = 40
	e := newEnv(t, simple("shop", "web", "198.19.0.10", "198.18.1.1")...)
	e.start(kubeadapter.WithMinSyncPeriod(500 * time.Millisecond))
	e.waitState(map[string]string{"shop/web": simpleSummary("198.19.0.10", "198.18.1.1")})
	before := e.calls.get("UpsertService")
	var last string
	for i := range n {
		ip := fmt.Sprintf("198.18.2.%d", i+1)
		e.updateSlice(slice("shop", "web", "web-a", v4, ports(slicePort("", corev1.ProtocolTCP, 8080)), endpoint(ip, ready, "")))
		last = simpleSummary("198.19.0.10", ip)
	}
	e.waitState(map[string]string{"shop/web": last})
	upserts := e.calls.get("UpsertService") - before
	t.Logf("%d slice updates gave %d upserts", n, upserts)
	if upserts < 1 || upserts > n/4 {
		t.Errorf("%d slice updates within the min sync period gave %d upserts; want 1 to %d", n, upserts, n/4)
	}
}

// TestVIPDRestartResyncs: a vipd that comes back empty (a new state
// directory) gets the full state again, with one SyncServices.
func TestVIPDRestartResyncs(t *testing.T) {
	var objs []runtime.Object
	objs = append(objs, simple("shop", "web", "198.19.0.10", "198.18.1.1")...)
	objs = append(objs, simple("shop", "api", "198.19.0.11", "198.18.1.2")...)
	e := newEnv(t, objs...)
	a := e.start()
	want := map[string]string{
		"shop/web": simpleSummary("198.19.0.10", "198.18.1.1"),
		"shop/api": simpleSummary("198.19.0.11", "198.18.1.2"),
	}
	e.waitState(want)
	syncs := e.calls.get("SyncServices")
	if err := e.srv.Close(); err != nil {
		t.Fatal(err)
	}
	srv2 := testserver.Start(t)
	e.setServer(srv2)
	e.waitState(want)
	if got := e.calls.get("SyncServices"); got <= syncs {
		t.Errorf("SyncServices calls: %d before the restart, %d after; want more", syncs, got)
	}
	eventually(t, "a second full sync counted", func() error {
		if v, _ := metric(t, a.reg, "vipd_k8s_syncs_total", "kind", "full", "result", "ok"); v < 2 {
			return fmt.Errorf("full syncs: %v, want at least 2", v)
		}
		return nil
	})
	// The restarted vipd got the services in one apply.
	var creating int
	for _, r := range srv2.Dataplane().Records() {
		if len(r.State.Services) > 0 {
			creating++
			if len(r.State.Services) != 2 {
				t.Errorf("an apply on the new vipd had %d services, want both at once", len(r.State.Services))
			}
		}
	}
	if creating == 0 {
		t.Error("the new vipd applied no services")
	}
	// And it keeps up with changes after that.
	e.updateSlice(slice("shop", "web", "web-a", v4, ports(slicePort("", corev1.ProtocolTCP, 8080)), endpoint("198.18.1.5", ready, "")))
	want["shop/web"] = simpleSummary("198.19.0.10", "198.18.1.5")
	e.waitState(want)
}

// TestAdapterRestartWithoutGap: stopping the adapter leaves vipd's services
// in place, and a new adapter over changed objects makes vipd equal to
// them without any apply lacking a service that both states have.
func TestAdapterRestartWithoutGap(t *testing.T) {
	var objs []runtime.Object
	for i := 1; i <= 4; i++ {
		objs = append(objs, simple("shop", fmt.Sprintf("s%d", i), fmt.Sprintf("198.19.0.%d", i), fmt.Sprintf("198.18.1.%d", i))...)
	}
	e := newEnv(t, objs...)
	a1 := e.start()
	e.settle()
	a1.stop()
	if got := len(e.state()); got != 4 {
		t.Fatalf("after the adapter stopped vipd has %d kubernetes services, want 4", got)
	}
	mark := len(e.srv.Dataplane().Records())

	// While no adapter runs: s4 goes, s5 comes, s1's backends change.
	e.deleteService("shop", "s4")
	for _, o := range simple("shop", "s5", "198.19.0.5", "198.18.1.5") {
		switch o := o.(type) {
		case *corev1.Service:
			e.createService(o)
		case *discoveryv1.EndpointSlice:
			e.createSlice(o)
		}
	}
	e.updateSlice(slice("shop", "s1", "s1-a", v4, ports(slicePort("", corev1.ProtocolTCP, 8080)), endpoint("198.18.1.11", ready, "")))
	if len(e.srv.Dataplane().Records()) != mark {
		t.Fatal("vipd changed while no adapter ran")
	}

	e.start()
	want := map[string]string{
		"shop/s1": simpleSummary("198.19.0.1", "198.18.1.11"),
		"shop/s2": simpleSummary("198.19.0.2", "198.18.1.2"),
		"shop/s3": simpleSummary("198.19.0.3", "198.18.1.3"),
		"shop/s5": simpleSummary("198.19.0.5", "198.18.1.5"),
	}
	e.waitState(want)
	records := e.srv.Dataplane().Records()[mark:]
	if len(records) == 0 {
		t.Fatal("no apply after the second adapter started")
	}
	for i, r := range records {
		for _, name := range []string{"shop/s1", "shop/s2", "shop/s3"} {
			if _, ok := r.State.Services[name]; !ok {
				t.Errorf("apply %d after the restart lacks %s, which both states have", i, name)
			}
		}
	}
	t.Logf("%d applies after the restart", len(records))
}

// TestInvalidServiceDoesNotBlockOthers: a Service vipd refuses is left out,
// in the full sync and in a change, and the others are programmed.
func TestInvalidServiceDoesNotBlockOthers(t *testing.T) {
	var objs []runtime.Object
	objs = append(objs, simple("shop", "web", "198.19.0.10", "198.18.1.1")...)
	objs = append(objs, simple("shop", "bad", "127.0.0.10", "198.18.1.2")...) // vipd refuses a loopback VIP
	objs = append(objs, simple("shop", "api", "198.19.0.11", "198.18.1.3")...)
	e := newEnv(t, objs...)
	a := e.start()
	e.settle()
	want := map[string]string{
		"shop/web": simpleSummary("198.19.0.10", "198.18.1.1"),
		"shop/api": simpleSummary("198.19.0.11", "198.18.1.3"),
	}
	if err := diffState(want, e.state()); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, a.reg, 1, "vipd_k8s_services_left_out", "reason", kubeadapter.ReasonInvalid)

	// A change that makes a programmed Service invalid keeps its last
	// version; the other changes of the same pass go through.
	bad := service("shop", "api", []string{"127.0.0.11"}, svcPort("", corev1.ProtocolTCP, 80, 8080))
	e.updateService(bad)
	e.updateSlice(slice("shop", "web", "web-a", v4, ports(slicePort("", corev1.ProtocolTCP, 8080)), endpoint("198.18.1.7", ready, "")))
	want["shop/web"] = simpleSummary("198.19.0.10", "198.18.1.7")
	e.settle()
	if err := diffState(want, e.state()); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, a.reg, 2, "vipd_k8s_services_left_out", "reason", kubeadapter.ReasonInvalid)
	// Made valid again, both are programmed.
	e.updateService(service("shop", "bad", []string{"198.19.0.12"}, svcPort("", corev1.ProtocolTCP, 80, 8080)))
	e.updateService(service("shop", "api", []string{"198.19.0.13"}, svcPort("", corev1.ProtocolTCP, 80, 8080)))
	want["shop/bad"] = simpleSummary("198.19.0.12", "198.18.1.2")
	want["shop/api"] = simpleSummary("198.19.0.13", "198.18.1.3")
	e.settle()
	if err := diffState(want, e.state()); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, a.reg, 0, "vipd_k8s_services_left_out", "reason", kubeadapter.ReasonInvalid)
}

// TestProgrammingLatency: the histogram observes now − the slice's
// last-change-trigger-time once the change is applied; changes without the
// annotation, and those from before the adapter started, are not observed.
func TestProgrammingLatency(t *testing.T) {
	old := slice("shop", "web", "web-a", v4, ports(slicePort("", corev1.ProtocolTCP, 8080)), endpoint("198.18.1.1", ready, ""))
	old.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: time.Now().Add(-time.Hour).Format(time.RFC3339Nano)}
	e := newEnv(t, service("shop", "web", []string{"198.19.0.10"}, svcPort("", corev1.ProtocolTCP, 80, 8080)), old)
	a := e.start()
	e.settle()
	const name = "vipd_k8s_network_programming_duration_seconds"
	if _, n := metric(t, a.reg, name); n != 0 {
		t.Fatalf("observed %d latencies for objects listed at start, want 0", n)
	}

	trigger := time.Now()
	s := slice("shop", "web", "web-a", v4, ports(slicePort("", corev1.ProtocolTCP, 8080)), endpoint("198.18.1.2", ready, ""))
	s.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: trigger.Format(time.RFC3339Nano)}
	e.updateSlice(s)
	e.waitState(map[string]string{"shop/web": simpleSummary("198.19.0.10", "198.18.1.2")})
	eventually(t, "one observation", func() error {
		if _, n := metric(t, a.reg, name); n != 1 {
			return fmt.Errorf("%d observations", n)
		}
		return nil
	})
	bound := time.Since(trigger).Seconds()
	sum, n := metric(t, a.reg, name)
	if n != 1 || sum < 0 || sum > bound {
		t.Errorf("after one annotated change: %d observations summing %vs; want 1 of at most %vs", n, sum, bound)
	}

	// A Service change carries no trigger time.
	e.updateService(service("shop", "web", []string{"198.19.0.10"}, svcPort("", corev1.ProtocolTCP, 81, 8080)))
	e.settle()
	if _, n := metric(t, a.reg, name); n != 1 {
		t.Errorf("after a Service change without the annotation: %d observations, want still 1", n)
	}
}

// TestHealthz: 503 until the first full sync, 200 after it, 503 while a
// change stays pending longer than the health timeout, and 200 again once
// it is applied.
func TestHealthz(t *testing.T) {
	e := newEnv(t, simple("shop", "web", "198.19.0.10", "198.18.1.1")...)
	gate := make(chan struct{})
	e.srv.Dataplane().SetHook(func(ctx context.Context, _ *dataplane.State) error {
		select {
		case <-gate:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	a := e.start(kubeadapter.WithHealthTimeout(200 * time.Millisecond))
	srv := httptest.NewServer(a.Healthz())
	t.Cleanup(srv.Close)
	type body struct {
		LastUpdated, CurrentTime, NodeName, Reason string
		Healthy                                    bool
	}
	get := func() (int, body) {
		t.Helper()
		resp, err := http.Get(srv.URL + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var b body
		if err := json.Unmarshal(raw, &b); err != nil {
			t.Fatalf("healthz body %q: %v", raw, err)
		}
		return resp.StatusCode, b
	}
	wantCode := func(code int, reason string) body {
		t.Helper()
		var b body
		eventually(t, fmt.Sprintf("healthz %d", code), func() error {
			var got int
			got, b = get()
			if got != code || !strings.Contains(b.Reason, reason) {
				return fmt.Errorf("status %d, body %+v", got, b)
			}
			return nil
		})
		return b
	}
	b := wantCode(http.StatusServiceUnavailable, "no full sync")
	if b.NodeName != "node-a" || b.Healthy || b.CurrentTime == "" {
		t.Errorf("body before the first sync: %+v", b)
	}
	close(gate)
	b = wantCode(http.StatusOK, "")
	if !b.Healthy || b.LastUpdated == "" {
		t.Errorf("body after the first sync: %+v", b)
	}

	// Applies block again: a change stays pending.
	gate = make(chan struct{})
	e.updateSlice(slice("shop", "web", "web-a", v4, ports(slicePort("", corev1.ProtocolTCP, 8080)), endpoint("198.18.1.2", ready, "")))
	wantCode(http.StatusServiceUnavailable, "pending")
	close(gate)
	wantCode(http.StatusOK, "")
	e.waitState(map[string]string{"shop/web": simpleSummary("198.19.0.10", "198.18.1.2")})
}

// TestAPIServerWatchErrorResyncs: a failed watch of the apiserver makes the
// next pass a full SyncServices, which also repairs drift in vipd.
func TestAPIServerWatchErrorResyncs(t *testing.T) {
	e := newEnv(t, simple("shop", "web", "198.19.0.10", "198.18.1.1")...)
	first := watch.NewFake()
	watches := 0
	e.kube.PrependWatchReactor("endpointslices", func(k8stesting.Action) (bool, watch.Interface, error) {
		watches++
		switch watches {
		case 1:
			return true, first, nil
		case 2:
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "discovery.k8s.io", Resource: "endpointslices"}, "", fmt.Errorf("test"))
		}
		return false, nil, nil
	})
	e.start(kubeadapter.WithFullSyncPeriod(0))
	want := map[string]string{"shop/web": simpleSummary("198.19.0.10", "198.18.1.1")}
	e.waitState(want)
	syncs := e.calls.get("SyncServices")
	// Someone deletes the adapter's service by hand; only a full sync
	// brings it back.
	if err := e.vipd.DeleteService(context.Background(), "shop/web", 0); err != nil {
		t.Fatal(err)
	}
	first.Stop()
	e.waitState(want)
	if got := e.calls.get("SyncServices"); got != syncs+1 {
		t.Errorf("SyncServices calls: %d, want %d", got, syncs+1)
	}
}

// TestPeriodicFullSyncRepairsDrift: a kubernetes-owned service deleted by
// hand comes back at the next periodic full sync.
func TestPeriodicFullSyncRepairsDrift(t *testing.T) {
	e := newEnv(t, simple("shop", "web", "198.19.0.10", "198.18.1.1")...)
	e.start(kubeadapter.WithFullSyncPeriod(200 * time.Millisecond))
	want := map[string]string{"shop/web": simpleSummary("198.19.0.10", "198.18.1.1")}
	e.waitState(want)
	if err := e.vipd.DeleteService(context.Background(), "shop/web", 0); err != nil {
		t.Fatal(err)
	}
	eventually(t, "drift repaired", func() error {
		_, err := e.vipd.GetService(context.Background(), "shop/web")
		if client.IsNotFound(err) {
			return err
		}
		return nil
	})
	e.waitState(want)
}

// TestUnsupportedServiceDoesNotBlockOthers: vipd refuses a SyncServices
// whose service its dataplane cannot honour without naming it
// (FailedPrecondition); the adapter then applies the services one by one,
// and only that one is left out. A stale kubernetes service goes too.
func TestUnsupportedServiceDoesNotBlockOthers(t *testing.T) {
	dp := fake.New(fake.WithCapabilities(dataplane.Capabilities{
		LoadBalancing: []dataplane.LoadBalancing{dataplane.LoadBalancingRandom},
		Protocols:     []dataplane.Protocol{dataplane.TCP, dataplane.UDP},
	}))
	var objs []runtime.Object
	objs = append(objs, simple("shop", "web", "198.19.0.10", "198.18.1.1")...)
	objs = append(objs, simple("shop", "api", "198.19.0.11", "198.18.1.2")...)
	objs = append(objs,
		service("shop", "sctp", []string{"198.19.0.12"}, svcPort("", corev1.ProtocolSCTP, 80, 80)),
		slice("shop", "sctp", "sctp-a", v4, ports(slicePort("", corev1.ProtocolSCTP, 80)), endpoint("198.18.1.3", ready, "")))
	e := newEnv(t, objs...)
	srv := testserver.Start(t, testserver.WithDataplane(dp))
	e.setServer(srv)
	// A kubernetes service left from an earlier run, no longer in the cluster.
	stale := nomadService("shop/gone", "198.19.0.40")
	stale.Owner = "kubernetes"
	if _, err := e.vipd.UpsertService(context.Background(), stale, 0); err != nil {
		t.Fatal(err)
	}
	a := e.start()
	e.settle()
	want := map[string]string{
		"shop/web": simpleSummary("198.19.0.10", "198.18.1.1"),
		"shop/api": simpleSummary("198.19.0.11", "198.18.1.2"),
	}
	if err := diffState(want, e.state()); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, a.reg, 1, "vipd_k8s_services_left_out", "reason", kubeadapter.ReasonUnsupported)
	// Later changes to it are refused alone too.
	e.updateSlice(slice("shop", "sctp", "sctp-a", v4, ports(slicePort("", corev1.ProtocolSCTP, 80)), endpoint("198.18.1.4", ready, "")))
	e.updateSlice(slice("shop", "web", "web-a", v4, ports(slicePort("", corev1.ProtocolTCP, 8080)), endpoint("198.18.1.5", ready, "")))
	want["shop/web"] = simpleSummary("198.19.0.10", "198.18.1.5")
	e.settle()
	if err := diffState(want, e.state()); err != nil {
		t.Fatal(err)
	}
	// Once the protocol is one vipd forwards, it is programmed.
	e.updateService(service("shop", "sctp", []string{"198.19.0.12"}, svcPort("", corev1.ProtocolUDP, 80, 80)))
	e.updateSlice(slice("shop", "sctp", "sctp-a", v4, ports(slicePort("", corev1.ProtocolUDP, 80)), endpoint("198.18.1.4", ready, "")))
	want["shop/sctp"] = "vips=198.19.0.12 ports=/UDP:80 backends=[198.18.1.4 READY =80]"
	e.settle()
	if err := diffState(want, e.state()); err != nil {
		t.Fatal(err)
	}
}
