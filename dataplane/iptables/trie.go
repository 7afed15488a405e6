package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
)

// trieEntry is one leaf rule of a dispatch, reject or hairpin trie: a rule
// that matches packets whose destination is addr; or of a node-port trie,
// where addr is a nodePortKey.
type trieEntry struct {
	addr netip.Addr
	rule string
}

// buildTrie renders entries as a prefix trie of chains rooted at the chain
// root, so that a packet walks a few short chains instead of one rule per
// address. A chain holds its entries as leaf rules while there are at most k
// of them (or they all share one address); otherwise it holds one
// `-d <prefix> -j <child>` rule per value of the next nibble of the address,
// or the entry itself where only one has that value. A child is named after
// the longest nibble-aligned prefix its entries share (path compression), so
// single-child levels cost no chain. Entries may share nothing but the
// family; no entries give an empty root chain. match spells the match of
// an inner chain's prefix; nil means `-d <prefix>`.
//
// The result is a pure function of the set of entries, and each chain name is
// a function of its prefix alone. Adding or removing an entry therefore
// changes only the chains on its address's path, plus any chains created or
// removed where a leaf splits, merges, or a shared prefix grows or shrinks.
// buildTrie sorts entries in place.
func buildTrie(root, namePrefix string, entries []trieEntry, k int, match func(netip.Prefix) string) map[string][]string {
	chains := map[string][]string{}
	// Stable: rules for one address keep the order they were rendered in.
	// Sorted already (sortedUnique) is the common case of a partial sync.
	if !slices.IsSortedFunc(entries, compareAddr) {
		slices.SortStableFunc(entries, compareAddr)
	}
	trieShape{namePrefix, k, match}.build(chains, root, 0, entries)
	return chains
}

// trieShape is how buildTrie lays a trie out: the names of its inner
// chains, their most leaf rules, and the match of an inner chain's prefix
// (nil: "-d <prefix> ").
type trieShape struct {
	namePrefix string
	k          int
	match      func(netip.Prefix) string
}

// build adds to chains the chain name, whose entries es share their first
// bits bits, and the chains below it.
func (t trieShape) build(chains map[string][]string, name string, bits int, es []trieEntry) {
	chains[name] = t.node(bits, es, func(child string, l int, ces []trieEntry) { t.build(chains, child, l, ces) })
}

// leaf reports whether the chain that holds es, which share their first
// bits bits, holds them as leaf rules.
func (t trieShape) leaf(bits int, es []trieEntry) bool {
	return len(es) <= t.k || bits == es[0].addr.BitLen()
}

// node returns the rules of the chain that holds es (sorted, sharing their
// first bits bits), and calls child with the name, prefix length and
// entries of each chain it jumps to, in order.
func (t trieShape) node(bits int, es []trieEntry, child func(name string, bits int, es []trieEntry)) []string {
	rules := []string{}
	if t.leaf(bits, es) {
		for _, e := range es {
			rules = append(rules, e.rule)
		}
		return rules
	}
	for len(es) > 0 {
		j := groupEnd(bits, es)
		if j == 1 {
			// In an inner chain, a chain for one rule would only cost a jump.
			rules = append(rules, es[0].rule)
			es = es[1:]
			continue
		}
		// Sorted, so the first and last entries bound the group's prefix.
		l := 4 * commonNibbles(es[0].addr, es[j-1].addr)
		p := netip.PrefixFrom(es[0].addr, l).Masked()
		name := trieChainName(t.namePrefix, p)
		if t.match == nil {
			rules = append(rules, "-d "+p.String()+" -j "+name)
		} else {
			rules = append(rules, t.match(p)+"-j "+name)
		}
		if child != nil {
			child(name, l, es[:j])
		}
		es = es[j:]
	}
	return rules
}

// groupEnd is how many entries of es (sorted, sharing their first bits
// bits) share the next nibble with the first.
func groupEnd(bits int, es []trieEntry) int {
	n := nibble(es[0].addr, bits/4)
	return sort.Search(len(es), func(i int) bool { return nibble(es[i].addr, bits/4) > n })
}

func compareAddr(a, b trieEntry) int { return a.addr.Compare(b.addr) }

// maxPatchedEntries is the most entries that may differ between two
// Renders for sortedUnique to patch the earlier sorted list instead of
// sorting again.
const maxPatchedEntries = 64

// fullSorts counts the full sorts of sortedUnique, for tests.
var fullSorts atomic.Int64

// sortedUnique returns collected sorted by address with one entry per
// address (entries for one address are equal), for a dedup trie, and how
// many entries of collected each stands for. old, the trie of an earlier
// Render or nil, only saves work: where collected differs from old.entries
// in one short run (a partial sync changes few services, and collected is
// in service order), it patches copies of old.sorted and old.refs with the
// entries that run adds and removes, instead of sorting tens of thousands
// of entries again. The result is the same either way.
func sortedUnique(old *renderedTrie, collected []trieEntry) ([]trieEntry, []int32) {
	// A trie that renderChanges patched has no entries to compare with.
	if old != nil && old.sorted != nil && old.chains != nil {
		o, n := old.entries, collected
		p := 0
		for p < len(o) && p < len(n) && o[p] == n[p] {
			p++
		}
		s := 0
		for s < len(o)-p && s < len(n)-p && o[len(o)-1-s] == n[len(n)-1-s] {
			s++
		}
		removed, added := o[p:len(o)-s], n[p:len(n)-s]
		if len(removed)+len(added) <= maxPatchedEntries {
			es, refs, _ := patchSorted(old.sorted, old.refs, removed, added)
			return es, refs
		}
	}
	fullSorts.Add(1)
	es := slices.Clone(collected)
	slices.SortFunc(es, compareAddr)
	unique, refs := es[:0], []int32(nil)
	for _, e := range es {
		if len(unique) > 0 && unique[len(unique)-1].addr == e.addr {
			refs[len(refs)-1]++
			continue
		}
		unique, refs = append(unique, e), append(refs, 1)
	}
	return unique, refs
}

// patchSorted returns copies of sorted and refs (as sortedUnique returns
// them) with the entries removed taken out and those added put in, and the
// addresses that this took out of sorted or put into it, sorted.
func patchSorted(sorted []trieEntry, refs []int32, removed, added []trieEntry) ([]trieEntry, []int32, []netip.Addr) {
	es, rs := slices.Clone(sorted), slices.Clone(refs)
	var dirty []netip.Addr
	for _, e := range removed {
		i, ok := slices.BinarySearchFunc(es, e, compareAddr)
		if !ok {
			continue
		}
		// Another service may still have the address.
		if rs[i]--; rs[i] == 0 {
			es, rs = slices.Delete(es, i, i+1), slices.Delete(rs, i, i+1)
			dirty = append(dirty, e.addr)
		}
	}
	for _, e := range added {
		i, ok := slices.BinarySearchFunc(es, e, compareAddr)
		if ok {
			rs[i]++
			continue
		}
		es, rs = slices.Insert(es, i, e), slices.Insert(rs, i, 1)
		dirty = append(dirty, e.addr)
	}
	slices.SortFunc(dirty, netip.Addr.Compare)
	return es, rs, slices.Compact(dirty)
}

// nibble is the i-th 4-bit digit of a, most significant first.
func nibble(a netip.Addr, i int) byte {
	var b []byte
	if a.Is4() {
		v := a.As4()
		b = v[:]
	} else {
		v := a.As16()
		b = v[:]
	}
	if i%2 == 0 {
		return b[i/2] >> 4
	}
	return b[i/2] & 0xf
}

// commonNibbles is how many leading nibbles a and b share.
func commonNibbles(a, b netip.Addr) int {
	n := 0
	for n < a.BitLen()/4 && nibble(a, n) == nibble(b, n) {
		n++
	}
	return n
}

// trieChainName is "<namePrefix>-<hex digits of p>-<length>", such as
// VIPD-D4-0a60-16. Where that exceeds MaxChainName (IPv6 prefixes longer
// than /64) it is namePrefix followed by a hash of p.
func trieChainName(namePrefix string, p netip.Prefix) string {
	var hex strings.Builder
	for i := range p.Bits() / 4 {
		fmt.Fprintf(&hex, "%x", nibble(p.Addr(), i))
	}
	name := fmt.Sprintf("%s-%s-%d", namePrefix, hex.String(), p.Bits())
	if len(name) > MaxChainName {
		name = hashName(namePrefix+"-", p.String())
	}
	return name
}
