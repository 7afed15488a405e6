package nodenet

import (
	"cmp"
	"net"
	"net/netip"
	"path"
	"slices"

	"github.com/vipd/vipd/dataplane"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Config says which namespace to follow and how to read it.
type Config struct {
	// NetNS is the path of the network namespace to follow; empty means
	// the caller's own.
	NetNS string
	// NodePortAddresses, when not empty, keeps only the node's addresses
	// within these prefixes as node-port addresses (vipd run
	// --nodeport-addresses).
	NodePortAddresses []netip.Prefix
	// ExternalInterfaces, when not empty, are path.Match globs: an
	// interface whose name matches one is external (vipd run
	// --external-interfaces). Empty: an interface that holds a default
	// route of the main table, IPv4 or IPv6, is external. A glob that
	// does not parse matches nothing (the daemon refuses it at start).
	ExternalInterfaces []string
}

// link is what Node needs of one interface.
type link struct {
	name  string
	index int
	up    bool
}

// addr is one address of an interface.
type addr struct {
	index int
	ip    netip.Addr
}

// build computes the Node from what the kernel listed: every up interface
// with a usable address or that is external, each with its usable
// addresses, and the node-port addresses among them. defaults holds the
// indexes of the interfaces that hold a default route.
func build(cfg Config, links []link, addrs []addr, defaults map[int]bool) dataplane.Node {
	byIndex := map[int][]netip.Addr{}
	for _, a := range addrs {
		byIndex[a.index] = append(byIndex[a.index], a.ip)
	}
	var n dataplane.Node
	for _, l := range links {
		if !l.up {
			continue
		}
		ips := byIndex[l.index]
		slices.SortFunc(ips, netip.Addr.Compare)
		ips = slices.Compact(ips)
		ext := external(cfg.ExternalInterfaces, l, defaults)
		if len(ips) == 0 && !ext {
			continue
		}
		n.Interfaces = append(n.Interfaces, dataplane.Interface{Name: l.name, Index: l.index, Addrs: ips, External: ext})
		for _, ip := range ips {
			if nodePort(cfg.NodePortAddresses, ip) {
				n.NodePortAddresses = append(n.NodePortAddresses, ip)
			}
		}
	}
	slices.SortFunc(n.Interfaces, func(a, b dataplane.Interface) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(n.NodePortAddresses, netip.Addr.Compare)
	n.NodePortAddresses = slices.Compact(n.NodePortAddresses)
	return n
}

func external(globs []string, l link, defaults map[int]bool) bool {
	if len(globs) == 0 {
		return defaults[l.index]
	}
	for _, g := range globs {
		if ok, _ := path.Match(g, l.name); ok {
			return true
		}
	}
	return false
}

func nodePort(prefixes []netip.Prefix, ip netip.Addr) bool {
	if len(prefixes) == 0 {
		return true
	}
	for _, p := range prefixes {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// usable is whether the kernel address a belongs in a Node: unicast, not
// loopback, not IPv6 link-local, and not tentative or failed in duplicate
// address detection (nothing can bind it yet; its end is another address
// event).
func usable(a netlink.Addr) (netip.Addr, bool) {
	if a.IPNet == nil {
		return netip.Addr{}, false
	}
	ip, ok := netip.AddrFromSlice(a.IP)
	if !ok {
		return netip.Addr{}, false
	}
	ip = ip.Unmap()
	switch {
	case ip.IsLoopback(), ip.IsMulticast(), ip.IsUnspecified(), ip.Is6() && ip.IsLinkLocalUnicast():
		return netip.Addr{}, false
	case a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) != 0:
		return netip.Addr{}, false
	}
	return ip, true
}

// defaultRouteLinks returns the indexes of the interfaces that the main
// table's unicast default routes go through, multipath ones included.
func defaultRouteLinks(routes []netlink.Route) map[int]bool {
	out := map[int]bool{}
	for _, r := range routes {
		if r.Table != unix.RT_TABLE_MAIN || r.Type != unix.RTN_UNICAST || !isDefault(r.Dst) {
			continue
		}
		if r.LinkIndex > 0 {
			out[r.LinkIndex] = true
		}
		for _, nh := range r.MultiPath {
			if nh != nil && nh.LinkIndex > 0 {
				out[nh.LinkIndex] = true
			}
		}
	}
	return out
}

func isDefault(dst *net.IPNet) bool {
	if dst == nil {
		return true
	}
	ones, _ := dst.Mask.Size()
	return ones == 0
}
