package daemon_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/internal/daemon"
)

func config(t *testing.T) daemon.Config {
	dir := t.TempDir()
	return daemon.Config{
		Socket:          filepath.Join(dir, "vipd.sock"),
		SocketMode:      0o660,
		StateDir:        filepath.Join(dir, "state"),
		Dataplane:       daemon.DataplaneNone,
		MaxBackends:     10,
		MaxRecvMsgSize:  1 << 20,
		FlowBuffer:      64,
		ShutdownTimeout: time.Second,
	}
}

func TestRefusesCorruptState(t *testing.T) {
	cfg := config(t)
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfg.StateDir, "state"), []byte("vipdstat\x01\x00\x00\x00 torn"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := daemon.Run(ctx, hclog.NewNullLogger(), cfg)
	if err == nil || !strings.Contains(err.Error(), "refusing to start") || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("Run over a corrupt state file returned %v", err)
	}
	if _, err := os.Stat(cfg.Socket); err == nil {
		t.Fatalf("vipd opened its socket despite the corrupt state")
	}
}

func TestRunsAndStopsGracefully(t *testing.T) {
	cfg := config(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- daemon.Run(ctx, hclog.NewNullLogger(), cfg) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.Dial("unix", cfg.Socket)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("socket never came up: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The socket is chmodded right after it starts listening (until then
	// its mode is the more restrictive one of the umask).
	for {
		fi, err := os.Stat(cfg.Socket)
		if err == nil && fi.Mode().Perm() == 0o660 {
			break
		}
		if time.Now().After(deadline) {
			if err != nil {
				t.Fatalf("stat socket: %v", err)
			}
			t.Fatalf("socket mode %v; want 0660", fi.Mode())
		}
		time.Sleep(5 * time.Millisecond)
	}
	// A second daemon on the same state dir is refused.
	second := cfg
	second.Socket = cfg.Socket + "2"
	if err := daemon.Run(context.Background(), hclog.NewNullLogger(), second); err == nil || !strings.Contains(err.Error(), "another vipd") {
		t.Fatalf("second daemon on one state dir: %v", err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v after shutdown", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after shutdown")
	}
}

func TestUnknownDataplane(t *testing.T) {
	cfg := config(t)
	cfg.Dataplane = "ipvs"
	if err := daemon.Run(context.Background(), hclog.NewNullLogger(), cfg); err == nil || !strings.Contains(err.Error(), "unknown dataplane") {
		t.Fatalf("got %v", err)
	}
}

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true},
		{"1048576", 1 << 20, true},
		{"512MiB", 512 << 20, true},
		{"2GiB", 2 << 30, true},
		{"64KiB", 64 << 10, true},
		{"", 0, false},
		{"-1", 0, false},
		{"1.5GiB", 0, false},
		{"512MB", 0, false},
		{"9000000000GiB", 0, false},
	} {
		got, err := daemon.ParseSize(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

// TestPprofNeedsMetricsAddr checks that profiles, which are served on the
// metrics listener, are refused without one rather than silently absent.
func TestPprofNeedsMetricsAddr(t *testing.T) {
	cfg := config(t)
	cfg.Pprof = true
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := daemon.Run(ctx, hclog.NewNullLogger(), cfg); err == nil || !strings.Contains(err.Error(), "metrics address") {
		t.Fatalf("Run with pprof and no metrics address: %v, want an error naming the metrics address", err)
	}
}
