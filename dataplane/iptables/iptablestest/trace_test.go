package iptablestest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vipd/vipd/dataplane"
	. "github.com/vipd/vipd/dataplane/iptables"
)

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
		"! -i eth0 -j RETURN",
		"-j MARK --set-mark 0x800000",
	} {
		payload := "*nat\n:VIPD-X - [0:0]\n-A VIPD-X " + rule + "\nCOMMIT\n"
		if err := NewTracer(IPv4).Restore([]byte(payload)); err == nil {
			t.Errorf("Restore accepted %q", rule)
		}
	}
	// vipd's masquerade mark belongs to nat, DROP to filter.
	for _, rule := range []string{"-j MARK --set-xmark 0x800000/0x800000", "-p tcp -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable -j DROP"} {
		payload := "*filter\n:VIPD-X - [0:0]\n-A VIPD-X " + rule + "\nCOMMIT\n"
		if err := NewTracer(IPv4).Restore([]byte(payload)); err == nil {
			t.Errorf("Restore accepted %q in filter", rule)
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
	// A local process's packet has no in-interface.
	out := packet("10.0.0.2", "10.96.0.1", dataplane.TCP, 80)
	out.Hook, out.In = HookOutput, "eth0"
	if o, err := tr.Trace(out); err == nil {
		t.Errorf("Trace of an OUTPUT packet with an in-interface = %+v; want an error", o)
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

// TestTraceInterfaceMarkDrop checks the tracer's model of -i, vipd's
// masquerade mark and DROP on hand-written rules.
func TestTraceInterfaceMarkDrop(t *testing.T) {
	tr := NewTracer(IPv4)
	payload := "*nat\n:VIPD-SERVICES - [0:0]\n:VIPD-POSTROUTING - [0:0]\n" +
		"-A VIPD-SERVICES -d 10.96.0.1/32 -i eth0 -j MARK --set-xmark 0x800000/0x800000\n" +
		"-A VIPD-SERVICES -d 10.96.0.1/32 -j CONNMARK --set-xmark 0x400000/0x400000\n" +
		"-A VIPD-SERVICES -d 10.96.0.1/32 -p tcp -m tcp -j DNAT --to-destination 10.0.0.1:80\n" +
		"-A VIPD-POSTROUTING -m mark --mark 0x800000/0x800000 -j MASQUERADE --random-fully\n" +
		"COMMIT\n*filter\n:VIPD-REJECT - [0:0]\n-A VIPD-REJECT -d 10.96.0.2/32 -i eth0 -j DROP\nCOMMIT\n"
	if err := tr.Restore([]byte(payload)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		in, dst string
		hook    Hook
		want    Verdict
		masq    bool
	}{
		{"eth0", "10.96.0.1", HookPrerouting, DNAT, true},
		{"veth1", "10.96.0.1", HookPrerouting, DNAT, false},
		{"", "10.96.0.1", HookOutput, DNAT, false},
		{"eth0", "10.96.0.2", HookPrerouting, Drop, false},
		{"veth1", "10.96.0.2", HookPrerouting, NoMatch, false},
	} {
		p := packet("10.0.0.2", tc.dst, dataplane.TCP, 80)
		p.In, p.Hook = tc.in, tc.hook
		o := MustTrace(t, tr, p)
		if o.Verdict != tc.want || (tc.want == DNAT && o.Destinations[0].Masquerade != tc.masq) {
			t.Errorf("%s via %q: %+v; want %v, masquerade %v", tc.dst, tc.in, o, tc.want, tc.masq)
		}
	}
}
