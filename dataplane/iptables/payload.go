package iptables

import (
	"bytes"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Stats counts what a payload does, for logs and metrics.
type Stats struct {
	ChainsRewritten int
	RulesWritten    int
	ChainsDeleted   int
}

// Update is the payload for one family.
type Update struct {
	Family Family
	// Restore is the input for `iptables-restore --noflush` (for IPv6,
	// ip6tables-restore), one *nat and one *filter section. It is nil when
	// the family needs no change, and the restore can be skipped.
	Restore []byte
	Stats
	// Rewritten and Deleted name the chains the payload rewrites and
	// deletes, sorted, indexed like tables (nat, then filter).
	Rewritten, Deleted [2][]string
	// sections are Restore's sections, indexed like tables, each from its
	// *table line to its COMMIT; a table with nothing to change has none
	// (nil), although Restore carries an empty section for it.
	sections [2][]byte
}

// ExistingChains lists the vipd chains that one family's tables hold in the
// kernel, sorted, per table.
type ExistingChains map[Table][]string

// Payload returns, indexed by Family, the iptables-restore --noflush input
// that moves the kernel from old to next. It touches only vipd chains:
//
//   - A chain of next that old lacks, or whose rules differ, is declared
//     (`:CHAIN - [0:0]`, which creates or flushes it) and rewritten. Unchanged
//     chains are left out (kube-proxy's partial sync).
//   - A chain of old that next lacks is declared (flushed) too, and deleted
//     with -X after every rewrite. Nothing else refers to it by then: chains
//     that referred to it are either rewritten or deleted themselves, since a
//     Ruleset never jumps to a chain it lacks.
//
// With full set, every chain of next is rewritten, and the chains to delete
// are those of old and of existing (what ParseSave found in the kernel) that
// next lacks. Use full for the first sync, after any failed restore, and for
// periodic resyncs; old may then be nil. Payload(nil, nil, true, existing)
// deletes every vipd chain, once the applier has removed the Hooks.
//
// iptables-restore may commit each table at its COMMIT, so a failure can
// leave the nat section applied and not the filter one. Follow any failure
// with a full sync.
func Payload(old, next *Ruleset, full bool, existing map[Family]ExistingChains) []Update {
	out := make([]Update, len(families))
	for _, f := range families {
		out[f].Family = f
		var rewrite, del [2][]string
		for i, t := range tables {
			rewrite[i], del[i] = tableDiff(old, next, f, t, full, existing[f][t])
		}
		if len(rewrite[0])+len(rewrite[1])+len(del[0])+len(del[1]) == 0 {
			continue
		}
		var b bytes.Buffer
		b.Grow(sectionSize(next, f, tables[0], rewrite[0], del[0]) + sectionSize(next, f, tables[1], rewrite[1], del[1]))
		var bounds [2][2]int
		for i, t := range tables {
			bounds[i][0] = b.Len()
			writeSection(&b, next, f, t, rewrite[i], del[i], &out[f].Stats)
			bounds[i][1] = b.Len()
		}
		out[f].Rewritten, out[f].Deleted = rewrite, del
		out[f].Restore = b.Bytes()
		for i := range tables {
			if len(rewrite[i])+len(del[i]) > 0 {
				start, end := bounds[i][0], bounds[i][1]
				out[f].sections[i] = out[f].Restore[start:end:end]
			}
		}
	}
	return out
}

// tableDiff returns the chains of table t of family f that a payload from
// old to next rewrites (sorted) and deletes, as Payload describes;
// existing is what ParseSave found in that table.
func tableDiff(old, next *Ruleset, f Family, t Table, full bool, existing []string) (rewrite, del []string) {
	oldT, newT := old.table(f, t), next.table(f, t)
	if !full && old != nil && next != nil && next.delta != nil && next.delta.from == old.id {
		// Only the chains the delta names can differ.
		for name := range next.delta.chains[f][t] {
			rules, ok := newT[name]
			o, had := oldT[name]
			switch {
			case ok && (!had || !slices.Equal(o, rules)):
				rewrite = append(rewrite, name)
			case !ok && had && strings.HasPrefix(name, ChainPrefix):
				del = append(del, name)
			}
		}
		slices.Sort(rewrite)
		slices.Sort(del)
		return rewrite, del
	}
	for name, rules := range newT {
		if o, ok := oldT[name]; full || !ok || !slices.Equal(o, rules) {
			rewrite = append(rewrite, name)
		}
	}
	slices.Sort(rewrite)
	// Only the chains to delete are sorted: a partial sync of 10,000
	// services deletes few of the tens of thousands it looks at.
	gone := func(name string) {
		if _, ok := newT[name]; !ok && strings.HasPrefix(name, ChainPrefix) {
			del = append(del, name)
		}
	}
	for name := range oldT {
		gone(name)
	}
	if full {
		for _, name := range existing {
			gone(name)
		}
	}
	slices.Sort(del)
	return rewrite, slices.Compact(del)
}

// writeSection writes to b the *t section that rewrites the chains rewrite
// with their rules in next and deletes the chains del, and counts it in st.
func writeSection(b *bytes.Buffer, next *Ruleset, f Family, t Table, rewrite, del []string, st *Stats) {
	b.WriteString("*" + string(t) + "\n")
	declare := slices.Concat(rewrite, del)
	slices.Sort(declare)
	for _, name := range declare {
		b.WriteString(":" + name + " - [0:0]\n")
	}
	if len(rewrite) >= bulkChains {
		rewrite = walkOrder(next, f, t, rewrite)
	}
	for _, name := range rewrite {
		for _, rule := range next.Rules(f, t, name) {
			for _, part := range [...]string{"-A ", name, " ", rule, "\n"} {
				b.WriteString(part)
			}
			st.RulesWritten++
		}
	}
	// Order matters: -X only after every rule that jumped here is gone.
	for _, name := range del {
		b.WriteString("-X " + name + "\n")
	}
	b.WriteString("COMMIT\n")
	st.ChainsRewritten += len(rewrite)
	st.ChainsDeleted += len(del)
}

// walkOrder returns the chains rewrite of table t of family f in next in
// the order nf_tables walks them when it validates the table (see doc.go):
// depth first from the chains the Hooks jump to, each chain's rules in
// order; the chains it does not reach follow in the order given. A bulk
// load writes its rules in this order, and the kernel allocates them in
// the order it reads them, so that the walk after every later commit reads
// memory mostly in the order it was allocated in: a 10,000-service move's
// commit was measured about 15% faster (108 ms against 128 ms) than with
// the rules written in chain name order.
func walkOrder(next *Ruleset, f Family, t Table, rewrite []string) []string {
	chains := next.table(f, t)
	want := make(map[string]bool, len(rewrite))
	for _, name := range rewrite {
		want[name] = true
	}
	seen := make(map[string]bool, len(chains))
	out := make([]string, 0, len(rewrite))
	var visit func(name string)
	visit = func(name string) {
		if seen[name] {
			return
		}
		seen[name] = true
		if want[name] {
			out = append(out, name)
		}
		for _, rule := range chains[name] {
			if target := ruleTarget(rule); target != "" {
				if _, ok := chains[target]; ok {
					visit(target)
				}
			}
		}
	}
	for _, h := range Hooks(f) {
		if h.Table == t {
			visit(h.Target())
		}
	}
	for _, name := range rewrite {
		visit(name)
	}
	return out
}

// ruleTarget is the target of rule (its last -j), or "" for none.
func ruleTarget(rule string) string {
	i := strings.LastIndex(rule, "-j ")
	if i < 0 || i > 0 && rule[i-1] != ' ' {
		return ""
	}
	target, _, _ := strings.Cut(rule[i+len("-j "):], " ")
	return target
}

// tablePayload is the section of Payload(old, next, false, nil)[f] for
// table t alone, or nil when that table needs no change, with the number
// of chains it rewrites.
func tablePayload(old, next *Ruleset, f Family, t Table) ([]byte, int) {
	rewrite, del := tableDiff(old, next, f, t, false, nil)
	if len(rewrite)+len(del) == 0 {
		return nil, 0
	}
	var b bytes.Buffer
	b.Grow(sectionSize(next, f, t, rewrite, del))
	writeSection(&b, next, f, t, rewrite, del, &Stats{})
	return b.Bytes(), len(rewrite)
}

// sectionSize bounds the size of a section, so that it is allocated once.
func sectionSize(next *Ruleset, f Family, t Table, rewrite, del []string) int {
	n := 32
	for _, name := range rewrite {
		n += len(name) + 10
		for _, rule := range next.Rules(f, t, name) {
			n += len(name) + len(rule) + 5
		}
	}
	for _, name := range del {
		n += 2*len(name) + 14
	}
	return n
}

// ParseSave lists the vipd chains in iptables-save (or ip6tables-save)
// output, for a full Payload.
func ParseSave(save []byte) ExistingChains {
	ec := ExistingChains{}
	var t Table
	for line := range strings.Lines(string(save)) {
		switch {
		case strings.HasPrefix(line, "*"):
			t = Table(strings.TrimSpace(line[1:]))
		case strings.HasPrefix(line, ":"+ChainPrefix):
			name, _, _ := strings.Cut(line[1:], " ")
			ec[t] = append(ec[t], strings.TrimSpace(name))
		}
	}
	for _, names := range ec {
		slices.Sort(names)
	}
	return ec
}

// RulesetFromSave reads the vipd chains out of iptables-save and
// ip6tables-save output, so that a sync can diff against what the kernel
// holds. Rules are kept as iptables-save prints them; a rule that Render would
// spell differently only costs a rewrite of its chain.
func RulesetFromSave(saves map[Family][]byte) *Ruleset {
	r := &Ruleset{}
	for _, f := range families {
		r.chains[f] = map[Table]map[string][]string{}
		var t Table
		for line := range strings.Lines(string(saves[f])) {
			line = strings.TrimRight(line, "\n")
			switch {
			case strings.HasPrefix(line, "*"):
				t = Table(line[1:])
				r.chains[f][t] = map[string][]string{}
			case strings.HasPrefix(line, ":"+ChainPrefix):
				name, _, _ := strings.Cut(line[1:], " ")
				r.add(f, t, name)
			case strings.HasPrefix(line, "-A "+ChainPrefix):
				name, rule, _ := strings.Cut(line[len("-A "):], " ")
				r.add(f, t, name, rule)
			}
		}
	}
	return r
}

var failedLine = regexp.MustCompile(`line (\d+)`)

// FailureContext returns the lines of payload around the line that
// iptables-restore's error output names, numbered and with the failing line
// marked, so that a failure can be logged without the whole payload. It
// returns "" when the error output names no line.
func FailureContext(payload []byte, stderr string) string {
	m := failedLine.FindStringSubmatch(stderr)
	if m == nil {
		return ""
	}
	n, _ := strconv.Atoi(m[1])
	lines := strings.Split(string(payload), "\n")
	var b strings.Builder
	for i := max(1, n-2); i <= min(len(lines), n+2); i++ {
		mark := "  "
		if i == n {
			mark = "> "
		}
		fmt.Fprintf(&b, "%s%d: %s\n", mark, i, lines[i-1])
	}
	return b.String()
}
