package iptables

import (
	"context"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
)

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

// FixtureStep is one restore of an Apply, as commitSteps plans it.
type FixtureStep struct {
	Family  Family
	Table   Table
	Payload []byte
}

// FixtureCommitSteps is the restores that an Apply from old to next runs,
// in order, when no hooks are missing.
func FixtureCommitSteps(old, next *Ruleset) []FixtureStep {
	var out []FixtureStep
	for _, s := range plannedSteps(old, next) {
		out = append(out, FixtureStep{s.family, s.table, s.payload})
	}
	return out
}

// FixtureRunCommit runs the restores of FixtureCommitSteps(old, next) with
// restore, undoing them on a failure as Apply does, and returns the error.
func FixtureRunCommit(old, next *Ruleset, restore func(Family, []byte) error) error {
	return runSteps(context.Background(), hclog.NewNullLogger(),
		func(_ context.Context, f Family, payload []byte) error { return restore(f, payload) }, plannedSteps(old, next))
}

func plannedSteps(old, next *Ruleset) []restoreStep {
	var steps []restoreStep
	for _, u := range Payload(old, next, false, nil) {
		steps = append(steps, commitSteps(old, next, u, [2]bool{})...)
	}
	return steps
}

// FixtureSections is u's sections, indexed like tables; nil for a table
// that does not change.
func FixtureSections(u Update) [2][]byte { return u.sections }
