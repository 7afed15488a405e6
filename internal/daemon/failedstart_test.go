package daemon_test

import (
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestFailedStartLeavesNoSocket runs vipd with an address another process
// already listens on, and checks that it exits with an error naming the
// address, leaves no socket file behind, and does not log a graceful-stop
// timeout (there was nothing to stop).
func TestFailedStartLeavesNoSocket(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"metrics port taken", []string{"--metrics-addr", addr}},
		{"listen address taken", []string{"--listen", "tcp://" + addr, "--insecure-listen"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, code := runProc(t, tc.args...)
			log := p.stderr.String()
			if code == 0 || !strings.Contains(log, addr) || !strings.Contains(log, "address already in use") {
				t.Fatalf("vipd exited %d, want an error naming %s:\n%s", code, addr, log)
			}
			if _, err := os.Lstat(p.socket); !os.IsNotExist(err) {
				t.Errorf("socket %s left behind after a failed start (%v):\n%s", p.socket, err, log)
			}
			if strings.Contains(log, "graceful stop") {
				t.Errorf("a failed start logs a graceful stop:\n%s", log)
			}
		})
	}
}

// TestShutdownTimeoutZeroStopsAtOnce checks --shutdown-timeout 0: SIGTERM
// stops vipd at once, cleanly, without a graceful-stop timeout in the log.
func TestShutdownTimeoutZeroStopsAtOnce(t *testing.T) {
	p := startServing(t, "--shutdown-timeout", "0")
	p.signal(syscall.SIGTERM)
	if code := p.wait(15 * time.Second); code != 0 {
		t.Fatalf("vipd exited %d:\n%s", code, p.stderr)
	}
	if strings.Contains(p.stderr.String(), "graceful stop") {
		t.Errorf("--shutdown-timeout 0 logs a graceful stop timeout:\n%s", p.stderr)
	}
}
