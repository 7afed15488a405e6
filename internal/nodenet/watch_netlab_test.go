package nodenet_test

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/internal/nodenet"
	"github.com/vipd/vipd/internal/testkit/netlab"
	"github.com/vishvananda/netlink"
)

// recorder collects what a Watcher emits.
type recorder struct {
	mu    sync.Mutex
	nodes []dataplane.Node
	at    []time.Time
}

func (r *recorder) emit(_ context.Context, n dataplane.Node) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nodes = append(r.nodes, n)
	r.at = append(r.at, time.Now())
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.nodes)
}

// waitFor waits until the last emitted Node satisfies ok, and returns it
// and when it was emitted.
func (r *recorder) waitFor(t *testing.T, what string, ok func(dataplane.Node) bool) (dataplane.Node, time.Time) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.mu.Lock()
		if n := len(r.nodes); n > 0 && ok(r.nodes[n-1]) {
			defer r.mu.Unlock()
			return r.nodes[n-1], r.at[n-1]
		}
		var last dataplane.Node
		if n := len(r.nodes); n > 0 {
			last = r.nodes[n-1]
		}
		r.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; last Node %+v", what, last)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// watch runs a Watcher of node with cfg until the test ends, starting from
// the zero Node.
func watch(t *testing.T, cfg nodenet.Config) *recorder {
	t.Helper()
	r := &recorder{}
	w := nodenet.New(hclog.NewNullLogger(), cfg, nodenet.WithResync(time.Hour))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(ctx, dataplane.Node{}, r.emit)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

// in runs f with a netlink handle inside node's namespace.
func in(t *testing.T, node *netlab.Node, f func() error) {
	t.Helper()
	if err := node.Do(f); err != nil {
		t.Fatal(err)
	}
}

func iface(n dataplane.Node, name string) (dataplane.Interface, bool) {
	i := slices.IndexFunc(n.Interfaces, func(i dataplane.Interface) bool { return i.Name == name })
	if i < 0 {
		return dataplane.Interface{}, false
	}
	return n.Interfaces[i], true
}

func ipnet(p string) *net.IPNet {
	ip, n, err := net.ParseCIDR(p)
	if err != nil {
		panic(err)
	}
	n.IP = ip
	return n
}

// addVeth creates a veth pair name/name+"p" inside the node, both ends
// there (removed with the lab), and returns name's link.
func addVeth(t *testing.T, node *netlab.Node, name string) netlink.Link {
	t.Helper()
	var l netlink.Link
	in(t, node, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
			return err
		}
		var err error
		l, err = netlink.LinkByName(name)
		return err
	})
	return l
}

// TestReadLabNode: a lab node's Node is its fabric addresses, with its
// uplink (which holds the default routes) external; loopback is left out,
// and --nodeport-addresses keeps only the addresses within it.
func TestReadLabNode(t *testing.T) {
	node := netlab.New(t, netlab.Spec{}).Node(1)
	n, err := nodenet.Read(nodenet.Config{NetNS: node.Path()})
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Addr{node.IPv4(), node.IPv6()}
	if !slices.Equal(n.NodePortAddresses, want) {
		t.Errorf("node-port addresses %v, want %v", n.NodePortAddresses, want)
	}
	if len(n.Interfaces) != 1 || n.Interfaces[0].Name != node.Uplink() || !n.Interfaces[0].External || !slices.Equal(n.Interfaces[0].Addrs, want) {
		t.Errorf("interfaces %+v, want only %s, external, with %v", n.Interfaces, node.Uplink(), want)
	}
	n, err = nodenet.Read(nodenet.Config{NetNS: node.Path(), NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("fd00:198::/32")}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(n.NodePortAddresses, []netip.Addr{node.IPv6()}) || len(n.Interfaces[0].Addrs) != 2 {
		t.Errorf("with --nodeport-addresses fd00:198::/32: %v (interface addresses %v)", n.NodePortAddresses, n.Interfaces[0].Addrs)
	}
}

// TestWatchFollowsTheNode: addresses added and removed, a link brought
// down and up, and the default route moved from one interface to another
// each reach the Watcher's Node, each within well under a second.
func TestWatchFollowsTheNode(t *testing.T) {
	node := netlab.New(t, netlab.Spec{}).Node(1)
	r := watch(t, nodenet.Config{NetNS: node.Path()})
	r.waitFor(t, "the first Node", func(n dataplane.Node) bool { return len(n.NodePortAddresses) == 2 })
	first := r.count()

	ext := addVeth(t, node, "ext1")
	extAddr := netip.MustParseAddr("198.18.200.1")
	var changed time.Time
	in(t, node, func() error {
		if err := netlink.AddrAdd(ext, &netlink.Addr{IPNet: ipnet("198.18.200.1/32")}); err != nil {
			return err
		}
		changed = time.Now()
		return netlink.LinkSetUp(ext)
	})
	n, at := r.waitFor(t, "ext1's address", func(n dataplane.Node) bool { return slices.Contains(n.NodePortAddresses, extAddr) })
	t.Logf("address added and link up → new Node in %v", at.Sub(changed))
	if i, ok := iface(n, "ext1"); !ok || i.External || !slices.Equal(i.Addrs, []netip.Addr{extAddr}) {
		t.Errorf("ext1: %+v (listed %v); want its address, not external", i, ok)
	}
	if r.count() > first+2 {
		t.Errorf("%d Nodes for one burst of changes; want them merged", r.count()-first)
	}

	// The IPv4 default route moves to ext1: both hold one.
	in(t, node, func() error {
		return netlink.RouteReplace(&netlink.Route{Dst: ipnet("0.0.0.0/0"), LinkIndex: ext.Attrs().Index, Scope: netlink.SCOPE_LINK})
	})
	r.waitFor(t, "ext1 external", func(n dataplane.Node) bool {
		i, _ := iface(n, "ext1")
		u, _ := iface(n, node.Uplink())
		return i.External && u.External
	})
	// Without the IPv6 default route, the uplink holds none.
	in(t, node, func() error {
		return netlink.RouteDel(&netlink.Route{Dst: ipnet("::/0"), LinkIndex: 0})
	})
	r.waitFor(t, "the uplink no longer external", func(n dataplane.Node) bool {
		u, ok := iface(n, node.Uplink())
		return ok && !u.External && slices.Equal(n.ExternalInterfaces(), []string{"ext1"})
	})

	// Down: ext1 goes, with its address and its default route.
	in(t, node, func() error { return netlink.LinkSetDown(ext) })
	r.waitFor(t, "ext1 gone while down", func(n dataplane.Node) bool {
		_, ok := iface(n, "ext1")
		return !ok && !slices.Contains(n.NodePortAddresses, extAddr) && len(n.ExternalInterfaces()) == 0
	})
	in(t, node, func() error { return netlink.LinkSetUp(ext) })
	r.waitFor(t, "ext1 back once up", func(n dataplane.Node) bool { return slices.Contains(n.NodePortAddresses, extAddr) })

	// An address removed is gone; an IPv6 one added is there.
	in(t, node, func() error {
		if err := netlink.AddrDel(ext, &netlink.Addr{IPNet: ipnet("198.18.200.1/32")}); err != nil {
			return err
		}
		return netlink.AddrAdd(ext, &netlink.Addr{IPNet: ipnet("fd00:198:200::1/128")})
	})
	r.waitFor(t, "ext1's IPv4 address replaced by an IPv6 one", func(n dataplane.Node) bool {
		return !slices.Contains(n.NodePortAddresses, extAddr) && slices.Contains(n.NodePortAddresses, netip.MustParseAddr("fd00:198:200::1"))
	})

	// Nothing changed for the Node: nothing emitted.
	before := r.count()
	in(t, node, func() error {
		return netlink.RouteAdd(&netlink.Route{Dst: ipnet("198.18.201.0/24"), LinkIndex: ext.Attrs().Index, Scope: netlink.SCOPE_LINK})
	})
	time.Sleep(300 * time.Millisecond)
	if r.count() != before {
		t.Errorf("a route that changes nothing of the Node emitted %d Nodes", r.count()-before)
	}
}

// TestWatchExternalGlobs: with --external-interfaces, the globs decide,
// not the default routes, for interfaces that come later too.
func TestWatchExternalGlobs(t *testing.T) {
	node := netlab.New(t, netlab.Spec{}).Node(1)
	r := watch(t, nodenet.Config{NetNS: node.Path(), ExternalInterfaces: []string{"ext*", "up?"}})
	r.waitFor(t, "the first Node", func(n dataplane.Node) bool { return len(n.NodePortAddresses) == 2 })
	if n, _ := r.waitFor(t, "any", func(dataplane.Node) bool { return true }); len(n.ExternalInterfaces()) != 0 {
		t.Fatalf("external %v: the uplink eth0 holds the default routes but matches no glob", n.ExternalInterfaces())
	}
	ext := addVeth(t, node, "ext7")
	in(t, node, func() error { return netlink.LinkSetUp(ext) })
	// External without an address: listed, so that the dataplane can attach.
	n, _ := r.waitFor(t, "ext7 external", func(n dataplane.Node) bool { return slices.Equal(n.ExternalInterfaces(), []string{"ext7"}) })
	if i, _ := iface(n, "ext7"); len(i.Addrs) != 0 || i.Index != ext.Attrs().Index {
		t.Errorf("ext7: %+v, want index %d and no address", i, ext.Attrs().Index)
	}
	// Its peer ext7p matches too once up.
	in(t, node, func() error {
		p, err := netlink.LinkByName("ext7p")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(p)
	})
	r.waitFor(t, "ext7p external", func(n dataplane.Node) bool {
		return slices.Equal(n.ExternalInterfaces(), []string{"ext7", "ext7p"})
	})
}
