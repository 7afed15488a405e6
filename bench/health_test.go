package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testkit/netlab"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"golang.org/x/sys/unix"
)

// cpuTicks is the user and the system CPU time of process pid, in clock
// ticks (1/100 s on Linux).
func cpuTicks(tb testing.TB, pid int) (user, sys int64) {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// The fields after the command name, which is in parentheses.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	user, _ = strconv.ParseInt(f[11], 10, 64)
	sys, _ = strconv.ParseInt(f[12], 10, 64)
	return user, sys
}

// cpuTimes is one line of /proc/stat: a CPU's (or, as "cpu", the
// machine's) time in clock ticks.
type cpuTimes struct {
	user, nice, system, idle, iowait, irq, softirq, steal int64
}

func (c cpuTimes) busy() int64 {
	return c.user + c.nice + c.system + c.irq + c.softirq + c.steal
}

func (c cpuTimes) sub(o cpuTimes) cpuTimes {
	return cpuTimes{c.user - o.user, c.nice - o.nice, c.system - o.system, c.idle - o.idle,
		c.iowait - o.iowait, c.irq - o.irq, c.softirq - o.softirq, c.steal - o.steal}
}

// procStat reads /proc/stat: "cpu" (the machine), "cpu0", "cpu1", ...
func procStat(tb testing.TB) map[string]cpuTimes {
	tb.Helper()
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]cpuTimes{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || !strings.HasPrefix(f[0], "cpu") {
			continue
		}
		var v [8]int64
		for i := range v {
			v[i], _ = strconv.ParseInt(f[i+1], 10, 64)
		}
		out[f[0]] = cpuTimes{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]}
	}
	return out
}

// usage is the CPU used over a window, as shares of one CPU.
type usage struct {
	vipdUser, vipdSys float64 // the vipd process
	softirq           [2]float64
	busy              [2]float64
	machine           float64 // every CPU, everything
}

func (u usage) sub(o usage) usage {
	return usage{u.vipdUser - o.vipdUser, u.vipdSys - o.vipdSys,
		[2]float64{u.softirq[0] - o.softirq[0], u.softirq[1] - o.softirq[1]},
		[2]float64{u.busy[0] - o.busy[0], u.busy[1] - o.busy[1]}, u.machine - o.machine}
}

// measure samples vipd's and the machine's CPU over d.
func measure(tb testing.TB, pid int, d time.Duration) usage {
	u0, s0 := cpuTicks(tb, pid)
	st0 := procStat(tb)
	time.Sleep(d)
	u1, s1 := cpuTicks(tb, pid)
	st1 := procStat(tb)
	share := func(ticks int64) float64 { return float64(ticks) / 100 / d.Seconds() }
	u := usage{vipdUser: share(u1 - u0), vipdSys: share(s1 - s0), machine: share(st1["cpu"].sub(st0["cpu"]).busy())}
	for i := range 2 {
		c := fmt.Sprintf("cpu%d", i)
		u.softirq[i] = share(st1[c].sub(st0[c]).softirq)
		u.busy[i] = share(st1[c].sub(st0[c]).busy())
	}
	return u
}

// pin sets the CPU affinity of every thread of process pid to cpu; threads
// it starts later inherit it.
func pin(tb testing.TB, pid, cpu int) {
	tb.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		tb.Fatal(err)
	}
	var set unix.CPUSet
	set.Set(cpu)
	for _, task := range tasks {
		tid, _ := strconv.Atoi(task.Name())
		if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH {
			tb.Fatalf("pin thread %d to CPU %d: %v", tid, cpu, err)
		}
	}
}

// steerRPS steers the receive processing of every device of the lab
// namespace at nsPath to the CPUs in mask (rps_cpus). sysfs shows the
// devices of the namespace that mounts it, so a child mounts one in a
// private mount namespace of its own; nothing outside the lab namespace
// changes.
func steerRPS(tb testing.TB, nsPath string, mask int) {
	tb.Helper()
	script := fmt.Sprintf(`mount -t sysfs sysfs /sys && for f in /sys/class/net/*/queues/rx-*/rps_cpus; do echo %x > "$f"; done`, mask)
	out, err := exec.Command("unshare", "--mount", "--propagation", "private",
		"nsenter", "--net="+nsPath, "sh", "-c", script).CombinedOutput()
	if err != nil {
		tb.Fatalf("steer RPS in %s: %v\n%s", nsPath, err, out)
	}
}

// BenchmarkHealthChecks measures the CPU that vipd spends on active health
// checks: 10,000 backends (5,000 services of 2 backends, both on echo
// servers in pod namespaces) checked over TCP every 2 s (the default,
// 5,000 checks a second), from the node's namespace. Each figure is the
// share of one CPU with the checks less the share without them (the same
// services, idle), over 20 s each, in two set-ups:
//
//   - veth: as the machine runs it. On veth the kernel runs the whole
//     handshake inside vipd's connect(), the backend's side included (its
//     SYN queue, SYN-ACK, child socket and reset), so vipd's kernel share
//     counts both ends of every check's connection.
//   - split: vipd pinned to CPU 0 and the receive processing of the
//     backends' namespaces steered to CPU 1 with RPS (the node namespace's
//     to CPU 0), with the backends' echo servers (this process) pinned to
//     CPU 1: the backend's side of the handshake runs on CPU 1, as it would
//     on the backend's machine, and vipd's own side on CPU 0.
//
// It reports vipd's user and kernel time, each CPU's softirq time (ticks
// in softirq are counted both to the CPU's softirq and to the process they
// interrupted, so CPU 0's overlaps vipd's kernel time), and the whole
// machine's busy time, which on a shared machine includes other work. The
// target is ≤ 5% of one CPU for vipd.
func BenchmarkHealthChecks(b *testing.B) {
	const services, window = 5000, 20 * time.Second
	lab := netlab.New(b, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: []string{"be1", "be2"}}}})
	node := lab.Node(1)
	pods := []*netlab.Pod{node.Pod("be1"), node.Pod("be2")}
	for _, p := range pods {
		if _, err := p.StartEcho("", 8080); err != nil {
			b.Fatal(err)
		}
	}
	cmd, c := startVipd(b, node, "--dataplane", "none")
	svcs := func(hc *vipdv1.HealthCheck) []*vipdv1.Service {
		out := make([]*vipdv1.Service, services)
		for i := range out {
			out[i] = &vipdv1.Service{
				Name:        fmt.Sprintf("bench/h%05d", i),
				Vips:        []string{fmt.Sprintf("198.19.%d.%d", i/250, i%250+1)},
				Ports:       []*vipdv1.Port{{Port: 80, TargetPort: 8080}},
				Backends:    []*vipdv1.Backend{{Ip: pods[0].IPv4().String()}, {Ip: pods[1].IPv4().String()}},
				HealthCheck: hc,
			}
		}
		return out
	}
	ctx := context.Background()
	run := func(setup string) {
		if _, err := c.SyncServices(ctx, "bench", svcs(nil)); err != nil {
			b.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		idle := measure(b, cmd.Process.Pid, window)
		if _, err := c.SyncServices(ctx, "bench", svcs(&vipdv1.HealthCheck{Protocol: vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_TCP})); err != nil {
			b.Fatal(err)
		}
		// Every check has started within one interval; then steady state.
		time.Sleep(5 * time.Second)
		busy := measure(b, cmd.Process.Pid, window)
		d := busy.sub(idle)
		if out := os.Getenv("VIPD_BENCH_PERF"); out != "" {
			// A profile of vipd with the checks on, after the measurement:
			// where its CPU goes, user space and kernel.
			data := filepath.Join(b.TempDir(), "perf.data")
			if o, err := exec.Command("perf", "record", "-g", "-o", data, "-p", strconv.Itoa(cmd.Process.Pid), "--", "sleep", "10").CombinedOutput(); err != nil {
				b.Fatalf("perf record: %v\n%s", err, o)
			}
			rep, err := exec.Command("perf", "report", "-i", data, "--stdio", "--no-children", "--sort", "sym", "--percent-limit", "0.5", "-g", "none").Output()
			if err != nil {
				b.Fatalf("perf report: %v", err)
			}
			if err := os.WriteFile(out+"-"+setup+".txt", rep, 0o644); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(100*d.vipdUser, "%vipd-user-"+setup)
		b.ReportMetric(100*d.vipdSys, "%vipd-kernel-"+setup)
		b.ReportMetric(100*(d.vipdUser+d.vipdSys), "%vipd-"+setup)
		b.ReportMetric(100*d.softirq[0], "%cpu0-softirq-"+setup)
		b.ReportMetric(100*d.softirq[1], "%cpu1-softirq-"+setup)
		b.ReportMetric(100*d.machine, "%machine-"+setup)
		b.Logf("%s: 10,000 backends checked every 2 s over TCP, less idle: vipd %.2f%% user + %.2f%% kernel = %.2f%% of one CPU (%.1f µs a check); "+
			"softirq CPU0 %.2f%%, CPU1 %.2f%%; busy CPU0 %.2f%%, CPU1 %.2f%%; machine %.2f%% (idle: vipd %.2f%% + %.2f%%, machine %.2f%%)",
			setup, 100*d.vipdUser, 100*d.vipdSys, 100*(d.vipdUser+d.vipdSys), 1e6*(d.vipdUser+d.vipdSys)/(2*services/2.0),
			100*d.softirq[0], 100*d.softirq[1], 100*d.busy[0], 100*d.busy[1], 100*d.machine,
			100*idle.vipdUser, 100*idle.vipdSys, 100*idle.machine)
	}
	for range b.N {
		run("veth")
		if _, err := os.Stat(filepath.Join("/sys/devices/system/cpu", "cpu1")); err != nil {
			b.Log("split: skipped, the machine has one CPU")
			continue
		}
		pin(b, cmd.Process.Pid, 0)
		var all unix.CPUSet
		if err := unix.SchedGetaffinity(0, &all); err != nil {
			b.Fatal(err)
		}
		pin(b, os.Getpid(), 1)
		b.Cleanup(func() {
			tasks, _ := os.ReadDir("/proc/self/task")
			for _, task := range tasks {
				tid, _ := strconv.Atoi(task.Name())
				unix.SchedSetaffinity(tid, &all)
			}
		})
		steerRPS(b, node.Path(), 1<<0)
		for _, p := range pods {
			steerRPS(b, p.Path(), 1<<1)
		}
		run("split")
	}
}
