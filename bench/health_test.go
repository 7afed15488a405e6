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

// cpuTicks is the user and system CPU time of process pid, in clock ticks
// (1/100 s on Linux).
func cpuTicks(tb testing.TB, pid int) int64 {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// The fields after the command name, which is in parentheses.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s
}

// cpuShare is the share of one CPU that pid uses over d.
func cpuShare(tb testing.TB, pid int, d time.Duration) float64 {
	before := cpuTicks(tb, pid)
	time.Sleep(d)
	return float64(cpuTicks(tb, pid)-before) / 100 / d.Seconds()
}

// BenchmarkHealthChecks measures the CPU that vipd spends on active health
// checks: 10,000 backends (5,000 services of 2 backends, both on echo
// servers in pod namespaces) checked over TCP every 2 s (the default),
// from the node's namespace. It reports vipd's share of one CPU with the
// checks, without them (the same services, idle), and the difference,
// the checks' cost; the target is ≤ 5% of one CPU.
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
		idle := cpuShare(b, cmd.Process.Pid, window)
		if _, err := c.SyncServices(ctx, "bench", svcs(&vipdv1.HealthCheck{Protocol: vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_TCP})); err != nil {
			b.Fatal(err)
		}
		// Every check has started within one interval; then steady state.
		time.Sleep(5 * time.Second)
		checking := cpuShare(b, cmd.Process.Pid, window)
		b.ReportMetric(100*checking, "%cpu-checking")
		b.ReportMetric(100*idle, "%cpu-idle")
		b.ReportMetric(100*(checking-idle), "%cpu-checks")
		b.Logf("10,000 backends checked every 2 s over TCP: vipd %.2f%% of one CPU (idle %.2f%%): the checks cost %.2f%%", 100*checking, 100*idle, 100*(checking-idle))
	}
}
