package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoHarnessDependencies checks that the daemon ships no test code: no
// package it is built from imports "testing" or the test harness under
// internal/testkit, however indirectly.
func TestNoHarnessDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go list -deps: %v: %s", err, stderr)
	}
	deps := strings.Fields(string(out))
	if len(deps) == 0 {
		t.Fatal("go list -deps listed nothing")
	}
	for _, p := range deps {
		if p == "testing" || strings.HasPrefix(p, "testing/") || strings.Contains(p, "/internal/testkit") {
			t.Errorf("cmd/vipd depends on %s; find who imports it with: go list -deps -f '{{.ImportPath}}: {{.Imports}}' ./cmd/vipd | grep %s", p, p)
		}
	}
}
