package iptablestest

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestProductDoesNotImport: no binary links this package; it is for tests.
func TestProductDoesNotImport(t *testing.T) {
	const self = "github.com/vipd/vipd/dataplane/iptables/iptablestest"
	out, err := exec.Command("go", "list", "-deps", "github.com/vipd/vipd/cmd/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/vipd/vipd/dataplane/iptables") {
		t.Fatalf("go list lists no iptables dataplane among the binaries' %d dependencies", len(deps))
	}
	if slices.Contains(deps, self) {
		t.Fatalf("a binary under cmd/ imports %s", self)
	}
}
