package validation_test

import (
	"testing"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/validation"
)

// TestHealthCheckViolations: each bad health_check field is refused, named.
func TestHealthCheckViolations(t *testing.T) {
	const (
		tcp  = vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_TCP
		http = vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_HTTP
		grpc = vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_GRPC
	)
	for _, tc := range []struct {
		name  string
		hc    *vipdv1.HealthCheck
		field string // "" means valid
	}{
		{"tcp", &vipdv1.HealthCheck{Protocol: tcp}, ""},
		{"http full", &vipdv1.HealthCheck{Protocol: http, PortName: "http", Path: "/healthz", IntervalMs: 100, TimeoutMs: 50, HealthyThreshold: 1, UnhealthyThreshold: 1}, ""},
		{"grpc", &vipdv1.HealthCheck{Protocol: grpc, Port: 9000, GrpcService: "web"}, ""},
		{"no protocol", &vipdv1.HealthCheck{}, "service.health_check.protocol"},
		{"bad protocol", &vipdv1.HealthCheck{Protocol: 9}, "service.health_check.protocol"},
		{"unknown port name", &vipdv1.HealthCheck{Protocol: tcp, PortName: "nope"}, "service.health_check.port_name"},
		{"port and port name", &vipdv1.HealthCheck{Protocol: tcp, PortName: "http", Port: 80}, "service.health_check.port"},
		{"port too big", &vipdv1.HealthCheck{Protocol: tcp, Port: 70000}, "service.health_check.port"},
		{"path on tcp", &vipdv1.HealthCheck{Protocol: tcp, Path: "/"}, "service.health_check.path"},
		{"relative path", &vipdv1.HealthCheck{Protocol: http, Path: "healthz"}, "service.health_check.path"},
		{"grpc service on http", &vipdv1.HealthCheck{Protocol: http, GrpcService: "x"}, "service.health_check.grpc_service"},
		{"interval too short", &vipdv1.HealthCheck{Protocol: tcp, IntervalMs: 10}, "service.health_check.interval_ms"},
		{"timeout too short", &vipdv1.HealthCheck{Protocol: tcp, TimeoutMs: 1}, "service.health_check.timeout_ms"},
		{"timeout over interval", &vipdv1.HealthCheck{Protocol: tcp, IntervalMs: 100, TimeoutMs: 200}, "service.health_check.timeout_ms"},
		{"timeout over default interval", &vipdv1.HealthCheck{Protocol: tcp, TimeoutMs: 3000}, "service.health_check.timeout_ms"},
		{"healthy threshold", &vipdv1.HealthCheck{Protocol: tcp, HealthyThreshold: 101}, "service.health_check.healthy_threshold"},
		{"unhealthy threshold", &vipdv1.HealthCheck{Protocol: tcp, UnhealthyThreshold: 101}, "service.health_check.unhealthy_threshold"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := valid()
			svc.HealthCheck = tc.hc
			_, _, v := validation.Service(svc, validation.Limits{}, "service")
			if tc.field == "" {
				if len(v) > 0 {
					t.Fatalf("refused: %v", v)
				}
				return
			}
			if len(v) != 1 || v[0].Field != tc.field {
				t.Fatalf("violations %v, want one on %s", v, tc.field)
			}
		})
	}
}

func TestHealthDefaults(t *testing.T) {
	d := validation.HealthDefaults(&vipdv1.HealthCheck{Protocol: vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_HTTP})
	if d.IntervalMs != 2000 || d.TimeoutMs != 1000 || d.HealthyThreshold != 2 || d.UnhealthyThreshold != 3 || d.Path != "/" {
		t.Fatalf("defaults %v", d)
	}
	d = validation.HealthDefaults(&vipdv1.HealthCheck{IntervalMs: 200})
	if d.TimeoutMs != 200 {
		t.Fatalf("timeout %d, want the interval, 200", d.TimeoutMs)
	}
}
