package daemon_test

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestCleanupRefusesWhileSocketAnswers checks that vipd cleanup refuses,
// naming the socket, while a vipd answers on --socket (or VIPD_SOCKET) even
// though --state-dir is not that vipd's, and that it logs that the state
// dir has no lock file; and that once that vipd has stopped, a socket
// that nobody answers on does not refuse.
func TestCleanupRefusesWhileSocketAnswers(t *testing.T) {
	p := startServing(t)
	// A namespace that does not exist: a cleanup that is not refused fails
	// there instead of cleaning the test's own namespace.
	const netnsPath = "/nonexistent/vipd-test-netns"
	cleanup := func(env []string, args ...string) (string, int) {
		t.Helper()
		args = append([]string{"cleanup", "--netns", netnsPath, "--bpffs", t.TempDir(),
			"--state-dir", filepath.Join(t.TempDir(), "not-vipds")}, args...)
		var out bytes.Buffer
		cmd := exec.Command(vipdPath(t), args...)
		cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		var exit *exec.ExitError
		switch {
		case err == nil:
			return out.String(), 0
		case errors.As(err, &exit):
			return out.String(), exit.ExitCode()
		}
		t.Fatal(err)
		return "", 0
	}
	refused := func(how, out string, code int) {
		t.Helper()
		if code == 0 || !strings.Contains(out, "refusing to clean up: a running vipd answers on its API socket "+p.socket) || !strings.Contains(out, "--force") {
			t.Fatalf("cleanup (%s) while vipd answers on %s: exit %d, want a refusal naming the socket and --force:\n%s", how, p.socket, code, out)
		}
		if !strings.Contains(out, "[WARN]  vipd: no vipd lock file in the state dir") {
			t.Fatalf("cleanup (%s) with a state dir without a lock file does not say so:\n%s", how, out)
		}
	}
	out, code := cleanup(nil, "--socket", p.socket)
	refused("--socket", out, code)
	out, code = cleanup([]string{"VIPD_SOCKET=" + p.socket})
	refused("VIPD_SOCKET", out, code)

	p.signal(syscall.SIGTERM)
	if code := p.wait(15 * time.Second); code != 0 {
		t.Fatalf("vipd exited %d:\n%s", code, p.stderr)
	}
	if _, err := os.Stat(p.socket); err != nil {
		// vipd removed it: leave a socket nobody listens on, as a killed
		// vipd does.
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p.socket, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		l.SetUnlinkOnClose(false)
		l.Close()
	}
	if out, _ := cleanup(nil, "--socket", p.socket); strings.Contains(out, "refusing") {
		t.Fatalf("cleanup after vipd stopped refused:\n%s", out)
	}
}
