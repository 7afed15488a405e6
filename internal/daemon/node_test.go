package daemon_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/fake"
	"github.com/vipd/vipd/internal/daemon"
	"github.com/vipd/vipd/internal/testkit/syncbuf"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/test/bufconn"
)

// TestDeprecatedFakeMeansNone checks that --dataplane fake still starts,
// as the none dataplane, with a WARN line saying it is deprecated.
func TestDeprecatedFakeMeansNone(t *testing.T) {
	cfg := config(t)
	cfg.Dataplane = daemon.DataplaneFake
	r := start(t, cfg, healthpb.HealthCheckResponse_SERVING)
	st, err := r.local.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if st.GetDataplane() != daemon.DataplaneNone {
		t.Errorf("--dataplane fake runs dataplane %q, want %q", st.GetDataplane(), daemon.DataplaneNone)
	}
	if log := r.log.String(); !strings.Contains(log, "[WARN]  vipd.dataplane: --dataplane fake is deprecated") {
		t.Errorf("no WARN line about the deprecated --dataplane fake:\n%s", log)
	}
}

// TestAssembleWithDataplane runs a node over an injected recording fake, as
// the test harness does, and checks the daemon's wiring around it: the
// initial apply reaches the fake, the node is ready and serving on the
// Unix socket and on an extra listener, the API answers with the fake's
// name and the version given, and Stop leaves the fake open (the caller's)
// and releases the socket and the state directory's lock.
func TestAssembleWithDataplane(t *testing.T) {
	cfg := config(t)
	dp := fake.New()
	extra := bufconn.Listen(1 << 16)
	logs := &syncbuf.Buffer{}
	log := hclog.New(&hclog.LoggerOptions{Name: "vipd", Output: logs})
	n, err := daemon.Assemble(ctxT(t), log, cfg, daemon.WithDataplane(dp), daemon.WithVersion("v0.0.0-node"),
		daemon.WithListener(extra))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop()
	if _, err := os.Stat(cfg.Socket); err != nil {
		t.Fatalf("Assemble did not open the socket: %v", err)
	}
	if len(dp.Records()) != 0 {
		t.Fatalf("Assemble applied before Start: %v", dp.Records())
	}
	n.Start(context.Background())
	select {
	case <-n.Ready():
	case <-time.After(10 * time.Second):
		t.Fatalf("the node is not ready:\n%s", logs)
	}
	if recs := dp.Records(); len(recs) != 1 || !recs[0].Full || recs[0].Err != nil {
		t.Fatalf("applies %+v, want the initial full apply", recs)
	}
	c, err := client.New(cfg.Socket, client.WithMaxAttempts(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if h, err := c.Health(ctxT(t)); err != nil || h != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health once Ready is closed: %v, %v; want SERVING", h, err)
	}
	st, err := c.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if st.GetDataplane() != fake.Name || st.GetVersion() != "v0.0.0-node" || !st.GetReady() {
		t.Errorf("GetStatus = %v; want the fake dataplane, ready, at v0.0.0-node", st)
	}
	if _, err := c.UpsertService(ctxT(t), svc("web", "k8s", "198.19.0.1", "198.18.1.10"), 0); err != nil {
		t.Fatal(err)
	}
	if applied, _ := dp.Applied(); applied["web"] == nil {
		t.Errorf("the upsert did not reach the injected dataplane: %v", applied)
	}
	if n.Flows() == nil {
		t.Errorf("no flow hub over a dataplane that reports flows")
	}
	if got := n.Snapshot().Len(); got != 1 {
		t.Errorf("Snapshot holds %d services, want 1", got)
	}
	conn, err := extra.DialContext(ctxT(t))
	if err != nil {
		t.Fatalf("the WithListener listener does not accept: %v", err)
	}
	conn.Close()

	if err := n.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := n.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	select {
	case <-n.Done():
	default:
		t.Errorf("Done is open after Stop")
	}
	if _, err := os.Lstat(cfg.Socket); !os.IsNotExist(err) {
		t.Errorf("socket left behind after Stop: %v", err)
	}
	// The caller's dataplane stays open: it still applies.
	if err := dp.Apply(context.Background(), &dataplane.State{Generation: 99}); err != nil {
		t.Errorf("Stop closed the injected dataplane: %v", err)
	}
	release, err := daemon.LockStateDir(cfg.StateDir)
	if err != nil {
		t.Fatalf("the state directory is still locked after Stop: %v", err)
	}
	release()
	for _, want := range []string{"state restored", "dataplane opened", "ready", "shutting down; the dataplane stays programmed"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log has no %q:\n%s", want, logs)
		}
	}
}

// TestAssembleWithoutStart checks that a node that is never started is
// released by Stop: the socket is gone, the lock free, and nothing was
// applied.
func TestAssembleWithoutStart(t *testing.T) {
	cfg := config(t)
	dp := fake.New()
	n, err := daemon.Assemble(ctxT(t), hclog.NewNullLogger(), cfg, daemon.WithDataplane(dp))
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Stop(); err != nil {
		t.Fatalf("Stop without Start: %v", err)
	}
	if _, err := os.Lstat(cfg.Socket); !os.IsNotExist(err) {
		t.Errorf("socket left behind: %v", err)
	}
	if recs := dp.Records(); len(recs) != 0 {
		t.Errorf("a node never started applied %v", recs)
	}
	n2, err := daemon.Assemble(ctxT(t), hclog.NewNullLogger(), cfg, daemon.WithDataplane(dp))
	if err != nil {
		t.Fatalf("a second node on the released state directory: %v", err)
	}
	n2.Stop()
}

// TestAssembleFailureReleases checks that an Assemble that fails after the
// state directory is locked (here: the socket's directory cannot be
// created) releases the lock and closes the WithListener listeners.
func TestAssembleFailureReleases(t *testing.T) {
	cfg := config(t)
	blocker := cfg.Socket + ".d"
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Socket = blocker + "/vipd.sock" // its parent is a file
	extra := bufconn.Listen(1 << 10)
	_, err := daemon.Assemble(ctxT(t), hclog.NewNullLogger(), cfg, daemon.WithDataplane(fake.New()),
		daemon.WithListener(extra))
	if err == nil || !strings.Contains(err.Error(), blocker) {
		t.Fatalf("Assemble with a socket under a file: %v, want an error naming %s", err, blocker)
	}
	release, err := daemon.LockStateDir(cfg.StateDir)
	if err != nil {
		t.Fatalf("a failed Assemble left the state directory locked: %v", err)
	}
	release()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := extra.DialContext(ctx); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the WithListener listener is still open (dial: %v)", err)
	}
}
