package nodecheck

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/internal/testkit/syncbuf"
)

func TestEvaluateSysctls(t *testing.T) {
	want := required(Needs{Conntrack: true}, true)
	f := facts{sysctls: map[string]string{
		"net.ipv4.ip_forward":                  "0",
		"net.ipv6.conf.all.forwarding":         "1",
		"net.netfilter.nf_conntrack_acct":      "1",
		"net.netfilter.nf_conntrack_timestamp": "1",
		// nf_conntrack_events at its default of 2 is not enough.
		"net.netfilter.nf_conntrack_events": "2",
	}}
	got := evaluate(f, want, "ip netns exec node1 ")
	wantWarnings := []Warning{
		{
			Check:   "sysctl/net.ipv4.ip_forward",
			Message: "net.ipv4.ip_forward is 0, want 1: the node does not forward IPv4, so connections from pods through a VIP to a backend cannot leave it",
			Remedy:  "ip netns exec node1 sysctl -w net.ipv4.ip_forward=1 (or start vipd with --set-sysctls)",
		},
		{
			Check:   "sysctl/net.netfilter.nf_conntrack_events",
			Message: "net.netfilter.nf_conntrack_events is 2, want 1: flows that start while no WatchFlows stream is open never report their close",
			Remedy:  "ip netns exec node1 sysctl -w net.netfilter.nf_conntrack_events=1 (or start vipd with --set-sysctls)",
		},
	}
	if diff := cmp.Diff(wantWarnings, got); diff != "" {
		t.Errorf("warnings (-want +got):\n%s", diff)
	}

	// Conntrack not loaded: its sysctls do not exist.
	got = evaluate(facts{sysctls: map[string]string{"net.ipv4.ip_forward": "1"}}, required(Needs{Conntrack: true}, false), "")
	if len(got) != 3 || got[0].Check != "sysctl/net.netfilter.nf_conntrack_acct" ||
		!strings.Contains(got[0].Message, "netfilter conntrack is not loaded") ||
		got[0].Remedy != "modprobe nf_conntrack, then sysctl -w net.netfilter.nf_conntrack_acct=1 (or start vipd with --set-sysctls)" {
		t.Errorf("conntrack not loaded: %+v", got)
	}
}

func TestRequired(t *testing.T) {
	keys := func(rs []sysctlReq) []string {
		var k []string
		for _, r := range rs {
			k = append(k, r.key)
		}
		return k
	}
	for _, c := range []struct {
		needs   Needs
		hasIPv6 bool
		want    []string
	}{
		{Needs{}, false, []string{"net.ipv4.ip_forward"}},
		{Needs{}, true, []string{"net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"}},
		{Needs{Conntrack: true}, false, []string{"net.ipv4.ip_forward", "net.netfilter.nf_conntrack_acct",
			"net.netfilter.nf_conntrack_timestamp", "net.netfilter.nf_conntrack_events"}},
	} {
		if diff := cmp.Diff(c.want, keys(required(c.needs, c.hasIPv6))); diff != "" {
			t.Errorf("required(%+v, %v) (-want +got):\n%s", c.needs, c.hasIPv6, diff)
		}
	}
}

func TestEvaluateRoutes(t *testing.T) {
	routes := map[netip.Addr]string{netip.MustParseAddr("198.19.1.1"): ""}
	for i := range 7 {
		routes[netip.AddrFrom4([4]byte{198, 19, 0, byte(10 + i)})] = "no route"
	}
	routes[netip.MustParseAddr("fd00:198:ffff::a")] = "blackhole route"
	got := evaluate(facts{routes: routes}, nil, "")
	want := []Warning{
		{
			Check: "route/ipv4",
			Message: "7 VIPs have no usable route, so connections to them fail or hang before vipd's rules forward or reject them: " +
				"198.19.0.10 (no route), 198.19.0.11 (no route), 198.19.0.12 (no route), 198.19.0.13 (no route), 198.19.0.14 (no route) and 2 more",
			Remedy: "ip route add 198.19.0.0/27 dev <the node's uplink interface>, or a route (such as the default route) that covers the service CIDR; a blackhole, unreachable or prohibit route does not do",
		},
		{
			Check:   "route/ipv6",
			Message: "1 VIP has no usable route, so connections to them fail or hang before vipd's rules forward or reject them: fd00:198:ffff::a (blackhole route)",
			Remedy:  "ip -6 route add fd00:198:ffff::a/128 dev <the node's uplink interface>, or a route (such as the default route) that covers the service CIDR; a blackhole, unreachable or prohibit route does not do",
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("warnings (-want +got):\n%s", diff)
	}
	if got := evaluate(facts{routes: map[netip.Addr]string{netip.MustParseAddr("198.19.1.1"): ""}}, nil, ""); len(got) != 0 {
		t.Errorf("every VIP routed: %+v", got)
	}
}

func TestCovering(t *testing.T) {
	for _, c := range []struct {
		addrs []string
		want  string
	}{
		{[]string{"198.19.0.10"}, "198.19.0.10/32"},
		{[]string{"198.19.0.10", "198.19.0.11"}, "198.19.0.10/31"},
		{[]string{"198.19.0.1", "198.19.255.1"}, "198.19.0.0/16"},
		{[]string{"10.0.0.1", "198.19.0.1"}, "0.0.0.0/0"},
		{[]string{"fd00:198::1", "fd00:198:1::1"}, "fd00:198::/47"},
	} {
		var addrs []netip.Addr
		for _, a := range c.addrs {
			addrs = append(addrs, netip.MustParseAddr(a))
		}
		if got := covering(addrs).String(); got != c.want {
			t.Errorf("covering(%v) = %s, want %s", c.addrs, got, c.want)
		}
	}
}

func TestRemedyPrefix(t *testing.T) {
	for netns, want := range map[string]string{
		"":                 "",
		"/run/netns/node1": "ip netns exec node1 ",
		"/proc/42/ns/net":  "nsenter --net=/proc/42/ns/net ",
	} {
		if got := New(hclog.NewNullLogger(), Config{NetNS: netns}).remedyPrefix(); got != want {
			t.Errorf("remedyPrefix for %q = %q, want %q", netns, got, want)
		}
	}
}

// TestUpdateLogsTransitions checks that a warning is logged once when it
// appears, not again while it lasts, and once at info level when it
// clears, and that Since stays the time it first appeared.
func TestUpdateLogsTransitions(t *testing.T) {
	logs := &syncbuf.Buffer{}
	c := New(hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info}), Config{})
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c.now = func() time.Time { return clock }
	fwd := Warning{Check: "sysctl/net.ipv4.ip_forward", Message: "net.ipv4.ip_forward is 0", Remedy: "sysctl -w net.ipv4.ip_forward=1"}

	c.update([]Warning{fwd})
	first := clock
	clock = clock.Add(5 * time.Second)
	c.update([]Warning{fwd})
	if got := c.Warnings(); len(got) != 1 || !got[0].Since.Equal(first) {
		t.Fatalf("warnings %+v; want ip_forward since %v", got, first)
	}
	if n := strings.Count(logs.String(), "[WARN]  node prerequisite unmet: net.ipv4.ip_forward is 0: check=sysctl/net.ipv4.ip_forward remedy=\"sysctl -w net.ipv4.ip_forward=1\""); n != 1 {
		t.Errorf("the warning was logged %d times, want once:\n%s", n, logs)
	}
	clock = clock.Add(5 * time.Second)
	c.update(nil)
	if got := c.Warnings(); len(got) != 0 {
		t.Fatalf("warnings after clearing: %+v", got)
	}
	if !strings.Contains(logs.String(), "[INFO]  node prerequisite met again: check=sysctl/net.ipv4.ip_forward unmet_for=10s") {
		t.Errorf("no info line for the cleared warning:\n%s", logs)
	}
	c.update([]Warning{fwd})
	if got := c.Warnings(); len(got) != 1 || !got[0].Since.Equal(clock) {
		t.Errorf("a warning that comes back starts anew: %+v", got)
	}
}
