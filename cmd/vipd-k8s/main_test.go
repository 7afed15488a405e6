package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/vipd/vipd/internal/version"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := rootCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func TestVersion(t *testing.T) {
	out, err := run(t, "version")
	if err != nil || strings.TrimSpace(out) != version.String() {
		t.Fatalf("version: %q, %v; want %q", out, err, version.String())
	}
}

// TestRefusedFlags: flag combinations that cannot work are refused before
// anything is contacted, with a message naming the flag.
func TestRefusedFlags(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--kubeconfig", "/nonexistent"}, "--node-name is required"},
		{[]string{"--node-name", "n", "--vipd", "tcp://192.0.2.1:9650"}, "needs mutual TLS"},
		{[]string{"--node-name", "n", "--vipd", "tcp://192.0.2.1:9650", "--insecure"}, "only for a loopback address"},
		{[]string{"--node-name", "n", "--cert", "c.pem"}, "apply to a tcp:// --vipd only"},
		{[]string{"--node-name", "n", "--vipd", "tcp://192.0.2.1:9650", "--cacert", "/nonexistent/ca.pem", "--cert", "c", "--key", "k"}, "read CA bundle"},
		{[]string{"--node-name", "n", "--log-level", "loud", "--kubeconfig", "/nonexistent"}, "--log-level"},
		{[]string{"--node-name", "n", "--kubeconfig", "/nonexistent/kubeconfig", "--healthz-address", "", "--metrics-address", ""}, "kubeconfig /nonexistent/kubeconfig"},
		{[]string{"--node-name", "n", "--service-proxy-name", "not a label value", "--kubeconfig", "/nonexistent"}, "--service-proxy-name"},
		{[]string{"--node-name", "n", "--service-proxy-name", "-vipd", "--kubeconfig", "/nonexistent"}, "--service-proxy-name"},
		{[]string{"--node-name", "n", "--service-proxy-name", strings.Repeat("v", 64), "--kubeconfig", "/nonexistent"}, "--service-proxy-name"},
		// A valid name passes the flag check and gets as far as the kubeconfig.
		{[]string{"--node-name", "n", "--service-proxy-name", "vipd", "--kubeconfig", "/nonexistent/kubeconfig", "--healthz-address", "", "--metrics-address", ""}, "kubeconfig /nonexistent/kubeconfig"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, err := run(t, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v; want one containing %q", err, tt.want)
			}
		})
	}
}

func TestLoopbackInsecureAllowed(t *testing.T) {
	for _, target := range []string{"tcp://127.0.0.1:9650", "tcp://[::1]:9650", "tcp://localhost:9650"} {
		cfg, err := transport(target, "", "", "", true)
		if err != nil || cfg != nil {
			t.Errorf("%s --insecure: %v, %v; want plaintext", target, cfg, err)
		}
	}
	if cfg, err := transport("/run/vipd/vipd.sock", "", "", "", false); err != nil || cfg != nil {
		t.Errorf("socket: %v, %v; want plaintext", cfg, err)
	}
}
