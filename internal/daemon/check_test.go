package daemon_test

import (
	"strings"
	"testing"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestZeroLimitsMeanNoLimit checks that 0 means no limit for the limits
// whose 0 used to mean a default (--max-ports was 100): a service with
// more ports than that default is accepted.
func TestZeroLimitsMeanNoLimit(t *testing.T) {
	cfg := config(t)
	cfg.MaxPorts, cfg.MaxBackends = 0, 0
	r := start(t, cfg, healthpb.HealthCheckResponse_SERVING)
	s := svc("many", "team-a", "198.19.0.1", "198.18.0.1")
	s.Ports = nil
	for i := range 150 {
		s.Ports = append(s.Ports, &vipdv1.Port{Name: "p" + string(rune('a'+i/26)) + string(rune('a'+i%26)), Port: uint32(1000 + i)})
	}
	if _, err := r.local.UpsertService(ctxT(t), s, 0); err != nil {
		t.Fatalf("150 ports with --max-ports 0: %v", err)
	}
}

// TestGroupWritableSocketWithoutGroupWarns checks the warning for a
// group-writable socket whose group vipd was not told.
func TestGroupWritableSocketWithoutGroupWarns(t *testing.T) {
	cfg := config(t)
	r := start(t, cfg, healthpb.HealthCheckResponse_SERVING)
	if !strings.Contains(r.log.String(), "[WARN]  vipd: the socket is group-writable but --socket-group is not set") {
		t.Fatalf("no warning for socket mode %#o without --socket-group:\n%s", cfg.SocketMode, r.log)
	}
	cfg = config(t)
	cfg.SocketMode = 0o600
	if r := start(t, cfg, healthpb.HealthCheckResponse_SERVING); strings.Contains(r.log.String(), "--socket-group") {
		t.Fatalf("a warning for socket mode 0600:\n%s", r.log)
	}
}
