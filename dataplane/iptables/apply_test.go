package iptables_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/iptables"
	"github.com/vipd/vipd/internal/testkit/netlab"
)

// These tests program a netlab node for real; the conformance suite covers
// the ClusterIP contract in depth. Here: the applier's own promises.

// clientLab is a lab node with the pods client and web1, an echo server
// on web1's port 7000, and a dataplane that programs the node.
type clientLab struct {
	lab          *netlab.Lab
	node         *netlab.Node
	client, web1 *netlab.Pod
	dp           *iptables.Dataplane
}

// newClientLab builds a clientLab with a dataplane in mode that logs to
// log; the dataplane is closed when the test ends, before the lab.
func newClientLab(ctx context.Context, t *testing.T, mode iptables.Mode, log hclog.Logger) *clientLab {
	t.Helper()
	lab := netlab.New(t, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: []string{"client", "web1"}}}})
	x := &clientLab{lab: lab, node: lab.Node(1), client: lab.Pod("client"), web1: lab.Pod("web1")}
	if _, err := x.web1.StartEcho("web1", 7000); err != nil {
		t.Fatal(err)
	}
	dp, err := iptables.New(ctx, log, iptables.Config{NetNS: x.node.Path(), Mode: mode})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	x.dp = dp
	return x
}

func liveService(name string, vip string, port uint16, backends ...netip.Addr) *dataplane.Service {
	svc := &dataplane.Service{
		Name: name, Owner: "default", Generation: 1,
		VIPs:          []netip.Addr{netip.MustParseAddr(vip)},
		Ports:         []dataplane.Port{{Protocol: dataplane.TCP, Port: port, TargetPort: 7000}},
		TrafficPolicy: dataplane.TrafficPolicyCluster, LoadBalancing: dataplane.LoadBalancingRandom,
	}
	for _, b := range backends {
		svc.Backends = append(svc.Backends, dataplane.Backend{IP: b, State: dataplane.BackendReady, Weight: 1})
	}
	return svc
}

func liveState(changed []string, svcs ...*dataplane.Service) *dataplane.State {
	s := &dataplane.State{Services: map[string]*dataplane.Service{}, Changed: changed}
	for _, svc := range svcs {
		s.Services[svc.Name] = svc
	}
	return s
}

func saveRules(t *testing.T, node *netlab.Node, mode iptables.Mode) string {
	t.Helper()
	var all string
	for _, tool := range []string{"iptables-", "ip6tables-"} {
		out, err := node.Exec(context.Background(), tool+string(mode)+"-save")
		if err != nil {
			t.Fatal(err)
		}
		all += out
	}
	return all
}

func TestApplyForwardsAndCleansUp(t *testing.T) {
	for _, mode := range []iptables.Mode{iptables.ModeNFT, iptables.ModeLegacy} {
		t.Run(string(mode), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			x := newClientLab(ctx, t, mode, hclog.NewNullLogger())
			node, client, web1, dp := x.node, x.client, x.web1, x.dp

			web := liveService("web", "198.19.0.10", 80, web1.IPv4())
			empty := liveService("empty", "198.19.0.11", 80)
			// Every rule shape, so that the restart check below covers them all.
			sticky := liveService("sticky", "198.19.0.12", 53, web1.IPv4(), client.IPv4(), netip.MustParseAddr("198.18.9.9"))
			sticky.Ports[0].Protocol = dataplane.UDP
			sticky.Affinity = dataplane.SessionAffinity{ClientIP: true, Timeout: 30 * time.Second}
			for i := range sticky.Backends {
				sticky.Backends[i].Weight = uint16(i + 1)
			}
			v6 := liveService("v6", "fd00:198:ff::10", 80, web1.IPv6())
			empty6 := liveService("empty6", "fd00:198:ff::11", 80)
			all := []*dataplane.Service{web, empty, sticky, v6, empty6}
			if err := dp.Apply(ctx, liveState(nil, all...)); err != nil {
				t.Fatal(err)
			}
			reply, err := client.Request(ctx, "tcp", "198.19.0.10:80")
			if err != nil || reply.Backend != "web1" || reply.Peer.Addr() != client.IPv4() {
				t.Fatalf("request through the VIP: %+v %v", reply, err)
			}
			reply, err = client.Request(ctx, "tcp", "[fd00:198:ff::10]:80")
			if err != nil || reply.Backend != "web1" || reply.Peer.Addr() != client.IPv6() {
				t.Fatalf("request through the IPv6 VIP: %+v %v", reply, err)
			}
			for _, vip := range []string{"198.19.0.11:80", "[fd00:198:ff::11]:80"} {
				if _, err := client.Request(ctx, "tcp", vip); !errors.Is(err, syscall.ECONNREFUSED) {
					t.Fatalf("%s, a service without backends: %v, want ECONNREFUSED", vip, err)
				}
			}

			// A fresh dataplane over the same kernel (a restarted vipd) finds
			// everything in place and rewrites nothing.
			before := saveRules(t, node, mode)
			again, err := iptables.New(ctx, hclog.NewNullLogger(), iptables.Config{NetNS: node.Path(), Mode: iptables.ModeAuto})
			if err != nil {
				t.Fatal(err)
			}
			defer again.Close()
			if again.Mode() != mode {
				t.Fatalf("auto picked %s, but the vipd chains are in %s", again.Mode(), mode)
			}
			if err := again.Apply(ctx, liveState(nil, all...)); err != nil {
				t.Fatal(err)
			}
			if st := again.LastSync(); !st.Full || st.ChainsRewritten != 0 || st.ChainsDeleted != 0 {
				t.Errorf("restart sync rewrote %d and deleted %d chains; want a full diff that finds nothing to do", st.ChainsRewritten, st.ChainsDeleted)
			}
			if after := saveRules(t, node, mode); stripCounters(after) != stripCounters(before) {
				t.Fatalf("re-applying the same state changed the rules:\nbefore:\n%s\nafter:\n%s", before, after)
			}

			// Cleanup removes every vipd rule and chain, and nothing else.
			if err := iptables.Cleanup(ctx, hclog.NewNullLogger(), node.Path(), iptables.ModeAuto); err != nil {
				t.Fatal(err)
			}
			if left := saveRules(t, node, mode); strings.Contains(left, "VIPD") {
				t.Fatalf("rules left after cleanup:\n%s", left)
			}
		})
	}
}

// TestFailedApplyKeepsOldState makes the IPv6 restore fail with a foreign
// rule that references a vipd chain, so that deleting it is refused, while
// the IPv4 part of the same change has already been applied: the IPv4 part
// must be rolled back.
func TestFailedApplyKeepsOldState(t *testing.T) {
	lab := netlab.New(t, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: []string{"client", "web1", "web2"}}}})
	node, client := lab.Node(1), lab.Pod("client")
	for _, p := range []string{"web1", "web2"} {
		if _, err := lab.Pod(p).StartEcho(p, 7000); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dp, err := iptables.New(ctx, hclog.NewNullLogger(), iptables.Config{NetNS: node.Path(), Mode: iptables.ModeNFT})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	web := liveService("web", "198.19.0.10", 80, lab.Pod("web1").IPv4())
	other := liveService("other", "fd00:198:ff::12", 80, lab.Pod("web2").IPv6())
	if err := dp.Apply(ctx, liveState(nil, web, other)); err != nil {
		t.Fatal(err)
	}
	// Pin the "other" service chain with a foreign rule: removing the service must now fail.
	svcChain := ""
	for line := range strings.Lines(saveRules(t, node, iptables.ModeNFT)) {
		if strings.Contains(line, "fd00:198:ff::12/128") && strings.Contains(line, "-j VIPD-SVC-") {
			svcChain = strings.TrimSpace(line[strings.Index(line, "-j ")+3:])
		}
	}
	if _, err := node.Exec(ctx, "ip6tables-nft", "-t", "nat", "-N", "FOREIGN"); err != nil {
		t.Fatal(err)
	}
	if _, err := node.Exec(ctx, "ip6tables-nft", "-t", "nat", "-A", "FOREIGN", "-j", svcChain); err != nil {
		t.Fatal(err)
	}
	web2 := liveService("web", "198.19.0.10", 80, lab.Pod("web2").IPv4())
	web2.Generation = 2
	err = dp.Apply(ctx, liveState([]string{"other", "web"}, web2))
	if err == nil {
		t.Fatal("apply succeeded although a foreign rule pins a vipd chain")
	}
	// The old state stays in force in both families: web still goes to web1.
	for vip, want := range map[string]string{"198.19.0.10:80": "web1", "[fd00:198:ff::12]:80": "web2"} {
		if r, err := client.Request(ctx, "tcp", vip); err != nil || r.Backend != want {
			t.Fatalf("%s after a failed apply: %+v %v, want %s", vip, r, err, want)
		}
	}
	// Once the conflict is gone, the next apply (a full one) succeeds.
	node.Exec(ctx, "ip6tables-nft", "-t", "nat", "-F", "FOREIGN")
	if err := dp.Apply(ctx, liveState([]string{"other", "web"}, web2)); err != nil {
		t.Fatal(err)
	}
	if st := dp.LastSync(); !st.Full {
		t.Fatalf("the apply after a failure was not a full sync")
	}
	if r, err := client.Request(ctx, "tcp", "198.19.0.10:80"); err != nil || r.Backend != "web2" {
		t.Fatalf("after recovery: %+v %v", r, err)
	}
}

// TestFailedApplyUndoesEarlierTables makes the nat restore of an Apply
// fail after the filter restore before it has been committed: a service
// loses its last backend, so the filter table gets its REJECT first, and
// a foreign rule pins the service's SVC chain, so deleting it in nat is
// refused. The filter restore must be undone, so that the service keeps
// working as before: its DNAT and no REJECT.
func TestFailedApplyUndoesEarlierTables(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	x := newClientLab(ctx, t, iptables.ModeNFT, hclog.NewNullLogger())
	node, client, dp := x.node, x.client, x.dp
	if err := dp.Apply(ctx, liveState(nil, liveService("web", "198.19.0.10", 80, x.web1.IPv4()))); err != nil {
		t.Fatal(err)
	}
	svcChain := ""
	for line := range strings.Lines(saveRules(t, node, iptables.ModeNFT)) {
		if strings.Contains(line, "198.19.0.10/32") && strings.Contains(line, "-j VIPD-SVC-") {
			svcChain = strings.TrimSpace(line[strings.Index(line, "-j ")+3:])
		}
	}
	for _, args := range [][]string{{"-t", "nat", "-N", "FOREIGN"}, {"-t", "nat", "-A", "FOREIGN", "-j", svcChain}} {
		if out, err := node.Exec(ctx, "iptables-nft", args...); err != nil {
			t.Fatalf("iptables %v: %v\n%s", args, err, out)
		}
	}
	gone := liveService("web", "198.19.0.10", 80)
	gone.Generation = 2
	err := dp.Apply(ctx, liveState([]string{"web"}, gone))
	if err == nil || !strings.Contains(err.Error(), "apply ipv4 nat rules") {
		t.Fatalf("apply: %v, want the ipv4 nat restore to fail", err)
	}
	if r, err := client.Request(ctx, "tcp", "198.19.0.10:80"); err != nil || r.Backend != "web1" {
		t.Fatalf("after the failed apply: %+v %v, want web1", r, err)
	}
	if rules := saveRules(t, node, iptables.ModeNFT); strings.Contains(rules, "-j REJECT") {
		t.Fatalf("the filter restore was not undone:\n%s", rules)
	}
	// Once the conflict is gone, the next apply (a full one) succeeds.
	if out, err := node.Exec(ctx, "iptables-nft", "-t", "nat", "-F", "FOREIGN"); err != nil {
		t.Fatalf("flush FOREIGN: %v\n%s", err, out)
	}
	if err := dp.Apply(ctx, liveState([]string{"web"}, gone)); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Request(ctx, "tcp", "198.19.0.10:80"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("after recovery: %v, want ECONNREFUSED", err)
	}
}

func stripCounters(save string) string {
	var b strings.Builder
	for line := range strings.Lines(save) {
		if strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, ":") {
			line = line[:strings.LastIndex(line, " ")] + "\n"
		}
		b.WriteString(line)
	}
	return b.String()
}

// TestBulkApplyInFreshNode loads more chains at once than bulkChains, the
// size from which an nft-mode restore first lists the table's chains, into
// a node whose nat table does not exist yet (a fresh node, or one after `nft
// flush ruleset`): the hooks must be installed with everything else.
func TestBulkApplyInFreshNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	x := newClientLab(ctx, t, iptables.ModeNFT, hclog.NewNullLogger())
	client, web1, dp := x.client, x.web1, x.dp
	svcs := []*dataplane.Service{liveService("web", "198.19.0.10", 80, web1.IPv4())}
	for i := range 1200 {
		vip := netip.AddrFrom4([4]byte{198, 19, byte(1 + i/250), byte(1 + i%250)})
		svcs = append(svcs, liveService(fmt.Sprintf("filler-%d", i), vip.String(), 80, netip.MustParseAddr("198.18.9.9")))
	}
	if err := dp.Apply(ctx, liveState(nil, svcs...)); err != nil {
		t.Fatal(err)
	}
	if st := dp.LastSync(); st.ChainsRewritten < 1000 {
		t.Fatalf("the apply rewrote %d chains; the test needs a bulk load", st.ChainsRewritten)
	}
	if r, err := client.Request(ctx, "tcp", "198.19.0.10:80"); err != nil || r.Backend != "web1" {
		t.Fatalf("request through the VIP: %+v %v", r, err)
	}
	if drift, err := dp.DetectDrift(ctx); err != nil || drift != nil {
		t.Fatalf("drift after a bulk apply: %v %v", drift, err)
	}
}
