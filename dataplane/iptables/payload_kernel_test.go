package iptables_test

// The payloads, applied in turn to iptablestest's kernel model, leave it
// holding exactly the rendered chains, and packets go where they should.
// These tests are external: package iptables cannot use iptablestest, which
// imports it; export_test.go lends them the in-package fixtures.

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vipd/vipd/dataplane"
	. "github.com/vipd/vipd/dataplane/iptables"
	. "github.com/vipd/vipd/dataplane/iptables/iptablestest"
)

// changes reads a payload back: per table, the chains it rewrites and the
// chains it deletes, sorted.
func changes(t *testing.T, payload []byte) (rewritten, deleted map[Table][]string) {
	t.Helper()
	rewritten, deleted = map[Table][]string{}, map[Table][]string{}
	var tab Table
	lastAppend, firstDelete := map[Table]int{}, map[Table]int{}
	for i, line := range strings.Split(string(payload), "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			tab = Table(line[1:])
		case strings.HasPrefix(line, ":"):
			rewritten[tab] = append(rewritten[tab], strings.Fields(line[1:])[0])
		case strings.HasPrefix(line, "-A "):
			lastAppend[tab] = i
		case strings.HasPrefix(line, "-X "):
			deleted[tab] = append(deleted[tab], line[3:])
			if _, ok := firstDelete[tab]; !ok {
				firstDelete[tab] = i
			}
		}
	}
	for tab, del := range deleted {
		rewritten[tab] = slices.DeleteFunc(rewritten[tab], func(n string) bool { return slices.Contains(del, n) })
		if firstDelete[tab] < lastAppend[tab] {
			t.Errorf("%s: -X before the last -A", tab)
		}
	}
	for _, m := range []map[Table][]string{rewritten, deleted} {
		for tab, names := range m {
			if slices.Sort(names); len(names) == 0 {
				delete(m, tab)
			}
		}
	}
	return rewritten, deleted
}

// svcChainOf is the SVC chain that the dispatch rule for vip:80/tcp jumps to.
func svcChainOf(t *testing.T, rs *Ruleset, vip string) string {
	t.Helper()
	prefix := "-d " + vip + "/32 -p tcp -m tcp --dport 80 "
	for _, name := range rs.Chains(IPv4, NAT) {
		for _, r := range rs.Rules(IPv4, NAT, name) {
			if strings.HasPrefix(r, prefix) {
				_, target, _ := strings.Cut(r, " -j ")
				return target
			}
		}
	}
	t.Fatalf("no dispatch rule for %s", vip)
	return ""
}

// ownChains is svcChain and the chains it jumps to.
func ownChains(rs *Ruleset, svcChain string) []string {
	own := []string{svcChain}
	for _, r := range rs.Rules(IPv4, NAT, svcChain) {
		target := r[strings.LastIndex(r, "-j ")+3:]
		if strings.HasPrefix(target, ChainPrefix) && !slices.Contains(own, target) {
			own = append(own, target)
		}
	}
	slices.Sort(own)
	return own
}

// hairpinLeaves are the hairpin trie chains that hold the rules for ips.
func hairpinLeaves(rs *Ruleset, ips ...string) []string {
	var leaves []string
	for _, ip := range ips {
		path := triePath(rs, NAT, chainHairpin, netip.MustParseAddr(ip))
		leaves = append(leaves, path[len(path)-1])
	}
	slices.Sort(leaves)
	return slices.Compact(leaves)
}

// triePath is the chains a packet to vip walks from root, read from the rules.
func triePath(rs *Ruleset, tab Table, root string, vip netip.Addr) []string {
	path := []string{root}
	for chain := root; chain != ""; {
		next := ""
		for _, r := range rs.Rules(IPv4, tab, chain) {
			var p, target string
			if n, _ := fmt.Sscanf(r, "-d %s -j %s", &p, &target); n == 2 && strings.HasPrefix(target, "VIPD-") &&
				netip.MustParsePrefix(p).Contains(vip) && strings.Count(r, " ") == 3 {
				next = target
				path = append(path, next)
				break
			}
		}
		chain = next
	}
	return path
}

// TestPayloadAddBackend: a backend added to a service without affinity
// rewrites its one SVC chain, plus the hairpin trie chain that holds the
// backend's address if no other service has that backend.
func TestPayloadAddBackend(t *testing.T) {
	base := baseServices(1000)
	old := mustRender(t, withServices(base), Options{})
	for _, tc := range []struct {
		name, ip   string
		newAddress bool
	}{
		{"new address", "10.246.0.1", true},
		{"address of another service's backend", "10.244.0.1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			changed := service("svc-0500", []string{"10.96.2.1"}, tcp(80, 8080), append(slices.Clone(base["svc-0500"].Backends), ready(tc.ip))...)
			next, err := Render(withServices(base, changed), Options{}, old)
			if err != nil {
				t.Fatal(err)
			}

			u := Payload(old, next, false, nil)
			rewritten, deleted := changes(t, u[IPv4].Restore)
			svcChain := svcChainOf(t, next, "10.96.2.1")
			if own := ownChains(next, svcChain); len(own) != 1 {
				t.Errorf("the SVC chain jumps to other chains: %v", own)
			}
			want := []string{svcChain}
			if tc.newAddress {
				want = append(want, hairpinLeaves(next, tc.ip)...)
			}
			slices.Sort(want)
			if diff := cmp.Diff(map[Table][]string{NAT: want}, rewritten); diff != "" || len(deleted) != 0 {
				t.Errorf("rewritten (-want +got):\n%s\ndeleted %v", diff, deleted)
			}
			rules := 0
			for _, name := range want {
				rules += len(next.Rules(IPv4, NAT, name))
			}
			if u[IPv4].Stats != (Stats{ChainsRewritten: len(want), RulesWritten: rules}) || u[IPv6].Restore != nil {
				t.Errorf("stats %+v, IPv6 payload %q", u[IPv4].Stats, u[IPv6].Restore)
			}
			tr := kernel(t, IPv4, Payload(nil, old, true, nil)[IPv4].Restore, u[IPv4].Restore)
			assertKernel(t, tr, next, IPv4)
			o := mustTrace(t, tr, packet("10.1.1.1", "10.96.2.1", dataplane.TCP, 80))
			if len(o.Destinations) != 3 {
				t.Errorf("after the update: %+v", o)
			}
			// Hairpin: masqueraded exactly when it comes back to itself.
			o = mustTrace(t, tr, packet(tc.ip, "10.96.2.1", dataplane.TCP, 80))
			masq := 0
			for _, d := range o.Destinations {
				if d.Masquerade != (d.Addr.Addr().String() == tc.ip) {
					t.Errorf("hairpin from the new backend: %+v", o)
				}
				if d.Masquerade {
					masq++
				}
			}
			if len(o.Destinations) != 3 || masq != 1 {
				t.Errorf("hairpin from the new backend: %+v", o)
			}
		})
	}
}

func TestPayloadAddService(t *testing.T) {
	base := baseServices(1000)
	old := mustRender(t, withServices(base), Options{})
	vip := netip.MustParseAddr("10.96.3.251")
	next := mustRender(t, withServices(base, service("new", []string{vip.String()}, tcp(80, 8080), ready("10.247.0.1"), ready("10.247.0.2"))), Options{})

	u := Payload(old, next, false, nil)
	rewritten, deleted := changes(t, u[IPv4].Restore)
	path := triePath(next, NAT, chainServices, vip)
	hairpin := slices.Concat(triePath(next, NAT, chainHairpin, netip.MustParseAddr("10.247.0.1")),
		triePath(next, NAT, chainHairpin, netip.MustParseAddr("10.247.0.2")))
	own := ownChains(next, svcChainOf(t, next, vip.String()))
	if len(path) < 3 {
		t.Fatalf("path %v: the test wants a deep trie", path)
	}
	for _, name := range rewritten[NAT] {
		if !slices.Contains(path, name) && !slices.Contains(own, name) && !slices.Contains(hairpin, name) {
			t.Errorf("rewrote %s, which is on neither the dispatch path %v nor the hairpin paths %v, nor the service's own", name, path, hairpin)
		}
	}
	for _, name := range slices.Concat(own, path[len(path)-1:], hairpinLeaves(next, "10.247.0.1", "10.247.0.2")) {
		if !slices.Contains(rewritten[NAT], name) {
			t.Errorf("did not rewrite %s", name)
		}
	}
	if len(deleted) != 0 || len(rewritten[Filter]) != 0 {
		t.Errorf("deleted %v, filter rewritten %v", deleted, rewritten[Filter])
	}
	t.Logf("path %v; rewritten %v", path, rewritten[NAT])
	assertKernel(t, kernel(t, IPv4, Payload(nil, old, true, nil)[IPv4].Restore, u[IPv4].Restore), next, IPv4)
}

func TestPayloadRemoveService(t *testing.T) {
	base := baseServices(1000)
	old := mustRender(t, withServices(base), Options{})
	own := ownChains(old, svcChainOf(t, old, "10.96.2.1"))
	leaf := triePath(old, NAT, chainServices, netip.MustParseAddr("10.96.2.1"))
	// Its backends are its own, so their hairpin rules go too.
	hairpin := hairpinLeaves(old, "10.244.2.1", "10.245.2.1")
	next := withServices(base)
	delete(next.Services, "svc-0500")
	rs := mustRender(t, next, Options{})

	u := Payload(old, rs, false, nil)
	rewritten, deleted := changes(t, u[IPv4].Restore)
	if diff := cmp.Diff(map[Table][]string{NAT: own}, deleted); diff != "" {
		t.Errorf("deleted (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[Table][]string{NAT: slices.Sorted(slices.Values(append(hairpin, leaf[len(leaf)-1])))}, rewritten); diff != "" {
		t.Errorf("rewritten (-want +got):\n%s", diff)
	}
	// The kernel model refuses -X of a chain that is still referenced.
	tr := kernel(t, IPv4, Payload(nil, old, true, nil)[IPv4].Restore, u[IPv4].Restore)
	assertKernel(t, tr, rs, IPv4)
	if o := mustTrace(t, tr, packet("10.1.1.1", "10.96.2.1", dataplane.TCP, 80)); o.Verdict != NoMatch {
		t.Errorf("removed service traced to %+v", o)
	}
}

func TestPayloadFirstBackend(t *testing.T) {
	base := baseServices(100)
	empty := service("grow", []string{"10.96.0.200"}, tcp(80, 8080))
	old := mustRender(t, withServices(base, empty), Options{})
	grown := service("grow", []string{"10.96.0.200"}, tcp(80, 8080), ready("10.247.0.1"))
	next := mustRender(t, withServices(base, grown), Options{})

	tr := kernel(t, IPv4, Payload(nil, old, true, nil)[IPv4].Restore)
	p := packet("10.1.1.1", "10.96.0.200", dataplane.TCP, 80)
	if o := mustTrace(t, tr, p); o.Verdict != Reject {
		t.Fatalf("before: %+v", o)
	}
	u := Payload(old, next, false, nil)
	rewritten, deleted := changes(t, u[IPv4].Restore)
	own := ownChains(next, svcChainOf(t, next, "10.96.0.200"))
	want := map[Table][]string{
		NAT: slices.Sorted(slices.Values(slices.Concat(own, triePath(next, NAT, chainServices, netip.MustParseAddr("10.96.0.200"))[1:2],
			hairpinLeaves(next, "10.247.0.1")))),
		Filter: {chainReject},
	}
	if diff := cmp.Diff(want, rewritten); diff != "" || len(deleted) != 0 {
		t.Errorf("rewritten (-want +got):\n%s\ndeleted %v", diff, deleted)
	}
	if err := tr.Restore(u[IPv4].Restore); err != nil {
		t.Fatal(err)
	}
	assertKernel(t, tr, next, IPv4)
	if o := mustTrace(t, tr, p); o.Verdict != DNAT {
		t.Errorf("after: %+v", o)
	}
	// And back: the last backend goes, the chains go, the REJECT returns.
	u = Payload(next, old, false, nil)
	if _, deleted := changes(t, u[IPv4].Restore); !slices.Equal(deleted[NAT], own) {
		t.Errorf("deleted %v; want %v", deleted[NAT], own)
	}
	if err := tr.Restore(u[IPv4].Restore); err != nil {
		t.Fatal(err)
	}
	if o := mustTrace(t, tr, p); o.Verdict != Reject {
		t.Errorf("after removing the backend: %+v", o)
	}
}

// save writes the kernel model in iptables-save syntax, with a foreign chain.
func save(tr *Tracer) []byte {
	var b strings.Builder
	for _, tab := range tables {
		fmt.Fprintf(&b, "# Generated by iptables-save\n*%s\n:OUTPUT ACCEPT [12:720]\n:KUBE-SERVICES - [0:0]\n", tab)
		chains := tr.Chains(tab)
		for _, name := range slices.Sorted(maps.Keys(chains)) {
			fmt.Fprintf(&b, ":%s - [3:180]\n", name)
		}
		for _, name := range slices.Sorted(maps.Keys(chains)) {
			for _, r := range chains[name] {
				fmt.Fprintf(&b, "-A %s %s\n", name, r)
			}
		}
		b.WriteString("COMMIT\n")
	}
	return []byte(b.String())
}

func TestPayloadFull(t *testing.T) {
	base := baseServices(50)
	old := mustRender(t, withServices(base), Options{})
	tr := kernel(t, IPv4, Payload(nil, old, true, nil)[IPv4].Restore, []byte(`*nat
:VIPD-SVC-STALE - [0:0]
:VIPD-SEP-STALE - [0:0]
-A VIPD-SVC-STALE -j VIPD-SEP-STALE
-A VIPD-SEP-STALE -p tcp -m tcp -j DNAT --to-destination 10.9.9.9:80
COMMIT
*filter
:VIPD-R4-STALE - [0:0]
COMMIT
`))
	existing := ParseSave(save(tr))
	if !slices.Contains(existing[NAT], "VIPD-SVC-STALE") || slices.Contains(existing[NAT], "KUBE-SERVICES") || !slices.IsSorted(existing[NAT]) {
		t.Fatalf("ParseSave = %v", existing)
	}
	next := mustRender(t, withServices(base, service("new", []string{"10.96.9.9"}, tcp(80, 80), ready("10.247.0.1"))), Options{})

	// The previous Ruleset is unknown (say, after a failed restore).
	u := Payload(nil, next, true, map[Family]ExistingChains{IPv4: existing})
	rewritten, deleted := changes(t, u[IPv4].Restore)
	for _, tab := range tables {
		if diff := cmp.Diff(next.Chains(IPv4, tab), rewritten[tab]); diff != "" {
			t.Errorf("%s: full sync must rewrite every chain (-want +got):\n%s", tab, diff)
		}
	}
	if diff := cmp.Diff(map[Table][]string{NAT: {"VIPD-SEP-STALE", "VIPD-SVC-STALE"}, Filter: {"VIPD-R4-STALE"}}, deleted); diff != "" {
		t.Errorf("deleted (-want +got):\n%s", diff)
	}
	if st := u[IPv4].Stats; st.ChainsDeleted != 3 || st.ChainsRewritten != len(next.Chains(IPv4, NAT))+len(next.Chains(IPv4, Filter)) {
		t.Errorf("stats %+v", st)
	}
	if err := tr.Restore(u[IPv4].Restore); err != nil {
		t.Fatal(err)
	}
	assertKernel(t, tr, next, IPv4)
	// Cleanup: with no Ruleset to keep, a full payload deletes every vipd chain.
	_, deleted = changes(t, Payload(nil, nil, true, map[Family]ExistingChains{IPv4: existing})[IPv4].Restore)
	if diff := cmp.Diff(map[Table][]string(existing), deleted); diff != "" {
		t.Errorf("cleanup deleted (-want +got):\n%s", diff)
	}
	// Full mode writes IPv6 too, even without IPv6 services: the base
	// chains (a node-ports chain in each table) and the canaries.
	if u[IPv6].Restore == nil || u[IPv6].ChainsRewritten != 8 {
		t.Errorf("IPv6: %+v", u[IPv6])
	}
}

// TestPayloadRandomWalk applies partial payloads for random changes, with a
// small leaf size so that trie chains split and merge, and checks after each
// step that the kernel model holds exactly what Render says.
func TestPayloadRandomWalk(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	opts := Options{MaxLeafRules: 3}
	svcs := map[string]*dataplane.Service{}
	randomService := func(name string) *dataplane.Service {
		var vips []string
		if rng.IntN(3) > 0 {
			vips = append(vips, fmt.Sprintf("10.96.%d.%d", rng.IntN(4), rng.IntN(40)))
		}
		if len(vips) == 0 || rng.IntN(3) == 0 {
			vips = append(vips, fmt.Sprintf("fd00:96::%x", rng.IntN(300)))
		}
		ports := tcp(80, 8080)
		if rng.IntN(3) == 0 {
			ports = append(ports, port("dns", dataplane.UDP, 53, 53))
			ports[0].Name = "http"
		}
		var bs []dataplane.Backend
		// Services share some backend addresses, and the hairpin trie splits
		// and merges as they come and go.
		first := rng.IntN(40)
		for i := range rng.IntN(4) {
			st := dataplane.BackendState(rng.IntN(3) + 1)
			j := first + i
			bs = append(bs, backend(fmt.Sprintf("10.244.%d.%d", j/16, j%16+1), st, uint16(rng.IntN(3))),
				backend(fmt.Sprintf("fd00:244::%x", j+1), st, 1))
		}
		s := service(name, vips, ports, bs...)
		if rng.IntN(4) == 0 {
			s.Affinity = affinity
		}
		return s
	}
	var old *Ruleset
	trs := []*Tracer{NewTracer(IPv4), NewTracer(IPv6)}
	for step := range 300 {
		for range rng.IntN(5) + 1 {
			name := fmt.Sprintf("svc-%d", rng.IntN(60))
			if _, ok := svcs[name]; ok && rng.IntN(3) == 0 {
				delete(svcs, name)
			} else {
				svcs[name] = randomService(name)
			}
		}
		next, err := Render(withServices(svcs), opts, old)
		if err != nil {
			t.Fatal(err)
		}
		// Reusing the previous rendering changes nothing.
		if fresh := mustRender(t, withServices(svcs), opts); !cmp.Equal(RulesetChains(fresh), RulesetChains(next)) {
			t.Fatalf("step %d: Render with prev differs from a fresh Render: %s", step, cmp.Diff(RulesetChains(fresh), RulesetChains(next)))
		}
		full := step%100 == 0
		for _, u := range Payload(old, next, full, nil) {
			if err := trs[u.Family].Restore(u.Restore); err != nil {
				t.Fatalf("step %d: %v\n%s", step, err, u.Restore)
			}
			assertKernel(t, trs[u.Family], next, u.Family)
		}
		old = next
	}
}
