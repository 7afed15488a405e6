package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/vipd/vipd/internal/configfile"
	"github.com/vipd/vipd/internal/testkit/require"
)

const unitPath = "../../deploy/systemd/vipd.service"

// TestSystemdUnitVerifies runs systemd-analyze verify over the shipped
// unit, with ExecStart pointing at an executable that exists here (verify
// checks that it does), and fails on anything it reports.
func TestSystemdUnitVerifies(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if require.CI() {
			t.Fatal("systemd-analyze is missing: scripts/install-deps.sh installs it (package systemd)")
		}
		t.Skip("systemd-analyze is missing (package systemd; scripts/install-deps.sh installs it)")
	}
	unit, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(unit), "ExecStart=/usr/bin/vipd ") {
		t.Fatal("the unit does not start /usr/bin/vipd, where the package installs it")
	}
	text := strings.ReplaceAll(string(unit), "ExecStart=/usr/bin/vipd ", "ExecStart="+self+" ")
	path := filepath.Join(t.TempDir(), "vipd.service")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", path).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify %s: %v\n%s", unitPath, err, out)
	}
}

// TestSystemdUnitSettings checks the settings that vipd's behaviour relies
// on, which verify cannot know about: notify readiness, reload by SIGHUP,
// the configuration file, vipd's own directories and its capabilities.
func TestSystemdUnitSettings(t *testing.T) {
	unit, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, line := range strings.Split(string(unit), "\n") {
		line = strings.TrimSpace(line)
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			got[k] = append(got[k], v)
		}
	}
	for k, want := range map[string]string{
		"Type":                  "notify",
		"ExecStart":             "/usr/bin/vipd run --config /etc/vipd/vipd.yaml",
		"ExecReload":            "/bin/kill -HUP $MAINPID",
		"StateDirectory":        "vipd",
		"RuntimeDirectory":      "vipd",
		"CapabilityBoundingSet": "CAP_NET_ADMIN CAP_BPF CAP_PERFMON CAP_NET_RAW",
		"NoNewPrivileges":       "yes",
		"ProtectSystem":         "strict",
		"ReadWritePaths":        "/sys/fs/bpf /proc/sys/net",
		"ProtectControlGroups":  "yes",
	} {
		if len(got[k]) != 1 || got[k][0] != want {
			t.Errorf("%s=%q, want %q", k, got[k], want)
		}
	}
	// The defaults that the unit relies on: the socket and state directory
	// are the ones systemd creates.
	if defaultSocket != "/run/vipd/vipd.sock" || defaultStateDir != "/var/lib/vipd" {
		t.Errorf("socket %s, state directory %s: RuntimeDirectory and StateDirectory are /run/vipd and /var/lib/vipd", defaultSocket, defaultStateDir)
	}
}

const shippedConfig = "../../deploy/package/vipd.yaml"

// TestShippedConfig checks the /etc/vipd/vipd.yaml that the package
// installs: vipd run accepts it, it points the socket hooks at the cgroup2
// that systemd mounts, and every setting it shows commented out is a flag
// that accepts the value shown, so that uncommenting one never refuses
// start.
func TestShippedConfig(t *testing.T) {
	data, err := os.ReadFile(shippedConfig)
	if err != nil {
		t.Fatal(err)
	}
	fs := runCommand().Flags()
	if err := configfile.Apply(fs, shippedConfig, "config"); err != nil {
		t.Fatal(err)
	}
	if got := fs.Lookup("cgroup-path").Value.String(); got != "/sys/fs/cgroup" {
		t.Errorf("cgroup-path %q, want /sys/fs/cgroup (systemd's cgroup2 on a stock Debian host)", got)
	}

	commented := regexp.MustCompile(`^# ([a-z0-9-]+:( |$)|  - )`)
	var uncommented []string
	n := 0
	for _, line := range strings.Split(string(data), "\n") {
		if commented.MatchString(line) {
			line, n = line[2:], n+1
		}
		uncommented = append(uncommented, line)
	}
	if n < 10 {
		t.Fatalf("only %d commented settings found in %s; has its format changed?", n, shippedConfig)
	}
	path := filepath.Join(t.TempDir(), "vipd.yaml")
	if err := os.WriteFile(path, []byte(strings.Join(uncommented, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := configfile.Apply(runCommand().Flags(), path, "config"); err != nil {
		t.Errorf("%s with every setting uncommented: %v", shippedConfig, err)
	}
}
