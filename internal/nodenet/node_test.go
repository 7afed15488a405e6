package nodenet

import (
	"net"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vipd/vipd/dataplane"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

var (
	a1 = netip.MustParseAddr("198.18.0.3")
	a2 = netip.MustParseAddr("198.18.9.1")
	a6 = netip.MustParseAddr("fd00:198:0:1::2")
)

func TestBuild(t *testing.T) {
	links := []link{{"lo", 1, true}, {"veth-a", 5, true}, {"eth0", 2, true}, {"eth1", 3, true}, {"down0", 4, false}, {"bare", 6, true}}
	addrs := []addr{{2, a6}, {2, a1}, {3, a2}, {4, netip.MustParseAddr("198.18.7.7")}, {2, a1}}
	defaults := map[int]bool{2: true, 6: true}
	for _, tc := range []struct {
		name string
		cfg  Config
		want dataplane.Node
	}{
		{"defaults", Config{}, dataplane.Node{
			NodePortAddresses: []netip.Addr{a1, a2, a6},
			Interfaces: []dataplane.Interface{
				{Name: "bare", Index: 6, External: true},
				{Name: "eth0", Index: 2, Addrs: []netip.Addr{a1, a6}, External: true},
				{Name: "eth1", Index: 3, Addrs: []netip.Addr{a2}},
			},
		}},
		{"nodeport addresses and globs", Config{
			NodePortAddresses:  []netip.Prefix{netip.MustParsePrefix("198.18.9.0/24"), netip.MustParsePrefix("fd00::/8")},
			ExternalInterfaces: []string{"eth1", "veth-*", "["},
		}, dataplane.Node{
			NodePortAddresses: []netip.Addr{a2, a6},
			Interfaces: []dataplane.Interface{
				{Name: "eth0", Index: 2, Addrs: []netip.Addr{a1, a6}},
				{Name: "eth1", Index: 3, Addrs: []netip.Addr{a2}, External: true},
				{Name: "veth-a", Index: 5, External: true},
			},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := build(tc.cfg, links, addrs, defaults)
			if d := cmp.Diff(tc.want, got, addrCmp); d != "" {
				t.Errorf("build (-want +got):\n%s", d)
			}
		})
	}
}

func TestUsable(t *testing.T) {
	for _, tc := range []struct {
		cidr  string
		flags int
		ok    bool
	}{
		{"198.18.0.3/31", 0, true},
		{"fd00:198::1/64", 0, true},
		{"127.0.0.1/8", 0, false},
		{"::1/128", 0, false},
		{"fe80::1/64", 0, false},
		{"169.254.3.3/16", 0, true},
		{"fd00:198::2/64", unix.IFA_F_TENTATIVE, false},
		{"fd00:198::3/64", unix.IFA_F_DADFAILED, false},
		{"fd00:198::4/64", unix.IFA_F_DEPRECATED, true},
	} {
		ip, n, _ := net.ParseCIDR(tc.cidr)
		n.IP = ip
		if _, ok := usable(netlink.Addr{IPNet: n, Flags: tc.flags}); ok != tc.ok {
			t.Errorf("usable(%s, flags %#x) = %v, want %v", tc.cidr, tc.flags, ok, tc.ok)
		}
	}
}

func TestDefaultRouteLinks(t *testing.T) {
	_, any4, _ := net.ParseCIDR("0.0.0.0/0")
	_, any6, _ := net.ParseCIDR("::/0")
	_, some, _ := net.ParseCIDR("198.18.0.0/16")
	main, uni := unix.RT_TABLE_MAIN, unix.RTN_UNICAST
	routes := []netlink.Route{
		{Dst: any4, LinkIndex: 2, Table: main, Type: uni},
		{Dst: any6, MultiPath: []*netlink.NexthopInfo{{LinkIndex: 3}, {LinkIndex: 4}}, Table: main, Type: uni},
		{Dst: some, LinkIndex: 5, Table: main, Type: uni},
		{Dst: any4, LinkIndex: 6, Table: 100, Type: uni},
		{Dst: any4, Table: main, Type: unix.RTN_UNREACHABLE},
		{LinkIndex: 7, Table: main, Type: uni}, // nil Dst: default
	}
	got := defaultRouteLinks(routes)
	want := map[int]bool{2: true, 3: true, 4: true, 7: true}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("defaultRouteLinks (-want +got):\n%s", d)
	}
}

var addrCmp = cmp.Comparer(func(a, b netip.Addr) bool { return a == b })
