package metrics_test

import (
	"net/http/httptest"
	"testing"

	"github.com/vipd/vipd/internal/metrics"
	"github.com/vipd/vipd/internal/servicesdir"
)

var _ servicesdir.Observer = (*metrics.Metrics)(nil)

// TestServicesDirErrors: vipd_services_dir_errors has exactly one series,
// of value 1, per file in error, labelled with the file and its field;
// a file no longer in error loses its series, and no errors is no series.
func TestServicesDirErrors(t *testing.T) {
	m := metrics.New()
	srv := httptest.NewServer(metrics.NewHandler(m, func() bool { return true }))
	defer srv.Close()
	series := func() map[string]float64 {
		out := map[string]float64{}
		fam := scrape(t, srv.URL+"/metrics")["vipd_services_dir_errors"]
		for _, s := range fam.GetMetric() {
			key := ""
			for _, l := range s.GetLabel() {
				key += l.GetName() + "=" + l.GetValue() + ";"
			}
			out[key] = s.GetGauge().GetValue()
		}
		return out
	}
	if s := series(); len(s) != 0 {
		t.Fatalf("before any error: %v", s)
	}
	m.SetServicesDirErrors(map[string]string{"a.yaml": "vips[0]", "b.yaml": ""})
	if s := series(); len(s) != 2 || s["field=vips[0];file=a.yaml;"] != 1 || s["field=;file=b.yaml;"] != 1 {
		t.Fatalf("two files in error: %v", s)
	}
	m.SetServicesDirErrors(map[string]string{"a.yaml": "ports[0].port"})
	if s := series(); len(s) != 1 || s["field=ports[0].port;file=a.yaml;"] != 1 {
		t.Fatalf("a.yaml with another field, b.yaml fixed: %v", s)
	}
	m.SetServicesDirErrors(nil)
	if s := series(); len(s) != 0 {
		t.Fatalf("no errors: %v", s)
	}
}
