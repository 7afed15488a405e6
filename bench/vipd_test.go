package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/netlab"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if vipdBin != "" {
		os.RemoveAll(filepath.Dir(vipdBin))
	}
	os.Exit(code)
}

var (
	buildOnce sync.Once
	vipdBin   string
	buildErr  error
)

// vipdBinary builds cmd/vipd once per test binary.
func vipdBinary(tb testing.TB) string {
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "vipd-bench-bin")
		if err != nil {
			buildErr = err
			return
		}
		vipdBin = filepath.Join(dir, "vipd")
		out, err := exec.Command("go", "build", "-o", vipdBin, "github.com/vipd/vipd/cmd/vipd").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("build vipd: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		tb.Fatal(buildErr)
	}
	return vipdBin
}

// startVipd runs vipd against node's namespace and returns a client for it.
func startVipd(tb testing.TB, node *netlab.Node, args ...string) *client.Client {
	dir := tb.TempDir()
	sock := filepath.Join(dir, "vipd.sock")
	cmd := exec.Command(vipdBinary(tb), append([]string{"run", "--netns", node.Path(), "--socket", sock,
		"--state-dir", filepath.Join(dir, "state"), "--log-level", "warn"}, args...)...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		exec.Command(vipdBin, "cleanup", "--netns", node.Path()).Run()
	})
	c, err := client.New("unix://"+sock, client.WithTimeout(5*time.Minute))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := c.Status(context.Background()); err == nil {
			return c
		}
		if time.Now().After(deadline) {
			tb.Fatal("vipd did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// services returns n services with 5 backends each, kube-proxy-benchmark style.
func services(n int) []*vipdv1.Service {
	svcs := make([]*vipdv1.Service, n)
	for i := range n {
		svc := &vipdv1.Service{
			Name:  fmt.Sprintf("bench/s%06d", i),
			Vips:  []string{fmt.Sprintf("198.19.%d.%d", i/250, i%250+1)},
			Ports: []*vipdv1.Port{{Port: 80, TargetPort: 8080}},
		}
		for k := range 5 {
			svc.Backends = append(svc.Backends, &vipdv1.Backend{Ip: fmt.Sprintf("198.18.%d.%d", 100+k, i%250+1)})
		}
		svcs[i] = svc
	}
	return svcs
}

// BenchmarkUpsertService measures one UpsertService round trip, which
// returns only once the kernel has the change, with n other services (5
// backends each) present, per dataplane and iptables mode.
func BenchmarkUpsertService(b *testing.B) {
	for _, dp := range [][]string{
		{"--dataplane", "iptables", "--iptables-mode", "nft"},
		{"--dataplane", "iptables", "--iptables-mode", "legacy"},
	} {
		for _, n := range []int{1, 1000, 10000} {
			b.Run(fmt.Sprintf("%s-%s/present=%d", dp[1], dp[3], n), func(b *testing.B) {
				lab := netlab.New(b, netlab.Spec{})
				c := startVipd(b, lab.Node(1), dp...)
				ctx := context.Background()
				start := time.Now()
				if _, err := c.SyncServices(ctx, "bench", services(n)); err != nil {
					b.Fatal(err)
				}
				initial := time.Since(start)
				b.ResetTimer()
				for i := range b.N {
					svc := &vipdv1.Service{
						Name: "bench/changing", Vips: []string{"198.19.250.1"},
						Ports:    []*vipdv1.Port{{Port: 80}},
						Backends: []*vipdv1.Backend{{Ip: fmt.Sprintf("198.18.200.%d", i%200+1)}},
					}
					if _, err := c.UpsertService(ctx, svc, 0); err != nil {
						b.Fatal(err)
					}
				}
				// After the loop: ResetTimer drops metrics reported before it.
				b.ReportMetric(initial.Seconds(), "initial-sync-s")
			})
		}
	}
}
