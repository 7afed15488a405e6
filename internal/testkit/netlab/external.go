package netlab

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vipd/vipd/dataplane"
)

// MaxExternalHosts is the largest number of external hosts a lab can have.
const MaxExternalHosts = 100

const (
	// extIfName is the external host's end of its link to the upstream
	// router; extLinkPrefix+name is the router's end.
	extIfName     = "eth0"
	extLinkPrefix = "ext"
	// The router's ends of external hosts' links get interface indexes
	// from extIndexBase up, for the reason given at nodeIndexBase.
	extIndexBase = 2000
)

var (
	// ServiceRangeV4 and ServiceRangeV6 hold the addresses a test may route
	// to a node with Lab.RouteToNode: external IPs and load-balancer IPs
	// (and VIPs, which need no route). netlab never assigns an address in
	// them to any interface.
	ServiceRangeV4 = netip.MustParsePrefix("198.19.0.0/16")
	ServiceRangeV6 = netip.MustParsePrefix("fd00:198:ffff::/48")
)

// The external part of the address plan; doc.go describes it.

func extUpstreamV4(e int) netip.Prefix { return v4Prefix(extThirdOctet, 2*e, 31) }
func extHostV4(e int) netip.Prefix     { return v4Prefix(extThirdOctet, 2*e+1, 31) }
func extUpstreamV6(e int) netip.Prefix { return v6Prefix(extThirdOctet, e, 1, 64) }
func extHostV6(e int) netip.Prefix     { return v6Prefix(extThirdOctet, e, 2, 64) }

// extThirdOctet is 250: external links live in 198.18.250.0/24 and
// fd00:198:fa::/48, beyond any node's pod range (nodes are at most 100).
const extThirdOctet = 250

// ExternalHost is a namespace outside the cluster: a machine behind the
// upstream router, whose traffic reaches a node on the node's uplink (eth0),
// as traffic from another machine does. It has one interface, eth0, with one
// IPv4 and one IPv6 address, and default routes through the upstream router.
// Its methods (Request, Dial, StartClient, Exec, ...) are those of NS; it can
// run echo servers too (StartEcho).
type ExternalHost struct {
	*NS
	lab   *Lab
	name  string
	index int
}

// HostName returns the external host's name, as given to AddExternalHost or
// in Spec.ExternalHosts. (Name, from NS, returns the namespace's name.)
func (h *ExternalHost) HostName() string { return h.name }

// Index returns e, the external host's number (1 for the first one added):
// its addresses are 198.18.250.2e+1 and fd00:198:fa:e::2.
func (h *ExternalHost) Index() int { return h.index }

// IPv4 returns the external host's IPv4 address.
func (h *ExternalHost) IPv4() netip.Addr { return extHostV4(h.index).Addr() }

// IPv6 returns the external host's IPv6 address.
func (h *ExternalHost) IPv6() netip.Addr { return extHostV6(h.index).Addr() }

// RouterLink returns the name of the upstream router's end of the external
// host's link, "ext<name>".
func (h *ExternalHost) RouterLink() string { return extLinkPrefix + h.name }

// StartEcho starts an echo server called backend (the host's name if
// empty) on the given ports of the host's IPv4 and IPv6 addresses; see
// Pod.StartEcho.
func (h *ExternalHost) StartEcho(backend string, ports ...uint16) (*Echo, error) {
	if backend == "" {
		backend = h.name
	}
	return h.startEcho(backend, []netip.Addr{h.IPv4(), h.IPv6()}, ports)
}

// AddExternalHost creates the external host name behind the upstream router
// and returns it once its addresses and routes are in place. Names follow
// the rules for pod names (see Node.AddPod) and are unique among the lab's
// external hosts. On error nothing of the host is left behind.
func (l *Lab) AddExternalHost(ctx context.Context, name string) (*ExternalHost, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("add external host %s: %w", name, err)
	}
	if l.closed {
		return nil, fmt.Errorf("add external host %s: %w", name, ErrClosed)
	}
	if err := validPodName(name); err != nil {
		return nil, fmt.Errorf("add external host: %w", err)
	}
	if l.externalLocked(name) != nil {
		return nil, fmt.Errorf("add external host %s: lab already has an external host with that name", name)
	}
	if l.nextExternal > MaxExternalHosts {
		return nil, fmt.Errorf("add external host %s: lab has used all %d external host numbers", name, MaxExternalHosts)
	}
	ns, err := createNS(l.prefix+"-ext-"+name, l.log)
	if err != nil {
		return nil, fmt.Errorf("add external host %s: %w", name, err)
	}
	h := &ExternalHost{NS: ns, lab: l, name: name, index: l.nextExternal}
	l.nextExternal++
	if err := h.wire(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("add external host %s: %w", name, err), h.teardown())
	}
	l.externals = append(l.externals, h)
	l.log.Debug("added external host", "host", name, "ipv4", h.IPv4(), "ipv6", h.IPv6())
	return h, nil
}

// ExternalHost returns the external host called name, or nil if there is
// none.
func (l *Lab) ExternalHost(name string) *ExternalHost {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.externalLocked(name)
}

// ExternalHosts returns the lab's external hosts in the order they were
// added.
func (l *Lab) ExternalHosts() []*ExternalHost {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.externals)
}

func (l *Lab) externalLocked(name string) *ExternalHost {
	i := slices.IndexFunc(l.externals, func(h *ExternalHost) bool { return h.name == name })
	if i < 0 {
		return nil
	}
	return l.externals[i]
}

// RemoveExternalHost stops the host's echo servers and client processes and
// deletes its link and namespace.
func (l *Lab) RemoveExternalHost(name string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	i := slices.IndexFunc(l.externals, func(h *ExternalHost) bool { return h.name == name })
	if i < 0 {
		return fmt.Errorf("remove external host %s: no such host", name)
	}
	h := l.externals[i]
	l.externals = slices.Delete(l.externals, i, i+1)
	if err := h.teardown(); err != nil {
		return fmt.Errorf("remove external host %s: %w", name, err)
	}
	return nil
}

// RouteToNode makes the upstream router send traffic for prefix to node n,
// through n's uplink: the way a real network brings a service's external
// IPs and load-balancer IPs to a node. prefix must lie within
// ServiceRangeV4 or ServiceRangeV6. A route for the same prefix is replaced,
// so calling RouteToNode again moves the prefix to another node.
//
// netlab gives the node no route of its own for prefix: a packet the node
// neither serves nor drops goes back to the router by the node's default
// route, and loops until its hop limit runs out (the sender gets an ICMP
// time exceeded, which fails a connection only by timing out).
func (l *Lab) RouteToNode(prefix netip.Prefix, n *Node) error {
	prefix = prefix.Masked()
	if !prefix.IsValid() || !(within(prefix, ServiceRangeV4) || within(prefix, ServiceRangeV6)) {
		return fmt.Errorf("route %s to a node: not within %s or %s", prefix, ServiceRangeV4, ServiceRangeV6)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("route %s to node%d: %w", prefix, n.index, ErrClosed)
	}
	if n.lab != l {
		return fmt.Errorf("route %s to node%d: the node belongs to another lab", prefix, n.index)
	}
	link, err := l.upstream.nl.LinkByName(n.routerLink())
	if err != nil {
		return fmt.Errorf("route %s to node%d: find link %s in netns %s: %w", prefix, n.index, n.routerLink(), l.upstream.name, err)
	}
	gw := fabricNodeV4(n.index).Addr()
	if prefix.Addr().Is6() {
		gw = fabricNodeV6(n.index).Addr()
	}
	if err := l.upstream.nl.RouteReplace(route(prefix, link.Attrs().Index, gw)); err != nil {
		return fmt.Errorf("route %s to node%d in netns %s: %w", prefix, n.index, l.upstream.name, err)
	}
	return nil
}

// within reports whether p lies inside r.
func within(p, r netip.Prefix) bool {
	return p.Addr().Is4() == r.Addr().Is4() && p.Bits() >= r.Bits() && r.Contains(p.Addr())
}

// wire connects the external host to the upstream router and routes through
// it. The caller holds lab.mu.
func (h *ExternalHost) wire(ctx context.Context) error {
	up, e := h.lab.upstream, h.index
	link := h.RouterLink()
	if err := up.addVeth(link, extIndexBase+e, h.NS, extIfName); err != nil {
		return err
	}
	down, err := up.configureLink(link, extUpstreamV4(e), extUpstreamV6(e))
	if err != nil {
		return err
	}
	eth0, err := h.configureLink(extIfName, extHostV4(e), extHostV6(e))
	if err != nil {
		return err
	}
	err = h.addRoutes(
		route(anyV4, eth0.Attrs().Index, extUpstreamV4(e).Addr()),
		route(anyV6, eth0.Attrs().Index, extUpstreamV6(e).Addr()),
	)
	if err != nil {
		return err
	}
	if err := up.waitReady(ctx, down.Attrs().Name, extUpstreamV4(e).Addr(), extUpstreamV6(e).Addr()); err != nil {
		return err
	}
	return h.waitReady(ctx, extIfName, h.IPv4(), h.IPv6())
}

// teardown deletes the host's link and namespace. The caller holds lab.mu.
func (h *ExternalHost) teardown() error {
	return errors.Join(h.lab.upstream.delLink(h.RouterLink()), h.close())
}

// UplinkIndex returns the interface index of the node's uplink, eth0.
func (n *Node) UplinkIndex() int { return nodeIndexBase }

// UplinkAddrs returns the node's addresses on its uplink, sorted (IPv4
// first), secondary addresses included once added. They are the node's only
// non-loopback unicast addresses: host veths have link-local addresses only.
func (n *Node) UplinkAddrs() []netip.Addr {
	n.lab.mu.Lock()
	defer n.lab.mu.Unlock()
	addrs := []netip.Addr{n.IPv4(), n.IPv6()}
	if n.secondary {
		addrs = append(addrs, n.SecondaryIPv4(), n.SecondaryIPv6())
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	return addrs
}

// DataplaneNode returns the node's network as a dataplane sees it with
// vipd's defaults: node ports on the uplink addresses, and the uplink as the
// one external interface (it holds the default routes). It leaves out lo and
// the host veths, which are never external; a dataplane test that needs them
// adds them.
func (n *Node) DataplaneNode() dataplane.Node {
	return dataplane.Node{
		NodePortAddresses: n.UplinkAddrs(),
		Interfaces: []dataplane.Interface{{
			Name: uplinkName, Index: n.UplinkIndex(), Addrs: n.UplinkAddrs(), External: true,
		}},
	}
}

// routerLink is the name of the upstream router's end of the node's uplink.
func (n *Node) routerLink() string { return fmt.Sprintf("node%d", n.index) }

// The node's secondary uplink addresses; doc.go describes them.
func secondaryV4(k int) netip.Addr { return v4Prefix(secondaryThirdOctet, k, 32).Addr() }
func secondaryV6(k int) netip.Addr { return v6Prefix(secondaryThirdOctet, 0, k, 128).Addr() }

// secondaryThirdOctet is 251: secondary node addresses live in
// 198.18.251.0/24 and fd00:198:fb::/64.
const secondaryThirdOctet = 251

// SecondaryIPv4 returns the IPv4 address AddSecondaryAddresses gives the
// node, 198.18.251.k, whether or not it has been added.
func (n *Node) SecondaryIPv4() netip.Addr { return secondaryV4(n.index) }

// SecondaryIPv6 returns the IPv6 address AddSecondaryAddresses gives the
// node, fd00:198:fb::k.
func (n *Node) SecondaryIPv6() netip.Addr { return secondaryV6(n.index) }

// AddSecondaryAddresses gives the node a second IPv4 and IPv6 address on
// its uplink, SecondaryIPv4 and SecondaryIPv6, and makes the upstream router
// route them to the node, so that a node has an address outside a range
// (vipd run --nodeport-addresses, say). It returns once the addresses are
// usable. Adding them twice is an error.
func (n *Node) AddSecondaryAddresses(ctx context.Context) error {
	l := n.lab
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("add secondary addresses to node%d: %w", n.index, ErrClosed)
	}
	if n.secondary {
		return fmt.Errorf("add secondary addresses to node%d: added already", n.index)
	}
	v4, v6 := netip.PrefixFrom(n.SecondaryIPv4(), 32), netip.PrefixFrom(n.SecondaryIPv6(), 128)
	if _, err := n.configureLink(uplinkName, v4, v6); err != nil {
		return fmt.Errorf("add secondary addresses to node%d: %w", n.index, err)
	}
	link, err := l.upstream.nl.LinkByName(n.routerLink())
	if err != nil {
		return fmt.Errorf("add secondary addresses to node%d: find link %s in netns %s: %w", n.index, n.routerLink(), l.upstream.name, err)
	}
	err = l.upstream.addRoutes(
		route(v4, link.Attrs().Index, n.IPv4()),
		route(v6, link.Attrs().Index, n.IPv6()),
	)
	if err != nil {
		return fmt.Errorf("add secondary addresses to node%d: %w", n.index, err)
	}
	n.secondary = true
	if err := n.waitReady(ctx, uplinkName, v4.Addr(), v6.Addr()); err != nil {
		return fmt.Errorf("add secondary addresses to node%d: %w", n.index, err)
	}
	return nil
}
