package daemon_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/cli"
	"github.com/vipd/vipd/internal/daemon"
	"github.com/vipd/vipd/internal/testkit/netlab"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// nodeCheckPeriod is the --drift-check-period of these tests.
const nodeCheckPeriod = 100 * time.Millisecond

// iptablesIn is a config for vipd with the iptables dataplane in node's
// namespace.
func iptablesIn(t *testing.T, node *netlab.Node) daemon.Config {
	cfg := config(t)
	cfg.Dataplane = daemon.DataplaneIPTables
	cfg.NetNS = node.Path()
	cfg.DriftCheckPeriod = nodeCheckPeriod
	return cfg
}

// warningsOf returns the checks of the warnings GetStatus reports, and
// the status.
func warningsOf(t *testing.T, r *running) (map[string]*vipdv1.StatusWarning, *vipdv1.GetStatusResponse) {
	t.Helper()
	st, err := r.local.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*vipdv1.StatusWarning{}
	for _, w := range st.GetWarnings() {
		out[w.GetCheck()] = w
	}
	return out, st
}

// waitWarnings polls GetStatus until cond holds for its warnings, for at
// most 20 check periods.
func waitWarnings(t *testing.T, r *running, what string, cond func(map[string]*vipdv1.StatusWarning) bool) map[string]*vipdv1.StatusWarning {
	t.Helper()
	deadline := time.Now().Add(20 * nodeCheckPeriod)
	for {
		ws, _ := warningsOf(t, r)
		if cond(ws) {
			return ws
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: warnings %v after 20 check periods\nlog:\n%s", what, ws, r.log)
		}
		time.Sleep(nodeCheckPeriod / 4)
	}
}

// vipctlStatus runs "vipctl status" against r.
func vipctlStatus(t *testing.T, r *running) string {
	t.Helper()
	var out, errb bytes.Buffer
	if code := cli.New(cli.Streams{In: strings.NewReader(""), Out: &out, Err: &errb}).Run(context.Background(),
		[]string{"--socket", r.cfg.Socket, "status"}); code != cli.ExitOK {
		t.Fatalf("vipctl status: exit %d\n%s%s", code, out.String(), errb.String())
	}
	return out.String()
}

// TestNodePrerequisiteWarnings runs vipd with the iptables dataplane in a
// lab node and breaks its prerequisites one by one: IPv4 forwarding off, an
// IPv6 VIP with IPv6 forwarding off, a VIP without a usable route. Each is
// a GetStatus warning naming the sysctl or VIP and the command to run, is
// shown by vipctl status, is logged once, and clears within a check period
// of being fixed. vipd stays ready throughout and changes no sysctl.
func TestNodePrerequisiteWarnings(t *testing.T) {
	node := netlab.New(t, netlab.Spec{}).Node(1)
	if err := node.SetSysctl("net.ipv4.ip_forward", "0"); err != nil {
		t.Fatal(err)
	}
	// The flow sysctls as an operator sets them (vipd does not without
	// --set-sysctls; TestFlowSysctlWarnings checks their warnings).
	for _, key := range []string{"net.netfilter.nf_conntrack_acct", "net.netfilter.nf_conntrack_timestamp", "net.netfilter.nf_conntrack_events"} {
		if err := node.SetSysctl(key, "1"); err != nil {
			t.Fatal(err)
		}
	}
	r := start(t, iptablesIn(t, node), healthpb.HealthCheckResponse_SERVING)

	ws, st := warningsOf(t, r)
	w := ws["sysctl/net.ipv4.ip_forward"]
	if w == nil || len(ws) != 1 || !st.GetReady() {
		t.Fatalf("status with ip_forward off: ready %v, warnings %v", st.GetReady(), ws)
	}
	if want := "ip netns exec " + node.Name() + " sysctl -w net.ipv4.ip_forward=1"; !strings.HasPrefix(w.GetRemedy(), want) ||
		!strings.HasPrefix(w.GetMessage(), "net.ipv4.ip_forward is 0, want 1") || w.GetSince() == nil {
		t.Errorf("ip_forward warning %v", w)
	}
	out := vipctlStatus(t, r)
	if !strings.Contains(out, "\nWarnings:\n  sysctl/net.ipv4.ip_forward: net.ipv4.ip_forward is 0, want 1") ||
		!strings.Contains(out, "\n    fix: ip netns exec "+node.Name()+" sysctl -w net.ipv4.ip_forward=1") ||
		!strings.Contains(out, "Ready:               true\n") {
		t.Errorf("vipctl status:\n%s", out)
	}
	if v, _ := node.Sysctl("net.ipv4.ip_forward"); v != "0" {
		t.Errorf("vipd set ip_forward to %s without --set-sysctls", v)
	}

	if err := node.SetSysctl("net.ipv4.ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	waitWarnings(t, r, "ip_forward on again", func(ws map[string]*vipdv1.StatusWarning) bool { return len(ws) == 0 })
	if out := vipctlStatus(t, r); strings.Contains(out, "Warnings:") {
		t.Errorf("vipctl status without warnings:\n%s", out)
	}
	log := r.log.String()
	if n := strings.Count(log, "[WARN]  vipd.nodecheck: node prerequisite unmet: net.ipv4.ip_forward is 0"); n != 1 {
		t.Errorf("the ip_forward warning was logged %d times, want once:\n%s", n, log)
	}
	if !strings.Contains(log, "[INFO]  vipd.nodecheck: node prerequisite met again: check=sysctl/net.ipv4.ip_forward") {
		t.Errorf("no info line when ip_forward was fixed:\n%s", log)
	}

	// An IPv6 VIP with IPv6 forwarding off; an IPv4 VIP whose route is
	// unreachable.
	if err := node.SetSysctl("net.ipv6.conf.all.forwarding", "0"); err != nil {
		t.Fatal(err)
	}
	if _, err := node.Exec(ctxT(t), "ip", "route", "add", "unreachable", "198.19.7.0/24"); err != nil {
		t.Fatal(err)
	}
	for _, svc := range []*vipdv1.Service{
		{Name: "v6", Vips: []string{"fd00:198:ffff::10"}, Ports: []*vipdv1.Port{{Port: 80, Protocol: vipdv1.Protocol_PROTOCOL_TCP}}},
		{Name: "unrouted", Vips: []string{"198.19.7.10"}, Ports: []*vipdv1.Port{{Port: 80, Protocol: vipdv1.Protocol_PROTOCOL_TCP}}},
	} {
		if _, err := r.local.UpsertService(ctxT(t), svc, 0); err != nil {
			t.Fatal(err)
		}
	}
	ws = waitWarnings(t, r, "after the IPv6 and unrouted VIPs", func(ws map[string]*vipdv1.StatusWarning) bool { return len(ws) == 2 })
	if w := ws["sysctl/net.ipv6.conf.all.forwarding"]; w == nil || !strings.Contains(w.GetRemedy(), "sysctl -w net.ipv6.conf.all.forwarding=1") {
		t.Errorf("IPv6 forwarding warning: %v", ws)
	}
	if w := ws["route/ipv4"]; w == nil || !strings.Contains(w.GetMessage(), "198.19.7.10 (unreachable route)") ||
		!strings.Contains(w.GetRemedy(), "ip route add 198.19.7.10/32 dev") {
		t.Errorf("route warning: %v", ws)
	}
	if _, err := node.Exec(ctxT(t), "ip", "route", "del", "198.19.7.0/24"); err != nil {
		t.Fatal(err)
	}
	waitWarnings(t, r, "after removing the unreachable route", func(ws map[string]*vipdv1.StatusWarning) bool {
		return len(ws) == 1 && ws["sysctl/net.ipv6.conf.all.forwarding"] != nil
	})
}

// TestSetSysctls checks that with --set-sysctls vipd turns forwarding on
// in the namespace it programs, logs it, and reports nothing; and that it
// sets it again when someone turns it off.
func TestSetSysctls(t *testing.T) {
	node := netlab.New(t, netlab.Spec{}).Node(1)
	if err := node.SetSysctl("net.ipv4.ip_forward", "0"); err != nil {
		t.Fatal(err)
	}
	cfg := iptablesIn(t, node)
	cfg.SetSysctls = true
	r := start(t, cfg, healthpb.HealthCheckResponse_SERVING)
	if v, err := node.Sysctl("net.ipv4.ip_forward"); err != nil || v != "1" {
		t.Fatalf("ip_forward %q (%v) after a start with --set-sysctls", v, err)
	}
	if ws, _ := warningsOf(t, r); len(ws) != 0 {
		t.Errorf("warnings with --set-sysctls: %v", ws)
	}
	if !strings.Contains(r.log.String(), "[INFO]  vipd.nodecheck: --set-sysctls: set sysctl: sysctl=net.ipv4.ip_forward was=0 value=1") {
		t.Errorf("no log line for the sysctl set:\n%s", r.log)
	}
	if err := node.SetSysctl("net.ipv4.ip_forward", "0"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * nodeCheckPeriod)
	for v, _ := node.Sysctl("net.ipv4.ip_forward"); v != "1"; v, _ = node.Sysctl("net.ipv4.ip_forward") {
		if time.Now().After(deadline) {
			t.Fatalf("ip_forward still %s 20 check periods after it was turned off", v)
		}
		time.Sleep(nodeCheckPeriod / 4)
	}
}
