package soak

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/dataplane/ebpf"
	"github.com/vipd/vipd/internal/testkit/cgroup2test"
	"github.com/vipd/vipd/internal/testkit/netlab"
	"github.com/vipd/vipd/internal/testkit/require"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// EchoPorts are the ports every backend pod's echo server listens on (TCP
// and UDP): the server on port p of pod x answers as x, whatever the port.
var EchoPorts = []uint16{8080, 8081}

// ReadyTimeout bounds a vipd start until health says SERVING.
const ReadyTimeout = time.Minute

// Spec describes an Env.
type Spec struct {
	// Clients and Backends name the pods of node1: clients make traffic,
	// backends run echo servers on EchoPorts. Names as netlab allows.
	Clients, Backends []string
	// VipdArgs are extra flags for vipd run.
	VipdArgs []string
}

// Env is one test's world: a lab with one node and its pods, a vipd
// programming the node, and an API client. NewEnv registers the cleanup of
// all of it.
type Env struct {
	T  testing.TB
	DP string
	// Lab and Node are the network; Vipd is the daemon, API a client of it.
	Lab  *netlab.Lab
	Node *netlab.Node
	Vipd *Vipd
	API  *client.Client
}

// NewEnv builds the lab of spec, starts vipd (the binary bin, dataplane dp)
// on it and waits until it is ready. Cleanups stop vipd, unmount its bpffs
// and remove its directory, the test cgroup and the lab, in that order,
// also when the test fails; on failure they first log vipd's log tail.
func NewEnv(t testing.TB, bin, dp string, spec Spec) *Env {
	t.Helper()
	netlab.RequireRoot(t)
	e := &Env{T: t, DP: dp}
	e.Lab = netlab.New(t, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: slices.Concat(spec.Clients, spec.Backends)}}})
	e.Node = e.Lab.Node(1)
	for _, c := range spec.Clients {
		// More ephemeral ports than the default 28,000: each connection
		// a client closes sits in TIME_WAIT for a minute.
		if err := e.Node.Pod(c).SetSysctl("net.ipv4.ip_local_port_range", "10000 60999"); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range spec.Backends {
		if _, err := e.Node.Pod(b).StartEcho(b, EchoPorts...); err != nil {
			t.Fatalf("start echo: %v", err)
		}
	}
	cg := cgroup2test.New(t)
	sweepDirs(t)
	// Short: the socket path must fit in sun_path. The pid lets sweepDirs
	// find the directories of test processes that died without cleaning up.
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", dirPrefix, os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	e.Vipd = NewVipd(VipdConfig{Bin: bin, Dataplane: dp, NetNS: e.Node.Path(), Dir: dir, Cgroup: cg, Args: spec.VipdArgs})
	// Cleanups run last registered first: vipd stops, then its bpffs and
	// directory go, then the cgroup and the lab (registered above).
	t.Cleanup(func() {
		if err := ebpf.UnmountBPFFS(e.Vipd.BPFFS); err != nil {
			t.Errorf("%v (leaving %s)", err, dir)
			return
		}
		os.RemoveAll(dir)
	})
	t.Cleanup(e.Vipd.Stop)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s: vipd log (tail):\n%s", dp, e.Vipd.LogTail(40))
		}
		if dir := os.Getenv("VIPD_SOAK_LOGS"); dir != "" {
			name := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+".log")
			if err := os.WriteFile(name, []byte(e.Vipd.Log()), 0o644); err != nil {
				t.Errorf("keep vipd's log: %v", err)
			}
		}
	})
	e.StartVipd()
	if e.API, err = NewClient(e.Vipd.Socket); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.API.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := e.API.Status(ctx)
	if err != nil {
		t.Fatalf("GetStatus: %v", err)
	}
	if st.GetDataplane() != dp {
		t.Fatalf("vipd runs dataplane %q, want %q", st.GetDataplane(), dp)
	}
	return e
}

// StartVipd starts vipd and waits until it is ready, failing the test
// otherwise.
func (e *Env) StartVipd() {
	e.T.Helper()
	if err := e.Vipd.Start(); err != nil {
		e.T.Fatal(err)
	}
	if err := e.Vipd.WaitReady(ReadyTimeout); err != nil {
		e.T.Fatalf("%s: %v\nvipd log (tail):\n%s", e.DP, err, e.Vipd.LogTail(40))
	}
}

// NewClient returns another API client (a connection of its own), closed
// when the test ends.
func (e *Env) NewClient(opts ...client.Option) *client.Client {
	e.T.Helper()
	c, err := NewClient(e.Vipd.Socket, opts...)
	if err != nil {
		e.T.Fatal(err)
	}
	e.T.Cleanup(func() { c.Close() })
	return c
}

// Pod returns node1's pod name.
func (e *Env) Pod(name string) *netlab.Pod {
	e.T.Helper()
	p := e.Node.Pod(name)
	if p == nil {
		e.T.Fatalf("no pod %s", name)
	}
	return p
}

// Upsert upserts svc and fails the test if vipd refuses.
func (e *Env) Upsert(svc *vipdv1.Service) *vipdv1.Service {
	e.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got, err := e.API.UpsertService(ctx, svc, 0)
	if err != nil {
		e.T.Fatalf("%s: UpsertService %s: %v", e.DP, svc.GetName(), err)
	}
	return got
}

// Request makes one TCP request from pod src to dst and returns the
// answering backend, or the error.
func (e *Env) Request(src string, dst netip.AddrPort, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	r, err := e.Pod(src).Request(ctx, "tcp", dst.String())
	if err != nil {
		return "", err
	}
	if r.Remote != dst {
		return r.Backend, fmt.Errorf("reply from %s came from %v, want %v", r.Backend, r.Remote, dst)
	}
	return r.Backend, nil
}

// CheckKernel compares the kernel with vipd's desired state; see the
// package function.
func (e *Env) CheckKernel() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return CheckKernel(ctx, e.API, e.DP, e.Node.NS, e.Vipd.BPFFS)
}

// dirPrefix starts the name of every Env's directory in the temporary
// directory, followed by the pid of the test process that made it.
const dirPrefix = "vsoak"

var dirPID = regexp.MustCompile(`^` + dirPrefix + `([1-9][0-9]*)-`)

// sweepDirs removes the directories, and unmounts the bpffs in them, that
// Envs of test processes that no longer exist left behind (killed by a go
// test timeout, say). Directories of live processes are left alone.
func sweepDirs(t testing.TB) {
	entries, err := os.ReadDir(os.TempDir())
	if err != nil {
		return
	}
	for _, e := range entries {
		m := dirPID.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		pid, err := strconv.Atoi(m[1])
		if err != nil || unix.Kill(pid, 0) == nil || errors.Is(unix.Kill(pid, 0), unix.EPERM) {
			continue
		}
		dir := filepath.Join(os.TempDir(), e.Name())
		if err := ebpf.UnmountBPFFS(filepath.Join(dir, "bpf")); err != nil {
			t.Logf("sweep %s: %v", dir, err)
			continue
		}
		os.RemoveAll(dir)
		t.Logf("removed %s, left behind by process %d", dir, pid)
	}
}

// VIP returns 198.19.x.y for n = x<<8 | y, a VIP no interface owns.
func VIP(n int) netip.Addr { return netip.AddrFrom4([4]byte{198, 19, byte(n >> 8), byte(n)}) }

// Dataplanes returns the dataplanes to test: VIPD_SOAK_DATAPLANES,
// comma-separated, or both.
func Dataplanes() []string {
	var dps []string
	for _, dp := range strings.Split(os.Getenv("VIPD_SOAK_DATAPLANES"), ",") {
		if dp = strings.TrimSpace(dp); dp != "" && !slices.Contains(dps, dp) {
			dps = append(dps, dp)
		}
	}
	if len(dps) == 0 {
		dps = []string{"ebpf", "iptables"}
	}
	return dps
}

// RequireDataplane skips the test when dataplane dp cannot run on this
// kernel (only eBPF may not), and fails it instead when CI=true: the
// require.KernelFeature policy.
func RequireDataplane(t testing.TB, dp string) {
	t.Helper()
	if dp != "ebpf" {
		return
	}
	require.KernelFeature(t, "the eBPF dataplane", ebpf.Supported())
}

// Full reports whether the tests run in their full form (VIPD_SOAK=full)
// rather than the short one CI runs.
func Full() bool { return os.Getenv("VIPD_SOAK") == "full" }

// Pick returns full in the full form and short otherwise.
func Pick[T any](short, full T) T {
	if Full() {
		return full
	}
	return short
}
