package kubeproxy

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testkit/netlab"
)

// restore loads rules into node's namespace and fails the test on error.
func restore(t *testing.T, node *netlab.Node, rules []byte, noflush bool) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	d, err := Restore(ctx, node.Path(), rules, noflush)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func natChains(t *testing.T, node *netlab.Node) []string {
	t.Helper()
	out, err := node.Exec(context.Background(), "iptables-nft-save", "-t", "nat")
	if err != nil {
		t.Fatal(err)
	}
	var chains []string
	for _, l := range strings.Split(out, "\n") {
		if name, ok := strings.CutPrefix(l, ":"); ok {
			chains = append(chains, strings.Fields(name)[0])
		}
	}
	return chains
}

// TestRestoreRefusesRootNamespace checks that Restore never runs in the
// test process's own namespace. The payload is empty, so that even a
// broken check would change nothing there.
func TestRestoreRefusesRootNamespace(t *testing.T) {
	for _, p := range []string{"", "/proc/self/ns/net", "/proc/1/ns/net"} {
		if _, err := Restore(context.Background(), p, nil, true); err == nil {
			t.Fatalf("Restore into %q: no error", p)
		}
	}
}

// TestPartialAfterFull loads Full for 3 services × 2 endpoints, then the
// partial sync of an endpoint change, and checks the chains that result.
func TestPartialAfterFull(t *testing.T) {
	lab := netlab.New(t, netlab.Spec{})
	node := lab.Node(1)
	svcs := fillers(3, 2)
	restore(t, node, Full(svcs, clusterCIDR), false)

	old := svcs[1].Endpoints
	added := netip.MustParseAddrPort("198.18.201.1:8080")
	svcs[1].Endpoints = []netip.AddrPort{old[0], added}
	restore(t, node, Partial(svcs, 1, old, clusterCIDR), true)
	chains := natChains(t, node)
	if slices.Contains(chains, svcs[1].SEPChain(old[1])) {
		t.Errorf("stale %s still exists", svcs[1].SEPChain(old[1]))
	}
	if !slices.Contains(chains, svcs[1].SEPChain(added)) {
		t.Errorf("new %s missing", svcs[1].SEPChain(added))
	}
	// 4 top-level chains + 3 × (SVC + 2 SEP), and nat's built-in chains.
	if n := len(chains); n != 4+9+4 {
		t.Errorf("nat has %d chains, want 17: %v", n, chains)
	}

	// A malformed payload fails with the failing line in the error.
	_, err := Restore(context.Background(), node.Path(), []byte("*nat\n-A NO-SUCH-CHAIN -j RETURN\nCOMMIT\n"), true)
	if err == nil || !strings.Contains(err.Error(), "> 2: -A NO-SUCH-CHAIN") {
		t.Errorf("bad payload: error %v, want one that shows line 2", err)
	}
}

// TestTraffic sends real connections through a kube-proxy ruleset in a
// node namespace: 50 filler services, a service without endpoints, and
// last the tested VIP with two echo pods behind it.
func TestTraffic(t *testing.T) {
	lab := netlab.New(t, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: []string{"client", "be1", "be2"}}}})
	node := lab.Node(1)
	client := node.Pod("client")
	var eps []netip.AddrPort
	for _, name := range []string{"be1", "be2"} {
		p := node.Pod(name)
		if _, err := p.StartEcho(name, 8080); err != nil {
			t.Fatal(err)
		}
		eps = append(eps, netip.AddrPortFrom(p.IPv4(), 8080))
	}
	svcs := append(fillers(50, 2),
		Service{Namespace: "test", Name: "empty", PortName: "http", VIP: netip.MustParseAddr("198.19.0.11"), Port: 80, Protocol: "tcp"},
		Service{Namespace: "test", Name: "web", PortName: "http", VIP: netip.MustParseAddr("198.19.0.10"), Port: 80, Protocol: "tcp", Endpoints: eps},
	)
	web := len(svcs) - 1
	restore(t, node, Full(svcs, clusterCIDR), false)

	backends := func(n int) map[string]int {
		t.Helper()
		got := map[string]int{}
		for range n {
			r, err := client.Request(context.Background(), "tcp", "198.19.0.10:80")
			if err != nil {
				t.Fatal(err)
			}
			if r.Peer.Addr() != client.IPv4() {
				t.Fatalf("backend saw the client as %s, want %s (no masquerade inside the cluster CIDR)", r.Peer.Addr(), client.IPv4())
			}
			got[r.Backend]++
		}
		return got
	}
	// With p = 1/2 each, 40 connections all reach one backend with
	// probability 2^-39.
	if got := backends(40); got["be1"] == 0 || got["be2"] == 0 {
		t.Errorf("40 connections reached %v, want both be1 and be2", got)
	}

	t.Run("should be rejected when no endpoints exist", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		start := time.Now()
		_, err := client.Request(ctx, "tcp", "198.19.0.11:80")
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("request to a service without endpoints: %v, want connection refused", err)
		}
		t.Logf("refused after %v", time.Since(start))
	})

	old := svcs[web].Endpoints
	svcs[web].Endpoints = old[1:]
	d := restore(t, node, Partial(svcs, web, old, clusterCIDR), true)
	t.Logf("partial restore with %d services: %v", len(svcs), d)
	if got := backends(20); got["be2"] != 20 {
		t.Errorf("after the partial sync to be2 only, 20 connections reached %v", got)
	}
	if slices.Contains(natChains(t, node), svcs[web].SEPChain(old[0])) {
		t.Errorf("be1's chain %s survived the partial sync", svcs[web].SEPChain(old[0]))
	}
}

// TestNodePortTraffic restores a NodePort service (policy Cluster) behind
// 50 fillers and connects to the node's address at the node port from an
// external host: both endpoints answer, and they see the node's address
// (masqueraded by KUBE-EXT's mark and KUBE-POSTROUTING).
func TestNodePortTraffic(t *testing.T) {
	lab := netlab.New(t, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: []string{"be1", "be2"}}}})
	node := lab.Node(1)
	outside, err := lab.AddExternalHost(context.Background(), "outside")
	if err != nil {
		t.Fatal(err)
	}
	var eps []netip.AddrPort
	for _, name := range []string{"be1", "be2"} {
		p := node.Pod(name)
		if _, err := p.StartEcho(name, 8080); err != nil {
			t.Fatal(err)
		}
		eps = append(eps, netip.AddrPortFrom(p.IPv4(), 8080))
	}
	svcs := append(fillers(50, 2),
		Service{Namespace: "test", Name: "web", PortName: "http", VIP: netip.MustParseAddr("198.19.0.10"), Port: 80, NodePort: 30080, Protocol: "tcp", Endpoints: eps})
	restore(t, node, Full(svcs, clusterCIDR), false)

	dst := netip.AddrPortFrom(node.IPv4(), 30080).String()
	got := map[string]int{}
	for range 40 {
		r, err := outside.Request(context.Background(), "tcp", dst)
		if err != nil {
			t.Fatal(err)
		}
		if r.Peer.Addr() != node.IPv4() {
			t.Fatalf("backend saw the outside client as %s, want the node's %s (masqueraded)", r.Peer.Addr(), node.IPv4())
		}
		got[r.Backend]++
	}
	if got["be1"] == 0 || got["be2"] == 0 {
		t.Errorf("40 connections to the node port reached %v, want both be1 and be2", got)
	}
}
