package daemon_test

import (
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

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

// TestDefaultSocketMode checks the socket's mode when none is given: 0600
// without a socket group, with no warning, and 0660 with one.
func TestDefaultSocketMode(t *testing.T) {
	for _, tc := range []struct {
		group string
		want  os.FileMode
	}{
		{"", 0o600},
		{strconv.Itoa(os.Getegid()), 0o660}, // a group of our own: no root needed
	} {
		cfg := config(t)
		cfg.SocketMode, cfg.SocketGroup = 0, tc.group
		r := start(t, cfg, healthpb.HealthCheckResponse_SERVING)
		deadline := time.Now().Add(5 * time.Second)
		for {
			fi, err := os.Stat(cfg.Socket)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() == tc.want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("--socket-group %q: socket mode %v, want %v", tc.group, fi.Mode().Perm(), tc.want)
			}
			time.Sleep(5 * time.Millisecond)
		}
		if strings.Contains(r.log.String(), "group-writable") {
			t.Fatalf("--socket-group %q: a warning with the default socket mode:\n%s", tc.group, r.log)
		}
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCheckGCPercentOff checks that a negative GCPercent passes Check only
// with a memory limit.
func TestCheckGCPercentOff(t *testing.T) {
	if debug.SetMemoryLimit(-1) != math.MaxInt64 {
		t.Skip("GOMEMLIMIT is set in the test's environment")
	}
	cfg := config(t)
	cfg.Memory.GCPercent = -1
	if err := cfg.Check(); err == nil || !strings.Contains(err.Error(), "--gc-percent -1") {
		t.Fatalf("GCPercent -1 without a limit: %v; want it refused", err)
	}
	cfg.Memory.Limit = 1 << 30
	if err := cfg.Check(); err != nil {
		t.Fatalf("GCPercent -1 with a 1 GiB limit: %v", err)
	}
}

// TestCheckZone checks that --zone takes what a backend's zone may be: at
// most 63 characters, without control characters.
func TestCheckZone(t *testing.T) {
	for zone, ok := range map[string]bool{"": true, "zone-a": true, strings.Repeat("z", 63): true,
		strings.Repeat("z", 64): false, "zone\n": false} {
		cfg := config(t)
		cfg.Zone = zone
		if err := cfg.Check(); (err == nil) != ok {
			t.Errorf("--zone %q: Check() = %v, want ok %v", zone, err, ok)
		} else if err != nil && !strings.Contains(err.Error(), "--zone") {
			t.Errorf("--zone %q: the error %q does not name the flag", zone, err)
		}
	}
}
