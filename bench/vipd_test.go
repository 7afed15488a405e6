package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/testkit/netlab"
	"github.com/vipd/vipd/internal/testkit/testbin"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// vipdBin is the vipd binary built once by TestMain.
var vipdBin string

func TestMain(m *testing.M) {
	dir, cleanup, err := testbin.Build(false, "./cmd/vipd")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	vipdBin = filepath.Join(dir, "vipd")
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// startVipd runs vipd against node's namespace, with its pins (if any) in a
// private bpffs, and returns the process and a client for it.
func startVipd(tb testing.TB, node *netlab.Node, args ...string) (*exec.Cmd, *client.Client) {
	dir := tb.TempDir()
	sock := filepath.Join(dir, "vipd.sock")
	bpffs := filepath.Join(dir, "bpf")
	cmd := exec.Command(vipdBin, append([]string{"run", "--netns", node.Path(), "--socket", sock,
		"--state-dir", filepath.Join(dir, "state"), "--bpffs", bpffs, "--metrics-addr=", "--log-level", "warn"}, args...)...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		// --bpffs: never the machine's default pin directory.
		exec.Command(vipdBin, "cleanup", "--netns", node.Path(), "--bpffs", bpffs).Run()
		unix.Unmount(bpffs, unix.MNT_DETACH)
	})
	c, err := client.New("unix://"+sock, client.WithTimeout(10*time.Minute))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := c.Status(context.Background()); err == nil {
			return cmd, c
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
				_, c := startVipd(b, lab.Node(1), dp...)
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
