package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/fake"
	"github.com/vipd/vipd/internal/metrics"
	"github.com/vipd/vipd/internal/testkit/testserver"
	"github.com/vipd/vipd/internal/version"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server"
	"github.com/vipd/vipd/server/reconcile"
	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// The producers' views of Metrics.
var (
	_ reconcile.Observer = (*metrics.Metrics)(nil)
	_ interface {
		Flow(service string, t dataplane.FlowEventType)
		Lost(source string, n uint64)
	} = (*metrics.Metrics)(nil)
)

// families is one scrape, by family name.
type families map[string]*dto.MetricFamily

// scrape GETs url and parses the text exposition.
func scrape(t *testing.T, url string) families {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse exposition: %v", err)
	}
	return mfs
}

// metric returns the metric of family name whose labels include want
// ("k=v" pairs), failing unless exactly one matches.
func (f families) metric(t *testing.T, name string, want ...string) *dto.Metric {
	t.Helper()
	mf, ok := f[name]
	if !ok {
		t.Fatalf("no family %s in the exposition", name)
	}
	var found []*dto.Metric
	for _, m := range mf.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for _, w := range want {
			k, v, _ := strings.Cut(w, "=")
			if got, ok := labels[k]; !ok || got != v {
				match = false
			}
		}
		if match {
			found = append(found, m)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s%v: %d series match, want 1", name, want, len(found))
	}
	return found[0]
}

// value returns a counter's or gauge's value.
func (f families) value(t *testing.T, name string, want ...string) float64 {
	t.Helper()
	m := f.metric(t, name, want...)
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	t.Fatalf("%s%v is neither a counter nor a gauge", name, want)
	return 0
}

// histogram returns a histogram's sample count and sum.
func (f families) histogram(t *testing.T, name string, want ...string) (uint64, float64) {
	t.Helper()
	h := f.metric(t, name, want...).Histogram
	if h == nil {
		t.Fatalf("%s%v is not a histogram", name, want)
	}
	return h.GetSampleCount(), h.GetSampleSum()
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// listen runs a metrics Server on a free loopback port until the test ends
// and returns its base URL.
func listen(t *testing.T, m *metrics.Metrics, ready func() bool, opts ...metrics.HandlerOption) string {
	t.Helper()
	srv, err := metrics.Listen(hclog.NewNullLogger(), "127.0.0.1:0", m, ready, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return "http://" + srv.Addr().String()
}

func TestEndpoint(t *testing.T) {
	m := metrics.New()
	var ready atomic.Bool
	base := listen(t, m, ready.Load)

	if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d, want 200", code)
	}
	if code, body := get(t, base+"/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz before the first apply: %d %q, want 503", code, body)
	}
	ready.Store(true)
	if code, _ := get(t, base+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz after the first apply: %d, want 200", code)
	}
	if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d, want 200", code)
	}

	m.ObserveSync(metrics.SyncFull, 10*time.Millisecond, nil)
	m.ObserveSync(metrics.SyncPartial, 2*time.Millisecond, nil)
	m.ObserveSync(metrics.SyncPartial, 2*time.Millisecond, nil)
	m.ObserveSync(metrics.SyncPartial, 1*time.Millisecond, errors.New("boom"))
	m.ObserveSync(metrics.SyncFull, 4*time.Millisecond, errors.New("boom"))
	m.ObserveProgramming(5 * time.Millisecond)
	m.ObserveProgramming(7 * time.Millisecond)
	m.SetState(9, 99)
	m.SetState(3, 7)

	for range 3 {
		m.Flow("web", dataplane.FlowNew)
	}
	m.Flow("web", dataplane.FlowClosed)
	m.Flow("web", dataplane.FlowClosed)
	// A close whose NEW was never seen: counted, but no negative gauge.
	m.Flow("db", dataplane.FlowClosed)
	m.Lost(metrics.LostKernel, 5)
	m.Lost(metrics.LostSubscriber, 2)
	m.Lost(metrics.LostSubscriber, 3)

	f := scrape(t, base+"/metrics")

	for _, name := range []string{
		"vipd_sync_duration_seconds",
		"vipd_network_programming_duration_seconds",
		"vipd_services",
		"vipd_backends",
		"vipd_sync_errors_total",
		"vipd_flows_total",
		"vipd_flow_events_lost_total",
		"vipd_active_flows",
		"vipd_build_info",
		"go_goroutines",
		"process_start_time_seconds",
	} {
		if _, ok := f[name]; !ok {
			t.Errorf("family %s missing", name)
		}
	}

	if n, sum := f.histogram(t, "vipd_sync_duration_seconds", "kind=full"); n != 2 || !near(sum, 0.014) {
		t.Errorf("full syncs: count %d sum %v, want 2 and 0.014", n, sum)
	}
	if n, sum := f.histogram(t, "vipd_sync_duration_seconds", "kind=partial"); n != 3 || !near(sum, 0.005) {
		t.Errorf("partial syncs: count %d sum %v, want 3 and 0.005", n, sum)
	}
	if n, sum := f.histogram(t, "vipd_network_programming_duration_seconds"); n != 2 || !near(sum, 0.012) {
		t.Errorf("programming: count %d sum %v, want 2 and 0.012", n, sum)
	}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"vipd_sync_errors_total", nil, 2},
		{"vipd_services", nil, 3},
		{"vipd_backends", nil, 7},
		{"vipd_flows_total", []string{"service=web", "event=new"}, 3},
		{"vipd_flows_total", []string{"service=web", "event=closed"}, 2},
		{"vipd_flows_total", []string{"service=db", "event=closed"}, 1},
		{"vipd_active_flows", []string{"service=web"}, 1},
		{"vipd_flow_events_lost_total", []string{"source=kernel"}, 5},
		{"vipd_flow_events_lost_total", []string{"source=subscriber"}, 5},
		{"vipd_build_info", []string{"version=" + version.String(), "goversion=" + runtime.Version()}, 1},
	} {
		if got := f.value(t, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if mf := f["vipd_active_flows"]; len(mf.GetMetric()) != 1 {
		t.Errorf("vipd_active_flows has %d series, want only web's (db never had an open flow)", len(mf.GetMetric()))
	}

	// More closes than opens never take the gauge below zero.
	for range 4 {
		m.Flow("web", dataplane.FlowClosed)
	}
	m.Flow("web", dataplane.FlowNew)
	f = scrape(t, base+"/metrics")
	if got := f.value(t, "vipd_active_flows", "service=web"); got != 1 {
		t.Errorf("active web flows after 4 closes of 1 open flow and 1 new: %v, want 1", got)
	}
	if got := f.value(t, "vipd_flows_total", "service=web", "event=closed"); got != 6 {
		t.Errorf("web closed events %v, want 6", got)
	}
}

func TestSyncKindsMatchReconcile(t *testing.T) {
	if metrics.SyncFull != reconcile.SyncFull || metrics.SyncPartial != reconcile.SyncPartial {
		t.Errorf("metrics' sync kinds %q, %q differ from reconcile's %q, %q",
			metrics.SyncFull, metrics.SyncPartial, reconcile.SyncFull, reconcile.SyncPartial)
	}
}

func TestFreshExposition(t *testing.T) {
	srv := httptest.NewServer(metrics.NewHandler(metrics.New(), func() bool { return false }))
	defer srv.Close()
	f := scrape(t, srv.URL+"/metrics")
	// Series that exist before the first event, so that rate() works from the start.
	for _, kind := range []string{"full", "partial"} {
		if n, _ := f.histogram(t, "vipd_sync_duration_seconds", "kind="+kind); n != 0 {
			t.Errorf("%s syncs: %d before any", kind, n)
		}
	}
	for _, src := range []string{"kernel", "subscriber"} {
		if v := f.value(t, "vipd_flow_events_lost_total", "source="+src); v != 0 {
			t.Errorf("lost %s: %v before any", src, v)
		}
	}
	for _, name := range []string{"vipd_sync_errors_total", "vipd_services", "vipd_backends"} {
		if v := f.value(t, name); v != 0 {
			t.Errorf("%s = %v before any", name, v)
		}
	}
	if code, _ := get(t, srv.URL+"/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz: %d, want 503", code)
	}
}

func TestActiveFlowsConcurrent(t *testing.T) {
	m := metrics.New()
	const workers, per = 8, 500
	var wg sync.WaitGroup
	for w := range workers {
		svc := fmt.Sprintf("svc-%d", w%2)
		wg.Go(func() {
			for range per {
				m.Flow(svc, dataplane.FlowNew)
			}
			for range per + 10 { // 10 closes too many each
				m.Flow(svc, dataplane.FlowClosed)
			}
		})
	}
	wg.Wait()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	f := scrape(t, srv.URL)
	for _, svc := range []string{"svc-0", "svc-1"} {
		if got := f.value(t, "vipd_flows_total", "service="+svc, "event=new"); got != workers/2*per {
			t.Errorf("%s new %v, want %d", svc, got, workers/2*per)
		}
		if got := f.value(t, "vipd_flows_total", "service="+svc, "event=closed"); got != workers/2*(per+10) {
			t.Errorf("%s closed %v, want %d", svc, got, workers/2*(per+10))
		}
		if got := f.value(t, "vipd_active_flows", "service="+svc); got < 0 || got > workers/2*10 {
			t.Errorf("%s active %v, want within [0, %d]", svc, got, workers/2*10)
		}
	}
}

// TestGRPCServerMetrics runs the real server wiring with the interceptors
// given through server.WithInterceptors.
func TestGRPCServerMetrics(t *testing.T) {
	m := metrics.New()
	ts := testserver.Start(t, testserver.WithServerOptions(server.WithInterceptors(m.GRPCInterceptors())))
	conn, err := grpc.NewClient(ts.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	lb := vipdv1.NewLoadBalancerServiceClient(conn)
	for range 3 {
		if _, err := lb.ListServices(ctx, &vipdv1.ListServicesRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	_, err = lb.GetService(ctx, &vipdv1.GetServiceRequest{Name: "nope"})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("GetService: %v, want NotFound", err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	w, err := healthpb.NewHealthClient(conn).Watch(wctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}
	wcancel()

	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	f := scrape(t, srv.URL)
	const lbSvc = "grpc_service=vipd.v1.LoadBalancerService"
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"grpc_server_started_total", []string{lbSvc, "grpc_method=ListServices", "grpc_type=unary"}, 3},
		{"grpc_server_handled_total", []string{lbSvc, "grpc_method=ListServices", "grpc_code=OK"}, 3},
		{"grpc_server_handled_total", []string{lbSvc, "grpc_method=GetService", "grpc_code=NotFound"}, 1},
		{"grpc_server_started_total", []string{"grpc_method=Watch", "grpc_type=server_stream"}, 1},
	} {
		if got := f.value(t, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if got := f.value(t, "grpc_server_msg_sent_total", "grpc_method=Watch"); got < 1 {
		t.Errorf("Watch messages sent %v, want at least 1", got)
	}
	if n, _ := f.histogram(t, "grpc_server_handling_seconds", lbSvc, "grpc_method=ListServices"); n != 3 {
		t.Errorf("ListServices handling-time samples %d, want 3", n)
	}
}

func TestInitializeGRPC(t *testing.T) {
	m := metrics.New()
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, health.NewServer())
	m.InitializeGRPC(gs)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	f := scrape(t, srv.URL)
	if got := f.value(t, "grpc_server_handled_total", "grpc_service=grpc.health.v1.Health", "grpc_method=Check", "grpc_code=OK"); got != 0 {
		t.Errorf("Check handled before any call: %v", got)
	}
}

type nopPersister struct{}

func (nopPersister) Save(*store.Snapshot) error { return nil }

// TestReconcilerReports wires Metrics as the reconciler's observer over
// the fake dataplane and checks that the exposition follows the applies.
func TestReconcilerReports(t *testing.T) {
	m := metrics.New()
	dp := fake.New()
	dp.FailNext(errors.New("not yet"))
	rec := reconcile.New(hclog.NewNullLogger(), dp, nopPersister{}, store.Empty(), reconcile.WithObserver(m))
	base := listen(t, m, func() bool {
		select {
		case <-rec.Ready():
			return true
		default:
			return false
		}
	})
	if code, _ := get(t, base+"/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz before Run: %d, want 503", code)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rec.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	select {
	case <-rec.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("not ready")
	}
	if code, _ := get(t, base+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz after the first apply: %d, want 200", code)
	}

	put := func(name, vip string, backends ...string) error {
		_, err := rec.Do(ctx, func(tx *store.Txn) (any, error) {
			svc := &vipdv1.Service{Name: name, Vips: []string{vip}, Ports: []*vipdv1.Port{{Port: 80}}}
			for _, b := range backends {
				svc.Backends = append(svc.Backends, &vipdv1.Backend{Ip: b})
			}
			out, dsvc, v := validation.Service(svc, validation.Limits{}, "service")
			if v != nil {
				return nil, v
			}
			return tx.Put(out, dsvc)
		})
		return err
	}
	if err := put("a", "10.96.0.1", "10.0.0.1", "10.0.0.2"); err != nil {
		t.Fatal(err)
	}
	if err := put("b", "10.96.0.2", "10.0.0.3"); err != nil {
		t.Fatal(err)
	}
	dp.FailNext(errors.New("kernel says no"))
	if err := put("c", "10.96.0.3", "10.0.0.4"); err == nil {
		t.Fatal("the failing apply succeeded")
	}

	f := scrape(t, base+"/metrics")
	if n, _ := f.histogram(t, "vipd_sync_duration_seconds", "kind=full"); n != 2 {
		t.Errorf("full syncs %d, want 2 (a failed initial apply and its retry)", n)
	}
	if n, _ := f.histogram(t, "vipd_sync_duration_seconds", "kind=partial"); n != 3 {
		t.Errorf("partial syncs %d, want 3", n)
	}
	if got := f.value(t, "vipd_sync_errors_total"); got != 2 {
		t.Errorf("sync errors %v, want 2", got)
	}
	if n, sum := f.histogram(t, "vipd_network_programming_duration_seconds"); n != 2 || sum <= 0 {
		t.Errorf("programming: count %d sum %v, want 2 changes programmed", n, sum)
	}
	if got := f.value(t, "vipd_services"); got != 2 {
		t.Errorf("services %v, want 2", got)
	}
	if got := f.value(t, "vipd_backends"); got != 3 {
		t.Errorf("backends %v, want 3", got)
	}
}

func TestListen(t *testing.T) {
	m := metrics.New()
	if _, err := metrics.Listen(hclog.NewNullLogger(), "127.0.0.1:0", m, nil); err == nil {
		t.Error("Listen with a nil ready func succeeded")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := metrics.Listen(hclog.NewNullLogger(), l.Addr().String(), m, func() bool { return true }); err == nil {
		t.Error("Listen on an address in use succeeded")
	}

	srv, err := metrics.Listen(hclog.NewNullLogger(), "127.0.0.1:0", m, func() bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	addr := srv.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	if code, _ := get(t, "http://"+addr+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz: %d, want 200", code)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve after cancel: %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Error("the listener is still open after Serve returned")
	}

	// Close releases a listener that never served.
	srv, err = metrics.Listen(hclog.NewNullLogger(), "127.0.0.1:0", m, func() bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	addr = srv.Addr().String()
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Error("the listener is still open after Close")
	}
}

// TestPprof checks that profiles are served only when asked for.
func TestPprof(t *testing.T) {
	m := metrics.New()
	ready := func() bool { return true }
	if code, _ := get(t, listen(t, m, ready)+"/debug/pprof/heap"); code != http.StatusNotFound {
		t.Errorf("/debug/pprof/heap without WithPprof: %d, want 404", code)
	}
	base := listen(t, m, ready, metrics.WithPprof())
	if code, body := get(t, base+"/debug/pprof/heap?debug=1"); code != http.StatusOK || !strings.Contains(body, "heap profile") {
		t.Errorf("/debug/pprof/heap with WithPprof: %d %.80q, want 200 and a heap profile", code, body)
	}
	if code, _ := get(t, base+"/metrics"); code != http.StatusOK {
		t.Errorf("/metrics with WithPprof: %d, want 200", code)
	}
}

// TestDriftRepairs checks vipd_dataplane_drift_repairs_total: InitDataplane
// exports the dataplane's known kinds at zero, and each ObserveDriftRepair
// counts one repair of one kind.
func TestDriftRepairs(t *testing.T) {
	m := metrics.New()
	m.InitDataplane("iptables", []string{"hook", "chain"})
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	f := scrape(t, srv.URL)
	for _, what := range []string{"hook", "chain"} {
		if v := f.value(t, "vipd_dataplane_drift_repairs_total", "dataplane=iptables", "what="+what); v != 0 {
			t.Errorf("iptables %s repairs: %v before any", what, v)
		}
	}
	m.ObserveDriftRepair("iptables", "hook")
	m.ObserveDriftRepair("iptables", "hook")
	m.ObserveDriftRepair("iptables", "chain")
	m.ObserveDriftRepair("ebpf", "map")
	f = scrape(t, srv.URL)
	for _, c := range []struct {
		dp, what string
		want     float64
	}{{"iptables", "hook", 2}, {"iptables", "chain", 1}, {"ebpf", "map", 1}} {
		if v := f.value(t, "vipd_dataplane_drift_repairs_total", "dataplane="+c.dp, "what="+c.what); v != c.want {
			t.Errorf("%s %s repairs = %v, want %v", c.dp, c.what, v, c.want)
		}
	}
}

// snatSource is a metrics.SNATSource whose counters the test sets.
type snatSource struct {
	mu                 sync.Mutex
	exhausted, twSkips uint64
	err                error
}

func (s *snatSource) SNATCounters() (uint64, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exhausted, s.twSkips, s.err
}

func (s *snatSource) set(exhausted, twSkips uint64, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.exhausted, s.twSkips, s.err = exhausted, twSkips, err
}

func TestSNATCounters(t *testing.T) {
	m := metrics.New()
	src := &snatSource{}
	m.WatchSNAT(src)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	want := func(exhausted, twSkips float64) {
		t.Helper()
		f := scrape(t, srv.URL)
		if v := f.value(t, "vipd_snat_port_exhausted_total"); v != exhausted {
			t.Errorf("vipd_snat_port_exhausted_total = %v, want %v", v, exhausted)
		}
		if v := f.value(t, "vipd_snat_timewait_skips_total"); v != twSkips {
			t.Errorf("vipd_snat_timewait_skips_total = %v, want %v", v, twSkips)
		}
	}
	want(0, 0)
	src.set(3, 70, nil)
	want(3, 70)
	// A read that fails (the dataplane closing) keeps the last values.
	src.set(0, 0, errors.New("map closed"))
	want(3, 70)
}
