package daemon_test

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane/fake"
	"github.com/vipd/vipd/internal/daemon"
	"github.com/vipd/vipd/internal/testkit/netlab"
	"github.com/vishvananda/netlink"
)

// TestNodeNetworkReachesTheDataplane runs a node over the recording fake
// in a lab node's namespace and checks that the node's network reaches
// the dataplane: the first apply already carries the Node (the lab node's
// addresses within --nodeport-addresses, its uplink external by
// --external-interfaces), and an address added later in the namespace is
// applied at once, with no service named as changed.
func TestNodeNetworkReachesTheDataplane(t *testing.T) {
	node := netlab.New(t, netlab.Spec{}).Node(1)
	cfg := config(t)
	cfg.NetNS = node.Path()
	cfg.NodePortAddresses = []string{"198.18.0.0/16"}
	cfg.ExternalInterfaces = []string{"eth*"}
	dp := fake.New()
	n, err := daemon.Assemble(ctxT(t), hclog.NewNullLogger(), cfg, daemon.WithDataplane(dp), daemon.WithoutHealthChecks())
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop()
	n.Start(context.Background())
	select {
	case <-n.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("the node is not ready")
	}
	recs := dp.Records()
	first := recs[0].State.Node
	if !slices.Equal(first.NodePortAddresses, []netip.Addr{node.IPv4()}) || !slices.Equal(first.ExternalInterfaces(), []string{node.Uplink()}) {
		t.Fatalf("the first apply's Node: node-port addresses %v, external %v; want [%s] and [%s]",
			first.NodePortAddresses, first.ExternalInterfaces(), node.IPv4(), node.Uplink())
	}

	added := netip.MustParseAddr("198.18.200.1")
	if err := node.Do(func() error {
		l, err := netlink.LinkByName(node.Uplink())
		if err != nil {
			return err
		}
		return netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: added.AsSlice(), Mask: net.CIDRMask(32, 32)}})
	}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		recs = dp.Records()
		last := recs[len(recs)-1]
		if slices.Contains(last.State.Node.NodePortAddresses, added) {
			if last.Err != nil || last.State.Changed == nil || len(last.State.Changed) != 0 {
				t.Errorf("the Node's apply: err %v, changed %#v; want an apply naming no service", last.Err, last.State.Changed)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the added address never reached the dataplane; last Node %+v", last.State.Node)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWithoutNodeNetwork: a node built WithoutNodeNetwork, as the test
// harness's in the machine's own namespace is, hands the dataplane the zero
// Node, even in a namespace that has addresses and a default route.
func TestWithoutNodeNetwork(t *testing.T) {
	node := netlab.New(t, netlab.Spec{}).Node(1)
	cfg := config(t)
	cfg.NetNS = node.Path()
	dp := fake.New()
	n, err := daemon.Assemble(ctxT(t), hclog.NewNullLogger(), cfg, daemon.WithDataplane(dp), daemon.WithoutHealthChecks(), daemon.WithoutNodeNetwork())
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop()
	n.Start(context.Background())
	select {
	case <-n.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("the node is not ready")
	}
	if got := dp.Records()[0].State.Node; len(got.NodePortAddresses) != 0 || len(got.Interfaces) != 0 {
		t.Fatalf("the first apply's Node %+v, want the zero Node", got)
	}
}
