package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// module is this repository's module path.
const module = "github.com/vipd/vipd"

// forbiddenDeps are packages the vipd binary must not link: the testing
// package, and test fakes, which only tests may import.
var forbiddenDeps = []string{
	"testing",
	module + "/dataplane/fake",
}

// forbiddenPrefixes are trees of packages vipd must not link at all.
var forbiddenPrefixes = []string{
	module + "/internal/testkit/",
}

// TestNoTestCodeInTheBinary lists vipd's dependencies with go list -deps
// and checks that none is test-only code: neither "testing" nor the test
// harness, however indirectly, and not the recording fake dataplane (the
// binary ships --dataplane none). To find who imports a package it names:
// go list -deps -f '{{.ImportPath}}: {{.Imports}}' ./cmd/vipd | grep PKG
func TestNoTestCodeInTheBinary(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go list needs the go command: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-deps", module+"/cmd/vipd").Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list -deps: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	// The list must be the real one, not empty or some other package's.
	for _, want := range []string{module + "/internal/daemon", module + "/dataplane/none", module + "/server"} {
		if !slices.Contains(deps, want) {
			t.Fatalf("go list -deps ./cmd/vipd does not list %s; got %d packages", want, len(deps))
		}
	}
	for _, dep := range deps {
		if slices.Contains(forbiddenDeps, dep) {
			t.Errorf("vipd links %s, which is for tests only", dep)
		}
		for _, p := range forbiddenPrefixes {
			if strings.HasPrefix(dep, p) {
				t.Errorf("vipd links %s, which is test harness", dep)
			}
		}
	}
}
