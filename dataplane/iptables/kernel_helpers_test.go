package iptables_test

// Helpers of the tests that use iptablestest's kernel model, and the
// in-package fixtures they share with the tests of package iptables (see
// export_test.go), under the names those use.

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vipd/vipd/dataplane"
	. "github.com/vipd/vipd/dataplane/iptables"
	. "github.com/vipd/vipd/dataplane/iptables/iptablestest"
)

var (
	service      = FixtureService
	port         = FixturePort
	tcp          = FixtureTCP
	backend      = FixtureBackend
	ready        = FixtureReady
	local        = FixtureLocal
	state        = FixtureState
	mustRender   = FixtureMustRender
	baseServices = FixtureBaseServices
	withServices = FixtureWithServices
	affinity     = FixtureAffinity
	tables       = FixtureTables
	families     = FixtureFamilies
	nodePort     = FixtureNodePort
)

const (
	chainHairpin  = FixtureChainHairpin
	chainServices = FixtureChainServices
	chainReject   = FixtureChainReject
)

// kernel returns a Tracer for family f that has applied payloads in order.
var kernel = Loaded

// tracer renders s and loads it, in full, into a Tracer for family f.
func tracer(t testing.TB, s *dataplane.State, opts Options, f Family) *Tracer {
	t.Helper()
	return kernel(t, f, Payload(nil, mustRender(t, s, opts), true, nil)[f].Restore)
}

var (
	packet    = NewPacket
	mustTrace = MustTrace
)

// assertKernel checks that the kernel model holds exactly the chains of rs.
func assertKernel(t testing.TB, tr *Tracer, rs *Ruleset, f Family) {
	t.Helper()
	for _, tab := range tables {
		want := map[string][]string{}
		for _, name := range rs.Chains(f, tab) {
			want[name] = append([]string{}, rs.Rules(f, tab, name)...)
		}
		if diff := cmp.Diff(want, tr.Chains(tab)); diff != "" {
			t.Fatalf("%s %s: kernel differs from the rendered rules (-want +got):\n%s", f, tab, diff)
		}
	}
}

// goldenCase is a FixtureGoldenCase as render_test.go spells it.
type goldenCase struct {
	name  string
	state *dataplane.State
	opts  Options
}

func goldenCases() []goldenCase {
	var out []goldenCase
	for _, tc := range FixtureGoldenCases() {
		out = append(out, goldenCase{tc.Name, tc.State, tc.Opts})
	}
	return out
}
