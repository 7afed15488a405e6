// Command demo shows vipd working for real: it builds a throwaway netlab
// topology (a node namespace, a client pod and three backend pods), runs
// vipd against the node namespace with the eBPF dataplane (the default) or
// the iptables one (-dataplane iptables), configures it with vipctl and
// grpcurl, sends requests through the VIP, shows a service without backends
// being refused at once, kills vipd with kill -9 while traffic keeps
// flowing, and restarts it. It removes everything on the way out, also on
// Ctrl-C.
//
// With eBPF it also sends requests from a process on the node itself, which
// the socket hooks balance at connect(), and lists the maps and links vipd
// pinned. vipd pins them in a bpffs of the demo's own and attaches its
// socket hooks to a cgroup of the demo's own (vipd-test-<pid>-<hex>, made through
// a private cgroup2 mount), never to the machine's root cgroup. With
// iptables it shows the conntrack entries and the rules instead.
//
// It is run by `make demo` (`make demo DATAPLANE=iptables`) with the
// binaries in bin/.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/vipd/vipd/internal/testkit/syncbuf"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/internal/cgroup2"
	"github.com/vipd/vipd/internal/testkit/cgroup2test"
	"github.com/vipd/vipd/internal/testkit/netlab"
)

// Dataplanes the demo runs vipd with.
const (
	dataplaneEBPF     = "ebpf"
	dataplaneIPTables = "iptables"
)

func main() {
	// The node-local client process of the eBPF demo is this binary again.
	netlab.RunClientIfRequested()
	bin := flag.String("bin", "bin", "directory with the vipd, vipctl and grpcurl binaries")
	dp := flag.String("dataplane", dataplaneEBPF, "vipd's dataplane: ebpf or iptables")
	flag.Parse()
	if *dp != dataplaneEBPF && *dp != dataplaneIPTables {
		fmt.Fprintf(os.Stderr, "demo: -dataplane %q: use ebpf or iptables\n", *dp)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *bin, *dp); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

const (
	vip      = "198.19.0.10"
	emptyVIP = "198.19.0.11"
)

// vipdStopTimeout bounds how long the cleanup waits for vipd to exit after
// SIGTERM before it kills it.
const vipdStopTimeout = 15 * time.Second

type demo struct {
	bin, dataplane  string
	work            string // removed on the way out
	socket, logPath string
	vipdArgs        []string
	lab             *netlab.Lab
	node            *netlab.Node
	cgroup          *cgroup2test.Group // eBPF only
	client          *netlab.Client     // eBPF only: the process on the node
	vipd            *exec.Cmd          // the running vipd, or nil
	vipdStartedOnce bool               // the kernel may hold what vipd programmed
}

func (d *demo) ebpf() bool { return d.dataplane == dataplaneEBPF }

// bpffs is where vipd pins the eBPF dataplane's maps and links; vipd mounts
// a bpffs there.
func (d *demo) bpffs() string { return filepath.Join(d.work, "bpf") }

func step(format string, args ...any) {
	fmt.Printf("\n\033[1m== %s\033[0m\n", fmt.Sprintf(format, args...))
}

// show runs a command, printing it and its output.
func (d *demo) show(ctx context.Context, name string, args ...string) error {
	fmt.Printf("$ %s %s\n", filepath.Base(name), strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout
	return cmd.Run()
}

// flowFollower is a `vipctl flows --follow` running in the background.
type flowFollower struct {
	cmd  *exec.Cmd
	out  *syncbuf.Buffer
	args []string
}

// followFlows starts streaming the flow events of default/web.
func (d *demo) followFlows(ctx context.Context) (*flowFollower, error) {
	args := []string{"--socket", d.socket, "flows", "--follow", "--service", "default/web"}
	cmd := exec.CommandContext(ctx, filepath.Join(d.bin, "vipctl"), args...)
	out := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	time.Sleep(200 * time.Millisecond) // subscribed before the traffic starts
	return &flowFollower{cmd: cmd, out: out, args: args[2:]}, nil
}

// show waits until the stream carried a NEW event for each of n
// connections (and, on the eBPF dataplane, a CLOSED one: iptables reports a
// close only when the kernel destroys the entry, after TIME_WAIT), stops
// it, and prints what it streamed.
func (f *flowFollower) show(n int) error {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if strings.Count(f.out.String(), " NEW ") >= n {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	f.cmd.Process.Signal(os.Interrupt)
	f.cmd.Wait()
	lines := strings.Split(strings.TrimSpace(f.out.String()), "\n")
	step("the flow events of those requests, from the kernel's connection tracking")
	fmt.Printf("$ vipctl %s   (%d lines; first 8)\n", strings.Join(f.args, " "), len(lines))
	for _, l := range lines[:min(8, len(lines))] {
		fmt.Println("  " + l)
	}
	news, closed := strings.Count(f.out.String(), " NEW "), strings.Count(f.out.String(), " CLOSED ")
	fmt.Printf("  %d NEW and %d CLOSED events for %d connections\n", news, closed, n)
	if news < n {
		return fmt.Errorf("the flow stream carried %d NEW events for %d connections", news, n)
	}
	return nil
}

func (d *demo) vipctl(ctx context.Context, args ...string) error {
	return d.show(ctx, filepath.Join(d.bin, "vipctl"), append([]string{"--socket", d.socket}, args...)...)
}

func run(ctx context.Context, bin, dataplane string) error {
	bin, err := filepath.Abs(bin)
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "vipd-demo")
	if err != nil {
		return err
	}
	d := &demo{bin: bin, dataplane: dataplane, work: work,
		socket: filepath.Join(work, "vipd.sock"), logPath: filepath.Join(work, "vipd.log")}
	defer d.close()

	if d.ebpf() {
		if d.cgroup, err = cgroup2test.NewGroup(func(string, ...any) {}); err != nil {
			return err
		}
	}
	step("build a node namespace with a client pod and three backend pods")
	if d.lab, err = netlab.Build(ctx, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: []string{"client", "web1", "web2", "web3"}}}}, hclog.NewNullLogger()); err != nil {
		return err
	}
	node := d.lab.Node(1)
	d.node = node
	for _, p := range node.Pods() {
		fmt.Printf("  %-7s %-15s %s\n", p.PodName(), p.IPv4(), p.Name())
		if p.PodName() != "client" {
			if _, err := p.StartEcho("", 8080); err != nil {
				return err
			}
		}
	}

	d.vipdArgs = []string{"run", "--dataplane", dataplane, "--netns", node.Path(), "--metrics-addr=",
		"--socket", d.socket, "--state-dir", filepath.Join(work, "state")}
	if d.ebpf() {
		d.vipdArgs = append(d.vipdArgs, "--cgroup-path", d.cgroup.Dir(), "--bpffs", d.bpffs())
		step("start vipd with the eBPF dataplane, programming %s", node.Name())
		fmt.Printf("  tc programs on the pods' host veths, socket hooks on the cgroup %s\n", d.cgroup.Dir())
		fmt.Printf("  (not the machine's root cgroup), maps and links pinned in %s\n", d.bpffs())
	} else {
		// Flows need conntrack accounting, timestamps and events, which
		// vipd sets in the node's namespace only when told.
		d.vipdArgs = append(d.vipdArgs, "--set-sysctls")
		step("start vipd with the iptables dataplane, programming %s", node.Name())
	}
	if err := d.startVipd(ctx); err != nil {
		return err
	}

	step("upsert default/web (%s:80 → three backends on 8080) with vipctl", vip)
	manifest := filepath.Join(work, "web.yaml")
	yaml := fmt.Sprintf("name: default/web\nvips: [%s]\nports:\n- {name: http, port: 80, target_port: 8080}\nbackends:\n", vip)
	for _, p := range []string{"web1", "web2", "web3"} {
		yaml += fmt.Sprintf("- {ip: %s}\n", d.lab.Pod(p).IPv4())
	}
	if err := os.WriteFile(manifest, []byte(yaml), 0o644); err != nil {
		return err
	}
	fmt.Print(yaml)
	if err := d.vipctl(ctx, "apply", "-f", manifest); err != nil {
		return err
	}

	step("upsert default/empty (%s:80, no backends) with grpcurl", emptyVIP)
	body := fmt.Sprintf(`{"service": {"name": "default/empty", "vips": ["%s"], "ports": [{"port": 80}]}}`, emptyVIP)
	if err := d.show(ctx, filepath.Join(bin, "grpcurl"), "-plaintext", "-d", body, "-unix", d.socket, "vipd.v1.LoadBalancerService/UpsertService"); err != nil {
		return err
	}
	if err := d.vipctl(ctx, "service", "list"); err != nil {
		return err
	}
	if err := d.vipctl(ctx, "service", "get", "default/web"); err != nil {
		return err
	}
	if err := d.vipctl(ctx, "status"); err != nil {
		return err
	}

	client := d.lab.Pod("client")
	flows, err := d.followFlows(ctx)
	if err != nil {
		return err
	}
	step("30 TCP requests from the client pod (%s) to %s:80", client.IPv4(), vip)
	hits := map[string]int{}
	for i := 1; i <= 30; i++ {
		r, err := client.Request(ctx, "tcp", vip+":80")
		if err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
		hits[r.Backend]++
		fmt.Printf("  %2d  client %-21s → VIP %s → %s (backend saw %s)\n", i, r.Local, r.Remote, r.Backend, r.Peer)
	}
	printHits(hits)
	if err := flows.show(30); err != nil {
		return err
	}

	if d.ebpf() {
		if err := d.nodeLocal(ctx); err != nil {
			return err
		}
	} else {
		step("the conntrack entries behind them: DNAT to a backend, replies translated back")
		out, err := node.Exec(ctx, "conntrack", "-L", "-d", vip)
		if err != nil {
			return err
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		fmt.Printf("$ conntrack -L -d %s   (in %s; %d entries, first 5)\n", vip, node.Name(), len(lines))
		for _, l := range lines[:min(5, len(lines))] {
			fmt.Println("  " + l)
		}
	}

	step("a service without backends is rejected at once, not left to hang")
	start := time.Now()
	_, err = client.Request(ctx, "tcp", emptyVIP+":80")
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		fmt.Printf("  connect %s:80: connection refused after %v\n", emptyVIP, time.Since(start).Round(time.Microsecond))
	default:
		return fmt.Errorf("connect to the empty service: want connection refused, got %v", err)
	}

	if d.ebpf() {
		step("what vipd pinned in %s", d.bpffs())
		if err := showPinned(d.bpffs(), node, d.cgroup.Dir()); err != nil {
			return err
		}
		fmt.Println("  The tcx links (the pods' host veths) and the cgroup links (the socket hooks) are pinned")
		fmt.Println("  like the maps, so the programs stay attached and traffic keeps flowing without vipd.")
		step("kill -9 vipd: traffic keeps flowing, because the programs, links and maps are pinned")
	} else {
		step("kill -9 vipd: traffic keeps flowing, because the rules live in the kernel")
	}
	d.vipd.Process.Kill()
	d.vipd.Wait()
	d.vipd = nil
	for i := 1; i <= 5; i++ {
		r, err := client.Request(ctx, "tcp", vip+":80")
		if err != nil {
			return fmt.Errorf("request %d with vipd down: %w", i, err)
		}
		fmt.Printf("  vipd down, request %d → %s\n", i, r.Backend)
	}
	if d.ebpf() {
		for i := 1; i <= 3; i++ {
			r, err := d.client.Request(ctx, "tcp", vip+":80")
			if err != nil {
				return fmt.Errorf("node request %d with vipd down: %w", i, err)
			}
			fmt.Printf("  vipd down, request %d from the node → %s (getpeername %s)\n", i, r.Backend, r.Remote)
		}
	}

	logOffset := fileSize(d.logPath)
	if d.ebpf() {
		step("restart vipd with the same state dir and bpffs: it reuses the pinned maps and links")
	} else {
		step("restart vipd with the same state dir: it finds its rules in place and rewrites nothing")
	}
	if err := d.startVipd(ctx); err != nil {
		return err
	}
	if d.ebpf() {
		d.showLog(logOffset, "reusing pinned maps")
	}
	if err := d.vipctl(ctx, "service", "list"); err != nil {
		return err
	}

	if !d.ebpf() {
		step("the rules vipd wrote for it (iptables-save | grep %s)", emptyVIP)
		save, err := node.Exec(ctx, "iptables-save")
		if err != nil {
			return err
		}
		for l := range strings.Lines(save) {
			if strings.Contains(l, emptyVIP) || strings.Contains(l, vip+"/32") {
				fmt.Print("  " + l)
			}
		}
	}
	return nil
}

// nodeLocal sends requests through the VIP from a process on the node
// itself, born in the demo's cgroup: the socket hooks pick the backend at
// connect(), so the packets carry the backend's address from the start,
// and getpeername() still gives the VIP.
func (d *demo) nodeLocal(ctx context.Context) error {
	c, err := d.node.StartClient(ctx, d.cgroup.Dir())
	if err != nil {
		return err
	}
	d.client = c
	cg, err := cgroup2.ProcCgroup(c.Pid())
	if err != nil {
		return err
	}
	want := netip.MustParseAddrPort(vip + ":80")
	step("10 TCP requests to %s:80 from a process on the node (pid %d, cgroup %s)", vip, c.Pid(), cg)
	fmt.Println("  the socket hooks pick a backend at connect(): no per-packet NAT on the way")
	hits := map[string]int{}
	for i := 1; i <= 10; i++ {
		r, err := c.Request(ctx, "tcp", vip+":80")
		if err != nil {
			return fmt.Errorf("node request %d: %w", i, err)
		}
		if r.Remote != want {
			return fmt.Errorf("node request %d: getpeername gave %s, want the VIP %s", i, r.Remote, want)
		}
		hits[r.Backend]++
		fmt.Printf("  %2d  node %-21s → VIP %s → %s (backend saw %s)\n", i, r.Local, r.Remote, r.Backend, r.Peer)
	}
	printHits(hits)
	fmt.Printf("  getpeername() gave %s every time: the socket hooks translate the backend's address back\n", want)

	start := time.Now()
	_, err = c.Request(ctx, "tcp", emptyVIP+":80")
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("connect to the empty service from the node: want connection refused, got %v", err)
	}
	fmt.Printf("  connect %s:80 from the node: connection refused by connect() itself after %v, before any packet\n",
		emptyVIP, time.Since(start).Round(time.Microsecond))
	return nil
}

func printHits(hits map[string]int) {
	names := make([]string, 0, len(hits))
	total := 0
	for n, k := range hits {
		names = append(names, n)
		total += k
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Printf("  %s answered %d of %d\n", n, hits[n], total)
	}
}

// startVipd starts vipd with d.vipdArgs, appending its output to d.logPath,
// and waits until it reports ready.
func (d *demo) startVipd(ctx context.Context) error {
	logFile, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.Command(filepath.Join(d.bin, "vipd"), d.vipdArgs...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	d.vipdStartedOnce = true
	if err := cmd.Start(); err != nil {
		return err
	}
	if err := d.waitReady(ctx); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		log, _ := os.ReadFile(d.logPath)
		return fmt.Errorf("%w\n%s", err, log)
	}
	d.vipd = cmd
	return nil
}

func (d *demo) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		out, err := exec.CommandContext(ctx, filepath.Join(d.bin, "grpcurl"), "-plaintext", "-unix", d.socket, "grpc.health.v1.Health/Check").Output()
		if err == nil && strings.Contains(string(out), `"SERVING"`) {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(100 * time.Millisecond)
	}
	return errors.New("vipd did not become ready")
}

// showLog prints the lines of vipd's log from offset on that contain substr.
func (d *demo) showLog(offset int64, substr string) {
	f, err := os.Open(d.logPath)
	if err != nil {
		return
	}
	defer f.Close()
	b, _ := io.ReadAll(io.NewSectionReader(f, offset, 1<<20))
	for l := range strings.Lines(string(b)) {
		if strings.Contains(l, substr) {
			fmt.Print("  vipd log: " + l)
		}
	}
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// close removes everything the demo made, in order: vipd, what vipd
// programmed, the bpffs, the namespaces, the cgroup and the work
// directory. It tries every step whatever failed before, and reports
// what it could not remove.
func (d *demo) close() {
	if d.ebpf() {
		step("clean up: stop vipd, remove what it programmed, the bpffs, the namespaces and the cgroup")
	} else {
		step("clean up: stop vipd, remove its rules and the namespaces")
	}
	report := func(what string, err error) {
		if err != nil {
			fmt.Printf("cleanup: %s: %v\n", what, err)
		}
	}
	if d.vipd != nil {
		d.vipd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { d.vipd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(vipdStopTimeout):
			d.vipd.Process.Kill()
			<-done
		}
		d.vipd = nil
	}
	if d.vipdStartedOnce {
		// --bpffs also for iptables: the default is the machine's own
		// /sys/fs/bpf/vipd, which is none of the demo's business.
		cmd := exec.Command(filepath.Join(d.bin, "vipd"), "cleanup", "--netns", d.node.Path(), "--bpffs", d.bpffs())
		// A process group of its own, so that another Ctrl-C does not
		// stop the cleanup halfway.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		out, err := cmd.CombinedOutput()
		if err != nil {
			report("vipd cleanup", fmt.Errorf("%w: %s", err, out))
		}
	}
	if d.ebpf() {
		// Unmount before RemoveAll, which cannot remove a mount point.
		if err := unix.Unmount(d.bpffs(), unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			report("unmount bpffs", err)
		}
	}
	if d.client != nil {
		report("stop the node's client process", d.client.Close())
	}
	if d.lab != nil {
		report("remove the namespaces", d.lab.Close())
	}
	if d.cgroup != nil {
		_, err := d.cgroup.Remove()
		report("remove the cgroup", err)
	}
	report("remove the work directory", os.RemoveAll(d.work))
}
