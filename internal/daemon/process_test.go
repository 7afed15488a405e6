package daemon_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/testkit/childproc"
	"github.com/vipd/vipd/internal/testkit/syncbuf"
	"github.com/vipd/vipd/internal/testkit/testbin"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// vipdBinary builds cmd/vipd once for the tests that run it as a process.
var vipdBinary struct {
	once    sync.Once
	path    string
	cleanup func()
	err     error
}

func vipdPath(t *testing.T) string {
	t.Helper()
	vipdBinary.once.Do(func() {
		var dir string
		dir, vipdBinary.cleanup, vipdBinary.err = testbin.Build(false, "./cmd/vipd")
		vipdBinary.path = filepath.Join(dir, "vipd")
	})
	if vipdBinary.err != nil {
		t.Fatalf("build vipd: %v", vipdBinary.err)
	}
	return vipdBinary.path
}

// proc is a vipd process run with the none dataplane, a socket and a state
// directory of the test's, and no metrics listener unless args set one.
type proc struct {
	t        *testing.T
	cmd      *exec.Cmd
	socket   string
	stateDir string
	stderr   *syncbuf.Buffer
	exited   <-chan error
	done     chan struct{}
	err      error // cmd.Wait's, once done is closed
}

// procArgs are the arguments every test vipd gets, before the test's own.
func procArgs(dir string) (socket, stateDir string, args []string) {
	socket, stateDir = filepath.Join(dir, "vipd.sock"), filepath.Join(dir, "state")
	return socket, stateDir, []string{"run", "--dataplane", "none", "--socket", socket, "--state-dir", stateDir, "--metrics-addr", ""}
}

// startProc starts vipd with args after the common ones and returns at
// once; env, if given, is its whole environment.
func startProc(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	socket, stateDir, common := procArgs(t.TempDir())
	p := &proc{t: t, socket: socket, stateDir: stateDir, stderr: &syncbuf.Buffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(vipdPath(t), append(common, args...)...)
	p.cmd.Env = env
	if env == nil {
		p.cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	}
	p.cmd.Stderr = p.stderr
	var err error
	if p.exited, err = childproc.Start(p.cmd); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = <-p.exited; close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// runProc runs vipd with args to its end and returns its exit code.
func runProc(t *testing.T, args ...string) (p *proc, code int) {
	t.Helper()
	p = startProc(t, nil, args...)
	return p, p.wait(15 * time.Second)
}

// startServing starts vipd and waits until it answers health checks with
// SERVING on its socket.
func startServing(t *testing.T, args ...string) *proc {
	t.Helper()
	p := startProc(t, nil, args...)
	c, err := client.New(p.socket, client.WithMaxAttempts(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	err = childproc.WaitReady(p.done, 20*time.Second, func(ctx context.Context) error {
		for {
			hctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := c.Health(hctx)
			cancel()
			if err == nil && st == healthpb.HealthCheckResponse_SERVING {
				return nil
			}
			select {
			case <-ctx.Done():
				return errors.Join(ctx.Err(), err)
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	if err != nil {
		t.Fatalf("vipd: %v\nstderr:\n%s", err, p.stderr)
	}
	return p
}

// signal sends sig to vipd.
func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatal(err)
	}
}

// wait waits up to timeout for vipd to exit and returns its exit code
// (-1 when a signal ended it).
func (p *proc) wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.t.Fatalf("vipd did not exit within %v\nstderr:\n%s", timeout, p.stderr)
	}
	var exit *exec.ExitError
	switch {
	case p.err == nil:
		return 0
	case errors.As(p.err, &exit):
		return exit.ExitCode()
	}
	p.t.Fatalf("vipd: %v", p.err)
	return 0
}

// waitLog waits up to 10 s for vipd's stderr to contain want.
func (p *proc) waitLog(want string) {
	p.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.stderr.String(), want) {
		select {
		case <-p.done:
			p.t.Fatalf("vipd exited (%v) before its log said %q:\n%s", p.err, want, p.stderr)
		default:
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("vipd's log does not say %q:\n%s", want, p.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startServingClient is a client of p's socket, closed at the end of the test.
func startServingClient(t *testing.T, p *proc) *client.Client {
	t.Helper()
	c, err := client.New(p.socket, client.WithMaxAttempts(1), client.WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
