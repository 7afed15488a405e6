package iptables

import "github.com/vipd/vipd/dataplane"

// The in-package fixtures, lent to the tests in package iptables_test that
// drive Render and Payload through iptablestest's kernel model: package
// iptables's own tests cannot use iptablestest, which imports iptables.

var (
	FixtureService      = service
	FixturePort         = port
	FixtureTCP          = tcp
	FixtureBackend      = backend
	FixtureReady        = ready
	FixtureLocal        = local
	FixtureState        = state
	FixtureMustRender   = mustRender
	FixtureBaseServices = baseServices
	FixtureWithServices = withServices
	FixtureAffinity     = affinity
	FixtureTables       = tables
	FixtureFamilies     = families
	FixtureNodePort     = nodePort
)

const (
	FixtureChainHairpin  = chainHairpin
	FixtureChainServices = chainServices
	FixtureChainReject   = chainReject
)

// RulesetChains is rs's chains, for comparisons.
func RulesetChains(rs *Ruleset) any { return rs.chains }

// FixtureGoldenCase is one of the golden states of render_test.go.
type FixtureGoldenCase struct {
	Name  string
	State *dataplane.State
	Opts  Options
}

// FixtureGoldenCases are the golden states of render_test.go.
func FixtureGoldenCases() []FixtureGoldenCase {
	var out []FixtureGoldenCase
	for _, tc := range goldenCases() {
		out = append(out, FixtureGoldenCase{tc.name, tc.state, tc.opts})
	}
	return out
}
