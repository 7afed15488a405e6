package iptables

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/vipd/vipd/dataplane"
)

// Drift.What values of the iptables dataplane.
const (
	driftCanary = "canary"
	driftHook   = "hook"
	driftChain  = "chain"
)

// DriftKinds implements dataplane.DriftDetector.
func (d *Dataplane) DriftKinds() []string { return []string{driftCanary, driftHook, driftChain} }

// DetectDrift implements dataplane.DriftDetector. In each family and table
// it checks that:
//
//   - the canary chain VIPD-CANARY exists (What "canary"): a firewall reload
//     or `iptables -t nat -X` deletes it with every other chain;
//   - each hook rule is still in its builtin chain (What "hook"): `iptables
//     -t nat -F PREROUTING` removes the jumps and leaves the chains;
//   - each chain a hook jumps to, and each table's VIPD-NODEPORTS, exists
//     and holds the rules last applied (What "chain"): `iptables -t nat -F
//     VIPD-SERVICES` empties one.
//
// In nft mode it first reads the nf_tables generation over netlink, in
// process: when it is where the rules were last verified (by a full sync,
// or by a check that found nothing, and since then only vipd's own partial
// syncs committed, each restore one commit; see verifyAfter), nothing in
// the namespace has changed them, and it returns nil without running
// anything. Otherwise it lists only those chains, one `iptables -S
// <chain>` each (thirteen per family), never the whole table, so its cost
// does not grow with the number of services; but twenty-six processes take
// tens of milliseconds, and the reconciler's changes wait for it, so the
// shortcut keeps a periodic check from adding to a change's latency. In
// legacy mode listing one chain copies the
// whole table out of the kernel anyway, so it reads each table once
// (`iptables-legacy-save -t TABLE`, four per check) and picks the chains
// from it: there the cost grows with the rules, as a full sync's does. The
// other chains below the hook targets (tries, services, backends) are not
// checked; a full Apply rewrites any of them that differ.
// Before the first successful Apply there is nothing to check and it
// returns nil.
func (d *Dataplane) DetectDrift(ctx context.Context) ([]dataplane.Drift, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.applied == nil {
		return nil, nil
	}
	var gen uint32
	var genErr error
	if d.cfg.Mode == ModeNFT {
		// Read before the listings: a commit during them moves it
		// past what is recorded below, and the next check looks again.
		if gen, genErr = d.run.nftGen(); genErr == nil && d.verified && gen == d.verifiedGen {
			return nil, nil
		}
		d.verified = false
	}
	var found []dataplane.Drift
	for _, f := range families {
		for _, t := range tables {
			drift, err := d.tableDrift(ctx, f, t)
			if err != nil {
				return nil, fmt.Errorf("detect %s %s drift: %w", f, t, err)
			}
			found = append(found, drift...)
		}
	}
	if d.cfg.Mode == ModeNFT && genErr == nil && len(found) == 0 {
		d.verified, d.verifiedGen = true, gen
	}
	return found, nil
}

// tableDrift checks the canary, hooks and hook targets of one table.
func (d *Dataplane) tableDrift(ctx context.Context, f Family, t Table) ([]dataplane.Drift, error) {
	var found []dataplane.Drift
	report := func(what, chain, format string, args ...any) {
		found = append(found, dataplane.Drift{What: what, Detail: fmt.Sprintf("%s %s %s: ", f, t, chain) + fmt.Sprintf(format, args...)})
	}
	listChain := func(chain string) ([]string, bool, error) { return d.run.listChain(ctx, f, t, chain) }
	if d.cfg.Mode == ModeLegacy {
		save, err := d.run.saveTable(ctx, f, string(t))
		if err != nil {
			return nil, err
		}
		chains := chainsOfSave(save)
		listChain = func(chain string) ([]string, bool, error) {
			rules, ok := chains[chain]
			return rules, ok, nil
		}
	}
	if _, ok, err := listChain(chainCanary); err != nil {
		return nil, err
	} else if !ok {
		report(driftCanary, chainCanary, "missing")
	}

	var builtins, targets []string
	for _, h := range Hooks(f) {
		if h.Table != t {
			continue
		}
		if !slices.Contains(builtins, h.Chain) {
			builtins = append(builtins, h.Chain)
		}
		if !slices.Contains(targets, h.Target()) {
			targets = append(targets, h.Target())
		}
	}
	for _, builtin := range builtins {
		rules, _, err := listChain(builtin)
		has := func(h HookRule) bool { return slices.Contains(rules, h.rule()) }
		if errors.Is(err, errIncompatible) {
			// Another tool's nft rules in the chain: look for the
			// jumps in what nf_tables holds.
			var nrules [][]byte
			if nrules, _, err = d.run.nftRules(f, t, builtin); err != nil {
				return nil, err
			}
			has = func(h HookRule) bool { return nftHasJump(nrules, h.Target()) }
		}
		if err != nil {
			return nil, err
		}
		for _, h := range Hooks(f) {
			if h.Table == t && h.Chain == builtin && !has(h) {
				report(driftHook, builtin, "no jump to %s", h.Target())
			}
		}
	}
	// VIPD-NODEPORTS is reached from a hook target, not a hook, but a
	// flush of it would silently stop every node port: checked too.
	targets = append(targets, chainNodePorts)
	for _, chain := range targets {
		rules, ok, err := listChain(chain)
		switch {
		case errors.Is(err, errIncompatible):
			report(driftChain, chain, "%v", errIncompatible)
		case err != nil:
			return nil, err
		case !ok:
			report(driftChain, chain, "missing")
		case !slices.Equal(rules, d.applied.Rules(f, t, chain)):
			report(driftChain, chain, "rules differ from those applied (%d found, %d applied)", len(rules), len(d.applied.Rules(f, t, chain)))
		}
	}
	return found, nil
}

// chainsOfSave returns the chains of one table's iptables-save output, each
// with its rules as listChain returns them (what follows "-A <chain> ").
func chainsOfSave(save []byte) map[string][]string {
	chains := map[string][]string{}
	for line := range strings.Lines(string(save)) {
		line = strings.TrimRight(line, "\n")
		switch {
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			if _, ok := chains[name]; !ok {
				chains[name] = nil
			}
		case strings.HasPrefix(line, "-A "):
			name, rule, _ := strings.Cut(line[3:], " ")
			chains[name] = append(chains[name], rule)
		}
	}
	return chains
}

var _ dataplane.DriftDetector = (*Dataplane)(nil)
