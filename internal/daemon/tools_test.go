package daemon_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testkit/testbin"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// tools builds vipd, vipctl and the pinned grpcurl once for the tests that run
// them, as a user would, against a daemon in this process.
var tools struct {
	once sync.Once
	dir  string
	err  error
}

func toolsDir(t *testing.T) string {
	t.Helper()
	tools.once.Do(func() {
		tools.dir, _, tools.err = testbin.Build(true, "./cmd/vipctl", "./cmd/vipd")
	})
	if tools.err != nil {
		t.Fatalf("build vipctl and grpcurl: %v", tools.err)
	}
	return tools.dir
}

func TestMain(m *testing.M) {
	if runSocketChildIfRequested() {
		return
	}
	code := m.Run()
	if tools.dir != "" {
		os.RemoveAll(tools.dir)
	}
	if vipdBinary.cleanup != nil {
		vipdBinary.cleanup()
	}
	os.Exit(code)
}

func runTool(t *testing.T, name string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	bin := filepath.Join(toolsDir(t), name) // before the deadline: it may build
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	// No VIPD_* variables from the environment running the tests.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("run %s: %v", name, err)
	}
	return o.String(), e.String(), code
}

// TestGrpcurlMutualTLS lists and calls the API over vipd's TCP listener with
// grpcurl -cacert -cert -key, and checks that grpcurl without a client
// certificate gets nothing.
func TestGrpcurlMutualTLS(t *testing.T) {
	p := newPKI(t)
	cfg := config(t)
	cfg.Remote = p.remote(t, writeAuthz(t, testPolicy))
	start(t, cfg, healthpb.HealthCheckResponse_SERVING)
	addr := strings.TrimPrefix(cfg.Remote.Listen, "tcp://")
	tlsArgs := func(client string) []string {
		return []string{"-cacert", p.ca.CertFile, "-cert", p.clients[client].Cert, "-key", p.clients[client].Key}
	}
	grpcurl := func(client string, args ...string) (string, string, int) {
		return runTool(t, "grpcurl", append(append(tlsArgs(client), "-format-error"), args...)...)
	}

	out, errOut, code := grpcurl("a", addr, "list")
	for _, want := range []string{"vipd.v1.LoadBalancerService", "vipd.v1.StatusService", "vipd.v1.FlowService", "vipd.v1.NodeService", "grpc.health.v1.Health"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("grpcurl list (exit %d) lacks %s:\n%s%s", code, want, out, errOut)
		}
	}
	out, errOut, code = grpcurl("a", addr, "grpc.health.v1.Health/Check")
	if code != 0 || !strings.Contains(out, `"SERVING"`) {
		t.Fatalf("grpcurl health (exit %d):\n%s%s", code, out, errOut)
	}
	out, errOut, code = grpcurl("a", "-d", `{"service": {"name": "a/web", "owner": "team-a", "vips": ["198.19.0.10"],
		"ports": [{"port": 80, "target_port": 8080}], "backends": [{"ip": "198.18.1.10"}]}}`, addr, "vipd.v1.LoadBalancerService/UpsertService")
	if code != 0 || !strings.Contains(out, `"generation": "1"`) {
		t.Fatalf("grpcurl upsert (exit %d):\n%s%s", code, out, errOut)
	}
	out, errOut, code = grpcurl("b", "-d", `{"name": "a/web"}`, addr, "vipd.v1.LoadBalancerService/GetService")
	if code != 0 || !strings.Contains(out, "198.18.1.10") {
		t.Fatalf("grpcurl get by another identity (exit %d):\n%s%s", code, out, errOut)
	}
	out, errOut, code = grpcurl("b", "-d", `{"name": "a/web"}`, addr, "vipd.v1.LoadBalancerService/DeleteService")
	if code == 0 || !strings.Contains(out+errOut, `"code": 7`) || !strings.Contains(out+errOut, `may not change services of owner \"team-a\"`) {
		t.Fatalf("grpcurl delete by another owner's identity (exit %d):\n%s%s", code, out, errOut)
	}

	// Without a client certificate, or without TLS, nothing gets through.
	out, errOut, code = runTool(t, "grpcurl", "-cacert", p.ca.CertFile, addr, "list")
	if code == 0 || strings.Contains(out, "vipd.v1") {
		t.Fatalf("grpcurl without a client certificate (exit %d):\n%s%s", code, out, errOut)
	}
	out, errOut, code = runTool(t, "grpcurl", "-plaintext", addr, "list")
	if code == 0 || strings.Contains(out, "vipd.v1") {
		t.Fatalf("grpcurl -plaintext (exit %d):\n%s%s", code, out, errOut)
	}
}

// TestVipctlMutualTLS drives vipd over TCP with vipctl --server --cacert
// --cert --key, and with the same settings from the environment.
func TestVipctlMutualTLS(t *testing.T) {
	p := newPKI(t)
	cfg := config(t)
	cfg.Remote = p.remote(t, writeAuthz(t, testPolicy))
	start(t, cfg, healthpb.HealthCheckResponse_SERVING)
	flags := func(client string) []string {
		return []string{"--server", cfg.Remote.Listen, "--cacert", p.ca.CertFile, "--cert", p.clients[client].Cert, "--key", p.clients[client].Key}
	}
	vipctl := func(client string, args ...string) (string, string, int) {
		return runTool(t, "vipctl", append(flags(client), args...)...)
	}
	manifest := filepath.Join(t.TempDir(), "web.yaml")
	if err := os.WriteFile(manifest, []byte("name: a/web\nowner: team-a\nvips: [198.19.0.10]\nports: [{port: 80}]\nbackends: [{ip: 198.18.1.10}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := vipctl("a", "apply", "-f", manifest); code != 0 {
		t.Fatalf("vipctl apply over mTLS (exit %d):\n%s%s", code, out, errOut)
	}
	out, errOut, code := vipctl("b", "service", "list")
	if code != 0 || !strings.Contains(out, "a/web") || !strings.Contains(out, "198.19.0.10") {
		t.Fatalf("vipctl service list over mTLS (exit %d):\n%s%s", code, out, errOut)
	}
	if out, errOut, code := vipctl("b", "status"); code != 0 {
		t.Fatalf("vipctl status over mTLS (exit %d):\n%s%s", code, out, errOut)
	}
	out, errOut, code = vipctl("b", "backends", "add", "a/web", "198.18.1.11")
	if code != 7 || !strings.Contains(errOut, "PermissionDenied") {
		t.Fatalf("vipctl backends add by another owner's identity: exit %d, want 7:\n%s%s", code, out, errOut)
	}
	if out, errOut, code := vipctl("a", "backends", "add", "a/web", "198.18.1.11"); code != 0 {
		t.Fatalf("vipctl backends add (exit %d):\n%s%s", code, out, errOut)
	}

	// The same from the environment.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(toolsDir(t), "vipctl"), "service", "get", "a/web", "-o", "json")
	cmd.Env = []string{"VIPD_SERVER=" + cfg.Remote.Listen, "VIPD_CACERT=" + p.ca.CertFile, "VIPD_CERT=" + p.clients["b"].Cert, "VIPD_KEY=" + p.clients["b"].Key}
	envOut, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(envOut), "198.18.1.11") {
		t.Fatalf("vipctl with VIPD_SERVER, VIPD_CACERT, VIPD_CERT, VIPD_KEY: %v\n%s", err, envOut)
	}

	// A certificate of another CA is refused; so is TLS without a certificate.
	foreign := []string{"--server", cfg.Remote.Listen, "--cacert", p.ca.CertFile, "--cert", p.clients["foreign"].Cert, "--key", p.clients["foreign"].Key, "--timeout", "3s", "status"}
	if out, errOut, code := runTool(t, "vipctl", foreign...); code != 6 {
		t.Fatalf("vipctl with a certificate of another CA: exit %d, want 6 (unavailable):\n%s%s", code, out, errOut)
	}
}
