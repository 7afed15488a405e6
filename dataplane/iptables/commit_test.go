package iptables

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
)

// stepList spells steps as "ipv4 filter", adding " +hooks" to those that
// take the hooks a full sync finds missing and " (hooks only)" to those
// without a payload.
func stepList(steps []restoreStep) []string {
	var out []string
	for _, s := range steps {
		name := fmt.Sprintf("%s %s", s.family, s.table)
		if s.hooks {
			name += " +hooks"
		}
		if s.payload == nil {
			name += " (hooks only)"
		}
		out = append(out, name)
	}
	return out
}

// TestCommitSteps checks the restores an Apply runs, and their order, for
// changes to one table, to both, to neither, and with hooks missing.
func TestCommitSteps(t *testing.T) {
	web := func(backends ...dataplane.Backend) *dataplane.Service {
		return service("web", []string{"10.96.0.10", "fd00:96::10"}, tcp(80, 8080), backends...)
	}
	other := func(backends ...dataplane.Backend) *dataplane.Service {
		return service("other", []string{"10.96.0.11"}, tcp(80, 8080), backends...)
	}
	v4, v6 := ready("10.244.1.5"), ready("fd00:244::5")
	const (
		nat4, filter4, nat6, filter6 = "ipv4 nat +hooks", "ipv4 filter +hooks", "ipv6 nat +hooks", "ipv6 filter +hooks"
		union4, toNext4              = "ipv4 filter +hooks", "ipv4 filter"
	)
	for _, c := range []struct {
		name         string
		old, next    *dataplane.State
		hooksMissing [2]bool
		want         []string
	}{{
		name: "no change",
		old:  state(web(v4)), next: state(web(v4)),
	}, {
		name: "nat only: a backend more",
		old:  state(web(v4)), next: state(web(v4, ready("10.244.1.6"))),
		want: []string{nat4},
	}, {
		name: "filter only: a service without backends",
		old:  state(web(v4)), next: state(web(v4), other()),
		want: []string{filter4},
	}, {
		name: "last backend gone: filter (the union is the new one), then nat",
		old:  state(web(v4)), next: state(web()),
		want: []string{union4, nat4},
	}, {
		name: "first backend back: nat, then filter",
		old:  state(web()), next: state(web(v4)),
		want: []string{nat4, toNext4},
	}, {
		name: "one gone, another back: union, nat, filter",
		old:  state(web(v4), other()), next: state(web(), other(ready("10.244.1.7"))),
		want: []string{union4, nat4, toNext4},
	}, {
		name: "both families, each on its own",
		old:  state(web(v4, v6)), next: state(web()),
		want: []string{union4, nat4, filter6, nat6},
	}, {
		name: "full sync, nothing changed, hooks missing in nat",
		old:  state(web(v4)), next: state(web(v4)), hooksMissing: [2]bool{true, false},
		want: []string{"ipv4 nat +hooks (hooks only)", "ipv6 nat +hooks (hooks only)"},
	}, {
		name: "full sync, nat changed, hooks missing in filter: the filter hooks first",
		old:  state(web(v4)), next: state(web(v4, ready("10.244.1.6"))), hooksMissing: [2]bool{false, true},
		want: []string{"ipv4 filter +hooks (hooks only)", nat4, "ipv6 filter +hooks (hooks only)"},
	}, {
		name: "full sync, both changed, hooks missing in both",
		old:  state(web()), next: state(web(v4)), hooksMissing: [2]bool{true, true},
		want: []string{"ipv4 filter +hooks (hooks only)", nat4, toNext4, "ipv6 filter +hooks (hooks only)", "ipv6 nat +hooks (hooks only)"},
	}} {
		t.Run(c.name, func(t *testing.T) {
			old, next := mustRender(t, c.old, Options{}), mustRender(t, c.next, Options{})
			var steps []restoreStep
			for _, u := range Payload(old, next, false, nil) {
				steps = append(steps, commitSteps(old, next, u, c.hooksMissing)...)
			}
			if diff := cmp.Diff(c.want, stepList(steps)); diff != "" {
				t.Errorf("steps (-want +got):\n%s", diff)
			}
			for _, s := range steps {
				if s.payload == nil {
					continue
				}
				if !strings.HasPrefix(string(s.payload), "*"+string(s.table)+"\n") || strings.Count(string(s.payload), "COMMIT\n") != 1 {
					t.Errorf("%s %s: want one section of that table, got\n%s", s.family, s.table, s.payload)
				}
			}
		})
	}
}

// TestCommitStepsUnion checks the union step's payload for a port that
// loses its backend while another gains one: the first restore adds the
// new REJECT and keeps the old one, the last removes the old.
func TestCommitStepsUnion(t *testing.T) {
	web := func(backends ...dataplane.Backend) *dataplane.Service {
		return service("web", []string{"10.96.0.10"}, tcp(80, 8080), backends...)
	}
	other := func(backends ...dataplane.Backend) *dataplane.Service {
		return service("other", []string{"10.96.0.11"}, tcp(80, 8080), backends...)
	}
	old, next := mustRender(t, state(web(ready("10.244.1.5")), other()), Options{}), mustRender(t, state(web(), other(ready("10.244.1.6"))), Options{})
	steps := commitSteps(old, next, Payload(old, next, false, nil)[IPv4], [2]bool{})
	if len(steps) != 3 {
		t.Fatalf("steps %q, want three", stepList(steps))
	}
	rejectWeb := `-A VIPD-REJECT -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -m comment --comment "web:80/tcp" -j REJECT --reject-with tcp-reset`
	rejectOther := `-A VIPD-REJECT -d 10.96.0.11/32 -p tcp -m tcp --dport 80 -m comment --comment "other:80/tcp" -j REJECT --reject-with tcp-reset`
	want := []string{
		"*filter\n:VIPD-REJECT - [0:0]\n" + rejectOther + "\n" + rejectWeb + "\nCOMMIT\n",
		"", // nat: Payload's own section
		"*filter\n:VIPD-REJECT - [0:0]\n" + rejectWeb + "\nCOMMIT\n",
	}
	for i, s := range steps {
		if want[i] == "" {
			if !slices.Equal(s.payload, Payload(old, next, false, nil)[IPv4].sections[0]) {
				t.Errorf("step %d: nat payload differs from Payload's nat section", i+1)
			}
			continue
		}
		if diff := cmp.Diff(want[i], string(s.payload)); diff != "" {
			t.Errorf("step %d (-want +got):\n%s", i+1, diff)
		}
	}
}

func TestUnionRules(t *testing.T) {
	for _, c := range []struct{ old, next, want []string }{
		{nil, nil, nil},
		{nil, []string{"a"}, []string{"a"}},
		{[]string{"a"}, nil, []string{"a"}},
		{[]string{"b"}, []string{"a", "b", "c"}, []string{"a", "b", "c"}},
		{[]string{"a", "b", "c"}, []string{"b"}, []string{"a", "b", "c"}},
		{[]string{"a", "c"}, []string{"b", "c"}, []string{"a", "c", "b"}},
	} {
		if got := unionRules(c.old, c.next); !slices.Equal(got, c.want) {
			t.Errorf("unionRules(%q, %q) = %q, want %q", c.old, c.next, got, c.want)
		}
	}
}

// TestFilterRulesOnlyDropRejectOrJump checks what unionFilter relies on:
// every rule of a vipd filter chain drops, rejects, or jumps to a vipd
// chain; none accepts or returns.
func TestFilterRulesOnlyDropRejectOrJump(t *testing.T) {
	for _, tc := range goldenCases() {
		rs := mustRender(t, tc.state, tc.opts)
		for _, f := range families {
			for _, chain := range rs.Chains(f, Filter) {
				for _, r := range rs.Rules(f, Filter, chain) {
					_, target, _ := strings.Cut(r, "-j ")
					if target != "DROP" && !strings.HasPrefix(target, "REJECT ") && !strings.HasPrefix(target, ChainPrefix) {
						t.Errorf("%s %s %s: rule %q", tc.name, f, chain, r)
					}
				}
			}
		}
	}
}

// TestRunStepsSkipsEmptySteps: a step without a payload runs nothing, and
// one whose undo has nothing to write is not undone.
func TestRunStepsSkipsEmptySteps(t *testing.T) {
	rs := mustRender(t, state(service("web", []string{"10.96.0.10"}, tcp(80, 8080), ready("10.244.1.5"))), Options{})
	var ran []string
	fail := errors.New("no")
	restore := func(_ context.Context, f Family, payload []byte) error {
		ran = append(ran, string(payload))
		if string(payload) == "fail" {
			return fail
		}
		return nil
	}
	steps := []restoreStep{
		{family: IPv4, table: NAT, from: rs, to: rs}, // nothing to run
		{family: IPv4, table: Filter, from: rs, to: rs, payload: []byte("hooks")},
		{family: IPv6, table: NAT, from: rs, to: rs, payload: []byte("fail")},
	}
	if err := runSteps(context.Background(), hclog.NewNullLogger(), restore, steps); !errors.Is(err, fail) {
		t.Fatalf("error %v, want %v", err, fail)
	}
	if want := []string{"hooks", "fail"}; !slices.Equal(ran, want) {
		t.Errorf("ran %q, want %q", ran, want)
	}
}
