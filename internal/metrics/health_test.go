package metrics_test

import (
	"net/http/httptest"
	"testing"

	"github.com/vipd/vipd/internal/metrics"
)

// TestHealthMetrics: vipd_health_checks_total exists from the start and
// counts by result; vipd_backend_health follows a backend and is removed
// with it.
func TestHealthMetrics(t *testing.T) {
	m := metrics.New()
	srv := httptest.NewServer(metrics.NewHandler(m, func() bool { return true }))
	defer srv.Close()
	f := scrape(t, srv.URL+"/metrics")
	for _, r := range []string{"pass", "fail"} {
		if v := f.value(t, "vipd_health_checks_total", "result="+r); v != 0 {
			t.Errorf("%s checks %v before any", r, v)
		}
	}
	m.ObserveCheck("pass")
	m.ObserveCheck("fail")
	m.ObserveCheck("fail")
	m.SetBackendHealth("web", "10.0.0.1", 1)
	m.SetBackendHealth("web", "10.0.0.2", 0)
	f = scrape(t, srv.URL+"/metrics")
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"vipd_health_checks_total", []string{"result=pass"}, 1},
		{"vipd_health_checks_total", []string{"result=fail"}, 2},
		{"vipd_backend_health", []string{"service=web", "backend=10.0.0.1"}, 1},
		{"vipd_backend_health", []string{"service=web", "backend=10.0.0.2"}, 0},
	} {
		if got := f.value(t, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	m.DeleteBackendHealth("web", "10.0.0.2")
	f = scrape(t, srv.URL+"/metrics")
	if mf := f["vipd_backend_health"]; len(mf.GetMetric()) != 1 {
		t.Errorf("vipd_backend_health has %d series after a delete, want 1", len(mf.GetMetric()))
	}
}
