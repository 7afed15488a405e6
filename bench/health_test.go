package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testkit/netlab"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
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

// cpuShare is the share of one CPU that pid uses over d, in user space
// and in the kernel.
func cpuShare(tb testing.TB, pid int, d time.Duration) (user, sys float64) {
	u0, s0 := cpuTicks(tb, pid)
	time.Sleep(d)
	u1, s1 := cpuTicks(tb, pid)
	return float64(u1-u0) / 100 / d.Seconds(), float64(s1-s0) / 100 / d.Seconds()
}

// BenchmarkHealthChecks measures the CPU that vipd spends on active health
// checks: 10,000 backends (5,000 services of 2 backends, both on echo
// servers in pod namespaces) checked over TCP every 2 s (the default),
// from the node's namespace. It reports vipd's share of one CPU with the
// checks less its share without them (the same services, idle): the
// checks' cost, in user space and in the kernel; the target is ≤ 5% of
// one CPU. On veth the kernel runs the whole handshake, the backend's
// side included, inside vipd's connect(): the kernel share counts both
// ends of every check's TCP connection.
func BenchmarkHealthChecks(b *testing.B) {
	const services, window = 5000, 20 * time.Second
	lab := netlab.New(b, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: []string{"be1", "be2"}}}})
	node := lab.Node(1)
	for _, p := range []*netlab.Pod{node.Pod("be1"), node.Pod("be2")} {
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
				Backends:    []*vipdv1.Backend{{Ip: node.Pod("be1").IPv4().String()}, {Ip: node.Pod("be2").IPv4().String()}},
				HealthCheck: hc,
			}
		}
		return out
	}
	ctx := context.Background()
	for range b.N {
		if _, err := c.SyncServices(ctx, "bench", svcs(nil)); err != nil {
			b.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		idleUser, idleSys := cpuShare(b, cmd.Process.Pid, window)
		if _, err := c.SyncServices(ctx, "bench", svcs(&vipdv1.HealthCheck{Protocol: vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_TCP})); err != nil {
			b.Fatal(err)
		}
		// Every check has started within one interval; then steady state.
		time.Sleep(5 * time.Second)
		user, sys := cpuShare(b, cmd.Process.Pid, window)
		b.ReportMetric(100*(user-idleUser), "%cpu-checks-user")
		b.ReportMetric(100*(sys-idleSys), "%cpu-checks-kernel")
		b.ReportMetric(100*(user+sys-idleUser-idleSys), "%cpu-checks")
		b.Logf("10,000 backends checked every 2 s over TCP: vipd %.2f%% of one CPU in user space, %.2f%% in the kernel (idle: %.2f%%, %.2f%%)",
			100*user, 100*sys, 100*idleUser, 100*idleSys)
	}
}
