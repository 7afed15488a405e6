package iptables

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/vipd/vipd/dataplane"
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

func TestTraceFailsLoudly(t *testing.T) {
	for _, rule := range []string{
		"-d 10.96.0.1/32 -j DROP",
		"-m foo -j VIPD-SERVICES",
		"-p tcp -m tcp --sport 80 -j RETURN",
		"-m tcp --dport 80 -j RETURN",
		"-p tcp -m tcp ! --dport 80 -j RETURN",
		"! -d 10.96.0.1/32 -j RETURN",
		"-m statistic --mode nth --every 2 -j RETURN",
		"-m recent --name x --mask 255.255.0.0 --rsource --rcheck -j RETURN",
		"-d fd00::1/128 -j RETURN",
		"-j DNAT --to-destination 10.0.0.1:80",
		"-j REJECT --reject-with icmp-port-unreachable",
		"-j VIPD-NOWHERE",
		"-j RETURN -d 10.0.0.1/32",
		`-m comment --comment "unterminated -j RETURN`,
		"-m mark --mark 0x20000/0x20000 -j RETURN",
		"-j MARK --set-xmark 0x20000/0x20000",
		"-m conntrack --ctstate ESTABLISHED -j RETURN",
		"-m conntrack --ctstate NEW,DNAT -j RETURN",
		"-m conntrack --ctstatus DNAT -j RETURN",
		"-j MASQUERADE --to-ports 1024",
		"-j CONNMARK --set-xmark 0x1/0x1",
		"-j CONNMARK --set-mark 0x400000",
	} {
		payload := "*nat\n:VIPD-X - [0:0]\n-A VIPD-X " + rule + "\nCOMMIT\n"
		if err := NewTracer(IPv4).Restore([]byte(payload)); err == nil {
			t.Errorf("Restore accepted %q", rule)
		}
	}
	for _, payload := range []string{
		"*nat\n-A PREROUTING -j RETURN\nCOMMIT\n", // not a vipd chain
		"*nat\n:VIPD-X - [0:0]\n",                 // no COMMIT
		"*nat\n-X VIPD-SERVICES\nCOMMIT\n",        // does not exist yet
		"*mangle\nCOMMIT\n",
		"*nat\n:VIPD-THIS-NAME-IS-LONGER-THAN-28 - [0:0]\nCOMMIT\n",
	} {
		if err := NewTracer(IPv4).Restore([]byte(payload)); err == nil {
			t.Errorf("Restore accepted %q", payload)
		}
	}
	// A chain that a hook still jumps to cannot be deleted.
	tr := tracer(t, state(), Options{}, IPv4)
	if err := tr.Restore([]byte("*nat\n:VIPD-SERVICES - [0:0]\n-X VIPD-SERVICES\nCOMMIT\n")); err == nil {
		t.Error("Restore deleted a hooked chain")
	}
	// Paths with different verdicts are an error, not a silent partial answer.
	tr = NewTracer(IPv4)
	if err := tr.Restore([]byte("*nat\n:VIPD-SERVICES - [0:0]\n-A VIPD-SERVICES -j CONNMARK --set-xmark 0x400000/0x400000\n-A VIPD-SERVICES -p tcp -m statistic --mode random --probability 0.5 -j DNAT --to-destination 10.0.0.1:80\nCOMMIT\n*filter\n:VIPD-REJECT - [0:0]\nCOMMIT\n*nat\n:VIPD-POSTROUTING - [0:0]\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	if o, err := tr.Trace(packet("10.0.0.2", "10.96.0.1", dataplane.TCP, 80)); err == nil {
		t.Errorf("Trace = %+v; want an error for mixed verdicts", o)
	}
	// Targets where the kernel refuses them, and a masquerade that no DNAT
	// asked for, are errors too.
	for name, rules := range map[string]struct{ services, postrouting string }{
		"MASQUERADE reached from PREROUTING": {"-j MASQUERADE --random-fully", ""},
		"DNAT reached from POSTROUTING":      {"", "-p tcp -m tcp -j DNAT --to-destination 10.0.0.1:80"},
		"MASQUERADE without DNAT":            {"", "-s 10.0.0.2/32 -j MASQUERADE --random-fully"},
		"DNAT without the flow mark":         {"-p tcp -m tcp -j DNAT --to-destination 10.0.0.1:80", ""},
	} {
		tr := NewTracer(IPv4)
		payload := "*nat\n:VIPD-SERVICES - [0:0]\n:VIPD-POSTROUTING - [0:0]\n"
		if rules.services != "" {
			payload += "-A VIPD-SERVICES " + rules.services + "\n"
		}
		if rules.postrouting != "" {
			payload += "-A VIPD-POSTROUTING " + rules.postrouting + "\n"
		}
		payload += "COMMIT\n*filter\n:VIPD-REJECT - [0:0]\nCOMMIT\n"
		if err := tr.Restore([]byte(payload)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if o, err := tr.Trace(packet("10.0.0.2", "10.96.0.1", dataplane.TCP, 80)); err == nil {
			t.Errorf("%s: Trace = %+v; want an error", name, o)
		}
	}
}

func TestTokenize(t *testing.T) {
	got, err := tokenize(`-m comment --comment "a b:c"  -j  X`)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"-m", "comment", "--comment", "a b:c", "-j", "X"}, got); diff != "" {
		t.Error(diff)
	}
}

// TestTrieScale checks that the dispatch trie keeps the walk short: 10,000
// VIPs per family, each traced to its own service, with few rules evaluated.
func TestTrieScale(t *testing.T) {
	const n = 10000
	rng := rand.New(rand.NewPCG(1, 2))
	svcs := make([]*dataplane.Service, 0, n)
	v4 := map[netip.Addr]bool{}
	for i := range n {
		var vip4 netip.Addr
		for !vip4.IsValid() || v4[vip4] {
			// Spread over a /12 service CIDR, like Kubernetes' default.
			x := 10<<24 | 96<<16 | rng.Uint32N(1<<20)
			vip4 = netip.AddrFrom4([4]byte{byte(x >> 24), byte(x >> 16), byte(x >> 8), byte(x)})
		}
		v4[vip4] = true
		vip6 := netip.MustParseAddr(fmt.Sprintf("fd00:96::%x:%x", i>>16, i&0xffff))
		svcs = append(svcs, service(fmt.Sprintf("svc-%05d", i), []string{vip4.String(), vip6.String()}, tcp(80, 8080),
			ready(fmt.Sprintf("10.%d.%d.%d", 100+i>>16, i>>8&0xff, i&0xff)),
			ready(fmt.Sprintf("fd00:244::%x", i))))
	}
	s := state(svcs...)
	rs := mustRender(t, s, Options{})
	for _, f := range families {
		tr := kernel(t, f, Payload(nil, rs, true, nil)[f].Restore)
		maxRules := 0
		client := map[Family]netip.Addr{IPv4: netip.MustParseAddr("10.250.0.1"), IPv6: netip.MustParseAddr("fd00:250::1")}[f]
		for i := 0; i < n; i += 37 {
			svc := svcs[i]
			vip, be := svc.VIPs[f], svc.Backends[f].IP
			// From a client, and from the backend itself (hairpin, which
			// walks the hairpin trie to its end).
			for _, src := range []netip.Addr{client, be} {
				o := mustTrace(t, tr, Packet{Src: src, Dst: vip, Protocol: dataplane.TCP, DstPort: 80})
				want := Destination{netip.AddrPortFrom(be, 8080), 1, src == be}
				if o.Verdict != DNAT || len(o.Destinations) != 1 || o.Destinations[0] != want {
					t.Fatalf("%s: %v from %v traced to %+v; want %+v", f, vip, src, o, want)
				}
				maxRules = max(maxRules, o.Rules)
			}
		}
		miss := map[Family]string{IPv4: "10.95.255.255", IPv6: "fd00:96::ffff:ffff"}[f]
		o := mustTrace(t, tr, Packet{Src: client, Dst: netip.MustParseAddr(miss), Protocol: dataplane.TCP, DstPort: 80})
		if o.Verdict != NoMatch {
			t.Errorf("%s: non-VIP %s traced to %+v", f, miss, o)
		}
		t.Logf("%s: %d chains in nat, at most %d rules evaluated per packet", f, len(rs.Chains(f, NAT)), maxRules)
		if maxRules >= 150 {
			t.Errorf("%s: a packet evaluated %d rules; want < 150", f, maxRules)
		}
	}
}

func TestTraceProbabilitiesAddUp(t *testing.T) {
	var bs []dataplane.Backend
	for i := range 50 {
		bs = append(bs, backend(fmt.Sprintf("10.244.0.%d", i+1), dataplane.BackendReady, uint16(i*7%13+1)))
	}
	tr := tracer(t, state(service("big", []string{"10.96.0.1"}, tcp(80, 80), bs...)), Options{}, IPv4)
	o := mustTrace(t, tr, packet("10.1.1.1", "10.96.0.1", dataplane.TCP, 80))
	total := 0
	for _, b := range bs {
		total += int(b.Weight)
	}
	sum := 0.0
	for i, d := range o.Destinations {
		sum += d.Probability
		if want := float64(bs[i].Weight) / float64(total); math.Abs(d.Probability-want) > 1e-9 {
			t.Errorf("%v: probability %v; want %v", d.Addr, d.Probability, want)
		}
	}
	if math.Abs(sum-1) > 1e-9 || o.Verdict != DNAT {
		t.Errorf("sum %v, verdict %v", sum, o.Verdict)
	}
}
