package daemon_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// notifySocket is a NOTIFY_SOCKET as systemd makes one for a Type=notify
// service: a datagram socket that receives one state per datagram.
type notifySocket struct {
	path string
	conn *net.UnixConn
	msgs chan string
}

func listenNotify(t *testing.T) *notifySocket {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	s := &notifySocket{path: path, conn: conn, msgs: make(chan string, 16)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			for _, line := range strings.Split(strings.TrimSpace(string(buf[:n])), "\n") {
				s.msgs <- line
			}
		}
	}()
	t.Cleanup(func() { conn.Close(); <-done })
	return s
}

// next waits up to timeout for the next state vipd sends.
func (s *notifySocket) next(t *testing.T, p *proc, timeout time.Duration) string {
	t.Helper()
	select {
	case m := <-s.msgs:
		return m
	case <-p.done:
		t.Fatalf("vipd exited (%v) before notifying:\n%s", p.err, p.stderr)
	case <-time.After(timeout):
		t.Fatalf("no notification from vipd within %v:\n%s", timeout, p.stderr)
	}
	return ""
}

// TestSdNotify runs vipd as systemd runs a Type=notify service, with
// NOTIFY_SOCKET naming a datagram socket, and checks that it sends READY=1
// only once health says SERVING, and STOPPING=1 when SIGTERM stops it.
func TestSdNotify(t *testing.T) {
	ns := listenNotify(t)
	p := startProc(t, []string{"PATH=" + os.Getenv("PATH"), "NOTIFY_SOCKET=" + ns.path})
	if m := ns.next(t, p, 20*time.Second); m != "READY=1" {
		t.Fatalf("first notification %q, want READY=1", m)
	}
	c := startServingClient(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if st, err := c.Health(ctx); err != nil || st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health %v, %v right after READY=1; want SERVING", st, err)
	}
	select {
	case m := <-ns.msgs:
		t.Fatalf("unexpected notification %q while running", m)
	default:
	}
	p.signal(syscall.SIGTERM)
	if m := ns.next(t, p, 10*time.Second); m != "STOPPING=1" {
		t.Fatalf("notification on SIGTERM %q, want STOPPING=1", m)
	}
	if code := p.wait(15 * time.Second); code != 0 {
		t.Fatalf("vipd exited %d after SIGTERM:\n%s", code, p.stderr)
	}
}

// TestSdNotifyNotReady checks that a vipd that never becomes ready (it
// holds after --recover until the first SyncServices) sends no READY=1,
// so that systemd does not count it as started.
func TestSdNotifyNotReady(t *testing.T) {
	cfg := config(t)
	corruptState(t, cfg)
	ns := listenNotify(t)
	p := startProc(t, []string{"PATH=" + os.Getenv("PATH"), "NOTIFY_SOCKET=" + ns.path}, "--state-dir", cfg.StateDir, "--recover")
	p.waitLog("until the first SyncServices")
	select {
	case m := <-ns.msgs:
		t.Fatalf("notification %q from a vipd that holds (health NOT_SERVING), want none", m)
	case <-time.After(time.Second):
	}
	p.signal(syscall.SIGTERM)
	if m := ns.next(t, p, 10*time.Second); m != "STOPPING=1" {
		t.Fatalf("notification on SIGTERM %q, want STOPPING=1", m)
	}
	p.wait(15 * time.Second)
}
