package cli

import (
	"strings"
	"testing"
	"time"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// TestServiceViewHealth: "service get" shows the health check with its
// defaults filled in, and each probed backend's health. (The daemon's
// netlab test checks the same data end to end, with Explain.)
func TestServiceViewHealth(t *testing.T) {
	svc := &vipdv1.Service{
		Name: "web", Owner: "default", Generation: 1, Vips: []string{"10.96.0.10"},
		Ports:       []*vipdv1.Port{{Name: "http", Port: 80, TargetPort: 8080}},
		Backends:    []*vipdv1.Backend{{Ip: "10.0.1.5"}, {Ip: "10.0.1.6"}, {Ip: "10.0.1.7"}},
		HealthCheck: &vipdv1.HealthCheck{Protocol: vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_HTTP, PortName: "http", Path: "/healthz"},
	}
	since := time.Date(2026, 12, 3, 17, 0, 0, 0, time.UTC).UnixMilli()
	health := []*vipdv1.BackendHealth{
		{Ip: "10.0.1.5", State: vipdv1.HealthState_HEALTH_STATE_PASSING, SinceUnixMs: since, Consecutive: 7, Detail: "passing health check (7 in a row)"},
		{Ip: "10.0.1.6", State: vipdv1.HealthState_HEALTH_STATE_FAILING, SinceUnixMs: since, Consecutive: 3, LastError: "connection refused",
			Detail: "failing health check (connection refused, 3 in a row)"},
		{Ip: "10.0.1.7", State: vipdv1.HealthState_HEALTH_STATE_UNKNOWN, SinceUnixMs: since, Detail: "no health check finished yet; treated as passing"},
	}
	var out strings.Builder
	tbl := newTable(&out)
	serviceView(svc, health...)(tbl)
	if err := tbl.flush(); err != nil {
		t.Fatal(err)
	}
	want := `Health check:  http GET /healthz, port http, every 2000ms (timeout 1000ms, up after 2 passes, down after 3 failures)
  IP        HEALTH   SINCE                 IN-A-ROW  DETAIL
  10.0.1.5  passing  2026-12-03T17:00:00Z  7         passing health check (7 in a row)
  10.0.1.6  failing  2026-12-03T17:00:00Z  3         failing health check (connection refused, 3 in a row)
  10.0.1.7  unknown  2026-12-03T17:00:00Z  0         no health check finished yet; treated as passing
`
	if got := out.String(); !strings.HasSuffix(got, want) {
		t.Errorf("service view ends\n%s\nwant it to end\n%s", got, want)
	}
	// Without a health check, nothing changes.
	svc.HealthCheck = nil
	out.Reset()
	tbl = newTable(&out)
	serviceView(svc)(tbl)
	tbl.flush()
	if strings.Contains(out.String(), "Health") {
		t.Errorf("health shown without a health check:\n%s", out.String())
	}
}
