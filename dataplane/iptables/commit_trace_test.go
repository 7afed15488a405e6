package iptables_test

// The commit order, checked in iptablestest's kernel model after each
// restore of an Apply: no packet that both the old and the new rules
// translate, reject or drop is ever let through untouched.

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vipd/vipd/dataplane"
	. "github.com/vipd/vipd/dataplane/iptables"
	. "github.com/vipd/vipd/dataplane/iptables/iptablestest"
)

// transition is an Apply from one state to another.
type transition struct {
	name      string
	old, next *dataplane.State
	opts      Options
}

// withoutBackends is s with the services that drop picks stripped of
// their backends.
func withoutBackends(s *dataplane.State, drop func(i int) bool) *dataplane.State {
	out := &dataplane.State{Generation: s.Generation + 1, Services: maps.Clone(s.Services), Node: s.Node}
	for i, name := range slices.Sorted(maps.Keys(s.Services)) {
		if drop(i) {
			svc := *s.Services[name]
			svc.Backends = nil
			out.Services[name] = &svc
		}
	}
	return out
}

// flapTransitions are, for every golden state, Applies that take every
// service's backends away and bring them back, and that take half of them
// away while the other half gets them back; then each golden state
// replaced by the next one.
func flapTransitions() []transition {
	var out []transition
	cases := goldenCases()
	all := func(int) bool { return true }
	even := func(i int) bool { return i%2 == 0 }
	odd := func(i int) bool { return i%2 == 1 }
	for i, tc := range cases {
		s, o := tc.state, tc.opts
		out = append(out,
			transition{tc.name + "/lose all", s, withoutBackends(s, all), o},
			transition{tc.name + "/regain all", withoutBackends(s, all), s, o},
			transition{tc.name + "/lose half", s, withoutBackends(s, even), o},
			transition{tc.name + "/swap halves", withoutBackends(s, even), withoutBackends(s, odd), o},
		)
		if i+1 < len(cases) && cases[i+1].opts == o {
			out = append(out, transition{tc.name + "/to " + cases[i+1].name, s, cases[i+1].state, o})
		}
	}
	return out
}

// probes are packets of family f to every port of every address of the
// services of the states (VIPs, external and LB IPs, node ports at the
// node-port addresses), from a pod, from the node itself and from outside
// (inside and outside the LB source ranges).
func probes(f Family, states ...*dataplane.State) []Packet {
	pod, inRange, outside := "10.244.9.9", "192.0.2.7", "203.0.113.99"
	if f == IPv6 {
		pod, inRange, outside = "fd00:244::99", "2001:db8::7", "2001:db9::7"
	}
	var out []Packet
	add := func(dst netip.Addr, proto dataplane.Protocol, port uint16) {
		if FamilyOf(dst) != f {
			return
		}
		for _, src := range []struct {
			addr, in string
			hook     Hook
		}{{pod, "vethweb", HookPrerouting}, {pod, "", HookOutput}, {inRange, "eth0", HookPrerouting}, {outside, "eth0", HookPrerouting}} {
			p := packet(src.addr, dst.String(), proto, port)
			p.In, p.Hook = src.in, src.hook
			out = append(out, p)
		}
	}
	for _, s := range states {
		for _, svc := range s.Services {
			for _, p := range svc.Ports {
				for _, a := range slices.Concat(svc.VIPs, svc.ExternalIPs, svc.LoadBalancerIPs) {
					add(a, p.Protocol, p.Port)
				}
				if p.NodePort != 0 {
					for _, a := range s.Node.NodePortAddresses {
						add(a, p.Protocol, p.NodePort)
					}
				}
			}
		}
	}
	return out
}

// verdicts traces every probe through tr.
func verdicts(t *testing.T, tr *Tracer, ps []Packet) []Verdict {
	t.Helper()
	out := make([]Verdict, len(ps))
	for i, p := range ps {
		out[i] = mustTrace(t, tr, p).Verdict
	}
	return out
}

// coverage checks that tr, a kernel between old and next, handles every
// probe that both old's and next's verdicts handle (DNAT, REJECT or DROP).
type coverage struct {
	probes          []Packet
	before, after   []Verdict
	failures, steps int
}

func newCoverage(t *testing.T, f Family, tr transition, old, next *Ruleset) *coverage {
	t.Helper()
	c := &coverage{probes: probes(f, tr.old, tr.next)}
	c.before = verdicts(t, kernel(t, f, Payload(nil, old, true, nil)[f].Restore), c.probes)
	c.after = verdicts(t, kernel(t, f, Payload(nil, next, true, nil)[f].Restore), c.probes)
	return c
}

// uncovered lists the probes that tr lets through although both the old
// and the new rules handle them.
func (c *coverage) uncovered(t *testing.T, tr *Tracer) []string {
	t.Helper()
	var out []string
	for i, v := range verdicts(t, tr, c.probes) {
		if v == NoMatch && c.before[i] != NoMatch && c.after[i] != NoMatch {
			p := c.probes[i]
			out = append(out, fmt.Sprintf("%s -> %s:%d/%s in %q (old %s, new %s)", p.Src, p.Dst, p.DstPort, p.Protocol, p.In, c.before[i], c.after[i]))
		}
	}
	return out
}

func stepNames(steps []FixtureStep) []string {
	var out []string
	for _, s := range steps {
		out = append(out, fmt.Sprintf("%s %s", s.Family, s.Table))
	}
	return out
}

// TestCommitOrderKeepsPortsCovered applies each transition's restores one
// at a time, as the kernel commits them, and traces every probe after each:
// a port handled before and after the Apply is handled in between, and the
// kernel ends up holding exactly the new rules.
func TestCommitOrderKeepsPortsCovered(t *testing.T) {
	threeSteps := 0
	for _, tr := range flapTransitions() {
		t.Run(tr.name, func(t *testing.T) {
			old, next := mustRender(t, tr.old, tr.opts), mustRender(t, tr.next, tr.opts)
			steps := FixtureCommitSteps(old, next)
			for _, f := range families {
				c := newCoverage(t, f, tr, old, next)
				k := kernel(t, f, Payload(nil, old, true, nil)[f].Restore)
				n := 0
				for _, s := range steps {
					if s.Family != f {
						continue
					}
					if n++; s.Payload == nil {
						t.Fatalf("%s: step %d has no payload", f, n)
					}
					if err := k.Restore(s.Payload); err != nil {
						t.Fatalf("%s step %d (%s): %v\n%s", f, n, s.Table, err, s.Payload)
					}
					if u := c.uncovered(t, k); len(u) > 0 {
						t.Errorf("%s: after step %d of %q, uncovered:\n%s", f, n, stepNames(steps), strings.Join(u, "\n"))
					}
				}
				if n == 3 {
					threeSteps++
				}
				assertKernel(t, k, next, f)
			}
		})
	}
	if threeSteps == 0 {
		t.Errorf("no transition took three restores: the union step went untested")
	}
}

// TestSingleRestoreOrderLeavesPortsUncovered is the control for
// TestCommitOrderKeepsPortsCovered: the sections of one restore, committed
// one after the other (nat, then filter), leave a port that loses its last
// backend with neither DNAT nor REJECT in between.
func TestSingleRestoreOrderLeavesPortsUncovered(t *testing.T) {
	s := state(service("web", []string{"10.96.0.10"}, tcp(80, 8080), ready("10.244.1.5")))
	tr := transition{"lose", s, withoutBackends(s, func(int) bool { return true }), Options{}}
	old, next := mustRender(t, tr.old, tr.opts), mustRender(t, tr.next, tr.opts)
	c := newCoverage(t, IPv4, tr, old, next)
	k := kernel(t, IPv4, Payload(nil, old, true, nil)[IPv4].Restore)
	nat := FixtureSections(Payload(old, next, false, nil)[IPv4])[0]
	if err := k.Restore(nat); err != nil {
		t.Fatal(err)
	}
	if u := c.uncovered(t, k); len(u) == 0 {
		t.Fatalf("nat committed before filter left every port covered; the coverage check sees nothing")
	}
	if got, want := stepNames(FixtureCommitSteps(old, next)), []string{"ipv4 filter", "ipv4 nat"}; !slices.Equal(got, want) {
		t.Errorf("steps %q, want %q", got, want)
	}
}

// TestCommitRollsBack fails each restore of an Apply in turn, and then
// also the first undo after it: the restores already run are undone, last
// first, every port stays covered after each restore and undo, and each
// family whose undo did not fail ends up holding the old rules again.
func TestCommitRollsBack(t *testing.T) {
	// Dual-stack services, half of them swapping backends for none: three
	// restores per family.
	base := state()
	for i := range 4 {
		name := fmt.Sprintf("svc-%d", i)
		base.Services[name] = service(name, []string{fmt.Sprintf("10.96.0.%d", i+1), fmt.Sprintf("fd00:96::%d", i+1)}, tcp(80, 8080),
			ready(fmt.Sprintf("10.244.1.%d", i+1)), ready(fmt.Sprintf("fd00:244::%d", i+1)))
	}
	tr := transition{"swap halves", withoutBackends(base, func(i int) bool { return i%2 == 0 }),
		withoutBackends(base, func(i int) bool { return i%2 == 1 }), Options{}}
	old, next := mustRender(t, tr.old, tr.opts), mustRender(t, tr.next, tr.opts)
	steps := FixtureCommitSteps(old, next)
	if got, want := stepNames(steps), []string{"ipv4 filter", "ipv4 nat", "ipv4 filter", "ipv6 filter", "ipv6 nat", "ipv6 filter"}; !slices.Equal(got, want) {
		t.Fatalf("steps %q, want %q", got, want)
	}
	errRestore := errors.New("restore failed")
	for failAt := range steps {
		for _, undoFails := range []bool{false, true} {
			t.Run(fmt.Sprintf("step %d %s, undo fails %v", failAt+1, stepNames(steps)[failAt], undoFails), func(t *testing.T) {
				var ks [2]*Tracer
				var cs [2]*coverage
				for _, f := range families {
					ks[f] = kernel(t, f, Payload(nil, old, true, nil)[f].Restore)
					cs[f] = newCoverage(t, f, tr, old, next)
				}
				var stuck [2]bool
				calls := 0
				err := FixtureRunCommit(old, next, func(f Family, payload []byte) error {
					calls++
					switch {
					case calls == failAt+1:
						return errRestore
					case undoFails && calls == failAt+2:
						stuck[f] = true
						return errRestore
					}
					if err := ks[f].Restore(payload); err != nil {
						t.Fatalf("restore %d: %v\n%s", calls, err, payload)
					}
					if u := cs[f].uncovered(t, ks[f]); len(u) > 0 {
						t.Errorf("after restore %d, uncovered:\n%s", calls, strings.Join(u, "\n"))
					}
					return nil
				})
				want := fmt.Sprintf("apply %s %s rules", steps[failAt].Family, steps[failAt].Table)
				if !errors.Is(err, errRestore) || !strings.Contains(err.Error(), want) {
					t.Fatalf("error %v, want one that wraps %v and says %q", err, errRestore, want)
				}
				if wantCalls := 2*failAt + 1; !undoFails && calls != wantCalls {
					t.Errorf("%d restores, want %d: the failed one, and each done one and its undo", calls, wantCalls)
				}
				for _, f := range families {
					if !stuck[f] {
						assertKernel(t, ks[f], old, f)
					}
				}
			})
		}
	}
}
