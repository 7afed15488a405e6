package netlab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// MaxNodes is the largest number of nodes a lab can have.
const MaxNodes = 100

const (
	// firstPodHost and lastPodHost bound the host numbers of a node's pods:
	// 198.18.k.h and fd00:198:k::h.
	firstPodHost = 10
	lastPodHost  = 254

	uplinkName = "eth0" // the node's fabric link
	podIfName  = "eth0" // the pod's end of its veth
	vethPrefix = "veth" // the node's end of a pod's veth: veth<pod>

	// The node-side ends of veth pairs get interface indexes from
	// nodeIndexBase up (the uplink nodeIndexBase, the host veth of the pod
	// with host number h nodeIndexBase+h), far above the small indexes
	// their peers get in younger namespaces. The kernel treats a state change
	// of a veth whose index equals its peer's as not urgent and may sit on it
	// for up to a second, and IPv6 ignores a link until then.
	nodeIndexBase = 1000
)

var (
	// podGatewayV4 and podGatewayV6 are every pod's default gateways. The
	// node answers ARP for podGatewayV4 by proxy ARP and owns podGatewayV6 on
	// every host veth.
	podGatewayV4 = netip.MustParseAddr("169.254.1.1")
	podGatewayV6 = netip.MustParseAddr("fe80::1")

	// podNameRE keeps veth<pod> within IFNAMSIZ (15 characters) and pod
	// names usable in interface, namespace and sysctl names.
	podNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,10}$`)
)

// The address plan; doc.go describes it.

func fabricUpstreamV4(k int) netip.Prefix { return v4Prefix(0, 2*k, 31) }
func fabricNodeV4(k int) netip.Prefix     { return v4Prefix(0, 2*k+1, 31) }
func fabricUpstreamV6(k int) netip.Prefix { return v6Prefix(0, k, 1, 64) }
func fabricNodeV6(k int) netip.Prefix     { return v6Prefix(0, k, 2, 64) }
func podCIDRv4(k int) netip.Prefix        { return v4Prefix(k, 0, 24) }
func podCIDRv6(k int) netip.Prefix        { return v6Prefix(k, 0, 0, 64) }
func podIPv4(k, h int) netip.Addr         { return v4Prefix(k, h, 32).Addr() }
func podIPv6(k, h int) netip.Addr         { return v6Prefix(k, 0, h, 128).Addr() }

// v4Prefix returns 198.18.c.d/bits.
func v4Prefix(c, d, bits int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, byte(c), byte(d)}), bits)
}

// v6Prefix returns fd00:198:g2:g3::h/bits.
func v6Prefix(g2, g3, h, bits int) netip.Prefix {
	b := [16]byte{0xfd, 0x00, 0x01, 0x98, byte(g2 >> 8), byte(g2), byte(g3 >> 8), byte(g3)}
	b[14], b[15] = byte(h>>8), byte(h)
	return netip.PrefixFrom(netip.AddrFrom16(b), bits)
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// linkUp brings up the link name and returns it.
func (n *NS) linkUp(name string) (netlink.Link, error) {
	l, err := n.nl.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("find link %s in netns %s: %w", name, n.name, err)
	}
	if err := n.nl.LinkSetUp(l); err != nil {
		return nil, fmt.Errorf("set link %s up in netns %s: %w", name, n.name, err)
	}
	return l, nil
}

// configureLink gives the link name addrs (without duplicate address
// detection, so that IPv6 addresses work at once), brings it up and returns it.
func (n *NS) configureLink(name string, addrs ...netip.Prefix) (netlink.Link, error) {
	l, err := n.nl.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("find link %s in netns %s: %w", name, n.name, err)
	}
	for _, a := range addrs {
		addr := &netlink.Addr{IPNet: ipNet(a)}
		if a.Addr().Is6() {
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := n.nl.AddrAdd(l, addr); err != nil {
			return nil, fmt.Errorf("add address %s to %s in netns %s: %w", a, name, n.name, err)
		}
	}
	return n.linkUp(name)
}

// waitReady waits until the link is operationally up and the kernel has
// finished configuring addrs on it, that is, until their local routes exist.
// Both happen asynchronously after the ends of a veth are up: until then the
// namespace ignores neighbor solicitations for its IPv6 addresses and drops
// packets to them, which costs the first connection a retransmit (1 s).
func (n *NS) waitReady(ctx context.Context, name string, addrs ...netip.Addr) error {
	ctx, cancel := withDefaultTimeout(ctx, DefaultTimeout)
	defer cancel()
	for {
		ready, err := n.ready(name, addrs)
		if err != nil || ready {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for link %s in netns %s to be ready: %w", name, n.name, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

func (n *NS) ready(name string, addrs []netip.Addr) (bool, error) {
	l, err := n.nl.LinkByName(name)
	if err != nil {
		return false, fmt.Errorf("find link %s in netns %s: %w", name, n.name, err)
	}
	if l.Attrs().OperState != netlink.OperUp {
		return false, nil
	}
	for _, a := range addrs {
		rs, err := n.nl.RouteGetWithOptions(a.AsSlice(), &netlink.RouteGetOptions{OifIndex: l.Attrs().Index})
		if err != nil || len(rs) == 0 || rs[0].Type != unix.RTN_LOCAL {
			return false, nil // no route at all is "not yet" too
		}
	}
	return true, nil
}

// addRoutes adds routes in order.
func (n *NS) addRoutes(routes ...*netlink.Route) error {
	for _, r := range routes {
		if err := n.nl.RouteAdd(r); err != nil {
			return fmt.Errorf("add route %s in netns %s: %w", r, n.name, err)
		}
	}
	return nil
}

// addVeth creates a veth pair inside n: the local end is named local and
// has interface index index, and the peer, named peer, is created directly
// inside the namespace to, so neither end ever exists anywhere else.
func (n *NS) addVeth(local string, index int, to *NS, peer string) error {
	attrs := netlink.NewLinkAttrs()
	attrs.Name = local
	attrs.Index = index
	veth := &netlink.Veth{LinkAttrs: attrs, PeerName: peer, PeerNamespace: netlink.NsFd(to.handle)}
	if err := n.nl.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s (netns %s) - %s (netns %s): %w", local, n.name, peer, to.name, err)
	}
	return nil
}

// delLink deletes the link name, and with it its veth peer and the routes
// through it. A missing link is not an error.
func (n *NS) delLink(name string) error {
	l, err := n.nl.LinkByName(name)
	if errors.As(err, new(netlink.LinkNotFoundError)) {
		return nil
	}
	if err == nil {
		err = n.nl.LinkDel(l)
	}
	if err != nil {
		return fmt.Errorf("delete link %s in netns %s: %w", name, n.name, err)
	}
	return nil
}

// route returns a route to dst through the link with index link, via gw if
// gw is valid and on-link otherwise.
func route(dst netip.Prefix, link int, gw netip.Addr) *netlink.Route {
	r := &netlink.Route{Dst: ipNet(dst), LinkIndex: link}
	if gw.IsValid() {
		r.Gw = gw.AsSlice()
	} else if dst.Addr().Is4() {
		r.Scope = netlink.SCOPE_LINK
	}
	return r
}

// unreachable returns a route that rejects dst with ICMP unreachable.
func unreachable(dst netip.Prefix) *netlink.Route {
	return &netlink.Route{Dst: ipNet(dst), Type: unix.RTN_UNREACHABLE}
}

var (
	anyV4 = netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	anyV6 = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
)
