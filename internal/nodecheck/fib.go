package nodecheck

import (
	"cmp"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// fib answers "how does the kernel route a packet to this VIP" in-process,
// from one dump of the namespace's routes and policy rules, as a RouteGet
// without source, mark or interface would: the rules in priority order,
// each a longest-prefix match in its table, a throw route going on to the
// next rule. It is sure only of the common case, and says when it is not
// (decide's sure is false), so that the caller asks the kernel:
//
//   - a rule that may apply to the VIP and is not a plain "lookup TABLE"
//     with at most a destination selector (a source, mark, interface,
//     port, uid or tos selector, an inverted, goto, suppress, nop,
//     blackhole or l3mdev rule);
//   - a best route that ties with another of the same metric, has a
//     nonzero tos, dead or link-down nexthops, no nexthop it can see (a
//     nexthop object), or a type other than unicast, local, blackhole,
//     unreachable, prohibit or throw;
//   - an IPv4-mapped IPv6 VIP.
type fib struct {
	// rules are each family's rules in priority order.
	rules map[int][]netlink.Rule
	// tables are the routes by family and table.
	tables map[tableKey]*fibTable
}

type tableKey struct{ family, table int }

// fibTable is one routing table of one family.
type fibTable struct {
	// lens are the prefix lengths with routes, longest first.
	lens []int
	// routes are the routes by destination prefix (masked).
	routes map[netip.Prefix][]netlink.Route
}

// newFIB indexes a dump of routes and rules, of both families.
func newFIB(routes []netlink.Route, rules []netlink.Rule) *fib {
	f := &fib{rules: map[int][]netlink.Rule{}, tables: map[tableKey]*fibTable{}}
	for _, r := range routes {
		p, ok := routePrefix(r)
		if !ok {
			continue
		}
		k := tableKey{r.Family, r.Table}
		t := f.tables[k]
		if t == nil {
			t = &fibTable{routes: map[netip.Prefix][]netlink.Route{}}
			f.tables[k] = t
		}
		if len(t.routes[p]) == 0 && !slices.Contains(t.lens, p.Bits()) {
			t.lens = append(t.lens, p.Bits())
		}
		t.routes[p] = append(t.routes[p], r)
	}
	for _, t := range f.tables {
		slices.SortFunc(t.lens, func(a, b int) int { return cmp.Compare(b, a) })
	}
	for _, r := range rules {
		if r.Family == unix.AF_INET || r.Family == unix.AF_INET6 {
			f.rules[r.Family] = append(f.rules[r.Family], r)
		}
	}
	for fam := range f.rules {
		// Stable: rules of one priority apply in the order the kernel lists them.
		slices.SortStableFunc(f.rules[fam], func(a, b netlink.Rule) int { return cmp.Compare(a.Priority, b.Priority) })
	}
	return f
}

// routePrefix is r's destination as a masked prefix of r's family; a
// route without one (a default route) has the family's /0.
func routePrefix(r netlink.Route) (netip.Prefix, bool) {
	var zero netip.Addr
	switch r.Family {
	case unix.AF_INET:
		zero = netip.IPv4Unspecified()
	case unix.AF_INET6:
		zero = netip.IPv6Unspecified()
	default:
		return netip.Prefix{}, false
	}
	if r.Dst == nil {
		return netip.PrefixFrom(zero, 0), true
	}
	return ipNetPrefix(r.Dst, zero.Is4())
}

// ipNetPrefix converts n, of the family that is4 says, to a masked prefix.
func ipNetPrefix(n *net.IPNet, is4 bool) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	if is4 {
		a = a.Unmap()
	}
	ones, _ := n.Mask.Size()
	p, err := a.Prefix(ones)
	return p, err == nil && a.Is4() == is4
}

// decide returns why vip has no usable route ("" when it has one), and
// whether it is sure of that; see fib.
func (f *fib) decide(vip netip.Addr) (why string, sure bool) {
	if vip.Is4In6() || vip.Zone() != "" {
		return "", false
	}
	family := unix.AF_INET6
	if vip.Is4() {
		family = unix.AF_INET
	}
	for _, r := range f.rules[family] {
		if r.Dst != nil && !r.Invert {
			p, ok := ipNetPrefix(r.Dst, vip.Is4())
			if !ok {
				return "", false
			}
			if !p.Contains(vip) {
				continue // the rule does not match the VIP, whatever else it says
			}
		}
		if !plainLookup(r) {
			return "", false
		}
		t := f.tables[tableKey{family, r.Table}]
		if t == nil {
			continue
		}
		route, sure := t.lookup(vip)
		switch {
		case !sure:
			return "", false
		case route == nil || route.Type == unix.RTN_THROW:
			continue // on to the next rule
		}
		return routeTypeWhy(route.Type)
	}
	return "no route", true
}

// plainLookup tells whether r is "lookup TABLE" with no selector but its
// destination: one that matches every lookup of a destination it covers.
func plainLookup(r netlink.Rule) bool {
	return r.Table != 0 && r.Goto == -1 && !r.Invert &&
		(r.Src == nil || isAll(r.Src)) &&
		r.Mark == 0 && r.Mask == nil && r.Tos == 0 && r.TunID == 0 && r.Flow == -1 &&
		r.IifName == "" && r.OifName == "" &&
		r.SuppressIfgroup == -1 && r.SuppressPrefixlen == -1 &&
		r.Dport == nil && r.Sport == nil && r.IPProto == 0 && r.UIDRange == nil
}

func isAll(n *net.IPNet) bool {
	ones, _ := n.Mask.Size()
	return ones == 0
}

// deadOrDown are the nexthop flags that may make the kernel pass over a
// route: RTNH_F_DEAD and RTNH_F_LINKDOWN.
const deadOrDown = unix.RTNH_F_DEAD | unix.RTNH_F_LINKDOWN

// lookup is the longest-prefix match of vip in t: the route of the lowest
// metric among those of the longest prefix that covers vip, or nil. sure is
// false when the kernel's choice there depends on more than that (see fib).
func (t *fibTable) lookup(vip netip.Addr) (route *netlink.Route, sure bool) {
	for _, bits := range t.lens {
		p, err := vip.Prefix(bits)
		if err != nil {
			continue
		}
		rs := t.routes[p]
		if len(rs) == 0 {
			continue
		}
		var best *netlink.Route
		tie := false
		for i := range rs {
			r := &rs[i]
			switch {
			case r.Tos != 0:
				return nil, false
			case best == nil || r.Priority < best.Priority:
				best, tie = r, false
			case r.Priority == best.Priority:
				tie = true
			}
		}
		if tie || best.Flags&deadOrDown != 0 {
			return nil, false
		}
		for _, nh := range best.MultiPath {
			if nh.Flags&deadOrDown != 0 {
				return nil, false
			}
		}
		if best.Type == unix.RTN_UNICAST && best.LinkIndex == 0 && len(best.MultiPath) == 0 {
			return nil, false // a nexthop object, whose state the dump does not show
		}
		return best, true
	}
	return nil, true
}

// routeTypeWhy is why a route of type typ is not usable ("" when it is),
// as lookupRoute says it; sure is false for a type it does not judge.
func routeTypeWhy(typ int) (why string, sure bool) {
	switch typ {
	case unix.RTN_UNICAST, unix.RTN_LOCAL:
		return "", true
	case unix.RTN_BLACKHOLE:
		return "blackhole route", true
	case unix.RTN_UNREACHABLE:
		return "unreachable route", true
	case unix.RTN_PROHIBIT:
		return "prohibit route", true
	}
	return fmt.Sprintf("route of type %d", typ), false
}
