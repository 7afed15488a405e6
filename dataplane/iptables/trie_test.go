package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// TestTrie checks the structure of addTrie's output for address sets that
// dispatch, reject and hairpin tries meet: empty, sharing nothing but the
// family, dense, and with several rules per address.
func TestTrie(t *testing.T) {
	var dense []string
	for i := range 600 {
		dense = append(dense, fmt.Sprintf("10.244.%d.%d", i/250, i%250+1))
	}
	for _, tc := range []struct {
		name  string
		addrs []string
		k     int
	}{
		{"empty", nil, 2},
		{"one", []string{"10.0.0.1"}, 1},
		{"sharing nothing but the family", []string{"0.0.0.0", "1.2.3.4", "10.0.0.1", "10.0.0.2", "127.0.0.1", "192.168.0.1", "255.255.255.255"}, 1},
		{"IPv6 sharing nothing but the family", []string{"::", "::1", "2001:db8::1", "fd00::1", "fd00::2", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"}, 1},
		{"dense", dense, 32},
		{"several rules per address", []string{"10.0.0.1", "10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2", "10.0.1.1"}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var entries []trieEntry
			for i, a := range tc.addrs {
				entries = append(entries, trieEntry{netip.MustParseAddr(a), fmt.Sprintf("leaf %d %s", i, a)})
			}
			const root = "VIPD-ROOT"
			chains := buildTrie(root, "VIPD-T", slices.Clone(entries), tc.k, nil)
			if len(entries) == 0 {
				if rules, ok := chains[root]; len(chains) != 1 || !ok || len(rules) != 0 {
					t.Fatalf("empty trie: %v; want one empty root chain", chains)
				}
				return
			}
			// Every chain but the root is reached by exactly one jump, and
			// holds rules.
			refs := map[string]int{}
			for _, rules := range chains {
				for _, rule := range rules {
					if _, child, ok := strings.Cut(rule, " -j "); ok {
						refs[child]++
					}
				}
			}
			for name, rules := range chains {
				if name != root && (refs[name] != 1 || len(rules) == 0) {
					t.Errorf("chain %s: %d references, %d rules", name, refs[name], len(rules))
				}
				if len(name) > MaxChainName {
					t.Errorf("chain name %s is too long", name)
				}
			}
			// A packet to each address reaches every rule for it, in order,
			// and no rule for another address.
			for _, e := range entries {
				var got []string
				var walk func(chain string)
				walk = func(chain string) {
					for _, rule := range chains[chain] {
						if strings.HasPrefix(rule, "leaf ") {
							if strings.HasSuffix(rule, " "+e.addr.String()) {
								got = append(got, rule)
							}
							continue
						}
						var p, child string
						if _, err := fmt.Sscanf(rule, "-d %s -j %s", &p, &child); err != nil {
							t.Fatalf("rule %q in %s", rule, chain)
						}
						if netip.MustParsePrefix(p).Contains(e.addr) {
							walk(child)
						}
					}
				}
				walk(root)
				var want []string
				for _, o := range entries {
					if o.addr == e.addr {
						want = append(want, o.rule)
					}
				}
				if !slices.Equal(got, want) {
					t.Errorf("%s reaches %q; want %q", e.addr, got, want)
				}
			}
			t.Logf("%d entries, %d chains", len(entries), len(chains))
		})
	}
}
