package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/vipd/vipd/internal/testkit/testbin"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// bin holds the binaries built once for all tests.
var bin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, cleanup, err := testbin.Build(true, "./cmd/vipd", "./cmd/vipctl")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cleanup()
	bin = dir
	return m.Run()
}

// daemon is one vipd process on a private socket and state dir.
type daemon struct {
	t      *testing.T
	socket string
	state  string
	cmd    *exec.Cmd
	log    *bytes.Buffer
}

func newDaemon(t *testing.T) *daemon {
	dir := t.TempDir()
	return &daemon{t: t, socket: filepath.Join(dir, "vipd.sock"), state: filepath.Join(dir, "state")}
}

// start runs vipd and waits until health reports SERVING.
func (d *daemon) start() {
	d.t.Helper()
	d.log = &bytes.Buffer{}
	d.cmd = exec.Command(filepath.Join(bin, "vipd"), "run", "--dataplane", "none", "--metrics-addr=", "--socket", d.socket, "--state-dir", d.state, "--log-level", "debug")
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	cmd := d.cmd
	d.t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := d.grpcurl("grpc.health.v1.Health/Check")
		if err == nil && strings.Contains(out, "SERVING") && !strings.Contains(out, "NOT_SERVING") {
			return
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("vipd did not become healthy: %v %s\nlog:\n%s", err, out, d.log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (d *daemon) kill9() {
	d.t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		d.t.Fatal(err)
	}
	d.cmd.Wait()
}

func runCmd(name string, args ...string) (stdout, stderr string, code int) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		code = -1
		e.WriteString(err.Error())
	}
	return o.String(), e.String(), code
}

// grpcurl calls method with an optional JSON body; args may add flags.
func (d *daemon) grpcurl(method string, flagsAndBody ...string) (string, error) {
	args := append([]string{"-plaintext", "-format-error"}, flagsAndBody...)
	args = append(args, "-unix", d.socket, method)
	out, errOut, code := runCmd(filepath.Join(bin, "grpcurl"), args...)
	if code != 0 {
		return out + errOut, fmt.Errorf("grpcurl %s exited %d", method, code)
	}
	return out, nil
}

func (d *daemon) vipctl(args ...string) (stdout, stderr string, code int) {
	return runCmd(filepath.Join(bin, "vipctl"), append([]string{"--socket", d.socket}, args...)...)
}

func TestGrpcurlVipctlAndRestart(t *testing.T) {
	d := newDaemon(t)
	d.start()

	// Reflection: the API is visible without proto files.
	out, err := d.grpcurl("list")
	if err != nil || !strings.Contains(out, "vipd.v1.LoadBalancerService") || !strings.Contains(out, "vipd.v1.StatusService") {
		t.Fatalf("grpcurl list: %v\n%s", err, out)
	}

	// A service upserted with grpcurl shows up in vipctl.
	out, err = d.grpcurl("vipd.v1.LoadBalancerService/UpsertService", "-d", `{"service": {"name": "default/web",
		"vips": ["198.19.0.10"], "ports": [{"port": 80, "target_port": 8080}],
		"backends": [{"ip": "198.18.1.10"}, {"ip": "198.18.1.11", "weight": 2}]}}`)
	if err != nil || !strings.Contains(out, `"generation": "1"`) {
		t.Fatalf("upsert: %v\n%s", err, out)
	}
	stdout, stderr, code := d.vipctl("service", "list")
	if code != 0 || !strings.Contains(stdout, "default/web") || !strings.Contains(stdout, "198.19.0.10") {
		t.Fatalf("vipctl service list (exit %d):\n%s%s", code, stdout, stderr)
	}

	// And one applied with vipctl shows up through grpcurl.
	manifest := filepath.Join(t.TempDir(), "api.yaml")
	os.WriteFile(manifest, []byte("name: default/api\nvips: [198.19.0.20, \"fd00:198:ff::20\"]\nports:\n- {port: 443, target_port: 8443, protocol: tcp}\nbackends:\n- {ip: 198.18.1.20}\n- {ip: \"fd00:198:1::20\"}\n"), 0o644)
	if stdout, stderr, code := d.vipctl("apply", "-f", manifest); code != 0 {
		t.Fatalf("vipctl apply (exit %d):\n%s%s", code, stdout, stderr)
	}
	out, err = d.grpcurl("vipd.v1.LoadBalancerService/GetService", "-d", `{"name": "default/api"}`)
	if err != nil || !strings.Contains(out, "fd00:198:1::20") {
		t.Fatalf("get: %v\n%s", err, out)
	}

	// Invalid input gets a field-level InvalidArgument, through both tools.
	out, err = d.grpcurl("vipd.v1.LoadBalancerService/UpsertService", "-d", `{"service": {"name": "default/bad",
		"vips": ["127.0.0.1"], "ports": [{"port": 70000}]}}`)
	for _, want := range []string{`"code": 3`, "google.rpc.BadRequest", `"field": "service.vips[0]"`, `"field": "service.ports[0].port"`} {
		if err == nil || !strings.Contains(out, want) {
			t.Fatalf("invalid upsert: want %q in\n%s", want, out)
		}
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("name: default/bad\nvips: [224.0.0.1]\nports: [{port: 80}]\n"), 0o644)
	_, stderr, code = d.vipctl("apply", "-f", bad)
	if code != 4 || !strings.Contains(stderr, "bad.yaml: document 1") || !strings.Contains(stderr, "vips[0]:") {
		t.Fatalf("vipctl apply of an invalid service: exit %d, stderr:\n%s", code, stderr)
	}
	_, _, code = d.vipctl("service", "get", "default/nope")
	if code != 3 {
		t.Fatalf("vipctl get of a missing service: exit %d, want 3", code)
	}

	// kill -9 and a restart lose nothing.
	d.kill9()
	d.start()
	stdout, stderr, code = d.vipctl("service", "list", "-o", "json")
	if code != 0 || !strings.Contains(stdout, "default/web") || !strings.Contains(stdout, "default/api") || strings.Contains(stdout, "default/bad") {
		t.Fatalf("after kill -9 and restart (exit %d):\n%s%s", code, stdout, stderr)
	}
	out, err = d.grpcurl("vipd.v1.StatusService/GetStatus")
	if err != nil || !strings.Contains(out, `"services": 2`) || !strings.Contains(out, `"backends": 4`) || !strings.Contains(out, `"ready": true`) {
		t.Fatalf("status after restart: %v\n%s", err, out)
	}
}

func TestCorruptStateRefusesToStart(t *testing.T) {
	d := newDaemon(t)
	d.start()
	if _, err := d.grpcurl("vipd.v1.LoadBalancerService/UpsertService", "-d", `{"service": {"name": "a", "vips": ["198.19.0.1"], "ports": [{"port": 80}]}}`); err != nil {
		t.Fatal(err)
	}
	d.kill9()
	path := filepath.Join(d.state, "state")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data[:len(data)-3], 0o600); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := runCmd(filepath.Join(bin, "vipd"), "run", "--dataplane", "none", "--metrics-addr=", "--socket", d.socket, "--state-dir", d.state)
	if code == 0 || !strings.Contains(stderr, "refusing to start") || !strings.Contains(stderr, "truncated") {
		t.Fatalf("vipd over a truncated state file: exit %d\n%s%s", code, stdout, stderr)
	}
}
