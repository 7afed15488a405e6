// Package require is the test suite's one policy for a test that needs
// something of the machine it runs on: root, or a kernel feature. Without it
// the test skips, saying why. With CI=true in the environment it fails
// instead, so that CI cannot pass by skipping what it is there to run.
//
// It is test harness: it imports "testing", and no product package may
// import it.
package require

import (
	"fmt"
	"os"
	"testing"
)

// geteuid is os.Geteuid, replaced by the package's own tests.
var geteuid = os.Geteuid

// Root skips the test unless it runs as root, or fails it under CI=true.
// what says what needs root, as in "creating network namespaces", and
// becomes the message "<what> needs root".
func Root(tb testing.TB, what string) {
	tb.Helper()
	if geteuid() == 0 {
		return
	}
	unavailable(tb, what+" needs root")
}

// KernelFeature skips the test when err, the outcome of probing for
// feature, is not nil, or fails it under CI=true. The caller decides which
// errors mean that the feature is missing (a verifier rejection, say, is a
// bug, never a reason to skip) and passes nil for the others.
func KernelFeature(tb testing.TB, feature string, err error) {
	tb.Helper()
	if err == nil {
		return
	}
	unavailable(tb, fmt.Sprintf("%s is not available here: %v", feature, err))
}

// CI reports whether the tests run under CI (CI=true in the environment),
// where nothing may be skipped for want of root or a kernel feature.
func CI() bool { return os.Getenv("CI") == "true" }

// unavailable skips the test for reason, or fails it under CI=true.
func unavailable(tb testing.TB, reason string) {
	tb.Helper()
	if CI() {
		tb.Fatal(reason + " (CI=true: not skipping)")
	}
	tb.Skip(reason)
}
