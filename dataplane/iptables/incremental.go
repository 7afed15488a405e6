package iptables

import (
	"maps"
	"net/netip"
	"slices"

	"github.com/vipd/vipd/dataplane"
)

// maxChangedServices is the most services a State's Changed may name for
// Render to take renderChanges' path; more is a bulk change, which the
// rest of Render handles as well.
const maxChangedServices = 256

// maxDirtyAddresses is the most addresses whose hairpin entries may come
// or go in one renderChanges.
const maxDirtyAddresses = 1024

// rulesetDelta says that a Ruleset differs from the Ruleset whose id is
// from only in the chains it names, per family and table: each of those
// is rewritten, created or deleted, and every other chain is the same.
type rulesetDelta struct {
	from   uint64
	chains [2]map[Table]map[string]bool
}

// touch records that chain may differ.
func (d *rulesetDelta) touch(f Family, t Table, chain string) {
	if d.chains[f] == nil {
		d.chains[f] = map[Table]map[string]bool{}
	}
	if d.chains[f][t] == nil {
		d.chains[f][t] = map[string]bool{}
	}
	d.chains[f][t][chain] = true
}

// renderChanges is the path Render takes for a partial sync, in time that
// grows with the change rather than with the services: when s.Changed
// names every service that differs from those prev was rendered from (as
// dataplane.State promises for the State of the previous Apply) and
// nothing else changed that the rules depend on, it copies prev's chains
// and puts in those of the changed services, and patches the hairpin trie
// along the paths of the backend addresses that came or went. The result
// is the Ruleset the rest of Render would build, with a delta that names
// the chains it touched (for Payload).
//
// It reports ok false, and leaves the work to the rest of Render, when it
// cannot: without prev or s.Changed, for more than maxChangedServices
// changes, when the options, the node's external interfaces or node-port
// addresses changed, when the service count shows that s.Changed misses a
// change, and when a change reaches a trie other than the hairpin trie (a
// VIP, port or node port came or went, or a port gained its first backend
// or lost its last one). Errors are Render's.
func renderChanges(s *dataplane.State, opts Options, prev *Ruleset, external []string) (r *Ruleset, ok bool, err error) {
	if prev == nil || s.Changed == nil || len(s.Changed) > maxChangedServices || prev.maxLeafRules != opts.MaxLeafRules ||
		!slices.Equal(prev.external, external) || !slices.Equal(prev.nodePorts, s.Node.NodePortAddresses) {
		return nil, false, nil
	}
	names := slices.Clone(s.Changed)
	slices.Sort(names) // Render checks the services in name order
	names = slices.Compact(names)
	caps := Capabilities()
	type change struct{ old, next *[2]serviceRules }
	var changes []change
	services := maps.Clone(prev.services)
	for _, name := range names {
		old, had := prev.services[name]
		svc, has := s.Get(name)
		switch {
		case had && has && old.svc == svc:
			continue
		case has:
			if err := caps.Check(svc); err != nil {
				return nil, true, err
			}
			sr := &[2]serviceRules{renderService(svc, IPv4, external), renderService(svc, IPv6, external)}
			services[name] = renderedService{svc, sr}
			changes = append(changes, change{old.rules, sr})
		case had:
			delete(services, name)
			changes = append(changes, change{old.rules, nil})
		}
	}
	if len(services) != s.Len() {
		return nil, false, nil
	}
	rulesOf := func(sr *[2]serviceRules, f Family) serviceRules {
		if sr == nil {
			return serviceRules{}
		}
		return sr[f]
	}
	for _, c := range changes {
		for _, f := range families {
			for k, kind := range trieKinds {
				if !kind.dedup && !slices.Equal(rulesOf(c.old, f).tries[k], rulesOf(c.next, f).tries[k]) {
					return nil, false, nil
				}
			}
		}
	}
	r = &Ruleset{services: services, tries: prev.tries, external: prev.external, nodePorts: prev.nodePorts,
		maxLeafRules: prev.maxLeafRules, id: rulesetIDs.Add(1), delta: &rulesetDelta{from: prev.id}}
	for _, f := range families {
		var removed, added []trieEntry
		var gone, set []map[string][]string
		for _, c := range changes {
			old, next := rulesOf(c.old, f), rulesOf(c.next, f)
			removed = append(removed, old.tries[hairpinTrie]...)
			added = append(added, next.tries[hairpinTrie]...)
			gone, set = append(gone, old.chains), append(set, next.chains)
		}
		r.chains[f] = prev.chains[f]
		nat := prev.chains[f][NAT]
		cloned := false
		write := func(name string, rules []string, del bool) {
			if !cloned {
				nat, cloned = maps.Clone(nat), true
				r.chains[f] = map[Table]map[string][]string{NAT: nat, Filter: prev.chains[f][Filter]}
			}
			if del {
				delete(nat, name)
			} else {
				nat[name] = rules
			}
			r.delta.touch(f, NAT, name)
		}
		// Services' chains have names of their own: those a change drops
		// are no other service's.
		for _, chains := range gone {
			for name := range chains {
				write(name, nil, true)
			}
		}
		for _, chains := range set {
			for name, rules := range chains {
				write(name, rules, false)
			}
		}
		if len(removed)+len(added) == 0 {
			continue
		}
		old := prev.tries[f][hairpinTrie]
		if old == nil {
			return nil, false, nil
		}
		sorted, refs, dirty := patchSorted(old.sorted, old.refs, removed, added)
		if len(dirty) > maxDirtyAddresses {
			return nil, false, nil
		}
		if len(dirty) > 0 {
			kind := trieKinds[hairpinTrie]
			p := triePatch{shape: trieShape{kind.trieNamePrefix(f), opts.MaxLeafRules, kind.match}, dirty: dirty,
				old: prev.chains[f][NAT], write: write}
			p.patch(kind.root, old.sorted, sorted)
		}
		r.tries[f][hairpinTrie] = &renderedTrie{k: opts.MaxLeafRules, sorted: sorted, refs: refs}
	}
	return r, true, nil
}

// triePatch moves the chains of a trie from the rendering (buildTrie) of
// one sorted list of entries to that of another that differs from it only
// at the addresses dirty, rendering only the chains whose entries changed
// and those that are new.
//
// A chain's name is a function of its prefix, and its rules and the chains
// below it are a function of the entries under that prefix. So a chain
// that the old rendering has, with no dirty address under its prefix, is
// the same in the new one, with everything below it.
type triePatch struct {
	shape trieShape
	// dirty is sorted.
	dirty []netip.Addr
	// old holds the old rendering's chains (and others).
	old map[string][]string
	// write sets a chain's rules, or deletes the chain.
	write func(name string, rules []string, del bool)
	// kept and rendered are the chains of the new rendering that build
	// kept as they were and those it rendered.
	kept, rendered map[string]bool
}

// patch moves the trie rooted at root from old to next.
func (p *triePatch) patch(root string, old, next []trieEntry) {
	p.kept, p.rendered = map[string]bool{}, map[string]bool{}
	p.build(root, 0, next)
	p.prune(0, old)
}

// build writes the chain name, which holds es (sorted, sharing their first
// bits bits), and the chains below it that changed or are new.
func (p *triePatch) build(name string, bits int, es []trieEntry) {
	p.rendered[name] = true
	p.write(name, p.shape.node(bits, es, func(child string, l int, ces []trieEntry) {
		if _, ok := p.old[child]; ok && !p.isDirty(netip.PrefixFrom(ces[0].addr, l).Masked()) {
			p.kept[child] = true
			return
		}
		p.build(child, l, ces)
	}), false)
}

// prune deletes the chains below the old chain that holds es (sorted,
// sharing their first bits bits), one that build rendered again, which
// the new rendering lacks.
func (p *triePatch) prune(bits int, es []trieEntry) {
	p.shape.node(bits, es, func(child string, l int, ces []trieEntry) {
		switch {
		case p.kept[child]:
		case p.rendered[child]:
			p.prune(l, ces)
		default:
			p.write(child, nil, true)
			p.prune(l, ces)
		}
	})
}

// isDirty reports whether a dirty address lies in prefix.
func (p *triePatch) isDirty(prefix netip.Prefix) bool {
	i, _ := slices.BinarySearchFunc(p.dirty, prefix.Addr(), netip.Addr.Compare)
	return i < len(p.dirty) && prefix.Contains(p.dirty[i])
}
