package nodecheck_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/internal/nodecheck"
	"github.com/vipd/vipd/internal/testkit/netlab"
)

// checks returns the Check of each warning.
func checks(ws []nodecheck.Warning) []string {
	var out []string
	for _, w := range ws {
		out = append(out, w.Check)
	}
	return out
}

// find returns the warning with the given check.
func find(ws []nodecheck.Warning, check string) (nodecheck.Warning, bool) {
	for _, w := range ws {
		if w.Check == check {
			return w, true
		}
	}
	return nodecheck.Warning{}, false
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

// TestForwardingInNamespace checks forwarding in a lab node (forwarding
// on, default routes in both families): off is a warning naming the
// sysctl and the command that fixes it, in that namespace only; on again
// clears it; IPv6 forwarding counts only once an IPv6 VIP exists.
func TestForwardingInNamespace(t *testing.T) {
	node := netlab.New(t, netlab.Spec{}).Node(1)
	c := nodecheck.New(hclog.NewNullLogger(), nodecheck.Config{NetNS: node.Path()})
	v4 := addrs("198.19.0.10")
	c.Check(v4)
	if ws := c.Warnings(); len(ws) != 0 {
		t.Fatalf("a forwarding node: %+v", ws)
	}

	if err := node.SetSysctl("net.ipv4.ip_forward", "0"); err != nil {
		t.Fatal(err)
	}
	c.Check(v4)
	w, ok := find(c.Warnings(), "sysctl/net.ipv4.ip_forward")
	if !ok || !strings.HasPrefix(w.Message, "net.ipv4.ip_forward is 0, want 1") ||
		w.Remedy != "ip netns exec "+node.Name()+" sysctl -w net.ipv4.ip_forward=1 (or start vipd with --set-sysctls)" || w.Since.IsZero() {
		t.Fatalf("ip_forward off: %+v", c.Warnings())
	}
	if err := node.SetSysctl("net.ipv4.ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	c.Check(v4)
	if ws := c.Warnings(); len(ws) != 0 {
		t.Fatalf("ip_forward on again: %+v", ws)
	}

	if err := node.SetSysctl("net.ipv6.conf.all.forwarding", "0"); err != nil {
		t.Fatal(err)
	}
	c.Check(v4)
	if ws := c.Warnings(); len(ws) != 0 {
		t.Fatalf("IPv6 forwarding off without IPv6 VIPs: %+v", ws)
	}
	c.Check(append(v4, addrs("fd00:198:ffff::10")...))
	if got := checks(c.Warnings()); len(got) != 1 || got[0] != "sysctl/net.ipv6.conf.all.forwarding" {
		t.Fatalf("IPv6 forwarding off with an IPv6 VIP: %+v", c.Warnings())
	}
}

// TestSetSysctls checks that with SetSysctls every checked sysctl that is
// off is set in the checked namespace, and nothing is reported.
func TestSetSysctls(t *testing.T) {
	node := netlab.New(t, netlab.Spec{}).Node(1)
	for _, k := range []string{"net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"} {
		if err := node.SetSysctl(k, "0"); err != nil {
			t.Fatal(err)
		}
	}
	c := nodecheck.New(hclog.NewNullLogger(), nodecheck.Config{NetNS: node.Path(), SetSysctls: true})
	c.Check(addrs("198.19.0.10", "fd00:198:ffff::10"))
	if ws := c.Warnings(); len(ws) != 0 {
		t.Errorf("with SetSysctls: %+v", ws)
	}
	for _, k := range []string{"net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"} {
		if v, err := node.Sysctl(k); err != nil || v != "1" {
			t.Errorf("%s = %q (%v) after the check, want 1", k, v, err)
		}
	}
}

// TestConntrackSysctls checks the flow source's conntrack sysctls, which
// a lab namespace has at the kernel's defaults (events 2, accounting and
// timestamps off), once conntrack is loaded.
func TestConntrackSysctls(t *testing.T) {
	node := netlab.New(t, netlab.Spec{}).Node(1)
	if _, err := node.Sysctl("net.netfilter.nf_conntrack_acct"); err != nil {
		// The module loads with the first conntrack rule anywhere; one in
		// the lab namespace loads it without touching the root namespace.
		if _, err := node.Exec(context.Background(), "iptables", "-t", "raw", "-A", "PREROUTING", "-m", "conntrack", "--ctstate", "INVALID"); err != nil {
			t.Fatalf("load netfilter conntrack: %v", err)
		}
	}
	for _, kv := range [][2]string{{"nf_conntrack_acct", "0"}, {"nf_conntrack_timestamp", "1"}, {"nf_conntrack_events", "2"}} {
		if err := node.SetSysctl("net.netfilter."+kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	cfg := nodecheck.Config{NetNS: node.Path(), Needs: nodecheck.Needs{Conntrack: true}}
	c := nodecheck.New(hclog.NewNullLogger(), cfg)
	c.Check(nil)
	got := checks(c.Warnings())
	if strings.Join(got, " ") != "sysctl/net.netfilter.nf_conntrack_acct sysctl/net.netfilter.nf_conntrack_events" {
		t.Fatalf("warnings %v, want acct and events", got)
	}
	cfg.SetSysctls = true
	c = nodecheck.New(hclog.NewNullLogger(), cfg)
	c.Check(nil)
	if ws := c.Warnings(); len(ws) != 0 {
		t.Errorf("with SetSysctls: %+v", ws)
	}
	if v, _ := node.Sysctl("net.netfilter.nf_conntrack_events"); v != "1" {
		t.Errorf("nf_conntrack_events = %s after the check, want 1", v)
	}
}

// TestVIPRoutes checks that a VIP without a usable route (none at all, or
// a blackhole or unreachable one) is a warning naming it, that a VIP with
// a route is not, and that adding a route clears the warning although the
// VIPs have not changed (the lookups are cached only while the routes
// stay the same).
func TestVIPRoutes(t *testing.T) {
	node := netlab.New(t, netlab.Spec{}).Node(1)
	ctx := context.Background()
	c := nodecheck.New(hclog.NewNullLogger(), nodecheck.Config{NetNS: node.Path(), Needs: nodecheck.Needs{VIPRoutes: true}})
	vips := addrs("198.19.0.10", "198.19.1.10", "198.19.2.10", "fd00:198:ffff::10")
	c.Check(vips)
	if ws := c.Warnings(); len(ws) != 0 {
		t.Fatalf("a node with default routes: %+v", ws)
	}

	for _, args := range [][]string{
		{"route", "del", "default"},
		{"route", "add", "blackhole", "198.19.1.0/24"},
		{"route", "add", "unreachable", "198.19.2.0/24"},
		{"route", "add", "198.19.0.0/24", "dev", node.Uplink()},
		{"-6", "route", "add", "blackhole", "fd00:198:ffff::/64"},
	} {
		if _, err := node.Exec(ctx, "ip", args...); err != nil {
			t.Fatal(err)
		}
	}
	c.Check(vips)
	w4, ok4 := find(c.Warnings(), "route/ipv4")
	w6, ok6 := find(c.Warnings(), "route/ipv6")
	if !ok4 || !ok6 || len(c.Warnings()) != 2 {
		t.Fatalf("warnings %+v; want route/ipv4 and route/ipv6", c.Warnings())
	}
	for _, want := range []string{"2 VIPs have no usable route", "198.19.1.10 (blackhole route)", "198.19.2.10 (unreachable route)"} {
		if !strings.Contains(w4.Message, want) {
			t.Errorf("IPv4 message %q lacks %q", w4.Message, want)
		}
	}
	if strings.Contains(w4.Message, "198.19.0.10") {
		t.Errorf("IPv4 message %q names the routed VIP", w4.Message)
	}
	if want := "ip netns exec " + node.Name() + " ip route add 198.19.0.0/22 dev"; !strings.HasPrefix(w4.Remedy, want) {
		t.Errorf("IPv4 remedy %q, want it to start with %q", w4.Remedy, want)
	}
	if !strings.Contains(w6.Message, "fd00:198:ffff::10 (") {
		t.Errorf("IPv6 message %q does not name the VIP", w6.Message)
	}

	if _, err := node.Exec(ctx, "ip", "route", "replace", "198.19.0.0/16", "dev", node.Uplink()); err != nil {
		t.Fatal(err)
	}
	if _, err := node.Exec(ctx, "ip", "route", "del", "198.19.1.0/24"); err != nil {
		t.Fatal(err)
	}
	c.Check(vips)
	w4, ok4 = find(c.Warnings(), "route/ipv4")
	if !ok4 || !strings.HasPrefix(w4.Message, "1 VIP has no usable route") || !strings.Contains(w4.Message, "198.19.2.10 (unreachable route)") {
		t.Errorf("after routing 198.19.1.0/24 through the /16: %+v", c.Warnings())
	}
}

// BenchmarkCheckRoutes measures a check of 10,000 VIPs in a lab node:
// "cold" decides every VIP (the first check, or one after the routes
// changed; in-process, the lab having the default rules), "cached" only
// lists the routes and rules.
func BenchmarkCheckRoutes(b *testing.B) {
	node := netlab.New(b, netlab.Spec{}).Node(1)
	var vips []netip.Addr
	for i := range 10000 {
		vips = append(vips, netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)}))
	}
	cfg := nodecheck.Config{NetNS: node.Path(), Needs: nodecheck.Needs{VIPRoutes: true}}
	b.Run("cold", func(b *testing.B) {
		for b.Loop() {
			nodecheck.New(hclog.NewNullLogger(), cfg).Check(vips)
		}
	})
	b.Run("cached", func(b *testing.B) {
		c := nodecheck.New(hclog.NewNullLogger(), cfg)
		c.Check(vips)
		for b.Loop() {
			c.Check(vips)
		}
	})
}
