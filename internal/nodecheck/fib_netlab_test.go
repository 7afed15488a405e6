package nodecheck

import (
	"context"
	"net/netip"
	"testing"

	"github.com/vipd/vipd/internal/nsdo"
	"github.com/vipd/vipd/internal/testkit/netlab"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// TestFIBAgreesWithKernel checks fib against RouteGet in a lab node with
// routes of every type, a throw route, a metric that loses, a longer
// prefix inside a blackhole and a plain rule to another table: fib is sure
// of every VIP and says what the kernel says. With a fwmark rule added, it
// is no longer sure of the IPv4 VIPs that reach that rule, but still of
// the others and of the IPv6 ones.
func TestFIBAgreesWithKernel(t *testing.T) {
	node := netlab.New(t, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: []string{"p1"}}}}).Node(1)
	ctx := context.Background()
	ip := func(args ...string) {
		t.Helper()
		if _, err := node.Exec(ctx, "ip", args...); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{
		{"route", "add", "blackhole", "198.19.1.0/24"},
		{"route", "add", "198.19.1.128/25", "dev", node.Uplink()},
		{"route", "add", "unreachable", "198.19.2.0/24"},
		{"route", "add", "prohibit", "198.19.3.0/24"},
		{"route", "add", "198.19.4.0/24", "dev", node.Uplink(), "metric", "100"},
		{"route", "add", "blackhole", "198.19.4.0/24", "metric", "200"},
		{"route", "add", "throw", "198.19.5.0/24"},
		{"route", "add", "blackhole", "198.19.12.0/24", "table", "100"},
		{"rule", "add", "to", "198.19.12.0/24", "lookup", "100", "pref", "100"},
		{"-6", "route", "add", "blackhole", "fd00:198:ffff::/64"},
		{"-6", "route", "add", "unreachable", "fd00:198:fffe::/64"},
		{"-6", "route", "add", "prohibit", "fd00:198:fffd::/64"},
	} {
		ip(args...)
	}
	vips := []netip.Addr{node.IPv4(), node.IPv6(), netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("198.18.0.1"),
		netip.MustParseAddr("fd00:198:ffff::1"), netip.MustParseAddr("fd00:198:fffe::1"), netip.MustParseAddr("fd00:198:fffd::1"),
		netip.MustParseAddr("fd00:1::1")}
	for _, third := range []byte{0, 1, 2, 3, 4, 5, 12, 13} {
		for _, fourth := range []byte{1, 127, 128, 200} {
			vips = append(vips, netip.AddrFrom4([4]byte{198, 19, third, fourth}))
		}
	}
	for _, p := range node.Pods() {
		vips = append(vips, p.IPv4(), p.IPv6())
	}
	compare := func(wantSure func(netip.Addr) bool) {
		t.Helper()
		err := nsdo.Do(node.Path(), func() error {
			h, err := netlink.NewHandleAt(netns.None(), unix.NETLINK_ROUTE)
			if err != nil {
				return err
			}
			defer h.Close()
			routes, rules, err := dumpRouting(h)
			if err != nil {
				return err
			}
			f := newFIB(routes, rules)
			for _, vip := range vips {
				kernel, err := lookupRoute(h, vip)
				if err != nil {
					return err
				}
				why, sure := f.decide(vip)
				switch {
				case sure != wantSure(vip):
					t.Errorf("%s: sure %v, want %v (the kernel says %q)", vip, sure, !sure, kernel)
				case sure && why != kernel:
					t.Errorf("%s: fib says %q, the kernel %q", vip, why, kernel)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	compare(func(netip.Addr) bool { return true })
	ip("rule", "add", "fwmark", "1", "lookup", "100", "pref", "200")
	// The rule comes after the local table's (0) and the 198.19.12.0/24
	// one (100): what those decide stays sure.
	before := netip.MustParsePrefix("198.19.12.0/24")
	compare(func(a netip.Addr) bool { return a.Is6() || a == node.IPv4() || a.IsLoopback() || before.Contains(a) })
}
