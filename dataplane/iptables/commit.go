package iptables

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/hashicorp/go-hclog"
)

// restoreStep is one iptables-restore run of an Apply. It moves one table
// of one family from the rules of from to those of to in a single COMMIT,
// so the kernel switches at once or not at all.
type restoreStep struct {
	family   Family
	table    Table
	from, to *Ruleset
	// payload is the table's section; nil when the step only carries the
	// hooks that a full sync finds missing.
	payload []byte
	// chains is how many chains payload rewrites.
	chains int
	// hooks marks the first step of its family and table: the hooks that
	// a full sync finds missing go there.
	hooks bool
}

// commitSteps returns the restores that move family u.Family from old to
// next, in the order they must run, where u is Payload(old, next, false,
// nil)[u.Family]. hooksMissing, indexed like tables, says that a table
// needs a restore for its hooks even if none of its chains changes.
//
// Commit order: each restore commits one table, so nat and filter never
// change at the same instant, and while both change a port must stay
// covered, by its DNAT in nat or by its REJECT (or DROP) in filter. The
// filter rules see only what nat left untranslated: nat's DNAT runs in
// PREROUTING and OUTPUT, before the filter hooks in INPUT, FORWARD and
// OUTPUT, and a DNATed packet no longer carries the VIP, external or
// node-port address that every filter rule matches. A filter rule for a
// port that nat translates is therefore dead, and the order is:
//
//  1. filter := old ∪ next (unionFilter), so a port about to lose its
//     backends is rejected before its DNAT goes;
//  2. nat := next;
//  3. filter := next, so a port that gains backends keeps its reject until
//     its DNAT is in.
//
// Steps with nothing to write are left out: when one filter table holds
// all the rules of the other, the union is that one, and the apply takes
// two restores (a port losing its last backend: filter, then nat; gaining
// one: nat, then filter). An apply that changes one table takes one
// restore, and one that changes none, none.
func commitSteps(old, next *Ruleset, u Update, hooksMissing [2]bool) []restoreStep {
	f := u.Family
	natStep := restoreStep{family: f, table: NAT, from: old, to: next, payload: u.sections[0], chains: len(u.Rewritten[0]), hooks: true}
	filterStep := restoreStep{family: f, table: Filter, from: old, to: next, payload: u.sections[1], chains: len(u.Rewritten[1]), hooks: true}
	natChanges := natStep.payload != nil || hooksMissing[0]
	filterChanges := filterStep.payload != nil || hooksMissing[1]
	switch {
	case !natChanges && !filterChanges:
		return nil
	case !filterChanges:
		return []restoreStep{natStep}
	case !natChanges:
		return []restoreStep{filterStep}
	}
	union := unionFilter(old, next, f)
	var steps []restoreStep
	if toUnion, n := tablePayload(old, union, f, Filter); toUnion != nil || hooksMissing[1] {
		steps = append(steps, restoreStep{family: f, table: Filter, from: old, to: union, payload: toUnion, chains: n, hooks: true})
	}
	steps = append(steps, natStep)
	if fromUnion, n := tablePayload(union, next, f, Filter); fromUnion != nil {
		steps = append(steps, restoreStep{family: f, table: Filter, from: union, to: next, payload: fromUnion, chains: n})
	}
	return steps
}

// unionFilter returns a Ruleset that holds only the filter table of family
// f, a table that drops or rejects every packet that the filter table of
// old or of next drops or rejects (where they disagree, the first rule
// that matches picks DROP or REJECT). It is meant for tablePayload.
//
// It merges chain by chain: a chain of both gets next's rules if they
// include all of old's, else old's followed by those of next that old
// lacks. That is a union because a vipd filter chain neither accepts nor
// returns: each rule drops, rejects, or jumps to a trie chain under a
// match that covers everything the chain matches, and a trie chain's name
// is a function of its prefix alone (buildTrie), so a name means the same
// packets in both. The one excess is at node ports: the union drops or
// rejects the node ports of either state at the node-port addresses of
// either state.
func unionFilter(old, next *Ruleset, f Family) *Ruleset {
	chains := make(map[string][]string, len(next.table(f, Filter))+1)
	maps.Copy(chains, old.table(f, Filter))
	for name, rules := range next.table(f, Filter) {
		if o, ok := chains[name]; ok {
			rules = unionRules(o, rules)
		}
		chains[name] = rules
	}
	u := &Ruleset{}
	u.chains[f] = map[Table]map[string][]string{Filter: chains}
	return u
}

// unionRules is next when it holds every rule of old, else old followed by
// the rules of next that old lacks.
func unionRules(old, next []string) []string {
	inNext := make(map[string]bool, len(next))
	for _, r := range next {
		inNext[r] = true
	}
	if !slices.ContainsFunc(old, func(r string) bool { return !inNext[r] }) {
		return next
	}
	inOld := make(map[string]bool, len(old))
	for _, r := range old {
		inOld[r] = true
	}
	out := slices.Clone(old)
	for _, r := range next {
		if !inOld[r] {
			out = append(out, r)
		}
	}
	return out
}

// restoreFunc runs iptables-restore --noflush (ip6tables-restore for
// IPv6) with payload; runner.restore is the real one.
type restoreFunc func(ctx context.Context, f Family, payload []byte) error

// runSteps runs steps in order, skipping those without a payload. When one
// fails, nothing of it is in force (it commits one table), and runSteps
// undoes the steps already run, last first, each with the payload that
// moves its table from its to back to its from (added hooks stay); it
// returns the failed step's error. Undoing in reverse keeps the commit
// order's promise. If an undo fails, it is logged and the family's earlier
// steps stay as they are: the family is then where the steps up to the
// one that could not be undone left it, a point that keeps every port
// covered. The other family is still undone.
func runSteps(ctx context.Context, log hclog.Logger, restore restoreFunc, steps []restoreStep) error {
	for i, s := range steps {
		if s.payload == nil {
			continue
		}
		if err := restore(ctx, s.family, s.payload); err != nil {
			undoSteps(ctx, log, restore, steps[:i])
			return fmt.Errorf("apply %s %s rules: %w", s.family, s.table, err)
		}
	}
	return nil
}

// undoSteps undoes done, which ran in order, last first; see runSteps.
func undoSteps(ctx context.Context, log hclog.Logger, restore restoreFunc, done []restoreStep) {
	var stuck [2]bool
	for _, s := range slices.Backward(done) {
		if s.payload == nil || stuck[s.family] {
			continue
		}
		back, _ := tablePayload(s.to, s.from, s.family, s.table)
		if back == nil {
			continue
		}
		if err := restore(ctx, s.family, back); err != nil {
			log.Error("roll back", "family", s.family, "table", s.table, "error", err)
			stuck[s.family] = true
		}
	}
}
