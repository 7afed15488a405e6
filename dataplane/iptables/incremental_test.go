package iptables

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vipd/vipd/dataplane"
)

// TestRenderChangesMatchesFullRender takes random walks of changes, each
// Render given the previous Ruleset and a State whose Changed names the
// services changed, and checks after each step that the Ruleset is the one
// a fresh Render builds, and that the Payload from the previous Ruleset
// (which diffs only the chains renderChanges touched) is the one a diff of
// every chain gives. The changes are mostly what renderChanges handles
// (backends that move, come and go, in both families, with affinity and
// with addresses that services share, external services among them) and
// some that it leaves to the rest of Render (services and VIPs that come
// and go, ports that lose their last backend, the node's network); small
// leaf sizes make the tries split and merge.
func TestRenderChangesMatchesFullRender(t *testing.T) {
	for _, opts := range []Options{{}, {MaxLeafRules: 1}, {MaxLeafRules: 2}, {MaxLeafRules: 5}} {
		t.Run(fmt.Sprint(opts.MaxLeafRules), func(t *testing.T) {
			rnd := rand.New(rand.NewPCG(uint64(opts.MaxLeafRules), 30))
			addr := func(v6 bool) string {
				if v6 {
					return fmt.Sprintf("fd00:10:%x::%x", rnd.IntN(3), rnd.IntN(300))
				}
				return fmt.Sprintf("10.%d.%d.%d", 244+rnd.IntN(2), rnd.IntN(4), rnd.IntN(60))
			}
			backends := func(v6 bool) []dataplane.Backend {
				var bs []dataplane.Backend
				for range rnd.IntN(5) {
					if b := ready(addr(v6 && rnd.IntN(4) > 0)); !slices.ContainsFunc(bs, func(x dataplane.Backend) bool { return x.IP == b.IP }) {
						bs = append(bs, b)
					}
				}
				return bs
			}
			mk := func(i int, bs []dataplane.Backend) *dataplane.Service {
				vips := []string{fmt.Sprintf("10.96.%d.%d", i/200, i%200+1)}
				v6 := i%3 == 0
				if v6 {
					vips = append(vips, fmt.Sprintf("fd00:96::%x", i+1))
				}
				svc := service(fmt.Sprintf("svc-%04d", i), vips, tcp(80, 8080), bs...)
				if i%7 == 0 {
					svc.Affinity = affinity
				}
				if i%5 == 0 { // external, some under LOCAL with node-local backends
					svc.Ports = []dataplane.Port{nodePort(svc.Ports[0], uint16(30000+i))}
					svc.LoadBalancerIPs = addrs(fmt.Sprintf("192.168.2.%d", i+1))
					if i%10 == 0 {
						svc.ExternalTrafficPolicy = dataplane.TrafficPolicyLocal
						for j := range svc.Backends {
							svc.Backends[j].NodeLocal = j%2 == 0
						}
					}
				}
				return svc
			}
			svcs := map[string]*dataplane.Service{}
			for i := range 120 {
				bs := backends(i%3 == 0)
				if len(bs) == 0 {
					bs = []dataplane.Backend{ready(addr(false))}
				}
				svc := mk(i, bs)
				svcs[svc.Name] = svc
			}
			s := &dataplane.State{Generation: 1, Services: maps.Clone(svcs), Node: testNode()}
			prev := mustRender(t, s, opts)
			incremental := 0
			for step := range 400 {
				var changed []string
				for range 1 + rnd.IntN(3) {
					i := rnd.IntN(130)
					name := fmt.Sprintf("svc-%04d", i)
					old, had := svcs[name]
					switch r := rnd.IntN(20); {
					case r == 0 && had: // the service goes
						delete(svcs, name)
					case r == 1 || !had: // the service comes, or comes back
						svcs[name] = mk(i, backends(i%3 == 0))
					case r == 2: // unchanged, but named anyway
					default: // its backends change, keeping one at least
						bs := backends(i%3 == 0)
						if len(bs) == 0 && len(old.Backends) > 0 && r%4 != 0 {
							bs = old.Backends[:1]
						}
						svcs[name] = mk(i, bs)
					}
					changed = append(changed, name)
				}
				node := testNode()
				if step/50%2 == 1 { // another node: other node-port addresses and uplink
					node.NodePortAddresses = addrs("192.168.1.6")
					node.Interfaces[0].Name = "eth1"
				}
				s = &dataplane.State{Generation: uint64(step + 2), Services: maps.Clone(svcs), Changed: changed, Node: node}
				got, err := Render(s, opts, prev)
				if err != nil {
					t.Fatal(err)
				}
				fresh := mustRender(t, s, opts)
				if reflect.DeepEqual(fresh.chains, got.chains) {
				} else if diff := cmp.Diff(fresh.chains, got.chains); diff != "" {
					t.Fatalf("step %d (changed %v): Render with prev differs from a fresh Render (-fresh +got):\n%s", step, changed, diff)
				}
				undelta := *got
				undelta.delta = nil
				want, gotPayload := Payload(prev, &undelta, false, nil), Payload(prev, got, false, nil)
				if reflect.DeepEqual(want, gotPayload) {
				} else if diff := cmp.Diff(want, gotPayload, cmp.AllowUnexported(Update{})); diff != "" {
					t.Fatalf("step %d (changed %v): Payload differs from a diff of every chain (-want +got):\n%s", step, changed, diff)
				}
				if got.delta != nil {
					incremental++
				}
				prev = got
			}
			if incremental < 150 {
				t.Errorf("renderChanges rendered %d of 400 steps, want 150 at least", incremental)
			}
		})
	}
}

// TestRenderChangesNeedsChanged checks that Render without a change list,
// or with one that misses a change, renders every service.
func TestRenderChangesNeedsChanged(t *testing.T) {
	a := state(service("a", []string{"10.96.0.1"}, tcp(80, 8080), ready("10.244.0.1")),
		service("b", []string{"10.96.0.2"}, tcp(80, 8080), ready("10.244.0.2")))
	prev := mustRender(t, a, Options{})
	b := state(service("a", []string{"10.96.0.1"}, tcp(80, 8080), ready("10.244.0.3")),
		service("b", []string{"10.96.0.2"}, tcp(80, 8080), ready("10.244.0.2")))
	for _, tc := range []struct {
		name    string
		changed []string
		want    bool
	}{
		{"no list", nil, false},
		{"a listed", []string{"a"}, true},
		// A service removed that the list does not name: the count shows it.
		{"c unlisted", []string{"a"}, false},
	} {
		s := *b
		s.Services = maps.Clone(b.Services)
		s.Changed = tc.changed
		if tc.name == "c unlisted" {
			prev = mustRender(t, withServices(a.Services, service("c", []string{"10.96.0.3"}, tcp(80, 8080), ready("10.244.0.4"))), Options{})
		}
		got, err := Render(&s, Options{}, prev)
		if err != nil {
			t.Fatal(err)
		}
		// Only renderChanges' path gives a Ruleset a delta.
		if took := got.delta != nil; took != tc.want {
			t.Errorf("%s: renderChanges' path taken: %v, want %v", tc.name, took, tc.want)
		}
		if diff := cmp.Diff(mustRender(t, &s, Options{}).chains, got.chains); diff != "" {
			t.Errorf("%s: Render differs from a fresh Render (-fresh +got):\n%s", tc.name, diff)
		}
	}
}

// TestTriePatchMatchesBuildTrie checks triePatch against buildTrie on
// random pairs of sorted, unique entry lists in both families and at
// several leaf sizes: patching the chains of the first list's trie must
// give those of the second's.
func TestTriePatchMatchesBuildTrie(t *testing.T) {
	rnd := rand.New(rand.NewPCG(30, 18))
	for iter := range 5000 {
		v6 := iter%2 == 1
		entries := func() []trieEntry {
			var es []trieEntry
			for range rnd.IntN(60) {
				a := netip.MustParseAddr(fmt.Sprintf("10.%d.%d.%d", rnd.IntN(2), rnd.IntN(2), rnd.IntN(40)))
				if v6 {
					a = netip.MustParseAddr(fmt.Sprintf("fd00:10:%x::%x", rnd.IntN(3), rnd.IntN(300)))
				}
				es = append(es, trieEntry{a, "-s " + hostPrefix(a) + " -j X"})
			}
			slices.SortFunc(es, compareAddr)
			return slices.CompactFunc(es, func(a, b trieEntry) bool { return a.addr == b.addr })
		}
		old, next := entries(), entries()
		k := 1 + rnd.IntN(4)
		before := buildTrie("ROOT", "VIPD-T", slices.Clone(old), k, nil)
		want := buildTrie("ROOT", "VIPD-T", slices.Clone(next), k, nil)
		var dirty []netip.Addr
		for _, e := range slices.Concat(old, next) {
			if slices.Contains(old, e) != slices.Contains(next, e) {
				dirty = append(dirty, e.addr)
			}
		}
		slices.SortFunc(dirty, netip.Addr.Compare)
		got := maps.Clone(before)
		p := triePatch{shape: trieShape{"VIPD-T", k, nil}, dirty: slices.Compact(dirty), old: before,
			write: func(name string, rules []string, del bool) {
				if del {
					delete(got, name)
				} else {
					got[name] = rules
				}
			}}
		p.patch("ROOT", old, next)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("iteration %d, k %d: patched chains differ from buildTrie's (-want +got):\n%s", iter, k, diff)
		}
	}
}
