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

// TestVIPRouteLookupsBounded checks what a route check costs in kernel
// lookups: none while the rules are the default ones, however the routes
// change; only the VIPs a non-default rule may apply to otherwise; and at
// most the per-check bound when a rule applies to every VIP, the VIPs
// beyond it keeping their last answer until a later check looks them up.
// (It also checks that a rule with a mark does not defeat the cache.)
func TestVIPRouteLookupsBounded(t *testing.T) {
	node := netlab.New(t, netlab.Spec{}).Node(1)
	ctx := context.Background()
	ip := func(args ...string) {
		t.Helper()
		if _, err := node.Exec(ctx, "ip", args...); err != nil {
			t.Fatal(err)
		}
	}
	const n = 2000
	var vips []netip.Addr
	for i := range n {
		vips = append(vips, netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)}))
	}
	c := nodecheck.New(hclog.NewNullLogger(), nodecheck.Config{NetNS: node.Path(), Needs: nodecheck.Needs{VIPRoutes: true}})
	check := func(when string, wantGets int, wantMessage string) {
		t.Helper()
		before := c.RouteGets()
		c.Check(vips)
		if got := c.RouteGets() - before; got != wantGets {
			t.Errorf("%s: %d kernel route lookups, want %d", when, got, wantGets)
		}
		w, ok := find(c.Warnings(), "route/ipv4")
		switch {
		case wantMessage == "*":
		case wantMessage == "" && ok:
			t.Errorf("%s: %+v; want no route warning", when, w)
		case wantMessage != "" && (!ok || !strings.HasPrefix(w.Message, wantMessage)):
			t.Errorf("%s: %+v; want a route warning starting %q", when, c.Warnings(), wantMessage)
		}
	}
	check("default routes and rules", 0, "")
	ip("route", "add", "blackhole", "198.19.1.0/24")
	check("a blackhole route added", 0, "256 VIPs have no usable route")

	// A rule that may apply to 198.19.2.0/24 only: those VIPs are looked up.
	ip("rule", "add", "to", "198.19.2.0/24", "fwmark", "1", "lookup", "100", "pref", "100")
	check("a rule for 198.19.2.0/24", 256, "256 VIPs have no usable route")
	check("nothing changed", 0, "256 VIPs have no usable route")

	// A rule that may apply to every VIP: 300 lookups a check, until all
	// are known; meanwhile the others keep their answers.
	defer nodecheck.SetMaxRouteGets(300)()
	ip("rule", "add", "fwmark", "2", "lookup", "100", "pref", "101")
	for left := n; left > 0; left -= 300 {
		check("a rule for every VIP", min(left, 300), "256 VIPs have no usable route")
	}
	check("every VIP looked up", 0, "256 VIPs have no usable route")
	// Until its lookup, a VIP keeps the answer from before the change.
	ip("route", "del", "blackhole", "198.19.1.0/24")
	for left := n; left > 300; left -= 300 {
		check("the blackhole route removed", 300, "*")
	}
	check("the blackhole route removed, last lookups", n%300, "")
}
