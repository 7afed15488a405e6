package daemon_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vipd/vipd/internal/daemon"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// corruptState writes services through a daemon on cfg, stops it, and
// flips a byte of the state file's payload.
func corruptState(t *testing.T, cfg daemon.Config) {
	t.Helper()
	r := start(t, cfg, healthpb.HealthCheckResponse_SERVING)
	if _, err := r.local.UpsertService(ctxT(t), svc("web", "k8s", "198.19.0.1", "198.18.1.10"), 0); err != nil {
		t.Fatal(err)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(cfg.StateDir, "state")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)-2] ^= 0xff
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestRecover walks through a --recover start over a corrupt state file:
// the plain start refuses, naming the file and --recover; --recover moves
// the file aside, is not ready and refuses every change but SyncServices
// with FailedPrecondition (a restart meanwhile holds again, or refuses
// without --recover), and the first SyncServices makes it ready.
func TestRecover(t *testing.T) {
	cfg := config(t)
	corruptState(t, cfg)

	err := daemon.Run(ctxT(t), testLogger(t), cfg)
	statePath := filepath.Join(cfg.StateDir, "state")
	for _, want := range []string{"refusing to start", statePath, "corrupt", "--recover"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("plain start over a corrupt state: %v, want an error with %q", err, want)
		}
	}

	cfg.Recover = true
	r := start(t, cfg, healthpb.HealthCheckResponse_NOT_SERVING)
	moved, _ := filepath.Glob(statePath + ".corrupt-*")
	if len(moved) != 1 {
		t.Fatalf("state files moved aside: %v, want one", moved)
	}
	if _, err := os.Stat(statePath); err == nil {
		t.Fatalf("the corrupt state file is still at %s", statePath)
	}
	if !strings.Contains(r.log.String(), "moved the unreadable state aside") || !strings.Contains(r.log.String(), moved[0]) {
		t.Errorf("the log does not say where the state went:\n%s", r.log)
	}
	checkHeld := func() {
		t.Helper()
		st, err := r.local.Status(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if st.GetReady() || !strings.Contains(st.GetLastError(), "not ready") || !strings.Contains(st.GetLastError(), "--recover") {
			t.Fatalf("GetStatus while held: ready %v, last_error %q", st.GetReady(), st.GetLastError())
		}
		for name, call := range map[string]func() error{
			"UpsertService": func() error {
				_, err := r.local.UpsertService(ctxT(t), svc("web", "k8s", "198.19.0.1"), 0)
				return err
			},
			"DeleteService": func() error { return r.local.DeleteService(ctxT(t), "web", 0) },
			"UpdateBackends": func() error {
				_, err := r.local.UpdateBackends(ctxT(t), "web", []*vipdv1.Backend{{Ip: "198.18.1.11"}}, nil, 0)
				return err
			},
		} {
			if err := call(); status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "SyncServices") {
				t.Errorf("%s while held: %v, want FailedPrecondition naming SyncServices", name, err)
			}
		}
	}
	checkHeld()

	// A restart before the first SyncServices: without --recover it
	// refuses (the empty state on disk is not the control plane's), with
	// it it holds again.
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	plain := cfg
	plain.Recover = false
	if err := daemon.Run(ctxT(t), testLogger(t), plain); err == nil || !strings.Contains(err.Error(), "recover-pending") || !strings.Contains(err.Error(), "--recover") {
		t.Fatalf("plain restart during the hold: %v", err)
	}
	r = start(t, cfg, healthpb.HealthCheckResponse_NOT_SERVING)
	checkHeld()

	resp, err := r.local.SyncServices(ctxT(t), "k8s", []*vipdv1.Service{svc("web", "", "198.19.0.1", "198.18.1.12")})
	if err != nil || len(resp.GetCreated()) != 1 {
		t.Fatalf("SyncServices while held: %v %v", resp, err)
	}
	// Health turns SERVING right after the SyncServices returns.
	waitHealth(t, r, healthpb.HealthCheckResponse_SERVING)
	st, err := r.local.Status(ctxT(t))
	if err != nil || !st.GetReady() || st.GetLastError() != "" || st.GetServices() != 1 {
		t.Fatalf("GetStatus after the first SyncServices: %v %v", st, err)
	}
	if _, err := r.local.UpdateBackends(ctxT(t), "web", []*vipdv1.Backend{{Ip: "198.18.1.13"}}, nil, 0); err != nil {
		t.Fatalf("UpdateBackends after the hold: %v", err)
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, "recover-pending")); err == nil {
		t.Fatal("the recover marker is still there after the first SyncServices")
	}
	// And a plain restart now starts over the synced state.
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	r = start(t, plain, healthpb.HealthCheckResponse_SERVING)
	got, err := r.local.GetService(ctxT(t), "web")
	if err != nil || len(got.GetBackends()) != 2 {
		t.Fatalf("service after a plain restart: %v %v", got, err)
	}
}

// TestRecoverOverGoodState checks that --recover changes nothing when the
// state is readable.
func TestRecoverOverGoodState(t *testing.T) {
	cfg := config(t)
	r := start(t, cfg, healthpb.HealthCheckResponse_SERVING)
	if _, err := r.local.UpsertService(ctxT(t), svc("web", "k8s", "198.19.0.1"), 0); err != nil {
		t.Fatal(err)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	cfg.Recover = true
	r = start(t, cfg, healthpb.HealthCheckResponse_SERVING)
	if _, err := r.local.GetService(ctxT(t), "web"); err != nil {
		t.Fatal(err)
	}
	if moved, _ := filepath.Glob(filepath.Join(cfg.StateDir, "*.corrupt-*")); len(moved) != 0 {
		t.Fatalf("moved aside: %v", moved)
	}
}
