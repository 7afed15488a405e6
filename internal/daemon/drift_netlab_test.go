package daemon_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/vipd/vipd/dataplane/iptables"
	"github.com/vipd/vipd/internal/daemon"
	"github.com/vipd/vipd/internal/testkit/netlab"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vishvananda/netlink"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// driftCheckPeriod is the --drift-check-period of TestDriftLoopRepairs.
const driftCheckPeriod = 500 * time.Millisecond

// TestDriftLoopRepairs runs vipd, for each real dataplane, in a lab node
// with a short drift check period, programs a service and checks TCP
// traffic to it; then breaks the kernel side as another tool would (the
// nat PREROUTING chain flushed; the tc program detached from the client
// pod's veth), and checks that traffic comes back on its own, that
// vipd_dataplane_drift_repairs_total counted the repair, and that vipd
// logged the drift and its repair.
func TestDriftLoopRepairs(t *testing.T) {
	netlab.RequireRoot(t)
	for _, dp := range []string{daemon.DataplaneIPTables, daemon.DataplaneEBPF} {
		t.Run(dp, func(t *testing.T) { testDriftLoopRepairs(t, dp) })
	}
}

func testDriftLoopRepairs(t *testing.T, dp string) {
	lab := netlab.New(t, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: []string{"client", "be1"}}}})
	node := lab.Node(1)
	cl, be1 := node.Pod("client"), node.Pod("be1")
	if _, err := be1.StartEcho(be1.PodName(), 8080); err != nil {
		t.Fatal(err)
	}
	cfg := config(t)
	cfg.Dataplane = dp
	cfg.NetNS = node.Path()
	cfg.DriftCheckPeriod = driftCheckPeriod
	cfg.MetricsAddr = freeAddr(t, "tcp", "127.0.0.1")
	what := "hook"
	var breakIt func()
	switch dp {
	case daemon.DataplaneIPTables:
		// The flush must hit the tables vipd programs.
		cfg.IPTablesMode = iptables.ModeNFT
		breakIt = func() {
			if out, err := node.Exec(ctxT(t), "iptables-nft", "-t", "nat", "-F", "PREROUTING"); err != nil {
				t.Fatalf("flush nat PREROUTING: %v\n%s", err, out)
			}
		}
	case daemon.DataplaneEBPF:
		labDataplane(t, &cfg, dp) // a test cgroup and a private bpffs
		what = "tc-link"
		breakIt = func() {
			var ifindex int
			if err := node.Do(func() error {
				l, err := netlink.LinkByName(cl.HostVeth())
				if err == nil {
					ifindex = l.Attrs().Index
				}
				return err
			}); err != nil {
				t.Fatal(err)
			}
			pin := filepath.Join(cfg.EBPF.BPFFS, "links", fmt.Sprintf("tcx_%d_ingress", ifindex))
			l, err := link.LoadPinnedLink(pin, nil)
			if err != nil {
				t.Fatalf("load the pinned tcx link: %v", err)
			}
			defer l.Close()
			if err := l.Detach(); err != nil {
				t.Fatalf("detach the tcx link: %v", err)
			}
		}
	}
	r := start(t, cfg, healthpb.HealthCheckResponse_SERVING)

	vip := netip.MustParseAddrPort("198.19.0.10:80")
	if _, err := r.local.UpsertService(ctxT(t), &vipdv1.Service{Name: "web", Vips: []string{vip.Addr().String()},
		Ports:    []*vipdv1.Port{{Port: uint32(vip.Port()), TargetPort: 8080}},
		Backends: []*vipdv1.Backend{{Ip: be1.IPv4().String()}}}, 0); err != nil {
		t.Fatal(err)
	}
	request := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		rep, err := cl.Request(ctx, "tcp", vip.String())
		if err == nil && rep.Backend != "be1" {
			err = fmt.Errorf("answered by %s, want be1", rep.Backend)
		}
		return err
	}
	if err := request(); err != nil {
		t.Fatalf("TCP to %v once programmed: %v", vip, err)
	}
	before := driftRepairs(t, cfg.MetricsAddr, dp, what)

	breakIt()
	// The break is seen: traffic stops until the drift check repairs it.
	// (The first check may repair before this request; then there is
	// nothing to see here, which is fine.)
	broken := request() != nil
	deadline := time.Now().Add(20 * driftCheckPeriod)
	for err := request(); err != nil; err = request() {
		if time.Now().After(deadline) {
			t.Fatalf("TCP to %v still fails 20 drift check periods after the break: %v\nlog:\n%s", vip, err, r.log)
		}
		time.Sleep(driftCheckPeriod / 5)
	}
	t.Logf("traffic broken right after the break: %v", broken)
	deadline = time.Now().Add(20 * driftCheckPeriod)
	for driftRepairs(t, cfg.MetricsAddr, dp, what) <= before {
		if time.Now().After(deadline) {
			t.Fatalf("vipd_dataplane_drift_repairs_total{dataplane=%q,what=%q} still %v after the repair\nlog:\n%s", dp, what, before, r.log)
		}
		time.Sleep(driftCheckPeriod / 5)
	}
	log := r.log.String()
	for _, want := range []string{"[WARN]  vipd.reconcile: dataplane drift; repairing with a full sync: what=" + what + " detail=",
		`[INFO]  vipd.reconcile: dataplane drift repaired with a full sync: what=["` + what + `"]`} {
		if !strings.Contains(log, want) {
			t.Errorf("the log does not say %q:\n%s", want, log)
		}
	}
}

// metricsText fetches vipd's /metrics from addr.
func metricsText(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// driftRepairs reads vipd_dataplane_drift_repairs_total{dataplane,what}
// from vipd's /metrics.
func driftRepairs(t *testing.T, addr, dp, what string) float64 {
	t.Helper()
	body := metricsText(t, addr)
	prefix := fmt.Sprintf("vipd_dataplane_drift_repairs_total{dataplane=%q,what=%q} ", dp, what)
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric line %q: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("/metrics has no %s line:\n%s", prefix, body)
	return 0
}
