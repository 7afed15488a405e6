package iptables_test

// Packets traced through the golden states, in iptablestest's kernel model.

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/vipd/vipd/dataplane"
	. "github.com/vipd/vipd/dataplane/iptables"
	. "github.com/vipd/vipd/dataplane/iptables/iptablestest"
)

// dests is a compact view of an outcome's destinations, for comparisons.
func dests(o Outcome) map[string]float64 {
	m := map[string]float64{}
	for _, d := range o.Destinations {
		k := d.Addr.String()
		if d.Masquerade {
			k += " masq"
		}
		m[k] = d.Probability
	}
	return m
}

var approx = cmpopts.EquateApprox(0, 1e-9)

func TestTrace(t *testing.T) {
	cases := map[string]*dataplane.State{}
	for _, tc := range goldenCases() {
		cases[tc.name] = tc.state
	}
	const client = "10.244.9.9"
	tcpTo := func(dst string, p uint16) Packet { return packet(client, dst, dataplane.TCP, p) }
	for _, tc := range []struct {
		name  string
		state string
		f     Family
		p     Packet
		want  Verdict
		dests map[string]float64
	}{
		{"one backend", "one-backend", IPv4, tcpTo("10.96.0.10", 80), DNAT, map[string]float64{"10.244.1.5:8080": 1}},
		{"weights 1,2,3", "weights", IPv4, tcpTo("10.96.0.11", 80), DNAT,
			map[string]float64{"10.244.1.1:8080": 1.0 / 6, "10.244.1.2:8080": 2.0 / 6, "10.244.1.3:8080": 3.0 / 6}},
		{"affinity without a hit picks at random", "affinity", IPv4, tcpTo("10.96.0.12", 80), DNAT,
			map[string]float64{"10.244.1.1:8080": 0.5, "10.244.1.2:8080": 0.5}},
		{"terminating only", "terminating-only", IPv4, tcpTo("10.96.0.13", 80), DNAT,
			map[string]float64{"10.244.1.1:8080": 0.5, "10.244.1.2:8080": 0.5}},
		{"ready wins over terminating, never not-serving", "not-serving-and-ready", IPv4, tcpTo("10.96.0.14", 80), DNAT,
			map[string]float64{"10.244.1.1:8080": 1}},
		{"local policy uses local ready backends", "local-with-local-backends", IPv4, tcpTo("10.96.0.15", 80), DNAT,
			map[string]float64{"10.244.1.2:8080": 1}},
		{"local policy without local backends rejects", "local-without-local-backends", IPv4, tcpTo("10.96.0.16", 80), Reject, nil},
		{"should be rejected when no endpoints exist", "no-backends", IPv4, tcpTo("10.96.0.17", 80), Reject, nil},
		{"rejected from the host too", "no-backends", IPv4, func() Packet { p := tcpTo("10.96.0.17", 80); p.Hook = HookOutput; return p }(), Reject, nil},
		{"undeclared port", "one-backend", IPv4, tcpTo("10.96.0.10", 81), NoMatch, nil},
		{"undeclared protocol", "one-backend", IPv4, packet(client, "10.96.0.10", dataplane.UDP, 80), NoMatch, nil},
		{"undeclared port of a service without backends", "no-backends", IPv4, tcpTo("10.96.0.17", 81), NoMatch, nil},
		{"not a VIP", "one-backend", IPv4, tcpTo("10.96.0.99", 80), NoMatch, nil},
		{"per-backend target port", "multi-port-override", IPv4, tcpTo("10.96.0.18", 80), DNAT,
			map[string]float64{"10.244.1.1:8081": 0.5, "10.244.1.2:8080": 0.5}},
		{"second port", "multi-port-override", IPv4, tcpTo("10.96.0.18", 9090), DNAT,
			map[string]float64{"10.244.1.1:9091": 0.5, "10.244.1.2:9091": 0.5}},
		{"sctp", "multi-port-override", IPv4, packet(client, "10.96.0.18", dataplane.SCTP, 3868), DNAT,
			map[string]float64{"10.244.1.1:3868": 0.5, "10.244.1.2:3868": 0.5}},
		{"udp", "tcp-udp-same-port", IPv4, packet(client, "10.96.0.53", dataplane.UDP, 53), DNAT, map[string]float64{"10.244.1.1:5353": 1}},
		{"tcp on the same port", "tcp-udp-same-port", IPv4, tcpTo("10.96.0.53", 53), DNAT, map[string]float64{"10.244.1.1:5353": 1}},
		{"dual stack over IPv4", "dual-stack", IPv4, tcpTo("10.96.0.20", 80), DNAT, map[string]float64{"10.244.1.1:8080": 1}},
		{"dual stack over IPv6", "dual-stack", IPv6, packet("fd00:244::9", "fd00:96::20", dataplane.TCP, 80), DNAT,
			map[string]float64{"[fd00:244::1]:8080": 1}},
		{"IPv6", "ipv6-only", IPv6, packet("fd00:244::9", "fd00:96::30", dataplane.TCP, 443), DNAT,
			map[string]float64{"[fd00:244::1]:8443": 0.5, "[fd00:244::2]:8443": 0.5}},
		{"IPv6 without backends", "ipv6-only", IPv6, packet("fd00:244::9", "fd00:96::31", dataplane.TCP, 80), Reject, nil},
		{"trie", "trie", IPv4, tcpTo("10.96.0.3", 80), DNAT, map[string]float64{"10.244.0.3:80": 1}},
		{"trie, inlined leaf", "trie", IPv4, tcpTo("192.168.0.1", 80), DNAT, map[string]float64{"10.244.0.5:80": 1}},
		{"reject trie", "trie", IPv4, tcpTo("10.96.5.2", 80), Reject, nil},
		{"IPv6 reject trie", "trie", IPv6, packet("fd00:244::9", "fd00:96::2", dataplane.TCP, 80), Reject, nil},
		{"hairpin is masqueraded", "one-backend", IPv4, packet("10.244.1.5", "10.96.0.10", dataplane.TCP, 80), DNAT,
			map[string]float64{"10.244.1.5:8080 masq": 1}},
		{"hairpin only on the branch back to the source", "weights", IPv4, packet("10.244.1.2", "10.96.0.11", dataplane.TCP, 80), DNAT,
			map[string]float64{"10.244.1.1:8080": 1.0 / 6, "10.244.1.2:8080 masq": 2.0 / 6, "10.244.1.3:8080": 3.0 / 6}},
		{"IPv6 hairpin", "ipv6-only", IPv6, packet("fd00:244::2", "fd00:96::30", dataplane.TCP, 443), DNAT,
			map[string]float64{"[fd00:244::1]:8443": 0.5, "[fd00:244::2]:8443 masq": 0.5}},
		{"hairpin with affinity", "affinity", IPv4, packet("10.244.1.1", "10.96.0.12", dataplane.TCP, 80), DNAT,
			map[string]float64{"10.244.1.1:8080 masq": 0.5, "10.244.1.2:8080": 0.5}},
		{"hairpin to a backend that another service shares", "shared-backends", IPv4, packet("10.244.1.2", "10.96.0.2", dataplane.TCP, 80), DNAT,
			map[string]float64{"10.244.1.2:8080 masq": 1.0 / 3, "10.244.1.3:8080": 1.0 / 3, "192.168.7.7:8080": 1.0 / 3}},
		{"a backend of another service is not masqueraded", "shared-backends", IPv4, packet("10.244.1.3", "10.96.0.1", dataplane.TCP, 80), DNAT,
			map[string]float64{"10.244.1.1:8080": 0.5, "10.244.1.2:8080": 0.5}},
		{"hairpin through the hairpin trie", "shared-backends", IPv4, packet("172.16.0.9", "10.96.0.3", dataplane.TCP, 80), DNAT,
			map[string]float64{"10.244.1.1:8080": 0.5, "172.16.0.9:8080 masq": 0.5}},
		{"IPv6 hairpin through the hairpin trie", "shared-backends", IPv6, packet("2001:db8::9", "fd00:96::3", dataplane.TCP, 80), DNAT,
			map[string]float64{"[2001:db8::9]:8080 masq": 0.5, "[fd00:244::1]:8080": 0.5}},
		{"a backend talking to itself without the VIP is left alone", "one-backend", IPv4, packet("10.244.1.5", "10.244.1.5", dataplane.TCP, 8080), NoMatch, nil},
		{"from the host, not masqueraded", "one-backend", IPv4, func() Packet {
			p := packet("192.168.1.1", "10.96.0.10", dataplane.TCP, 80)
			p.Hook = HookOutput
			return p
		}(), DNAT, map[string]float64{"10.244.1.5:8080": 1}},
		{"a backend serving only named ports gets its ports", "only-named-ports", IPv4, tcpTo("10.96.0.21", 80), DNAT,
			map[string]float64{"10.244.1.1:8080": 0.5, "10.244.1.2:8081": 0.5}},
		{"a backend serving only named ports gets no other port", "only-named-ports", IPv4, tcpTo("10.96.0.21", 9090), DNAT,
			map[string]float64{"10.244.1.1:9091": 1}},
		{"a backend serving only named ports gets no other UDP port", "only-named-ports", IPv4, packet(client, "10.96.0.21", dataplane.UDP, 53), DNAT,
			map[string]float64{"10.244.1.1:5353": 1}},
		{"ready backend of one port, terminating of the other: ready", "only-named-ports", IPv4, tcpTo("10.96.0.22", 80), DNAT,
			map[string]float64{"10.244.2.1:8080": 1}},
		{"terminating fallback per port", "only-named-ports", IPv4, tcpTo("10.96.0.22", 9000), DNAT,
			map[string]float64{"10.244.2.2:9000": 1}},
		{"a port whose only backend does not serve it rejects", "only-named-ports", IPv4, tcpTo("10.96.0.23", 81), Reject, nil},
		{"the other port of that service forwards", "only-named-ports", IPv4, tcpTo("10.96.0.23", 80), DNAT,
			map[string]float64{"10.244.3.1:8080": 1}},
		{"affinity to a backend that does not serve the port is not kept", "only-named-ports", IPv4, func() Packet {
			p := tcpTo("10.96.0.24", 81)
			p.Affinity = netip.MustParseAddr("10.244.4.2")
			return p
		}(), DNAT, map[string]float64{"10.244.4.1:8081": 1}},
		{"affinity on the port it serves", "only-named-ports", IPv4, func() Packet {
			p := tcpTo("10.96.0.24", 80)
			p.Affinity = netip.MustParseAddr("10.244.4.2")
			return p
		}(), DNAT, map[string]float64{"10.244.4.2:8080": 1}},
		{"hairpin from a backend that serves one port", "only-named-ports", IPv4, packet("10.244.1.2", "10.96.0.21", dataplane.TCP, 9090), DNAT,
			map[string]float64{"10.244.1.1:9091": 1}},
		{"hairpin back to a backend that serves one port", "only-named-ports", IPv4, packet("10.244.1.2", "10.96.0.21", dataplane.TCP, 80), DNAT,
			map[string]float64{"10.244.1.1:8080": 0.5, "10.244.1.2:8081 masq": 0.5}},
		{"the unnamed port by the empty name", "unnamed-port-by-empty-name", IPv4, tcpTo("10.96.0.25", 80), DNAT,
			map[string]float64{"10.244.5.1:8081": 0.5, "10.244.5.2:8082": 0.5}},
		{"affinity hit", "affinity", IPv4, func() Packet {
			p := tcpTo("10.96.0.12", 80)
			p.Affinity = netip.MustParseAddr("10.244.1.2")
			return p
		}(), DNAT, map[string]float64{"10.244.1.2:8080": 1}},
		{"IPv6 affinity hit", "ipv6-only", IPv6, func() Packet {
			p := packet("fd00:244::9", "fd00:96::30", dataplane.TCP, 443)
			p.Affinity = netip.MustParseAddr("fd00:244::1")
			return p
		}(), DNAT, map[string]float64{"[fd00:244::1]:8443": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := tracer(t, cases[tc.state], Options{}, tc.f)
			o := mustTrace(t, tr, tc.p)
			if o.Verdict != tc.want {
				t.Fatalf("verdict %v; want %v (%+v)", o.Verdict, tc.want, o)
			}
			if tc.dests == nil {
				tc.dests = map[string]float64{}
			}
			if diff := cmp.Diff(tc.dests, dests(o), approx); diff != "" {
				t.Errorf("destinations (-want +got):\n%s", diff)
			}
		})
	}
}
