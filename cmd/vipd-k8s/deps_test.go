package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestDepsLeaveOutVipctl: vipd-k8s talks to vipd through package client
// alone; it must not link vipctl's command tree (internal/cli), which it
// once imported only for the default socket.
func TestDepsLeaveOutVipctl(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go test puts the go command on PATH, but: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list -deps .: %v\n%s", err, stderr)
	}
	deps := strings.Fields(string(out))
	// The positive check keeps an empty or unexpected listing from passing.
	for _, want := range []string{"github.com/vipd/vipd/cmd/vipd-k8s", "github.com/vipd/vipd/client"} {
		if !slices.Contains(deps, want) {
			t.Fatalf("go list -deps . lists %d packages but not %s", len(deps), want)
		}
	}
	for _, d := range deps {
		if d == "github.com/vipd/vipd/internal/cli" || strings.HasPrefix(d, "github.com/vipd/vipd/internal/cli/") {
			t.Errorf("vipd-k8s depends on %s; take what it needs from package client", d)
		}
	}
}
