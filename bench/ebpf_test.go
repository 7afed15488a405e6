package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testkit/cgroup2test"
	"github.com/vipd/vipd/internal/testkit/netlab"
	"github.com/vipd/vipd/internal/testkit/procstat"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// wideServices returns n services with k backends each, every (VIP, port)
// and every backend (address, port) distinct: up to 131,070 services on
// 198.19.0.0/16 (ports 80 and 81), backends spread over 198.18.0.0/16 and
// target ports.
func wideServices(n, k int) []*vipdv1.Service {
	svcs := make([]*vipdv1.Service, n)
	for i := range n {
		v, port := i%65535+1, uint32(80+i/65535)
		j := i * k
		svc := &vipdv1.Service{
			Name:  fmt.Sprintf("bench/w%06d", i),
			Vips:  []string{fmt.Sprintf("198.19.%d.%d", v>>8, v&255)},
			Ports: []*vipdv1.Port{{Port: port, TargetPort: uint32(8080 + j/65536)}},
		}
		for b := range k {
			a := (j + b) % 65536
			svc.Backends = append(svc.Backends, &vipdv1.Backend{Ip: fmt.Sprintf("198.18.%d.%d", a>>8, a&255)})
		}
		svcs[i] = svc
	}
	return svcs
}

// BenchmarkEBPFScale programs n services × 10 backends from empty with one
// SyncServices (metric sync-s), then measures UpsertService of one more
// service while they are present (p50-ms, p99-ms), and reports vipd's RSS
// (now and at its peak, peak-rss-MiB)
// and the memory of its BPF maps (as the kernel accounts it).
//
//	go test ./bench/ -run '^$' -bench EBPFScale -benchtime 300x
//
// With VIPD_BENCH_PPROF=dir, vipd serves pprof on a loopback port and the
// benchmark saves, per case, a CPU profile of the sync (the first
// VIPD_BENCH_PPROF_SECONDS seconds, 20 by default), the heap and allocs
// profiles after it, and a CPU profile of the upserts (1 s per 100
// iterations, at least 1 s) into dir. VIPD_BENCH_VIPD_ARGS adds flags to
// vipd's command line, such as "--memory-limit 512MiB".
func BenchmarkEBPFScale(b *testing.B) {
	for _, n := range []int{1, 10_000, 100_000} {
		b.Run(fmt.Sprintf("present=%d", n), func(b *testing.B) {
			lab := netlab.New(b, netlab.Spec{})
			args := []string{"--dataplane", "ebpf", "--cgroup-path", cgroup2test.New(b)}
			prof := newProfiler(b, fmt.Sprintf("present%d", n))
			args = append(args, prof.args()...)
			args = append(args, strings.Fields(os.Getenv("VIPD_BENCH_VIPD_ARGS"))...)
			cmd, api := startVipd(b, lab.Node(1), args...)
			ctx := context.Background()
			svcs := wideServices(n, 10)
			syncProfile := prof.cpu("sync", prof.syncSeconds())
			start := time.Now()
			if _, err := api.SyncServices(ctx, "bench", svcs); err != nil {
				b.Fatal(err)
			}
			sync := time.Since(start)
			svcs = nil
			syncProfile()
			prof.save("heap?gc=1", "heap-after-sync") // gc=1: the live heap now, not at the last GC
			prof.save("allocs", "allocs-after-sync")
			upsertProfile := prof.cpu("upserts", max(1, b.N/100))

			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				svc := &vipdv1.Service{
					Name: "bench/changing", Vips: []string{"198.19.255.254"},
					Ports:    []*vipdv1.Port{{Port: 443, TargetPort: 8443}},
					Backends: []*vipdv1.Backend{{Ip: fmt.Sprintf("198.18.250.%d", i%200+1)}, {Ip: "198.18.251.1"}},
				}
				t := time.Now()
				if _, err := api.UpsertService(ctx, svc, 0); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t))
			}
			b.StopTimer()
			upsertProfile()
			slices.Sort(lat)
			pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
			b.ReportMetric(pct(0.5), "p50-ms")
			b.ReportMetric(pct(0.99), "p99-ms")
			b.ReportMetric(sync.Seconds(), "sync-s")
			pid := cmd.Process.Pid
			if rss, err := procstat.StatusBytes(pid, "VmRSS"); err == nil {
				b.ReportMetric(float64(rss)/(1<<20), "rss-MiB")
			}
			if hwm, err := procstat.StatusBytes(pid, "VmHWM"); err == nil {
				b.ReportMetric(float64(hwm)/(1<<20), "peak-rss-MiB")
			}
			if mem, err := procstat.MapMemlock(pid); err == nil {
				b.ReportMetric(float64(mem)/(1<<20), "map-MiB")
			}
		})
	}
}

// profiler saves a vipd's pprof profiles into VIPD_BENCH_PPROF; it does
// nothing when that is unset.
type profiler struct {
	tb   testing.TB
	dir  string
	name string
	addr string
}

func newProfiler(tb testing.TB, name string) *profiler {
	p := &profiler{tb: tb, dir: os.Getenv("VIPD_BENCH_PPROF"), name: name}
	if p.dir == "" {
		return p
	}
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p.addr = l.Addr().String()
	l.Close()
	return p
}

// args are vipd's flags that serve pprof.
func (p *profiler) args() []string {
	if p.dir == "" {
		return nil
	}
	return []string{"--metrics-addr", p.addr, "--pprof"}
}

func (p *profiler) syncSeconds() int {
	if s, err := strconv.Atoi(os.Getenv("VIPD_BENCH_PPROF_SECONDS")); err == nil && s > 0 {
		return s
	}
	return 20
}

// cpu starts a CPU profile of seconds and returns a func that waits for it
// and saves it as what.
func (p *profiler) cpu(what string, seconds int) func() {
	if p.dir == "" {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.fetch(fmt.Sprintf("profile?seconds=%d", seconds), what)
	}()
	time.Sleep(100 * time.Millisecond) // let the profile start before the work does
	return func() { <-done }
}

// save saves the profile named profile as what.
func (p *profiler) save(profile, what string) {
	if p.dir != "" {
		p.fetch(profile, what)
	}
}

func (p *profiler) fetch(query, what string) {
	resp, err := http.Get("http://" + p.addr + "/debug/pprof/" + query)
	if err != nil {
		p.tb.Errorf("pprof %s: %v", query, err)
		return
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		p.tb.Errorf("pprof %s: %d %v", query, resp.StatusCode, err)
		return
	}
	if err := os.WriteFile(filepath.Join(p.dir, p.name+"-"+what+".pprof"), data, 0o644); err != nil {
		p.tb.Error(err)
	}
}
