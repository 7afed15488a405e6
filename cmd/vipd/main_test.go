package main

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/version"
)

// execute runs vipd's command line in this process with the none dataplane,
// a socket and state directory of the test's and no metrics listener, then
// args. A start that was not refused runs until a few seconds have passed.
func execute(t *testing.T, args ...string) (dir string, err error) {
	t.Helper()
	dir = t.TempDir()
	common := []string{"run", "--dataplane", "none", "--socket", filepath.Join(dir, "vipd.sock"),
		"--state-dir", filepath.Join(dir, "state"), "--metrics-addr", ""}
	cmd := rootCommand()
	cmd.SetArgs(append(common, args...))
	cmd.SetOut(&bytes.Buffer{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return dir, cmd.ExecuteContext(ctx)
}

// noNetNS is a --netns that does not exist: a test that passes a dataplane
// other than fake passes it too, so that a start that is not refused as it
// should be fails to open the namespace instead of programming the test's.
const noNetNS = "/nonexistent/vipd-test-netns"

// TestBadFlagsRefuseStart checks that flags that make no sense stop vipd
// before it opens anything (no state directory, no socket), with an error
// that names the flag.
func TestBadFlagsRefuseStart(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--max-backends", "-1"}, "--max-backends"},
		{[]string{"--max-ports", "-1"}, "--max-ports"},
		{[]string{"--max-services", "-5"}, "--max-services"},
		{[]string{"--max-total-backends", "-1"}, "--max-total-backends"},
		{[]string{"--max-concurrent-streams", "-1"}, "--max-concurrent-streams"},
		{[]string{"--max-inflight-requests", "-1"}, "--max-inflight-requests"},
		{[]string{"--max-flow-watchers", "-1"}, "--max-flow-watchers"},
		{[]string{"--max-recv-msg-size", "-1"}, "--max-recv-msg-size"},
		{[]string{"--flow-buffer", "0"}, "--flow-buffer"},
		{[]string{"--flow-buffer", "-3"}, "--flow-buffer"},
		{[]string{"--resync-period", "-1s"}, "--resync-period"},
		{[]string{"--drift-check-period", "-5s"}, "--drift-check-period"},
		{[]string{"--shutdown-timeout", "-1s"}, "--shutdown-timeout"},
		{[]string{"--socket-mode", "0666"}, "--socket-mode"},
		{[]string{"--socket-mode", "0661"}, "--socket-mode"},
		{[]string{"--socket-mode", "0604"}, "--socket-mode"},
		{[]string{"--socket-mode", "01660"}, "--socket-mode"},
		{[]string{"--socket-mode", "rw"}, "--socket-mode"},
		{[]string{"--max-ports", "-1", "--flow-buffer", "0"}, "--flow-buffer"},
		{[]string{"--nodeport-addresses", "198.18.0.0/16,198.18.0.1"}, `--nodeport-addresses "198.18.0.1"`},
		{[]string{"--external-interfaces", "eth*,eth["}, `--external-interfaces "eth["`},
		{[]string{"--snat-port-range", "65535-1024"}, `--snat-port-range "65535-1024"`},
		{[]string{"--socket-mode", "0"}, "--socket-mode"},
		// Negative eBPF durations are refused whatever the dataplane.
		{[]string{"--bpf-ct-gc-interval", "-1s"}, "--bpf-ct-gc-interval"},
		{[]string{"--bpf-ct-timeout-tcp-syn", "-1s"}, "--bpf-ct-timeout-tcp-syn"},
		{[]string{"--bpf-ct-timeout-tcp", "-1s"}, "--bpf-ct-timeout-tcp "},
		{[]string{"--bpf-ct-timeout-tcp-close", "-1s"}, "--bpf-ct-timeout-tcp-close"},
		{[]string{"--bpf-ct-timeout-other", "-1s"}, "--bpf-ct-timeout-other"},
		// With a dataplane that may be eBPF, so is what it cannot use. The
		// check refuses before the dataplane is opened, so no root is
		// needed (and noNetNS keeps a vipd whose check regressed from
		// programming this namespace).
		{[]string{"--dataplane", "ebpf", "--netns", noNetNS, "--bpf-ct-gc-interval", "0"}, "--bpf-ct-gc-interval"},
		{[]string{"--dataplane", "auto", "--netns", noNetNS, "--bpf-ct-gc-interval", "0"}, "--bpf-ct-gc-interval"},
		{[]string{"--dataplane", "ebpf", "--netns", noNetNS, "--bpf-ct-timeout-tcp-syn", "0"}, "--bpf-ct-timeout-tcp-syn"},
		{[]string{"--dataplane", "ebpf", "--netns", noNetNS, "--bpf-ct-timeout-tcp", "0"}, "--bpf-ct-timeout-tcp "},
		{[]string{"--dataplane", "ebpf", "--netns", noNetNS, "--bpf-ct-timeout-tcp-close", "0"}, "--bpf-ct-timeout-tcp-close"},
		{[]string{"--dataplane", "ebpf", "--netns", noNetNS, "--bpf-ct-timeout-other", "0"}, "--bpf-ct-timeout-other"},
		{[]string{"--dataplane", "ebpf", "--netns", noNetNS, "--maglev-table-size", "0"}, "--maglev-table-size"},
		{[]string{"--dataplane", "ebpf", "--netns", noNetNS, "--maglev-table-size", "16384"}, "--maglev-table-size"},
		{[]string{"--dataplane", "ebpf", "--netns", noNetNS, "--bpf-lb-map-max", "0"}, "--bpf-lb-map-max"},
		{[]string{"--dataplane", "ebpf", "--netns", noNetNS, "--bpf-backend-map-max", "0"}, "--bpf-backend-map-max"},
		{[]string{"--dataplane", "ebpf", "--netns", noNetNS, "--bpf-ct-map-max", "0"}, "--bpf-ct-map-max"},
		{[]string{"--dataplane", "ebpf", "--netns", noNetNS, "--bpf-affinity-map-max", "0"}, "--bpf-affinity-map-max"},
		{[]string{"--dataplane", "ebpf", "--netns", noNetNS, "--bpf-sock-map-max", "0"}, "--bpf-sock-map-max"},
		{[]string{"--dataplane", "ebpf", "--netns", noNetNS, "--bpf-events-map-max", "0"}, "--bpf-events-map-max"},
		{[]string{"--dataplane", "ebpf", "--netns", noNetNS, "--bpf-events-map-max", "1048577"}, "--bpf-events-map-max"},
		{[]string{"--dataplane", "ebpf", "--netns", noNetNS, "--bpf-events-map-max", "1024"}, "--bpf-events-map-max"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			dir, err := execute(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("vipd %s: %v; want an error naming %s", strings.Join(tc.args, " "), err, tc.want)
			}
			for _, name := range []string{"state", "vipd.sock"} {
				if _, err := os.Lstat(filepath.Join(dir, name)); !os.IsNotExist(err) {
					t.Errorf("%s exists after a refused start", name)
				}
			}
		})
	}
}

// TestGCPercentOffNeedsMemoryLimit checks that --gc-percent below 0 (the
// proportional collector off) refuses start without a memory limit to
// bound the heap (internal/daemon's TestCheckGCPercentOff checks that one
// lets it pass).
func TestGCPercentOffNeedsMemoryLimit(t *testing.T) {
	if debug.SetMemoryLimit(-1) != math.MaxInt64 {
		t.Skip("GOMEMLIMIT is set in the test's environment: vipd would have a memory limit")
	}
	if _, err := execute(t, "--gc-percent", "-1"); err == nil || !strings.Contains(err.Error(), "--gc-percent -1") {
		t.Fatalf("--gc-percent -1 without a memory limit: %v; want it refused", err)
	}
}

// TestDefaultsPassTheEBPFChecks checks that the eBPF flags' defaults pass
// Check: with --dataplane ebpf and one bad flag, only that flag is named.
func TestDefaultsPassTheEBPFChecks(t *testing.T) {
	_, err := execute(t, "--dataplane", "ebpf", "--netns", noNetNS, "--flow-buffer", "0")
	if err == nil || !strings.Contains(err.Error(), "--flow-buffer") || strings.Contains(err.Error(), "--bpf") || strings.Contains(err.Error(), "--maglev") {
		t.Fatalf("--dataplane ebpf --flow-buffer 0: %v; want only --flow-buffer named", err)
	}
}

// TestEnvironmentSetsFlags checks VIPD_<FLAG>: a bad value from the
// environment is refused as the flag's would be, an unparsable one names
// the variable, and the command line wins over the environment.
func TestEnvironmentSetsFlags(t *testing.T) {
	t.Run("checked like the flag", func(t *testing.T) {
		t.Setenv("VIPD_FLOW_BUFFER", "0")
		if _, err := execute(t); err == nil || !strings.Contains(err.Error(), "--flow-buffer 0") {
			t.Fatalf("VIPD_FLOW_BUFFER=0: %v", err)
		}
	})
	t.Run("slice flag", func(t *testing.T) {
		t.Setenv("VIPD_SERVICE_CIDR", "198.19.0.0/16,not-a-cidr")
		if _, err := execute(t); err == nil || !strings.Contains(err.Error(), `--service-cidr "not-a-cidr"`) {
			t.Fatalf("VIPD_SERVICE_CIDR with a bad second value: %v", err)
		}
	})
	t.Run("node network lists", func(t *testing.T) {
		t.Setenv("VIPD_NODEPORT_ADDRESSES", "198.18.0.0/16,fd00:198::/32,nope")
		if _, err := execute(t); err == nil || !strings.Contains(err.Error(), `--nodeport-addresses "nope"`) {
			t.Fatalf("VIPD_NODEPORT_ADDRESSES with a bad third value: %v", err)
		}
		t.Setenv("VIPD_NODEPORT_ADDRESSES", "")
		t.Setenv("VIPD_EXTERNAL_INTERFACES", "eth*,[")
		if _, err := execute(t); err == nil || !strings.Contains(err.Error(), `--external-interfaces "["`) {
			t.Fatalf("VIPD_EXTERNAL_INTERFACES with a bad second glob: %v", err)
		}
	})
	t.Run("unparsable names the variable", func(t *testing.T) {
		t.Setenv("VIPD_MAX_SERVICES", "many")
		if _, err := execute(t); err == nil || !strings.Contains(err.Error(), "VIPD_MAX_SERVICES") {
			t.Fatalf("VIPD_MAX_SERVICES=many: %v", err)
		}
	})
	t.Run("command line wins", func(t *testing.T) {
		t.Setenv("VIPD_MAX_PORTS", "-1")
		if _, err := execute(t, "--max-ports", "-2"); err == nil || !strings.Contains(err.Error(), "--max-ports -2") {
			t.Fatalf("VIPD_MAX_PORTS=-1 with --max-ports -2: %v; want the flag's value refused", err)
		}
	})
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"version"}} {
		cmd := rootCommand()
		var out bytes.Buffer
		cmd.SetArgs(args)
		cmd.SetOut(&out)
		if err := cmd.Execute(); err != nil || out.String() != version.String()+"\n" {
			t.Errorf("vipd %s: %q, %v; want %q", args[0], out.String(), err, version.String()+"\n")
		}
	}
}
