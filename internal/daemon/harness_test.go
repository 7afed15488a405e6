package daemon_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/daemon"
	"github.com/vipd/vipd/internal/testkit/syncbuf"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// running is a daemon.Run in this process, logging at info level (the
// default) into log.
type running struct {
	t      *testing.T
	cfg    daemon.Config
	log    *syncbuf.Buffer
	cancel context.CancelFunc
	done   chan error
	local  *client.Client // over the Unix socket
}

// start runs vipd with cfg and waits until its Unix socket answers health
// checks with want. It is stopped at the end of the test.
func start(t *testing.T, cfg daemon.Config, want healthpb.HealthCheckResponse_ServingStatus) *running {
	t.Helper()
	return startAt(t, hclog.Info, cfg, want)
}

// startAt is start logging at level.
func startAt(t *testing.T, level hclog.Level, cfg daemon.Config, want healthpb.HealthCheckResponse_ServingStatus) *running {
	t.Helper()
	r := &running{t: t, cfg: cfg, log: &syncbuf.Buffer{}, done: make(chan error, 1)}
	log := hclog.New(&hclog.LoggerOptions{Name: "vipd", Level: level, Output: r.log})
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- daemon.Run(ctx, log, cfg) }()
	t.Cleanup(func() { r.stop() })
	var err error
	if r.local, err = client.New(cfg.Socket, client.WithMaxAttempts(1)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.local.Close() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case err := <-r.done:
			r.done <- err
			t.Fatalf("vipd exited at start: %v\nlog:\n%s", err, r.log)
		default:
		}
		hctx, hcancel := context.WithTimeout(context.Background(), time.Second)
		st, err := r.local.Health(hctx)
		hcancel()
		if err == nil && st == want {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("vipd health: %v %v, want %v\nlog:\n%s", st, err, want, r.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop stops vipd as SIGTERM does and returns Run's error.
func (r *running) stop() error {
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err
		return err
	case <-time.After(15 * time.Second):
		r.t.Errorf("vipd did not stop\nlog:\n%s", r.log)
		return errors.New("vipd did not stop")
	}
}

// freeAddr returns a loopback TCP address that was free a moment ago.
func freeAddr(t *testing.T, network, host string) string {
	t.Helper()
	l, err := net.Listen(network, net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// testLogger logs to the test's log.
func testLogger(t *testing.T) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "vipd", Level: hclog.Debug, Output: testWriter{t}})
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// waitHealth waits up to 5 s for vipd's health to be want.
func waitHealth(t *testing.T, r *running, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := r.local.Health(ctxT(t))
		if err == nil && st == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("health %v %v, want %v", st, err, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
