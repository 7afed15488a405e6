package daemon_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/daemon"
	"github.com/vipd/vipd/internal/testkit/require"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// socketChildEnv asks the test binary, re-executed as another user, to
// call vipd's health check over the Unix socket it names.
const socketChildEnv = "VIPD_TEST_SOCKET_CHILD"

// Exit codes of the socket child.
const (
	childConnected = 0
	childDenied    = 3
	childOther     = 4
)

// runSocketChildIfRequested runs the socket child and reports true if this
// process is one; it exits with one of the child exit codes.
func runSocketChildIfRequested() bool {
	path := os.Getenv(socketChildEnv)
	if path == "" {
		return false
	}
	code := childOther
	c, err := client.New(path, client.WithMaxAttempts(1), client.WithTimeout(5*time.Second))
	if err == nil {
		var st healthpb.HealthCheckResponse_ServingStatus
		st, err = c.Health(context.Background())
		switch {
		case err == nil && st == healthpb.HealthCheckResponse_SERVING:
			code = childConnected
		case err != nil && strings.Contains(err.Error(), "permission denied"):
			code = childDenied
		}
		c.Close()
	}
	fmt.Fprintf(os.Stderr, "uid %d gid %d groups %v: %v\n", os.Getuid(), os.Getgid(), must(os.Getgroups()), err)
	os.Exit(code)
	return true
}

func must[T any](v T, _ error) T { return v }

// TestSocketGroup checks --socket-group: the socket is mode 0660 and owned
// by the group, a user outside the group cannot connect, and one with the
// group as a supplementary group can.
func TestSocketGroup(t *testing.T) {
	require.Root(t, "changing a socket's group and running clients as other users")
	const gid, nobody = 65533, 65534
	// Traversable by anyone, so that only the socket's own mode decides.
	dir, err := os.MkdirTemp("", "vipdgrp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	cfg := config(t)
	cfg.Socket = filepath.Join(dir, "vipd.sock")
	cfg.SocketMode, cfg.SocketGroup = 0, fmt.Sprint(gid) // the default mode: 0660 with a group
	start(t, cfg, healthpb.HealthCheckResponse_SERVING)

	fi, err := os.Stat(cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Gid != gid || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket group %d mode %v, want group %d mode 0660", st.Gid, fi.Mode().Perm(), gid)
	}
	// The test binary lives in a directory only root may enter: the
	// clients run a copy.
	exe := filepath.Join(dir, "client.test")
	copyFile(t, os.Args[0], exe, 0o755)
	for _, tc := range []struct {
		name   string
		groups []uint32
		want   int
	}{
		{"outside the group", nil, childDenied},
		{"in another supplementary group", []uint32{gid - 1}, childDenied},
		{"in the group", []uint32{gid}, childConnected},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(exe, "-test.run=^$")
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), socketChildEnv+"="+cfg.Socket)
			cmd.SysProcAttr = &syscall.SysProcAttr{
				Credential: &syscall.Credential{Uid: nobody, Gid: nobody, Groups: tc.groups},
				Pdeathsig:  syscall.SIGKILL,
			}
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			code := 0
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				code = exit.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.want {
				t.Fatalf("client as uid %d, groups %v: exit %d, want %d: %s", nobody, tc.groups, code, tc.want, stderr.String())
			}
		})
	}
}

func TestLookupGroup(t *testing.T) {
	if gid, err := daemon.LookupGroup("0"); err != nil || gid != 0 {
		t.Errorf("LookupGroup(0) = %d, %v", gid, err)
	}
	if gid, err := daemon.LookupGroup("4242"); err != nil || gid != 4242 {
		t.Errorf("LookupGroup(4242) = %d, %v", gid, err)
	}
	if gid, err := daemon.LookupGroup("root"); err != nil || gid != 0 {
		t.Errorf("LookupGroup(root) = %d, %v", gid, err)
	}
	if _, err := daemon.LookupGroup("no-such-group-vipd"); err == nil || !strings.Contains(err.Error(), "--socket-group no-such-group-vipd") {
		t.Errorf("LookupGroup of an unknown name: %v", err)
	}
}

// TestUnknownSocketGroupRefusesStart checks that a group that does not
// exist stops vipd before it opens anything.
func TestUnknownSocketGroupRefusesStart(t *testing.T) {
	cfg := config(t)
	cfg.SocketGroup = "no-such-group-vipd"
	if err := daemon.Run(ctxT(t), testLogger(t), cfg); err == nil || !strings.Contains(err.Error(), "no-such-group-vipd") {
		t.Fatalf("Run with an unknown socket group: %v", err)
	}
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, mode); err != nil {
		t.Fatal(err)
	}
}
