package iptables

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/internal/testkit/netlab"
)

// kernelGolden holds what iptables-save and ip6tables-save show after the
// dataplane programs layoutState: the ground truth that the README's chain
// layout is checked against (TestREADMEChainLayout).
var kernelGolden = filepath.Join("testdata", "kernel", "iptables-save.golden")

// layoutState is small but uses every kind of chain: services in both
// families, a backendless one, ClientIP affinity, and enough VIPs, ports
// and backends per family for every prefix trie to split with
// MaxLeafRules 1; and the external half: node ports on the node's uplink
// addresses (eth0 external), external IPs, an LB IP with source ranges,
// both external traffic policies, one of them with no local backend.
func layoutState(node *netlab.Node, web1, web2 *netlab.Pod) *dataplane.State {
	ports := []dataplane.Port{nodePort(port("http", dataplane.TCP, 80, 7000), 30080), port("dns", dataplane.UDP, 53, 7000)}
	webVIPs := []string{"198.19.0.10", "fd00:198:ff::10"}
	sticky := service("sticky", []string{"198.19.0.12", "fd00:198:ff::12"}, tcp(443, 7000),
		local(ready(web1.IPv4().String())), local(ready(web1.IPv6().String())), ready(web2.IPv4().String()))
	sticky.Affinity = dataplane.SessionAffinity{ClientIP: true, Timeout: 10 * time.Minute}
	sticky.ExternalTrafficPolicy = dataplane.TrafficPolicyLocal
	sticky.LoadBalancerIPs = addrs("198.19.1.12", "fd00:198:ff:1::12")
	sticky.LoadBalancerSourceRanges = prefixes("198.18.0.0/24", "fd00:198::/48")
	web := service("web", webVIPs, ports, ready(web1.IPv4().String()), ready(web2.IPv4().String()),
		ready(web1.IPv6().String()), ready(web2.IPv6().String()))
	web.ExternalIPs = addrs("198.19.1.10", "fd00:198:ff:1::10")
	empty := service("empty", []string{"198.19.0.11", "fd00:198:ff::11"}, ports)
	empty.ExternalTrafficPolicy = dataplane.TrafficPolicyLocal
	empty.Ports = []dataplane.Port{nodePort(port("http", dataplane.TCP, 80, 7000), 30081)}
	s := state(web, sticky, empty)
	s.Node = dataplane.Node{
		NodePortAddresses: []netip.Addr{node.IPv4(), node.IPv6()},
		Interfaces:        []dataplane.Interface{{Name: node.Uplink(), Addrs: []netip.Addr{node.IPv4(), node.IPv6()}, External: true}},
	}
	return s
}

// TestKernelRulesGolden programs layoutState into a lab node with the real
// dataplane, in each mode, and compares what iptables-save and
// ip6tables-save show with kernelGolden (-update rewrites it from nft mode),
// and checks that a second dataplane (a restart) rewrites nothing.
// Both modes must show the same rules: a full sync compares them, as text,
// with what Render produces.
func TestKernelRulesGolden(t *testing.T) {
	for _, mode := range []Mode{ModeNFT, ModeLegacy} {
		t.Run(string(mode), func(t *testing.T) {
			lab := netlab.New(t, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: []string{"web1", "web2"}}}})
			node := lab.Node(1)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			dp, err := New(ctx, hclog.NewNullLogger(), Config{NetNS: node.Path(), Mode: mode, Render: Options{MaxLeafRules: 1}})
			if err != nil {
				t.Fatal(err)
			}
			defer dp.Close()
			s := layoutState(node, lab.Pod("web1"), lab.Pod("web2"))
			if err := dp.Apply(ctx, s); err != nil {
				t.Fatal(err)
			}
			// Every rule is spelled as iptables-save prints it: a restarted
			// vipd finds nothing to rewrite.
			again, err := New(ctx, hclog.NewNullLogger(), Config{NetNS: node.Path(), Mode: mode, Render: Options{MaxLeafRules: 1}})
			if err != nil {
				t.Fatal(err)
			}
			defer again.Close()
			if err := again.Apply(ctx, s); err != nil {
				t.Fatal(err)
			}
			if st := again.LastSync(); !st.Full || st.ChainsRewritten != 0 || st.ChainsDeleted != 0 {
				t.Errorf("restart sync rewrote %d and deleted %d chains; want none", st.ChainsRewritten, st.ChainsDeleted)
			}
			var got strings.Builder
			for _, f := range families {
				out, err := node.Exec(ctx, mode.tool(f, "save"))
				if err != nil {
					t.Fatal(err)
				}
				got.WriteString("# " + f.String() + "\n" + normalizeSave(out))
			}
			if *update && mode == ModeNFT {
				if err := os.WriteFile(kernelGolden, []byte(got.String()), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(kernelGolden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if diff := gocmp.Diff(string(want), got.String()); diff != "" {
				t.Errorf("%s-save differs from %s (-want +got):\n%s", mode, kernelGolden, diff)
			}
		})
	}
}

// normalizeSave makes iptables-save output comparable across runs and
// modes: it drops comments and packet counters, puts the tables in name
// order, declares the chains of each in name order and lists the rules of
// each chain (in their order) by chain name.
func normalizeSave(save string) string {
	type section struct {
		name          string
		chains, rules []string
	}
	var sections []*section
	var cur *section
	for line := range strings.Lines(save) {
		line = strings.TrimRight(line, "\n")
		switch {
		case strings.HasPrefix(line, "*"):
			cur = &section{name: line}
			sections = append(sections, cur)
		case cur == nil || strings.HasPrefix(line, "#") || line == "COMMIT":
		case strings.HasPrefix(line, ":"):
			decl, _, _ := strings.Cut(line, " [")
			cur.chains = append(cur.chains, decl)
		default:
			cur.rules = append(cur.rules, line)
		}
	}
	slices.SortFunc(sections, func(a, b *section) int { return cmp.Compare(a.name, b.name) })
	var b strings.Builder
	for _, s := range sections {
		slices.Sort(s.chains)
		slices.SortStableFunc(s.rules, func(a, b string) int { return cmp.Compare(ruleChain(a), ruleChain(b)) })
		b.WriteString(s.name + "\n")
		for _, l := range slices.Concat(s.chains, s.rules) {
			b.WriteString(l + "\n")
		}
		b.WriteString("COMMIT\n")
	}
	return b.String()
}

// ruleChain is the chain of an iptables-save rule line ("-A CHAIN ...").
func ruleChain(rule string) string {
	fields := strings.Fields(rule)
	if len(fields) < 2 {
		return ""
	}
	return fields[1]
}

func TestNormalizeSave(t *testing.T) {
	save := `# Generated by iptables-nft-save v1.8.9
*nat
:VIPD-B - [0:0]
:PREROUTING ACCEPT [12:345]
:VIPD-A - [0:0]
-A VIPD-B -j VIPD-A
-A PREROUTING -j VIPD-B
-A VIPD-A -j RETURN
-A VIPD-B -j ACCEPT
COMMIT
# Completed
*filter
:INPUT ACCEPT [1:2]
COMMIT
`
	want := `*filter
:INPUT ACCEPT
COMMIT
*nat
:PREROUTING ACCEPT
:VIPD-A -
:VIPD-B -
-A PREROUTING -j VIPD-B
-A VIPD-A -j RETURN
-A VIPD-B -j VIPD-A
-A VIPD-B -j ACCEPT
COMMIT
`
	if diff := gocmp.Diff(want, normalizeSave(save)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// readmePath is the README whose iptables section holds the chain layout
// block, between layoutBegin and layoutEnd.
var readmePath = filepath.Join("..", "..", "README.md")

const (
	layoutBegin = "<!-- iptables chain layout: TestREADMEChainLayout checks it against iptables-save -->"
	layoutEnd   = "<!-- end of iptables chain layout -->"
)

// TestREADMEChainLayout checks the chain layout the README describes
// against kernelGolden, what iptables-save really shows: every hook, chain
// and jump it names must be there, and every hook and vipd chain there must
// be named.
func TestREADMEChainLayout(t *testing.T) {
	readme, err := os.ReadFile(readmePath)
	if err != nil {
		t.Fatal(err)
	}
	block, err := layoutBlock(string(readme))
	if err != nil {
		t.Fatal(err)
	}
	golden, err := os.ReadFile(kernelGolden)
	if err != nil {
		t.Fatal(err)
	}
	saves := parseGoldenSaves(string(golden))
	if problems := checkLayout(parseLayout(block), saves); len(problems) > 0 {
		t.Errorf("the README's chain layout does not match %s:\n%s", kernelGolden, strings.Join(problems, "\n"))
	}

	// The check must catch a README that drifts from the rules.
	for _, m := range []struct{ name, old, new string }{
		{"a hook left out", "PREROUTING, OUTPUT ->", "PREROUTING ->"},
		{"a hook that does not exist", "POSTROUTING        ->", "POSTROUTING, INPUT ->"},
		{"a chain renamed", "VIPD-HAIRPIN", "VIPD-MASQUERADE"},
		{"a chain family left out", "VIPD-SEP-*", "VIPD-SVC-*"},
		{"a jump that does not exist", ": REJECT\n", ": REJECT\n                           -> VIPD-SVC-*\n"},
		{"the canaries left out", "VIPD-CANARY", ""},
	} {
		if !strings.Contains(block, m.old) {
			t.Fatalf("%s: the README's block no longer contains %q; update this test", m.name, m.old)
		}
		drifted := strings.Replace(block, m.old, m.new, 1)
		if problems := checkLayout(parseLayout(drifted), saves); len(problems) == 0 {
			t.Errorf("%s: the check finds nothing wrong with\n%s", m.name, drifted)
		}
	}
}

// layoutBlock returns the lines of the fenced block between layoutBegin and
// layoutEnd.
func layoutBlock(readme string) (string, error) {
	_, rest, ok := strings.Cut(readme, layoutBegin)
	if !ok {
		return "", fmt.Errorf("%s lacks the line %s", readmePath, layoutBegin)
	}
	block, _, ok := strings.Cut(rest, layoutEnd)
	if !ok {
		return "", fmt.Errorf("%s lacks the line %s", readmePath, layoutEnd)
	}
	block = strings.TrimSpace(block)
	block, ok = strings.CutPrefix(block, "```")
	if !ok || !strings.HasSuffix(block, "```") {
		return "", fmt.Errorf("%s: the chain layout is not one fenced block", readmePath)
	}
	return strings.Trim(strings.TrimSuffix(block, "```"), "\n"), nil
}

// chainLayout is what a README chain layout block claims. Chains are
// names or patterns ending in "*" (VIPD-SVC-*).
type chainLayout struct {
	// hooks are (table, builtin chain, vipd chain) jumps.
	hooks map[[3]string]bool
	// jumps are (table, from, to): to is reachable from from.
	jumps map[[3]string]bool
	// chains are (table, chain) that a line's path names.
	chains map[[2]string]bool
	// named is every chain the block mentions, in paths or prose.
	named []string
}

var (
	builtinChains = []string{"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"}
	chainMention  = regexp.MustCompile(`VIPD-[A-Z0-9-]*[A-Z0-9*]`)
)

// parseLayout reads a chain layout block. A line starts with its tables
// ("nat", "nat, filter") or, continuing the line above, with "->"; then
// comes a path: builtin chains, then vipd chains joined by "->"; the first
// other word starts prose.
//
//	nat     PREROUTING, OUTPUT -> VIPD-SERVICES   prose
//	                           -> VIPD-SVC-*      prose
//	nat, filter  VIPD-CANARY                      prose
func parseLayout(block string) chainLayout {
	l := chainLayout{hooks: map[[3]string]bool{}, jumps: map[[3]string]bool{}, chains: map[[2]string]bool{}}
	var tables, from []string // from: the builtins or the vipd chain a "->" starts at
	for line := range strings.Lines(block) {
		l.named = append(l.named, chainMention.FindAllString(line, -1)...)
		words := strings.Fields(line)
		if len(words) == 0 {
			continue
		}
		if words[0] != "->" {
			tables, from = nil, nil
			for len(words) > 0 && slices.Contains([]string{"nat", "filter"}, strings.TrimSuffix(words[0], ",")) {
				tables = append(tables, strings.TrimSuffix(words[0], ","))
				words = words[1:]
			}
		}
		arrow := false
	path:
		for _, w := range words {
			name := strings.TrimSuffix(w, ",")
			switch {
			case w == "->":
				arrow = true
			case slices.Contains(builtinChains, name) && !arrow:
				from = append(from, name)
			case chainMention.FindString(w) == w:
				for _, t := range tables {
					l.chains[[2]string{t, w}] = true
					for _, f := range from {
						if arrow && slices.Contains(builtinChains, f) {
							l.hooks[[3]string{t, f, w}] = true
						} else if arrow {
							l.jumps[[3]string{t, f, w}] = true
						}
					}
				}
				from, arrow = []string{w}, false
			default:
				break path // prose
			}
		}
	}
	return l
}

// savedTables is iptables-save output parsed per family, table and chain,
// each chain's rules without "-A <chain> ".
type savedTables map[Family]map[string]map[string][]string

// parseGoldenSaves parses kernelGolden: normalized iptables-save output of
// each family after a "# ipv4" or "# ipv6" line.
func parseGoldenSaves(golden string) savedTables {
	out := savedTables{}
	var f Family
	var table string
	for line := range strings.Lines(golden) {
		line = strings.TrimRight(line, "\n")
		switch {
		case line == "# ipv4" || line == "# ipv6":
			f = map[string]Family{"# ipv4": IPv4, "# ipv6": IPv6}[line]
			out[f] = map[string]map[string][]string{}
		case strings.HasPrefix(line, "*"):
			table = line[1:]
			out[f][table] = map[string][]string{}
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			out[f][table][name] = nil
		case strings.HasPrefix(line, "-A "):
			name, rule, _ := strings.Cut(line[len("-A "):], " ")
			out[f][table][name] = append(out[f][table][name], rule)
		}
	}
	return out
}

// jumpTarget is the chain a rule jumps or goes to, or "".
func jumpTarget(rule string) string {
	words := strings.Fields(rule)
	for i, w := range words[:max(0, len(words)-1)] {
		if w == "-j" || w == "-g" {
			return words[i+1]
		}
	}
	return ""
}

// matchChain reports whether chain is the layout's name or pattern p.
func matchChain(p, chain string) bool {
	if prefix, ok := strings.CutSuffix(p, "*"); ok {
		return strings.HasPrefix(chain, prefix)
	}
	return p == chain
}

// checkLayout lists every way in which l and saves disagree.
func checkLayout(l chainLayout, saves savedTables) []string {
	var problems []string
	for _, f := range families {
		hooks := map[[3]string]bool{}
		for table, chains := range saves[f] {
			for chain, rules := range chains {
				for _, r := range rules {
					if to := jumpTarget(r); !strings.HasPrefix(chain, ChainPrefix) && strings.HasPrefix(to, ChainPrefix) {
						hooks[[3]string{table, chain, to}] = true
					}
				}
				if strings.HasPrefix(chain, ChainPrefix) && !slices.ContainsFunc(l.named, func(p string) bool { return matchChain(p, chain) }) {
					problems = append(problems, fmt.Sprintf("%s %s %s: a chain the README does not name", f, table, chain))
				}
			}
		}
		for h := range hooks {
			if !l.hooks[h] {
				problems = append(problems, fmt.Sprintf("%s %s %s -> %s: a hook the README does not name", f, h[0], h[1], h[2]))
			}
		}
		for h := range l.hooks {
			if !hooks[h] {
				problems = append(problems, fmt.Sprintf("%s %s %s -> %s: the README names a hook iptables-save lacks", f, h[0], h[1], h[2]))
			}
		}
		for c := range l.chains {
			if !slices.ContainsFunc(slices.Collect(maps.Keys(saves[f][c[0]])), func(chain string) bool { return matchChain(c[1], chain) }) {
				problems = append(problems, fmt.Sprintf("%s %s %s: the README names a chain iptables-save lacks", f, c[0], c[1]))
			}
		}
		for j := range l.jumps {
			if !reachable(saves[f][j[0]], j[1], j[2]) {
				problems = append(problems, fmt.Sprintf("%s %s %s -> %s: the README names a jump iptables-save lacks", f, j[0], j[1], j[2]))
			}
		}
	}
	for _, p := range l.named {
		found := false
		for _, tables := range saves {
			for _, chains := range tables {
				for chain := range chains {
					found = found || matchChain(p, chain)
				}
			}
		}
		if !found {
			problems = append(problems, fmt.Sprintf("%s: the README names a chain iptables-save lacks", p))
		}
	}
	slices.Sort(problems)
	return problems
}

// reachable reports whether a chain matching to can be reached, through
// one jump or more, from a chain matching from.
func reachable(chains map[string][]string, from, to string) bool {
	var queue []string
	seen := map[string]bool{}
	for chain := range chains {
		if matchChain(from, chain) {
			queue = append(queue, chain)
		}
	}
	for len(queue) > 0 {
		chain := queue[0]
		queue = queue[1:]
		for _, r := range chains[chain] {
			next := jumpTarget(r)
			if next == "" || seen[next] {
				continue
			}
			if matchChain(to, next) {
				return true
			}
			seen[next] = true
			queue = append(queue, next)
		}
	}
	return false
}
