package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func configFile(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "vipd.yaml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestConfigRefusesStart checks that vipd run --config refuses to start on
// a key that names no flag and on a value the flag refuses, naming the key
// and the file, and that the file's values reach the daemon's own checks.
func TestConfigRefusesStart(t *testing.T) {
	for _, tc := range []struct {
		body      string
		want      string
		namesFile bool // else the daemon's check names the flag
	}{
		{"max-servics: 10\n", `unknown key "max-servics"`, true},
		{"max-services: many\n", `key "max-services"`, true},
		{"config: /etc/vipd/other.yaml\n", `key "config"`, true},
		{"socket-mode: 0666\n", "--socket-mode", false},
		{"flow-buffer: 0\n", "--flow-buffer", false},
		{"nodeport-addresses: [198.18.0.0/16, not-a-cidr]\n", `--nodeport-addresses "not-a-cidr"`, false},
		{"external-interfaces: [eth0, \"eth[\"]\n", `--external-interfaces "eth["`, false},
	} {
		path := configFile(t, tc.body)
		dir, err := execute(t, "--config", path)
		if err == nil || !strings.Contains(err.Error(), tc.want) || (tc.namesFile && !strings.Contains(err.Error(), path)) {
			t.Errorf("--config with %q: %v, want an error containing %q (and the file: %v)", tc.body, err, tc.want, tc.namesFile)
		}
		if _, err := os.Stat(filepath.Join(dir, "state")); err == nil {
			t.Errorf("--config with %q: the state directory was created before the refusal", tc.body)
		}
	}
}

// TestConfigPrecedence checks the order through vipd's own command line:
// a flag wins over VIPD_<FLAG>, which wins over the file. The file's
// socket-mode and flow-buffer would refuse start.
func TestConfigPrecedence(t *testing.T) {
	path := configFile(t, "socket-mode: 0666\nflow-buffer: 0\n")
	t.Setenv("VIPD_FLOW_BUFFER", "64")
	if _, err := execute(t, "--config", path, "--socket-mode", "0600"); err != nil {
		t.Fatalf("the command line's --socket-mode and VIPD_FLOW_BUFFER must win over the file: %v", err)
	}
	t.Setenv("VIPD_CONFIG", configFile(t, "socket-mode: 0666\n"))
	if _, err := execute(t); err == nil || !strings.Contains(err.Error(), "--socket-mode") {
		t.Fatalf("VIPD_CONFIG names the file as --config does: %v, want its socket-mode refused", err)
	}
}
