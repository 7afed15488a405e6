package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/bench/kubeproxy"
	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/testkit/cgroup2test"
	"github.com/vipd/vipd/internal/testkit/netlab"
	"github.com/vipd/vipd/internal/testkit/procstat"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// daemon is one vipd process serving one netlab node, with its state
// directory, its private bpffs and (eBPF) its private cgroup. It may be
// stopped and started again on the same state.
type daemon struct {
	bin       string
	dataplane string
	node      *netlab.Node
	dir       string
	cgroup    *cgroup2test.Group
	extra     []string // added to the command line of every start

	cmd *exec.Cmd
	api *client.Client
}

// readyTimeout bounds how long a start waits for vipd to have applied its
// restored state.
const readyTimeout = 15 * time.Minute

// newDaemon prepares a vipd for node in a new directory under work; start
// runs it.
func newDaemon(bin string, extra []string, dataplane string, node *netlab.Node, work string) (*daemon, error) {
	dir, err := os.MkdirTemp(work, "vipd-"+dataplane+"-")
	if err != nil {
		return nil, err
	}
	d := &daemon{bin: bin, extra: extra, dataplane: dataplane, node: node, dir: dir}
	if dataplane == "ebpf" {
		if d.cgroup, err = cgroup2test.NewGroup(func(string, ...any) {}); err != nil {
			return nil, fmt.Errorf("cgroup for vipd: %w", err)
		}
	}
	return d, nil
}

func (d *daemon) bpffs() string { return filepath.Join(d.dir, "bpf") }

// start runs vipd and waits until it has applied its restored state. It
// returns how long that took.
func (d *daemon) start() (time.Duration, error) {
	sock := filepath.Join(d.dir, "vipd.sock")
	args := []string{"run", "--dataplane", d.dataplane, "--netns", d.node.Path(), "--socket", sock,
		"--state-dir", filepath.Join(d.dir, "state"), "--bpffs", d.bpffs(), "--metrics-addr=", "--log-level", "warn"}
	if d.cgroup != nil {
		args = append(args, "--cgroup-path", d.cgroup.Dir())
	}
	d.cmd = exec.Command(d.bin, append(args, d.extra...)...)
	d.cmd.Stderr = os.Stderr
	// Die with the benchmark, even if it is killed.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	os.Remove(sock)
	start := time.Now()
	if err := d.cmd.Start(); err != nil {
		return 0, err
	}
	exited := make(chan error, 1)
	go func() { exited <- d.cmd.Wait() }()
	api, err := client.New("unix://"+sock, client.WithTimeout(30*time.Minute))
	if err != nil {
		return 0, err
	}
	d.api = api
	deadline := start.Add(readyTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := api.Status(ctx)
		cancel()
		if err == nil && st.GetReady() {
			return time.Since(start), nil
		}
		select {
		case err := <-exited:
			return 0, fmt.Errorf("vipd exited before it was ready: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("vipd not ready after %v", readyTimeout)
		}
	}
}

// stop ends vipd with SIGTERM, leaving the kernel programmed.
func (d *daemon) stop() error {
	if d.cmd == nil || d.cmd.Process == nil {
		return nil
	}
	d.api.Close()
	d.cmd.Process.Signal(unix.SIGTERM)
	deadline := time.Now().Add(time.Minute)
	for processAlive(d.cmd.Process.Pid) {
		if time.Now().After(deadline) {
			d.cmd.Process.Kill()
			return errors.New("vipd did not stop within a minute of SIGTERM; killed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	d.cmd = nil
	return nil
}

func processAlive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// A zombie (state Z) has exited.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// close stops vipd and removes everything it programmed and pinned, its
// cgroup and its directory.
func (d *daemon) close() error {
	errs := []error{d.stop()}
	out, err := exec.Command(d.bin, "cleanup", "--netns", d.node.Path(), "--bpffs", d.bpffs()).CombinedOutput()
	if err != nil {
		errs = append(errs, fmt.Errorf("vipd cleanup: %w: %s", err, out))
	}
	if err := unix.Unmount(d.bpffs(), unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("unmount %s: %w", d.bpffs(), err))
	}
	if d.cgroup != nil {
		_, err := d.cgroup.Remove()
		errs = append(errs, err)
	}
	errs = append(errs, os.RemoveAll(d.dir))
	return errors.Join(errs...)
}

// peakRSS is vipd's peak resident memory so far (VmHWM), in bytes.
func (d *daemon) peakRSS() (int64, error) {
	return procstat.StatusBytes(d.cmd.Process.Pid, "VmHWM")
}

// mapMemory sums the memory the kernel charges for the BPF maps vipd holds
// open (the memlock line of each map's fdinfo), counting each map once.
func (d *daemon) mapMemory() (int64, error) {
	return procstat.MapMemlock(d.cmd.Process.Pid)
}

// cpuTime is the CPU time vipd has used so far, user and system.
func (d *daemon) cpuTime() (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", d.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	s := string(data)
	// Fields after the command name, which is in parentheses: state is
	// field 3, utime 14 and stime 15, in clock ticks (100 per second on
	// Linux).
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", d.cmd.Process.Pid)
	}
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond, nil
}

// programCase programs node for a data-path case: the kube-proxy-shaped
// ruleset of n-1 fillers and kube (for "kube-proxy"), nothing (for
// "direct"), or else a started vipd of that dataplane synced with n-1
// fillers and tested. It returns that vipd, which the caller closes, or
// nil.
func (b *bench) programCase(ctx context.Context, kind string, node *netlab.Node, n int, kube []kubeproxy.Service, tested ...*vipdv1.Service) (*daemon, error) {
	switch kind {
	case "direct":
		return nil, nil
	case "kube-proxy":
		if _, err := kubeproxy.Restore(ctx, node.Path(), kubeproxy.Full(append(kubeProxyFillers(n-1, 5), kube...), clusterCIDR), false); err != nil {
			return nil, fmt.Errorf("load %d kube-proxy services: %w", n, err)
		}
		return nil, nil
	}
	d, err := newDaemon(b.vipd, b.vipdArgs, kind, node, b.work)
	if err != nil {
		return nil, err
	}
	if _, err := d.start(); err != nil {
		return nil, errors.Join(err, d.close())
	}
	if _, err := d.api.SyncServices(ctx, owner, append(fillers(n-1, 5), tested...)); err != nil {
		return nil, errors.Join(fmt.Errorf("sync %d services: %w", n, err), d.close())
	}
	return d, nil
}
