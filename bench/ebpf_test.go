package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/cgroup2"
	"github.com/vipd/vipd/internal/netlab"
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
// and the memory of its BPF maps (as the kernel accounts it).
//
//	go test ./bench/ -run '^$' -bench EBPFScale -benchtime 300x
func BenchmarkEBPFScale(b *testing.B) {
	for _, n := range []int{1, 10_000, 100_000} {
		b.Run(fmt.Sprintf("present=%d", n), func(b *testing.B) {
			lab := netlab.New(b, netlab.Spec{})
			cmd, api := startVipd(b, lab.Node(1), "--dataplane", "ebpf", "--cgroup-path", cgroup2.NewTestGroup(b))
			ctx := context.Background()
			svcs := wideServices(n, 10)
			start := time.Now()
			if _, err := api.SyncServices(ctx, "bench", svcs); err != nil {
				b.Fatal(err)
			}
			sync := time.Since(start)
			svcs = nil

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
			slices.Sort(lat)
			pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
			b.ReportMetric(pct(0.5), "p50-ms")
			b.ReportMetric(pct(0.99), "p99-ms")
			b.ReportMetric(sync.Seconds(), "sync-s")
			pid := cmd.Process.Pid
			if rss, err := statusKB(pid, "VmRSS"); err == nil {
				b.ReportMetric(float64(rss)/1024, "rss-MiB")
			}
			if mem, err := mapMemlock(pid); err == nil {
				b.ReportMetric(float64(mem)/(1<<20), "map-MiB")
			}
		})
	}
}

// statusKB reads a "kB" field of /proc/PID/status.
func statusKB(pid int, field string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), field+":"); ok {
			return strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// mapMemlock sums the memory the kernel charges for the BPF maps that pid
// holds open (the memlock line of each map's fdinfo), counting each map
// once.
func mapMemlock(pid int) (int64, error) {
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	seen := map[string]bool{}
	var total int64
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil || !strings.Contains(string(data), "map_type:") {
			continue
		}
		var id string
		var mem int64
		for line := range strings.Lines(string(data)) {
			k, val, _ := strings.Cut(strings.TrimSpace(line), ":")
			switch k {
			case "map_id":
				id = strings.TrimSpace(val)
			case "memlock":
				mem, _ = strconv.ParseInt(strings.TrimSpace(val), 10, 64)
			}
		}
		if !seen[id] {
			seen[id] = true
			total += mem
		}
	}
	return total, nil
}
