package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
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
	slices.SortStableFunc(entries, func(a, b trieEntry) int { return a.addr.Compare(b.addr) })
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
