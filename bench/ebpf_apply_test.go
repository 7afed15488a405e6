package bench

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/ebpf"
	"github.com/vipd/vipd/internal/testkit/cgroup2test"
	"github.com/vipd/vipd/internal/testkit/netlab"
)

// dpServices returns n dataplane services with k backends each, every
// (VIP, port) and backend (address, port) distinct, as wideServices.
func dpServices(n, k int) map[string]*dataplane.Service {
	out := make(map[string]*dataplane.Service, n)
	for i := range n {
		v, port := i%65535+1, uint16(80+i/65535)
		j := i * k
		svc := &dataplane.Service{
			Name:          fmt.Sprintf("bench/w%06d", i),
			Generation:    uint64(i + 1),
			VIPs:          []netip.Addr{netip.AddrFrom4([4]byte{198, 19, byte(v >> 8), byte(v)})},
			Ports:         []dataplane.Port{{Protocol: dataplane.TCP, Port: port, TargetPort: uint16(8080 + j/65536)}},
			TrafficPolicy: dataplane.TrafficPolicyCluster,
			LoadBalancing: dataplane.LoadBalancingRandom,
		}
		for b := range k {
			a := (j + b) % 65536
			svc.Backends = append(svc.Backends, dataplane.Backend{
				IP: netip.AddrFrom4([4]byte{198, 18, byte(a >> 8), byte(a)}), State: dataplane.BackendReady, Weight: 1,
			})
		}
		out[svc.Name] = svc
	}
	return out
}

// BenchmarkEBPFApply measures the eBPF dataplane alone, in process: the
// first (full) Apply of n services × 10 backends from empty maps (metric
// program-s; program-cpu-s is the process's CPU time, user and system,
// which other load on the machine disturbs less) and the Go heap the
// dataplane retains afterwards, per service (heap-B/svc); then one
// incremental Apply that changes one service's backends while the n
// services are present (p50-us, p99-us): the per-update cost, which must
// not grow with n; then a restart (restart-s): New on the pinned maps and
// its first, full, Apply.
//
//	go test ./bench/ -run '^$' -bench EBPFApply -benchtime 1000x
func BenchmarkEBPFApply(b *testing.B) {
	for _, n := range []int{1, 10_000, 100_000} {
		b.Run(fmt.Sprintf("present=%d", n), func(b *testing.B) {
			lab := netlab.New(b, netlab.Spec{})
			bpffs := filepath.Join(b.TempDir(), "bpf")
			ctx := context.Background()
			cfg := ebpf.Config{NetNS: lab.Node(1).Path(), BPFFS: bpffs, CgroupPath: cgroup2test.New(b)}
			dp, err := ebpf.New(ctx, hclog.NewNullLogger(), cfg)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				dp.Close()
				ebpf.Cleanup(hclog.NewNullLogger(), lab.Node(1).Path(), bpffs)
				unix.Unmount(bpffs, unix.MNT_DETACH)
			})
			svcs := dpServices(n, 10)
			before := heapInUse()
			cpu0 := cpuTime()
			start := time.Now()
			if err := dp.Apply(ctx, &dataplane.State{Generation: 1, Services: svcs}); err != nil {
				b.Fatal(err)
			}
			program := time.Since(start)
			programCPU := cpuTime() - cpu0
			retained := heapInUse() - before

			const name = "bench/changing"
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				// Apply does not retain the map: changing it in place is fine.
				svcs[name] = &dataplane.Service{
					Name: name, Generation: uint64(n + i + 2),
					VIPs:          []netip.Addr{netip.MustParseAddr("198.19.255.254")},
					Ports:         []dataplane.Port{{Protocol: dataplane.TCP, Port: 443, TargetPort: 8443}},
					TrafficPolicy: dataplane.TrafficPolicyCluster, LoadBalancing: dataplane.LoadBalancingRandom,
					Backends: []dataplane.Backend{
						{IP: netip.AddrFrom4([4]byte{198, 18, 250, byte(i%200 + 1)}), State: dataplane.BackendReady, Weight: 1},
						{IP: netip.MustParseAddr("198.18.251.1"), State: dataplane.BackendReady, Weight: 1},
					},
				}
				t := time.Now()
				if err := dp.Apply(ctx, &dataplane.State{Generation: uint64(n + i + 2), Services: svcs, Changed: []string{name}}); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t))
			}
			b.StopTimer()
			slices.Sort(lat)
			pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Nanoseconds()) / 1000 }
			b.ReportMetric(pct(0.5), "p50-us")
			b.ReportMetric(pct(0.99), "p99-us")
			b.ReportMetric(program.Seconds(), "program-s")
			b.ReportMetric(programCPU.Seconds(), "program-cpu-s")
			b.ReportMetric(float64(retained)/float64(n), "heap-B/svc")

			// A restart: a new Dataplane restores the IDs from the pinned
			// maps, and its first (full) Apply reads them once, rewrites
			// what differs and prunes what no service accounts for.
			dp.Close()
			start = time.Now()
			dp, err = ebpf.New(ctx, hclog.NewNullLogger(), cfg)
			if err != nil {
				b.Fatal(err)
			}
			if err := dp.Apply(ctx, &dataplane.State{Generation: uint64(n + b.N + 2), Services: svcs}); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(time.Since(start).Seconds(), "restart-s")
		})
	}
}

// heapInUse returns the bytes of live Go heap objects after a collection.
func heapInUse() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// cpuTime returns the CPU time (user and system) the process used so far.
func cpuTime() time.Duration {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
