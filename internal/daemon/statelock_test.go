package daemon_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/vipd/vipd/internal/daemon"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestLockStateDir checks what vipd cleanup relies on: a running vipd's
// state directory cannot be locked, and the error names vipd's pid; once
// vipd has stopped, or where none ever ran, the lock is taken.
func TestLockStateDir(t *testing.T) {
	if release, err := daemon.LockStateDir(filepath.Join(t.TempDir(), "none")); err != nil {
		t.Fatalf("a state dir that does not exist: %v", err)
	} else {
		release()
	}
	cfg := config(t)
	r := start(t, cfg, healthpb.HealthCheckResponse_SERVING)
	_, err := daemon.LockStateDir(cfg.StateDir)
	var inUse *daemon.StateDirInUseError
	if !errors.As(err, &inUse) || inUse.PID != os.Getpid() || inUse.Dir != cfg.StateDir {
		t.Fatalf("LockStateDir while vipd runs: %v (%+v), want a StateDirInUseError naming pid %d", err, inUse, os.Getpid())
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	release, err := daemon.LockStateDir(cfg.StateDir)
	if err != nil {
		t.Fatalf("LockStateDir after vipd stopped: %v", err)
	}
	// While cleanup holds it, no vipd starts on the directory.
	if err := daemon.Run(ctxT(t), testLogger(t), cfg); err == nil {
		t.Fatal("vipd started while the state dir was locked")
	}
	release()
}
