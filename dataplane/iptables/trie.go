package iptables

import (
	"fmt"
	"net/netip"
	"slices"
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
	if match == nil {
		match = func(p netip.Prefix) string { return "-d " + p.String() + " " }
	}
	// Stable: rules for one address keep the order they were rendered in.
	// Sorted already (sortedUnique) is the common case of a partial sync.
	if !slices.IsSortedFunc(entries, compareAddr) {
		slices.SortStableFunc(entries, compareAddr)
	}
	var node func(name string, bits int, es []trieEntry)
	node = func(name string, bits int, es []trieEntry) {
		leaf := len(es) <= k || bits == es[0].addr.BitLen()
		rules := []string{}
		for len(es) > 0 {
			j := 1
			for !leaf && j < len(es) && nibble(es[j].addr, bits/4) == nibble(es[0].addr, bits/4) {
				j++
			}
			if j == 1 {
				// In an inner chain, a chain for one rule would only cost a jump.
				rules = append(rules, es[0].rule)
				es = es[1:]
				continue
			}
			// Sorted, so the first and last entries bound the group's prefix.
			l := 4 * commonNibbles(es[0].addr, es[j-1].addr)
			p := netip.PrefixFrom(es[0].addr, l).Masked()
			child := trieChainName(namePrefix, p)
			rules = append(rules, match(p)+"-j "+child)
			node(child, l, es[:j])
			es = es[j:]
		}
		chains[name] = rules
	}
	node(root, 0, entries)
	return chains
}

func compareAddr(a, b trieEntry) int { return a.addr.Compare(b.addr) }

// maxPatchedEntries is the most entries that may differ between two
// Renders for sortedUnique to patch the earlier sorted list instead of
// sorting again.
const maxPatchedEntries = 64

// fullSorts counts the full sorts of sortedUnique, for tests.
var fullSorts atomic.Int64

// sortedUnique returns collected sorted by address with one entry per
// address (entries for one address are equal), for a dedup trie. old, the
// trie of an earlier Render or nil, only saves work: where collected differs
// from old.entries in one short run (a partial sync changes few services,
// and collected is in service order), it patches a copy of old.sorted with
// the addresses that run adds and removes, instead of sorting tens of
// thousands of entries again. The result is the same either way.
func sortedUnique(old *renderedTrie, collected []trieEntry) []trieEntry {
	if old != nil && old.sorted != nil {
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
			es := slices.Clone(old.sorted)
			for _, e := range removed {
				// Another service may still have the address.
				if slices.ContainsFunc(n, func(x trieEntry) bool { return x.addr == e.addr }) {
					continue
				}
				if i, ok := slices.BinarySearchFunc(es, e, compareAddr); ok {
					es = slices.Delete(es, i, i+1)
				}
			}
			for _, e := range added {
				if i, ok := slices.BinarySearchFunc(es, e, compareAddr); !ok {
					es = slices.Insert(es, i, e)
				}
			}
			return es
		}
	}
	fullSorts.Add(1)
	es := slices.Clone(collected)
	slices.SortFunc(es, compareAddr)
	return slices.CompactFunc(es, func(a, b trieEntry) bool { return a.addr == b.addr })
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
