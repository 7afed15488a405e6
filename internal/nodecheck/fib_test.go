package nodecheck

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// route is a route of table to prefix (empty: the family's default route)
// of type typ through interface 2, with metric prio.
func route(family, table int, prefix string, typ, prio int) netlink.Route {
	r := netlink.Route{Family: family, Table: table, Type: typ, Priority: prio, LinkIndex: 2}
	if prefix != "" {
		_, n, err := net.ParseCIDR(prefix)
		if err != nil {
			panic(err)
		}
		r.Dst = n
	}
	return r
}

// rule is a plain "lookup table" rule at prio, to dst when not empty.
func rule(family, prio, table int, dst string) netlink.Rule {
	r := *netlink.NewRule()
	r.Family, r.Priority, r.Table = family, prio, table
	if dst != "" {
		_, r.Dst, _ = net.ParseCIDR(dst)
	}
	return r
}

// defaultRules are the rules of a fresh network namespace.
func defaultRules() []netlink.Rule {
	return []netlink.Rule{
		rule(unix.AF_INET, 0, unix.RT_TABLE_LOCAL, ""), rule(unix.AF_INET, 32766, unix.RT_TABLE_MAIN, ""), rule(unix.AF_INET, 32767, unix.RT_TABLE_DEFAULT, ""),
		rule(unix.AF_INET6, 0, unix.RT_TABLE_LOCAL, ""), rule(unix.AF_INET6, 32766, unix.RT_TABLE_MAIN, ""),
	}
}

func TestFIBDecide(t *testing.T) {
	const v4, v6, local, main, deflt = unix.AF_INET, unix.AF_INET6, unix.RT_TABLE_LOCAL, unix.RT_TABLE_MAIN, unix.RT_TABLE_DEFAULT
	base := []netlink.Route{
		route(v4, local, "10.0.0.1/32", unix.RTN_LOCAL, 0),
		route(v4, main, "", unix.RTN_UNICAST, 0), // default route
		route(v4, main, "198.19.1.0/24", unix.RTN_BLACKHOLE, 0),
		route(v4, main, "198.19.1.128/25", unix.RTN_UNICAST, 0), // longer than the blackhole
		route(v4, main, "198.19.2.0/24", unix.RTN_UNREACHABLE, 0),
		route(v4, main, "198.19.3.0/24", unix.RTN_PROHIBIT, 0),
		route(v4, main, "198.19.4.0/24", unix.RTN_UNICAST, 100),
		route(v4, main, "198.19.4.0/24", unix.RTN_BLACKHOLE, 200), // a worse metric loses
		route(v4, main, "198.19.5.0/24", unix.RTN_THROW, 0),       // on to table default: empty
		route(v4, deflt, "198.19.6.0/24", unix.RTN_THROW, 0),
		route(v4, main, "198.19.6.0/24", unix.RTN_THROW, 0),
		route(v6, main, "fd00:198::/32", unix.RTN_UNICAST, 1024),
		route(v6, main, "fd00:198:ffff::/64", unix.RTN_BLACKHOLE, 1024),
	}
	noDefault := append([]netlink.Route(nil), base[:1]...)
	noDefault = append(noDefault, base[2:]...)
	tied := append(append([]netlink.Route(nil), base...), route(v4, main, "198.19.7.0/24", unix.RTN_UNICAST, 0), route(v4, main, "198.19.7.0/24", unix.RTN_UNICAST, 0))
	dead := route(v4, main, "198.19.8.0/24", unix.RTN_UNICAST, 0)
	dead.Flags = unix.RTNH_F_DEAD
	nhObject := route(v4, main, "198.19.9.0/24", unix.RTN_UNICAST, 0)
	nhObject.LinkIndex = 0
	tos := route(v4, main, "198.19.10.0/24", unix.RTN_UNICAST, 0)
	tos.Tos = 0x10
	odd := append(append([]netlink.Route(nil), base...), dead, nhObject, tos, route(v4, local, "198.19.11.255/32", unix.RTN_BROADCAST, 0))

	markRule := rule(v4, 100, 100, "")
	markRule.Mark = 1
	scoped := rule(v4, 100, 100, "198.19.12.0/24")
	scopedMark := markRule
	_, scopedMark.Dst, _ = net.ParseCIDR("198.19.13.0/24")
	withTable100 := append(append([]netlink.Route(nil), base...), route(v4, 100, "198.19.12.0/24", unix.RTN_BLACKHOLE, 0))

	for _, tc := range []struct {
		name   string
		routes []netlink.Route
		rules  []netlink.Rule
		vip    string
		why    string
		sure   bool
	}{
		{"default route", base, defaultRules(), "198.18.0.1", "", true},
		{"local address", base, defaultRules(), "10.0.0.1", "", true},
		{"blackhole", base, defaultRules(), "198.19.1.1", "blackhole route", true},
		{"longer prefix inside the blackhole", base, defaultRules(), "198.19.1.200", "", true},
		{"unreachable", base, defaultRules(), "198.19.2.1", "unreachable route", true},
		{"prohibit", base, defaultRules(), "198.19.3.1", "prohibit route", true},
		{"lowest metric wins", base, defaultRules(), "198.19.4.1", "", true},
		{"throw to an empty table", base, defaultRules(), "198.19.5.1", "no route", true},
		{"throw in every table", base, defaultRules(), "198.19.6.1", "no route", true},
		{"no default route", noDefault, defaultRules(), "198.18.0.1", "no route", true},
		{"IPv6 route", base, defaultRules(), "fd00:198::1", "", true},
		{"IPv6 blackhole", base, defaultRules(), "fd00:198:ffff::1", "blackhole route", true},
		{"IPv6 without a route", base, defaultRules(), "fd00:1::1", "no route", true},
		{"no rules", base, nil, "198.18.0.1", "no route", true},
		{"a tie of metrics", tied, defaultRules(), "198.19.7.1", "", false},
		{"a dead nexthop", odd, defaultRules(), "198.19.8.1", "", false},
		{"a nexthop object", odd, defaultRules(), "198.19.9.1", "", false},
		{"a tos route", odd, defaultRules(), "198.19.10.1", "", false},
		{"a broadcast route", odd, defaultRules(), "198.19.11.255", "", false},
		{"IPv4-mapped", base, defaultRules(), "::ffff:198.18.0.1", "", false},
		{"a mark rule", base, append(defaultRules(), markRule), "198.18.0.1", "", false},
		{"a mark rule, IPv6 VIP", base, append(defaultRules(), markRule), "fd00:198::1", "", true},
		{"a scoped plain rule, VIP inside", withTable100, append(defaultRules(), scoped), "198.19.12.1", "blackhole route", true},
		{"a scoped plain rule, VIP outside", withTable100, append(defaultRules(), scoped), "198.18.0.1", "", true},
		{"a scoped mark rule, VIP inside", base, append(defaultRules(), scopedMark), "198.19.13.1", "", false},
		{"a scoped mark rule, VIP outside", base, append(defaultRules(), scopedMark), "198.18.0.1", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			why, sure := newFIB(tc.routes, tc.rules).decide(netip.MustParseAddr(tc.vip))
			if sure != tc.sure || (sure && why != tc.why) {
				t.Errorf("decide(%s) = %q, sure %v; want %q, sure %v", tc.vip, why, sure, tc.why, tc.sure)
			}
		})
	}
}
