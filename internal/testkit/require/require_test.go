package require

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
)

// recorder is a testing.TB that records how a policy ended the test
// instead of ending a real one. Like testing.T, Skip and Fatal stop the
// goroutine that calls them.
type recorder struct {
	testing.TB // nil: a method the policy should not call panics
	skipped    string
	fatal      string
}

func (r *recorder) Helper() {}
func (r *recorder) Skip(args ...any) {
	r.skipped = fmt.Sprint(args...)
	runtime.Goexit()
}
func (r *recorder) Fatal(args ...any) {
	r.fatal = fmt.Sprint(args...)
	runtime.Goexit()
}

// run runs policy against a recorder, on a goroutine of its own since the
// recorder may end it, and returns the recorder.
func run(policy func(testing.TB)) *recorder {
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		policy(r)
	}()
	<-done
	return r
}

func TestRoot(t *testing.T) {
	for _, tc := range []struct {
		name        string
		euid        int
		ci          string
		skip, fatal string
	}{
		{name: "root", euid: 0, ci: "true"},
		{name: "root without CI", euid: 0},
		{name: "not root", euid: 1000, skip: "testing things needs root"},
		{name: "not root, CI=false", euid: 1000, ci: "false", skip: "testing things needs root"},
		{name: "not root under CI", euid: 1000, ci: "true", fatal: "testing things needs root (CI=true: not skipping)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("CI", tc.ci)
			old := geteuid
			geteuid = func() int { return tc.euid }
			t.Cleanup(func() { geteuid = old })
			r := run(func(tb testing.TB) { Root(tb, "testing things") })
			if r.skipped != tc.skip || r.fatal != tc.fatal {
				t.Errorf("skipped %q, fatal %q; want skipped %q, fatal %q", r.skipped, r.fatal, tc.skip, tc.fatal)
			}
		})
	}
}

func TestKernelFeature(t *testing.T) {
	missing := errors.New("no such thing")
	for _, tc := range []struct {
		name        string
		err         error
		ci          string
		skip, fatal string
	}{
		{name: "present", ci: "true"},
		{name: "present without CI"},
		{name: "missing", err: missing, skip: "frobnication is not available here: no such thing"},
		{name: "missing under CI", err: missing, ci: "true", fatal: "frobnication is not available here: no such thing (CI=true: not skipping)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("CI", tc.ci)
			r := run(func(tb testing.TB) { KernelFeature(tb, "frobnication", tc.err) })
			if r.skipped != tc.skip || r.fatal != tc.fatal {
				t.Errorf("skipped %q, fatal %q; want skipped %q, fatal %q", r.skipped, r.fatal, tc.skip, tc.fatal)
			}
		})
	}
}

// TestRealTest checks the policy against a real testing.T: without CI a
// missing feature skips the test; under CI=true it fails it, which a child
// test process running TestHelperMissingFeature shows.
func TestRealTest(t *testing.T) {
	t.Run("skip", func(t *testing.T) {
		t.Setenv("CI", "")
		var inner *testing.T
		ok := t.Run("inner", func(t *testing.T) {
			inner = t
			KernelFeature(t, "frobnication", errors.New("missing"))
			t.Error("KernelFeature returned for a missing feature")
		})
		if !ok || !inner.Skipped() {
			t.Errorf("subtest passed %v, skipped %v; want it skipped", ok, inner.Skipped())
		}
	})
	t.Run("fail under CI", func(t *testing.T) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperMissingFeature$", "-test.count=1")
		cmd.Env = append(os.Environ(), "CI=true", helperEnv+"=1")
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Fatalf("child test: got %v, want exit status 1; output:\n%s", err, out)
		}
		for _, want := range []string{
			"--- FAIL: TestHelperMissingFeature",
			"frobnication is not available here: missing (CI=true: not skipping)",
		} {
			if !strings.Contains(string(out), want) {
				t.Errorf("child test output lacks %q:\n%s", want, out)
			}
		}
		if strings.Contains(string(out), "returned") {
			t.Errorf("KernelFeature returned under CI=true:\n%s", out)
		}
	})
}

// helperEnv makes TestHelperMissingFeature run; without it the test does
// nothing.
const helperEnv = "VIPD_REQUIRE_HELPER"

func TestHelperMissingFeature(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		return
	}
	KernelFeature(t, "frobnication", errors.New("missing"))
	t.Log("KernelFeature returned")
}

func TestCI(t *testing.T) {
	for v, want := range map[string]bool{"true": true, "": false, "1": false, "false": false, "TRUE": false} {
		t.Setenv("CI", v)
		if got := CI(); got != want {
			t.Errorf("CI with CI=%q: got %v, want %v", v, got, want)
		}
	}
}
