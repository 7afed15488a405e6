package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/dataplane/ebpf"
	"github.com/vipd/vipd/internal/testkit/cgroup2test"
	"github.com/vipd/vipd/internal/testkit/childproc"
	"github.com/vipd/vipd/internal/testkit/netlab"
	"github.com/vipd/vipd/internal/testkit/syncbuf"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// vipdProc is the vipd binary running in a lab, as an operator runs it.
type vipdProc struct {
	t    *testing.T
	args []string // vipd run's flags
	log  syncbuf.Buffer

	mu     sync.Mutex
	proc   *os.Process
	exited chan error
}

func (v *vipdProc) start(extra ...string) {
	v.t.Helper()
	v.mu.Lock()
	defer v.mu.Unlock()
	fmt.Fprintf(&v.log, "=== vipd %s\n", strings.Join(extra, " "))
	cmd := exec.Command(filepath.Join(toolsDir(v.t), "vipd"), append(append([]string{"run"}, v.args...), extra...)...)
	cmd.Stdout, cmd.Stderr = &v.log, &v.log
	waited, err := childproc.Start(cmd)
	if err != nil {
		v.t.Fatal(err)
	}
	v.proc, v.exited = cmd.Process, make(chan error, 1)
	exited := v.exited
	go func() { exited <- <-waited }()
}

// stop sends SIGTERM (kill9: SIGKILL) and waits for vipd to exit.
func (v *vipdProc) stop(sig syscall.Signal) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.proc == nil {
		return
	}
	v.proc.Signal(sig)
	select {
	case err := <-v.exited:
		fmt.Fprintf(&v.log, "=== vipd exited: %v\n", err)
	case <-time.After(30 * time.Second):
		v.proc.Kill()
		<-v.exited
		v.t.Errorf("vipd did not stop on %v", sig)
	}
	v.proc = nil
}

// wait waits for a vipd that must exit on its own and returns its error.
func (v *vipdProc) wait(timeout time.Duration) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	select {
	case err := <-v.exited:
		v.proc = nil
		return err
	case <-time.After(timeout):
		return errors.New("vipd still runs")
	}
}

func (v *vipdProc) waitHealth(api *client.Client, want healthpb.HealthCheckResponse_ServingStatus) {
	v.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := api.Health(ctx)
		cancel()
		if err == nil && st == want {
			return
		}
		if time.Now().After(deadline) {
			v.t.Fatalf("vipd health %v %v, want %v\nlog:\n%s", st, err, want, v.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRecoverKeepsKernelRules runs, for each real dataplane, vipd in a lab
// node with two services of two owners, corrupts its state file, and
// checks on real traffic that: a plain start refuses (and changes
// nothing); a --recover start leaves every kernel rule alone, for longer
// than several resync periods, and refuses changes; the first SyncServices
// makes the kernel match the synced state, for both owners (the other
// owner's service, missing from the empty desired state, goes).
func TestRecoverKeepsKernelRules(t *testing.T) {
	netlab.RequireRoot(t)
	for _, dp := range []string{"iptables", "ebpf"} {
		t.Run(dp, func(t *testing.T) { testRecoverKeepsKernelRules(t, dp) })
	}
}

func testRecoverKeepsKernelRules(t *testing.T, dp string) {
	lab := netlab.New(t, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: []string{"client", "be1", "be2"}}}})
	node := lab.Node(1)
	cl, be1, be2 := node.Pod("client"), node.Pod("be1"), node.Pod("be2")
	for _, p := range []*netlab.Pod{be1, be2} {
		if _, err := p.StartEcho(p.PodName(), 8080); err != nil {
			t.Fatal(err)
		}
	}
	dir, err := os.MkdirTemp("", "vipdr") // short: the socket path must fit in sun_path
	if err != nil {
		t.Fatal(err)
	}
	stateDir, socket := filepath.Join(dir, "state"), filepath.Join(dir, "vipd.sock")
	v := &vipdProc{t: t, args: []string{"--dataplane", dp, "--netns", node.Path(), "--metrics-addr=", "--socket", socket,
		"--state-dir", stateDir, "--log-level", "debug", "--resync-period", "200ms"}}
	if dp == "ebpf" {
		// Never the machine's root cgroup, and pins in a private bpffs.
		cg := cgroup2test.New(t)
		bpffs := filepath.Join(dir, "bpf")
		if err := os.Mkdir(bpffs, 0o700); err != nil {
			t.Fatal(err)
		}
		v.args = append(v.args, "--cgroup-path", cg, "--bpffs", bpffs)
	}
	// Registered before vipd's stop, so it runs after it.
	t.Cleanup(func() {
		if err := ebpf.UnmountBPFFS(filepath.Join(dir, "bpf")); err != nil {
			t.Errorf("%v (leaving %s)", err, dir)
			return
		}
		os.RemoveAll(dir)
	})
	t.Cleanup(func() {
		v.stop(syscall.SIGKILL)
		if t.Failed() {
			t.Logf("vipd log:\n%s", v.log.String())
		}
	})
	api, err := client.New(socket, client.WithMaxAttempts(1), client.WithTimeout(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer api.Close()

	webVIP, apiVIP := netip.MustParseAddrPort("198.19.0.10:80"), netip.MustParseAddrPort("198.19.0.11:80")
	service := func(name, owner string, vip netip.AddrPort, be *netlab.Pod) *vipdv1.Service {
		return &vipdv1.Service{Name: name, Owner: owner, Vips: []string{vip.Addr().String()},
			Ports:    []*vipdv1.Port{{Port: uint32(vip.Port()), TargetPort: 8080}},
			Backends: []*vipdv1.Backend{{Ip: be.IPv4().String()}}}
	}
	// expect sends n requests from the client pod to vip; each must be
	// answered by want, or, with want "", fail.
	expect := func(when string, vip netip.AddrPort, want string, n int) {
		t.Helper()
		for i := range n {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			r, err := cl.Request(ctx, "tcp", vip.String())
			cancel()
			switch {
			case want == "" && err == nil:
				t.Fatalf("%s: request %d to %v answered by %s; want no service there", when, i, vip, r.Backend)
			case want != "" && err != nil:
				t.Fatalf("%s: request %d to %v: %v; want %s to answer", when, i, vip, err, want)
			case want != "" && r.Backend != want:
				t.Fatalf("%s: request %d to %v answered by %s; want %s", when, i, vip, r.Backend, want)
			}
		}
	}

	v.start()
	v.waitHealth(api, healthpb.HealthCheckResponse_SERVING)
	ctx := context.Background()
	if _, err := api.UpsertService(ctx, service("k8s/web", "k8s", webVIP, be1), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := api.UpsertService(ctx, service("nomad/api", "nomad", apiVIP, be2), 0); err != nil {
		t.Fatal(err)
	}
	expect("programmed", webVIP, "be1", 5)
	expect("programmed", apiVIP, "be2", 5)
	v.stop(syscall.SIGTERM)

	statePath := filepath.Join(stateDir, "state")
	data, err := os.ReadFile(statePath)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0x5a
	if err := os.WriteFile(statePath, data, 0o600); err != nil {
		t.Fatal(err)
	}

	v.start()
	if err := v.wait(time.Minute); err == nil || !strings.Contains(v.log.String(), "refusing to start") ||
		!strings.Contains(v.log.String(), statePath) || !strings.Contains(v.log.String(), "--recover") {
		t.Fatalf("plain start over a corrupt state: %v\n%s", err, v.log.String())
	}
	expect("after the refused start", webVIP, "be1", 5)
	expect("after the refused start", apiVIP, "be2", 5)

	v.start("--recover")
	v.waitHealth(api, healthpb.HealthCheckResponse_NOT_SERVING)
	st, err := api.Status(ctx)
	if err != nil || st.GetReady() || !strings.Contains(st.GetLastError(), "--recover") {
		t.Fatalf("GetStatus while recovering: %v %v", st, err)
	}
	if _, err := api.UpsertService(ctx, service("k8s/web", "k8s", webVIP, be2), 0); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("UpsertService while recovering: %v, want FailedPrecondition", err)
	}
	// Traffic keeps its rules over many resync periods.
	for range 5 {
		expect("while recovering", webVIP, "be1", 4)
		expect("while recovering", apiVIP, "be2", 4)
		time.Sleep(200 * time.Millisecond)
	}
	if h, err := api.Health(ctx); err != nil || h != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health while recovering: %v %v", h, err)
	}

	// The control plane re-syncs k8s, now on be2; nomad has not re-synced.
	resp, err := api.SyncServices(ctx, "k8s", []*vipdv1.Service{service("k8s/web", "", webVIP, be2)})
	if err != nil || len(resp.GetCreated()) != 1 {
		t.Fatalf("SyncServices: %v %v", resp, err)
	}
	v.waitHealth(api, healthpb.HealthCheckResponse_SERVING)
	expect("after the sync", webVIP, "be2", 8)
	expect("after the sync", apiVIP, "", 3)
	st, err = api.Status(ctx)
	if err != nil || !st.GetReady() || st.GetServices() != 1 || st.GetLastError() != "" {
		t.Fatalf("GetStatus after the sync: %v %v", st, err)
	}
	// Back to normal: changes are applied at once.
	if _, err := api.SyncServices(ctx, "nomad", []*vipdv1.Service{service("nomad/api", "", apiVIP, be1)}); err != nil {
		t.Fatal(err)
	}
	expect("after nomad's sync", apiVIP, "be1", 5)
}
