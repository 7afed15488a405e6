package kubeproxy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var clusterCIDR = netip.MustParsePrefix("198.18.0.0/16")

// fillers returns n services ns-i/svc-i:http, VIPs 198.19.1.0 upwards (so
// that they never collide with the 198.19.0.x VIPs the tests use), each
// with eps endpoints from 198.18.200.0/24 that nothing listens on.
func fillers(n, eps int) []Service {
	svcs := make([]Service, n)
	for i := range svcs {
		v := 256 + i
		svcs[i] = Service{
			Namespace: fmt.Sprintf("ns-%d", i%97), Name: fmt.Sprintf("svc-%d", i), PortName: "http",
			VIP: netip.AddrFrom4([4]byte{198, 19, byte(v >> 8), byte(v)}), Port: 80, Protocol: "tcp",
		}
		for k := range eps {
			idx := i*eps + k
			svcs[i].Endpoints = append(svcs[i].Endpoints, fakeEndpoint(idx))
		}
	}
	return svcs
}

// fakeEndpoint returns a distinct endpoint in 198.18.200.0/24 for each idx:
// the port goes up by one each time the addresses wrap.
func fakeEndpoint(idx int) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, 200, byte(1 + idx%254)}), uint16(8080+idx/254))
}

// TestChainNames checks the hashes against chains every kube-proxy
// cluster has.
func TestChainNames(t *testing.T) {
	for _, tc := range []struct {
		svc  Service
		want string
	}{
		{Service{Namespace: "default", Name: "kubernetes", PortName: "https", Protocol: "TCP"}, "KUBE-SVC-NPX46M4PTMTKRN6Y"},
		{Service{Namespace: "kube-system", Name: "kube-dns", PortName: "dns", Protocol: "UDP"}, "KUBE-SVC-TCOU7JCQXEZGVUNU"},
		{Service{Namespace: "kube-system", Name: "kube-dns", PortName: "dns-tcp", Protocol: "TCP"}, "KUBE-SVC-ERIFXISQEP7F7OF4"},
	} {
		if got := tc.svc.SVCChain(); got != tc.want {
			t.Errorf("SVCChain(%s) = %s, want %s", tc.svc.portName(), got, tc.want)
		}
	}
	// kube-proxy's own proxier tests name ns1/svc1:p80's chains so.
	np := Service{Namespace: "ns1", Name: "svc1", PortName: "p80", Protocol: "TCP"}
	if got, want := np.EXTChain(), "KUBE-EXT-XPGD46QRK7WJZT7O"; got != want {
		t.Errorf("EXTChain(ns1/svc1:p80) = %s, want %s", got, want)
	}
	if got, want := np.SVCChain(), "KUBE-SVC-XPGD46QRK7WJZT7O"; got != want {
		t.Errorf("SVCChain(ns1/svc1:p80) = %s, want %s", got, want)
	}
	s := Service{Namespace: "ns", Name: "a", PortName: "http", Protocol: "tcp"}
	e1, e2 := netip.MustParseAddrPort("198.18.1.10:8080"), netip.MustParseAddrPort("198.18.1.11:8080")
	if a, b := s.SEPChain(e1), s.SEPChain(e2); a == b || len(a) != len("KUBE-SEP-")+16 || !strings.HasPrefix(a, "KUBE-SEP-") {
		t.Errorf("SEPChain: %s and %s, want two distinct KUBE-SEP-<16 chars>", a, b)
	}
}

func TestProbability(t *testing.T) {
	for n, want := range map[int]string{2: "0.5000000000", 3: "0.3333333333", 5: "0.2000000000", 7: "0.1428571429"} {
		if got := probability(n); got != want {
			t.Errorf("probability(%d) = %s, want %s", n, got, want)
		}
	}
}

// section returns the lines of table's section of payload, without the
// *table and COMMIT lines.
func section(t *testing.T, payload []byte, table string) []string {
	t.Helper()
	var out []string
	in := false
	for _, l := range strings.Split(string(payload), "\n") {
		switch {
		case l == "*"+table:
			in = true
		case in && l == "COMMIT":
			return out
		case in:
			out = append(out, l)
		}
	}
	t.Fatalf("no complete *%s section in:\n%s", table, payload)
	return nil
}

// TestFullGolden pins the exact nat and filter rules of one service with
// two endpoints and one without.
func TestFullGolden(t *testing.T) {
	svcs := []Service{
		{Namespace: "ns", Name: "web", PortName: "http", VIP: netip.MustParseAddr("198.19.0.10"), Port: 80, Protocol: "tcp",
			Endpoints: []netip.AddrPort{netip.MustParseAddrPort("198.18.1.10:8080"), netip.MustParseAddrPort("198.18.1.11:8080")}},
		{Namespace: "ns", Name: "empty", PortName: "dns", VIP: netip.MustParseAddr("198.19.0.11"), Port: 53, Protocol: "UDP"},
	}
	svc, sep1, sep2 := svcs[0].SVCChain(), svcs[0].SEPChain(svcs[0].Endpoints[0]), svcs[0].SEPChain(svcs[0].Endpoints[1])
	payload := Full(svcs, clusterCIDR)

	wantNAT := []string{
		":KUBE-SERVICES - [0:0]",
		":KUBE-NODEPORTS - [0:0]",
		":KUBE-POSTROUTING - [0:0]",
		":KUBE-MARK-MASQ - [0:0]",
		":" + svc + " - [0:0]",
		":" + sep1 + " - [0:0]",
		":" + sep2 + " - [0:0]",
		`-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
		`-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
		`-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING`,
		"-A KUBE-POSTROUTING -m mark ! --mark 0x00004000/0x00004000 -j RETURN",
		"-A KUBE-POSTROUTING -j MARK --xor-mark 0x00004000",
		`-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`,
		"-A KUBE-MARK-MASQ -j MARK --or-mark 0x00004000",
		`-A KUBE-SERVICES -m comment --comment "ns/web:http cluster IP" -m tcp -p tcp -d 198.19.0.10 --dport 80 -j ` + svc,
		"-A " + svc + ` -m comment --comment "ns/web:http cluster IP" -m tcp -p tcp -d 198.19.0.10 --dport 80 ! -s 198.18.0.0/16 -j KUBE-MARK-MASQ`,
		"-A " + svc + ` -m comment --comment "ns/web:http -> 198.18.1.10:8080" -m statistic --mode random --probability 0.5000000000 -j ` + sep1,
		"-A " + svc + ` -m comment --comment "ns/web:http -> 198.18.1.11:8080" -j ` + sep2,
		"-A " + sep1 + " -m comment --comment ns/web:http -s 198.18.1.10 -j KUBE-MARK-MASQ",
		"-A " + sep1 + " -m comment --comment ns/web:http -m tcp -p tcp -j DNAT --to-destination 198.18.1.10:8080",
		"-A " + sep2 + " -m comment --comment ns/web:http -s 198.18.1.11 -j KUBE-MARK-MASQ",
		"-A " + sep2 + " -m comment --comment ns/web:http -m tcp -p tcp -j DNAT --to-destination 198.18.1.11:8080",
		`-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS`,
	}
	if diff := cmp.Diff(wantNAT, section(t, payload, "nat")); diff != "" {
		t.Errorf("nat section (-want +got):\n%s", diff)
	}
	reject := `-A KUBE-SERVICES -m comment --comment "ns/empty:dns has no endpoints" -m udp -p udp -d 198.19.0.11 --dport 53 -j REJECT`
	if n := strings.Count(string(payload), reject+"\n"); n != 1 {
		t.Errorf("filter has %d copies of %q, want 1", n, reject)
	}
	if i, j := strings.Index(string(payload), "*filter"), strings.Index(string(payload), "*nat"); i != 0 || j < i {
		t.Errorf("want *filter first and *nat second, as kube-proxy writes them")
	}
}

// TestNodePortGolden pins the external half kube-proxy renders for a
// NodePort service (policy Cluster) with one endpoint, and the filter
// reject of a NodePort service without endpoints.
func TestNodePortGolden(t *testing.T) {
	svcs := []Service{
		{Namespace: "ns", Name: "web", PortName: "http", VIP: netip.MustParseAddr("198.19.0.10"), Port: 80, NodePort: 30080, Protocol: "tcp",
			Endpoints: []netip.AddrPort{netip.MustParseAddrPort("198.18.1.10:8080")}},
		{Namespace: "ns", Name: "empty", PortName: "dns", VIP: netip.MustParseAddr("198.19.0.11"), Port: 53, NodePort: 30053, Protocol: "UDP"},
	}
	svc, ext, sep := svcs[0].SVCChain(), svcs[0].EXTChain(), svcs[0].SEPChain(svcs[0].Endpoints[0])
	payload := Full(svcs, clusterCIDR)
	wantNAT := []string{
		":KUBE-SERVICES - [0:0]",
		":KUBE-NODEPORTS - [0:0]",
		":KUBE-POSTROUTING - [0:0]",
		":KUBE-MARK-MASQ - [0:0]",
		":" + svc + " - [0:0]",
		":" + ext + " - [0:0]",
		":" + sep + " - [0:0]",
		`-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
		`-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
		`-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING`,
		"-A KUBE-POSTROUTING -m mark ! --mark 0x00004000/0x00004000 -j RETURN",
		"-A KUBE-POSTROUTING -j MARK --xor-mark 0x00004000",
		`-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`,
		"-A KUBE-MARK-MASQ -j MARK --or-mark 0x00004000",
		`-A KUBE-SERVICES -m comment --comment "ns/web:http cluster IP" -m tcp -p tcp -d 198.19.0.10 --dport 80 -j ` + svc,
		"-A KUBE-NODEPORTS -m comment --comment ns/web:http -m tcp -p tcp --dport 30080 -j " + ext,
		"-A " + svc + ` -m comment --comment "ns/web:http cluster IP" -m tcp -p tcp -d 198.19.0.10 --dport 80 ! -s 198.18.0.0/16 -j KUBE-MARK-MASQ`,
		"-A " + ext + ` -m comment --comment "masquerade traffic for ns/web:http external destinations" -j KUBE-MARK-MASQ`,
		"-A " + ext + " -j " + svc,
		"-A " + svc + ` -m comment --comment "ns/web:http -> 198.18.1.10:8080" -j ` + sep,
		"-A " + sep + " -m comment --comment ns/web:http -s 198.18.1.10 -j KUBE-MARK-MASQ",
		"-A " + sep + " -m comment --comment ns/web:http -m tcp -p tcp -j DNAT --to-destination 198.18.1.10:8080",
		`-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS`,
	}
	if diff := cmp.Diff(wantNAT, section(t, payload, "nat")); diff != "" {
		t.Errorf("nat section (-want +got):\n%s", diff)
	}
	filter := section(t, payload, "filter")
	for _, want := range []string{
		`-A KUBE-SERVICES -m comment --comment "ns/empty:dns has no endpoints" -m udp -p udp -d 198.19.0.11 --dport 53 -j REJECT`,
		`-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns/empty:dns has no endpoints" -m addrtype --dst-type LOCAL -m udp -p udp --dport 30053 -j REJECT`,
	} {
		if n := strings.Count(strings.Join(filter, "\n")+"\n", want+"\n"); n != 1 {
			t.Errorf("filter has %d copies of %q, want 1", n, want)
		}
	}

	// A partial sync of another service keeps web's KUBE-NODEPORTS rule
	// (the chain is rewritten) but not its KUBE-EXT chain; emptying web
	// deletes its KUBE-EXT chain with its KUBE-SVC chain.
	other := append(slices.Clone(svcs), Service{Namespace: "ns", Name: "other", PortName: "http", VIP: netip.MustParseAddr("198.19.0.12"), Port: 80, Protocol: "tcp",
		Endpoints: []netip.AddrPort{netip.MustParseAddrPort("198.18.1.12:8080")}})
	nat := strings.Join(section(t, Partial(other, 2, nil, clusterCIDR), "nat"), "\n")
	if !strings.Contains(nat, "-A KUBE-NODEPORTS -m comment --comment ns/web:http -m tcp -p tcp --dport 30080 -j "+ext) || strings.Contains(nat, ":"+ext) {
		t.Errorf("partial sync of another service: want web's KUBE-NODEPORTS rule and no %s declaration; got\n%s", ext, nat)
	}
	old := svcs[0].Endpoints
	emptied := slices.Clone(svcs)
	emptied[0].Endpoints = nil
	nat = strings.Join(section(t, Partial(emptied, 0, old, clusterCIDR), "nat"), "\n")
	for _, want := range []string{"-X " + svc, "-X " + ext, "-X " + sep} {
		if !strings.Contains(nat, want) {
			t.Errorf("partial sync that empties web: no %q in\n%s", want, nat)
		}
	}
	if strings.Contains(nat, "KUBE-NODEPORTS -m") {
		t.Errorf("partial sync that empties web kept a KUBE-NODEPORTS rule:\n%s", nat)
	}
}

// counts tallies a section's chain declarations and its rules per chain.
type counts struct {
	decls  int
	rules  map[string]int // by chain prefix: KUBE-SVC-, KUBE-SEP- or the full name
	delete int
}

func count(t *testing.T, payload []byte, table string) counts {
	t.Helper()
	c := counts{rules: map[string]int{}}
	for _, l := range section(t, payload, table) {
		f := strings.Fields(l)
		switch {
		case strings.HasPrefix(l, ":"):
			c.decls++
		case f[0] == "-X":
			c.delete++
		case f[0] == "-A":
			chain := f[1]
			for _, p := range []string{"KUBE-SVC-", "KUBE-SEP-"} {
				if strings.HasPrefix(chain, p) {
					chain = p
				}
			}
			c.rules[chain]++
		default:
			t.Fatalf("unexpected line %q", l)
		}
	}
	return c
}

// TestCounts checks the shape of Full and Partial for 3 services with 2
// endpoints each.
func TestCounts(t *testing.T) {
	svcs := fillers(3, 2)
	full := Full(svcs, clusterCIDR)
	nat := count(t, full, "nat")
	// 4 top-level chains, then 1 SVC + 2 SEP chains per service.
	if want := 4 + 3*3; nat.decls != want {
		t.Errorf("Full: %d nat chain lines, want %d", nat.decls, want)
	}
	wantNAT := map[string]int{
		"KUBE-SERVICES": 3 + 1, "KUBE-POSTROUTING": 3, "KUBE-MARK-MASQ": 1,
		"PREROUTING": 1, "OUTPUT": 1, "POSTROUTING": 1,
		"KUBE-SVC-": 3 * (1 + 2), "KUBE-SEP-": 3 * 2 * 2,
	}
	if diff := cmp.Diff(wantNAT, nat.rules); diff != "" {
		t.Errorf("Full: nat rules per chain (-want +got):\n%s", diff)
	}
	filter := count(t, full, "filter")
	wantFilter := map[string]int{
		"INPUT": 4, "FORWARD": 4, "OUTPUT": 3,
		"KUBE-FIREWALL": 1, "KUBE-FORWARD": 3,
	}
	if diff := cmp.Diff(wantFilter, filter.rules); diff != "" || filter.decls != 6 {
		t.Errorf("Full: %d filter chains (want 6); rules per chain (-want +got):\n%s", filter.decls, diff)
	}

	// Service 1 loses its second endpoint and gains a new one.
	old := svcs[1].Endpoints
	svcs[1].Endpoints = []netip.AddrPort{old[0], netip.MustParseAddrPort("198.18.201.1:8080")}
	partial := Partial(svcs, 1, old, clusterCIDR)
	nat = count(t, partial, "nat")
	// 4 top-level, the changed SVC, its 2 current SEPs, the stale SEP.
	if nat.decls != 4+1+2+1 || nat.delete != 1 {
		t.Errorf("Partial: %d nat chain lines and %d -X, want 8 and 1", nat.decls, nat.delete)
	}
	wantNAT = map[string]int{
		"KUBE-SERVICES": 3 + 1, "KUBE-POSTROUTING": 3, "KUBE-MARK-MASQ": 1,
		"KUBE-SVC-": 1 + 2, "KUBE-SEP-": 2 * 2,
	}
	if diff := cmp.Diff(wantNAT, nat.rules); diff != "" {
		t.Errorf("Partial: nat rules per chain (-want +got):\n%s", diff)
	}
	if want := "-X " + svcs[1].SEPChain(old[1]) + "\n"; !strings.Contains(string(partial), want) {
		t.Errorf("Partial lacks %q", want)
	}
	if filter := count(t, partial, "filter"); filter.rules["INPUT"] != 0 || filter.rules["KUBE-FORWARD"] != 3 {
		t.Errorf("Partial filter: %v, want kube-proxy's chains rewritten and no hooks", filter.rules)
	}

	// All endpoints gone: the SVC chain goes too, and the VIP is rejected.
	svcs[1].Endpoints = nil
	partial = Partial(svcs, 1, old, clusterCIDR)
	if nat := count(t, partial, "nat"); nat.delete != 3 || nat.rules["KUBE-SERVICES"] != 2+1 {
		t.Errorf("Partial to no endpoints: %d -X and %d KUBE-SERVICES rules, want 3 and 3", nat.delete, nat.rules["KUBE-SERVICES"])
	}
	if filter := count(t, partial, "filter"); filter.rules["KUBE-SERVICES"] != 1 {
		t.Errorf("Partial to no endpoints: %d filter KUBE-SERVICES rules, want 1 REJECT", filter.rules["KUBE-SERVICES"])
	}
}

// TestLargeClusterMode checks that above 1000 endpoints the SVC→SEP and
// SEP rules lose their comments, as kube-proxy's do.
func TestLargeClusterMode(t *testing.T) {
	small := string(Full(fillers(500, 2), clusterCIDR))
	large := string(Full(fillers(501, 2), clusterCIDR))
	if !strings.Contains(small, "-m comment --comment ns-0/svc-0:http -s ") {
		t.Error("1000 endpoints: SEP rules have no comment")
	}
	for _, l := range strings.Split(large, "\n") {
		if strings.HasPrefix(l, "-A KUBE-SEP-") && strings.Contains(l, "comment") ||
			strings.HasPrefix(l, "-A KUBE-SVC-") && strings.Contains(l, "->") {
			t.Fatalf("1002 endpoints: rule keeps its comment: %s", l)
		}
	}
	if !strings.Contains(large, `--comment "ns-0/svc-0:http cluster IP"`) {
		t.Error("1002 endpoints: cluster IP rules lost their comment, kube-proxy keeps it")
	}
}

func TestFailureContext(t *testing.T) {
	payload := []byte("*nat\n:A - [0:0]\n-A A -j RETURN\n-A B -j RETURN\nCOMMIT\n")
	got := failureContext(payload, "iptables-nft-restore: line 4 failed")
	want := "  1: *nat\n  2: :A - [0:0]\n  3: -A A -j RETURN\n> 4: -A B -j RETURN\n  5: COMMIT\n"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("failureContext (-want +got):\n%s", diff)
	}
	if got := failureContext(payload, "iptables-nft-restore: unknown option"); got != "" {
		t.Errorf("failureContext without a line number = %q, want \"\"", got)
	}
}
