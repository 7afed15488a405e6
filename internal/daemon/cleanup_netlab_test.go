package daemon_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/testkit/netlab"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// TestCleanupRefusesWhileVipdRuns runs vipd with the iptables dataplane in
// a lab node and checks, on real traffic, that vipd cleanup with the same
// --state-dir refuses while vipd runs (naming its pid and --force) and
// leaves the VIP working; that --force cleans up anyway; and that once vipd
// has stopped, cleanup proceeds without --force.
func TestCleanupRefusesWhileVipdRuns(t *testing.T) {
	netlab.RequireRoot(t)
	lab := netlab.New(t, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: []string{"client", "be1"}}}})
	node := lab.Node(1)
	cl, be1 := node.Pod("client"), node.Pod("be1")
	if _, err := be1.StartEcho("be1", 8080); err != nil {
		t.Fatal(err)
	}
	vip := netip.MustParseAddrPort("198.19.0.10:80")
	bpffs := t.TempDir() // no eBPF pins: cleanup finds nothing there
	expect := func(when, want string, n int) {
		t.Helper()
		for i := range n {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			r, err := cl.Request(ctx, "tcp", vip.String())
			cancel()
			switch {
			case want == "" && err == nil:
				t.Fatalf("%s: request %d to %v answered by %s; want no service there", when, i, vip, r.Backend)
			case want != "" && (err != nil || r.Backend != want):
				t.Fatalf("%s: request %d to %v: %v %v; want %s to answer", when, i, vip, r.Backend, err, want)
			}
		}
	}
	program := func() *proc {
		t.Helper()
		// No drift check or resync: they would reprogram what cleanup
		// --force removes within seconds.
		p := startServing(t, "--dataplane", "iptables", "--netns", node.Path(), "--drift-check-period", "0", "--resync-period", "0")
		api, err := client.New(p.socket, client.WithMaxAttempts(1), client.WithTimeout(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer api.Close()
		s := &vipdv1.Service{Name: "web", Vips: []string{vip.Addr().String()},
			Ports: []*vipdv1.Port{{Port: uint32(vip.Port()), TargetPort: 8080}}, Backends: []*vipdv1.Backend{{Ip: be1.IPv4().String()}}}
		if _, err := api.UpsertService(context.Background(), s, 0); err != nil {
			t.Fatal(err)
		}
		expect("programmed", "be1", 3)
		return p
	}
	cleanup := func(stateDir string, extra ...string) (string, int) {
		t.Helper()
		args := append([]string{"cleanup", "--netns", node.Path(), "--bpffs", bpffs, "--state-dir", stateDir}, extra...)
		var out bytes.Buffer
		cmd := exec.Command(vipdPath(t), args...)
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

	p := program()
	out, code := cleanup(p.stateDir)
	if code == 0 || !strings.Contains(out, fmt.Sprintf("pid %d", p.cmd.Process.Pid)) || !strings.Contains(out, "--force") {
		t.Fatalf("cleanup while vipd runs: exit %d, want a refusal naming pid %d and --force:\n%s", code, p.cmd.Process.Pid, out)
	}
	expect("after the refused cleanup", "be1", 3)

	if out, code := cleanup(p.stateDir, "--force"); code != 0 || !strings.Contains(out, "the running vipd will reprogram it within --drift-check-period; stop it first") {
		t.Fatalf("cleanup --force: exit %d:\n%s", code, out)
	}
	expect("after cleanup --force", "", 2)
	p.signal(syscall.SIGTERM)
	if code := p.wait(15 * time.Second); code != 0 {
		t.Fatalf("vipd exited %d:\n%s", code, p.stderr)
	}

	p = program()
	p.signal(syscall.SIGTERM)
	if code := p.wait(15 * time.Second); code != 0 {
		t.Fatalf("vipd exited %d:\n%s", code, p.stderr)
	}
	expect("after vipd stopped", "be1", 3)
	if out, code := cleanup(p.stateDir); code != 0 {
		t.Fatalf("cleanup after vipd stopped: exit %d:\n%s", code, out)
	}
	expect("after cleanup", "", 2)
	// A state dir that was never used has no vipd either.
	if out, code := cleanup(filepath.Join(t.TempDir(), "none")); code != 0 || !strings.Contains(out, "no vipd lock file in the state dir") {
		t.Fatalf("cleanup with an unused --state-dir: exit %d, want 0 and a log that it has no lock file:\n%s", code, out)
	}
}
