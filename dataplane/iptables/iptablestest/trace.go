package iptablestest

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/iptables"
)

// Hook is where a traced packet enters the network stack.
type Hook int

// Hooks a traced packet can enter at.
const (
	// HookPrerouting is a packet from a pod or another host, in through
	// Packet.In: nat PREROUTING, filter FORWARD (a VIP is no local address;
	// INPUT, for a node's own address, has the same vipd hook), nat
	// POSTROUTING.
	HookPrerouting Hook = iota
	// HookOutput is a packet from a local process: nat OUTPUT, filter OUTPUT,
	// nat POSTROUTING. It has no in-interface (Packet.In must be empty).
	HookOutput
)

type builtin struct {
	table iptables.Table
	chain string
}

var hookPath = [...][]builtin{
	HookPrerouting: {{iptables.NAT, "PREROUTING"}, {iptables.Filter, "FORWARD"}, {iptables.NAT, "POSTROUTING"}},
	HookOutput:     {{iptables.NAT, "OUTPUT"}, {iptables.Filter, "OUTPUT"}, {iptables.NAT, "POSTROUTING"}},
}

var builtins = map[iptables.Table][]string{
	iptables.NAT:    {"PREROUTING", "OUTPUT", "POSTROUTING"},
	iptables.Filter: {"INPUT", "FORWARD", "OUTPUT"},
}

// Packet is the first packet of a new connection.
type Packet struct {
	Hook     Hook
	Src, Dst netip.Addr
	Protocol dataplane.Protocol
	DstPort  uint16
	// In is the interface a HookPrerouting packet came in through, which
	// `-i` matches; empty matches no `-i`.
	In string
	// Affinity, when valid, is the backend the client holds a live
	// session-affinity entry for: a `recent --rcheck` matches when its list is
	// the one set by the chain that DNATs to Affinity. When Affinity is not
	// valid, no --rcheck matches.
	Affinity netip.Addr
}

// Verdict is what vipd's rules do to a packet.
type Verdict int

// Verdicts.
const (
	// NoMatch means no vipd rule decided: the packet goes on unchanged.
	NoMatch Verdict = iota
	// DNAT means the packet is sent to a backend.
	DNAT
	// Reject means the packet is refused with an ICMP port unreachable.
	Reject
	// Drop means the packet is dropped without an answer.
	Drop
)

func (v Verdict) String() string {
	return [...]string{NoMatch: "no match", DNAT: "DNAT", Reject: "REJECT", Drop: "DROP"}[v]
}

// Destination is one backend a packet may be DNATed to.
type Destination struct {
	Addr        netip.AddrPort
	Probability float64
	// Masquerade is whether the walk of nat POSTROUTING, with the packet as
	// DNAT left it, reaches MASQUERADE (hairpin traffic, or external
	// traffic that got iptables.MasqueradeMark).
	Masquerade bool
}

// Outcome is the result of tracing a packet.
type Outcome struct {
	Verdict Verdict
	// Destinations are, for DNAT, every possible destination, sorted, with
	// probabilities that add up to 1.
	Destinations []Destination
	// Rules is the most rules that any one path of the packet evaluated,
	// hook rules included.
	Rules int
}

// Tracer is an in-memory model of one family's vipd chains, fed with
// iptables-restore --noflush input, that follows packets through them. It
// parses the rule text it is given, so it checks the rendered text rather
// than Render's data structures, and it fails loudly on any match, option or
// target it does not model. Its builtin chains hold iptables.Hooks. A
// Tracer is not safe for concurrent use.
type Tracer struct {
	family iptables.Family
	tables map[iptables.Table]*chainSet
	// lists maps a recent list to the address its chain DNATs to; built on
	// the first trace that needs it.
	lists map[string]netip.Addr
}

type chainSet struct {
	chains map[string][]*rule
	// refs counts the rules that jump to each chain.
	refs map[string]int
}

func (cs *chainSet) clone() *chainSet {
	c := &chainSet{chains: make(map[string][]*rule, len(cs.chains)), refs: maps.Clone(cs.refs)}
	for name, rules := range cs.chains {
		c.chains[name] = slices.Clone(rules)
	}
	return c
}

func (cs *chainSet) flush(name string) {
	for _, r := range cs.chains[name] {
		if r.jump != "" {
			cs.refs[r.jump]--
		}
	}
	cs.chains[name] = nil
}

func (cs *chainSet) append(name string, r *rule) {
	cs.chains[name] = append(cs.chains[name], r)
	if r.jump != "" {
		cs.refs[r.jump]++
	}
}

// NewTracer returns a Tracer for family f whose kernel holds
// iptables.Hooks and no vipd chain.
func NewTracer(f iptables.Family) *Tracer {
	t := &Tracer{family: f, tables: map[iptables.Table]*chainSet{}}
	for tab, names := range builtins {
		cs := &chainSet{chains: map[string][]*rule{}, refs: map[string]int{}}
		for _, name := range names {
			cs.chains[name] = nil
		}
		t.tables[tab] = cs
	}
	for _, h := range iptables.Hooks(f) {
		r, err := parseRule(f, h.Table, h.Args)
		if err != nil {
			panic(fmt.Sprintf("hook %s %s: %v", h.Table, h.Chain, err))
		}
		t.tables[h.Table].append(h.Chain, r)
	}
	return t
}

// Restore applies iptables-restore --noflush input, all or nothing. Like the
// kernel, it refuses an -A to a missing chain, a jump to a missing chain, and
// an -X of a chain that is not empty or is still referenced. It also refuses
// anything but vipd chains, which Payload never leaves.
func (t *Tracer) Restore(payload []byte) error {
	rs := restorer{family: t.family, work: map[iptables.Table]*chainSet{}}
	for tab, cs := range t.tables {
		rs.work[tab] = cs.clone()
	}
	for n, line := range strings.Split(string(payload), "\n") {
		if err := rs.line(strings.TrimSpace(line)); err != nil {
			return fmt.Errorf("restore line %d %q: %w", n+1, line, err)
		}
	}
	if rs.cs != nil {
		return fmt.Errorf("restore: table %s lacks COMMIT", rs.tab)
	}
	t.tables, t.lists = rs.work, nil
	return nil
}

// restorer applies restore input, line by line, to a copy of the tables.
type restorer struct {
	family iptables.Family
	work   map[iptables.Table]*chainSet
	tab    iptables.Table
	cs     *chainSet // the table being restored; nil outside one
}

func (rs *restorer) line(line string) error {
	switch {
	case line == "" || line[0] == '#':
		return nil
	case line[0] == '*':
		if rs.cs != nil {
			return fmt.Errorf("table %s lacks COMMIT", rs.tab)
		}
		rs.tab = iptables.Table(line[1:])
		if rs.cs = rs.work[rs.tab]; rs.cs == nil {
			return fmt.Errorf("unknown table %s", rs.tab)
		}
		return nil
	case rs.cs == nil:
		return errors.New("outside a table")
	case line == "COMMIT":
		rs.cs = nil
		return nil
	case line[0] == ':':
		f := strings.Fields(line[1:])
		if len(f) != 3 || f[1] != "-" || f[2] != "[0:0]" {
			return errors.New("only user chains may be declared")
		}
		if !strings.HasPrefix(f[0], iptables.ChainPrefix) || len(f[0]) > iptables.MaxChainName {
			return fmt.Errorf("chain name %s: not a vipd chain name of at most %d characters", f[0], iptables.MaxChainName)
		}
		rs.cs.flush(f[0])
		return nil
	}
	op, rest, _ := strings.Cut(line, " ")
	name, spec, _ := strings.Cut(rest, " ")
	if !strings.HasPrefix(name, iptables.ChainPrefix) {
		return fmt.Errorf("%s is not a vipd chain", name)
	}
	rules, ok := rs.cs.chains[name]
	if !ok {
		return fmt.Errorf("no chain %s", name)
	}
	switch op {
	case "-A":
		args, err := tokenize(spec)
		if err != nil {
			return err
		}
		r, err := parseRule(rs.family, rs.tab, args)
		if err != nil {
			return err
		}
		if _, ok := rs.cs.chains[r.jump]; r.jump != "" && !ok {
			return fmt.Errorf("jump to missing chain %s", r.jump)
		}
		r.spec = spec
		rs.cs.append(name, r)
	case "-X":
		switch {
		case spec != "":
			return errors.New("-X takes one chain")
		case len(rules) > 0:
			return fmt.Errorf("chain %s is not empty", name)
		case rs.cs.refs[name] > 0:
			return fmt.Errorf("chain %s is still referenced", name)
		}
		delete(rs.cs.chains, name)
	default:
		return fmt.Errorf("unsupported command %s", op)
	}
	return nil
}

// Chains returns the vipd chains of table tab and their rule specs.
func (t *Tracer) Chains(tab iptables.Table) map[string][]string {
	out := map[string][]string{}
	for name, rules := range t.tables[tab].chains {
		if !strings.HasPrefix(name, iptables.ChainPrefix) {
			continue
		}
		out[name] = []string{}
		for _, r := range rules {
			out[name] = append(out[name], r.spec)
		}
	}
	return out
}

// Trace follows p through the nat and filter tables (see Hook) and reports
// the outcome. Every statistic rule forks the trace into a matching and a
// non-matching path, whose probabilities multiply. It fails if the paths
// reach different verdicts, such as DNAT on some and no match on others.
func (t *Tracer) Trace(p Packet) (Outcome, error) {
	if !p.Src.IsValid() || !p.Dst.IsValid() || iptables.FamilyOf(p.Src) != t.family || iptables.FamilyOf(p.Dst) != t.family {
		return Outcome{}, fmt.Errorf("trace %v -> %v: need two %s addresses", p.Src, p.Dst, t.family)
	}
	if p.Hook < 0 || int(p.Hook) >= len(hookPath) {
		return Outcome{}, fmt.Errorf("trace: unknown hook %d", p.Hook)
	}
	if p.Hook == HookOutput && p.In != "" {
		return Outcome{}, errors.New("trace: a local process's packet has no in-interface")
	}
	live := []branch{{prob: 1, dst: p.Dst, dport: p.DstPort}}
	for _, hc := range hookPath[p.Hook] {
		var next []branch
		for _, b := range live {
			if b.reject || b.drop {
				next = append(next, b)
				continue
			}
			b.stop = false
			res, err := t.walk(hc, hc.chain, b, &p, 0)
			if err != nil {
				return Outcome{}, fmt.Errorf("trace %v -> %v: %w", p.Src, p.Dst, err)
			}
			next = append(next, res...)
		}
		live = next
	}
	return outcome(live)
}

// branch is one path of a traced packet.
type branch struct {
	prob               float64
	dst                netip.Addr
	dport              uint16
	rules              int
	dnat, masq, reject bool
	drop               bool
	// marked is set by vipd's CONNMARK rule (see iptables.FlowMark).
	marked bool
	// masqMark is set by vipd's MARK rule (see iptables.MasqueradeMark).
	masqMark bool
	// stop is set by a target that ends the traversal of the current table.
	stop bool
}

const maxDepth = 64

// walk runs b through chain, reached from the builtin chain hook, and returns
// the resulting paths: those with stop set met a terminating target, the
// others returned from the chain. Like the kernel, it refuses DNAT reached
// from POSTROUTING and MASQUERADE reached from anywhere else.
func (t *Tracer) walk(hook builtin, chain string, b branch, p *Packet, depth int) ([]branch, error) {
	tab := hook.table
	rules, ok := t.tables[tab].chains[chain]
	if !ok {
		return nil, fmt.Errorf("%s: no chain %s", tab, chain)
	}
	if depth > maxDepth {
		return nil, fmt.Errorf("%s: jumps nest deeper than %d at %s", tab, maxDepth, chain)
	}
	live, out := []branch{b}, []branch(nil)
	for _, r := range rules {
		var next []branch
		for _, b := range live {
			b.rules++
			pm, err := t.match(r, &b, p)
			if err != nil {
				return nil, fmt.Errorf("%s -A %s %s: %w", tab, chain, r.spec, err)
			}
			if pm < 1 {
				nb := b
				nb.prob *= 1 - pm
				next = append(next, nb)
			}
			if pm == 0 {
				continue
			}
			b.prob *= pm
			switch r.target {
			case "":
				next = append(next, b)
			case "CONNMARK":
				b.marked = true
				next = append(next, b)
			case "MARK":
				b.masqMark = true
				next = append(next, b)
			case "RETURN":
				out = append(out, b)
			case "ACCEPT":
				b.stop = true
				out = append(out, b)
			case "DNAT":
				if hook.chain == "POSTROUTING" {
					return nil, fmt.Errorf("%s -A %s %s: DNAT reached from POSTROUTING", tab, chain, r.spec)
				}
				b.dst, b.dport, b.dnat, b.stop = r.dnat.Addr(), r.dnat.Port(), true, true
				out = append(out, b)
			case "MASQUERADE":
				if hook.chain != "POSTROUTING" {
					return nil, fmt.Errorf("%s -A %s %s: MASQUERADE reached from %s", tab, chain, r.spec, hook.chain)
				}
				b.masq, b.stop = true, true
				out = append(out, b)
			case "REJECT":
				b.reject, b.stop = true, true
				out = append(out, b)
			case "DROP":
				b.drop, b.stop = true, true
				out = append(out, b)
			default:
				sub, err := t.walk(hook, r.jump, b, p, depth+1)
				if err != nil {
					return nil, err
				}
				for _, s := range sub {
					if s.stop {
						out = append(out, s)
					} else {
						next = append(next, s)
					}
				}
			}
		}
		live = next
	}
	return append(out, live...), nil
}

// match returns the probability that r matches b: 0 or 1, or a statistic
// rule's probability. The packet is the first of its connection, so
// --ctstate NEW always holds, and --ctstate DNAT holds once a DNAT target
// has translated it.
func (t *Tracer) match(r *rule, b *branch, p *Packet) (float64, error) {
	switch {
	case r.src.IsValid() && !r.src.Contains(p.Src),
		r.dst.IsValid() && !r.dst.Contains(b.dst),
		r.proto != 0 && r.proto != p.Protocol,
		r.dport >= 0 && r.dport != int(b.dport),
		r.in != "" && r.in != p.In,
		r.markMatch && !b.masqMark,
		r.ctDNAT && !b.dnat:
		return 0, nil
	}
	if r.rcheck != "" {
		owner, err := t.listOwner(r.rcheck)
		if err != nil {
			return 0, err
		}
		if !p.Affinity.IsValid() || owner != p.Affinity {
			return 0, nil
		}
	}
	return r.prob, nil
}

// listOwner is the address that the chain setting recent list name DNATs to.
func (t *Tracer) listOwner(name string) (netip.Addr, error) {
	if t.lists == nil {
		t.lists = map[string]netip.Addr{}
		for _, rules := range t.tables[iptables.NAT].chains {
			var set string
			var to netip.Addr
			for _, r := range rules {
				set = cmp.Or(r.rset, set)
				if r.target == "DNAT" {
					to = r.dnat.Addr()
				}
			}
			if set != "" && to.IsValid() {
				t.lists[set] = to
			}
		}
	}
	a, ok := t.lists[name]
	if !ok {
		return a, fmt.Errorf("recent list %s is checked, but no DNAT chain sets it", name)
	}
	return a, nil
}

func outcome(paths []branch) (Outcome, error) {
	var o Outcome
	type dest struct {
		addr netip.AddrPort
		masq bool
	}
	dests := map[dest]float64{}
	verdicts := map[Verdict]float64{}
	for _, b := range paths {
		if b.prob == 0 {
			continue
		}
		o.Rules = max(o.Rules, b.rules)
		if b.masq && !b.dnat {
			return o, errors.New("a path is masqueraded, but no vipd rule DNATed it")
		}
		if b.dnat && !b.marked {
			// The flow source would never see this connection.
			return o, errors.New("a path is DNATed without vipd's flow connmark")
		}
		v := NoMatch
		switch {
		case b.reject:
			v = Reject
		case b.drop:
			v = Drop
		case b.dnat:
			v = DNAT
			dests[dest{netip.AddrPortFrom(b.dst, b.dport), b.masq}] += b.prob
		}
		verdicts[v] += b.prob
	}
	if len(verdicts) != 1 {
		return o, fmt.Errorf("paths reach different verdicts: %v", verdicts)
	}
	for v := range verdicts {
		o.Verdict = v
	}
	for d, prob := range dests {
		o.Destinations = append(o.Destinations, Destination{d.addr, prob, d.masq})
	}
	slices.SortFunc(o.Destinations, func(a, b Destination) int {
		if c := a.Addr.Compare(b.Addr); c != 0 {
			return c
		}
		if a.Masquerade == b.Masquerade {
			return 0
		}
		if a.Masquerade {
			return 1
		}
		return -1
	})
	return o, nil
}

// rule is a parsed rule: the matches and the one target the tracer models.
type rule struct {
	spec     string
	src, dst netip.Prefix
	proto    dataplane.Protocol
	dport    int     // -1: any
	prob     float64 // statistic; 1 without one
	rcheck   string  // recent list that must hold the source
	rset     string  // recent list the source is added to
	ctDNAT   bool    // --ctstate DNAT: the connection's destination was translated
	in       string  // -i: the interface the packet came in through
	// markMatch is -m mark --mark MasqueradeMark/MasqueradeMark.
	markMatch bool
	target    string // "" when the rule has none
	jump      string // user chain, when target is one
	dnat      netip.AddrPort
}

// Options of the matches and targets the tracer models, and whether each
// takes a value. A "!" key allows the option to be negated.
var (
	matchOptions = map[string]map[string]bool{
		"tcp":       {"--dport": true},
		"udp":       {"--dport": true},
		"sctp":      {"--dport": true},
		"comment":   {"--comment": true},
		"statistic": {"--mode": true, "--probability": true},
		"recent":    {"--name": true, "--mask": true, "--rsource": false, "--rcheck": false, "--set": false, "--seconds": true, "--reap": false},
		"conntrack": {"--ctstate": true},
		"mark":      {"--mark": true},
	}
	targetOptions = map[string]map[string]bool{
		"DNAT":       {"--to-destination": true},
		"MASQUERADE": {"--random-fully": false},
		"REJECT":     {"--reject-with": true},
		"CONNMARK":   {"--set-xmark": true},
		"MARK":       {"--set-xmark": true},
		"DROP":       {},
		"RETURN":     {},
		"ACCEPT":     {},
	}
	protocols = map[string]dataplane.Protocol{"tcp": dataplane.TCP, "udp": dataplane.UDP, "sctp": dataplane.SCTP}
)

// parseRule parses the arguments of a rule of family f in table tab.
func parseRule(f iptables.Family, tab iptables.Table, args []string) (*rule, error) {
	r := &rule{dport: -1, prob: 1}
	for i := 0; i < len(args); {
		flag := args[i]
		if i+1 >= len(args) {
			return nil, fmt.Errorf("%s needs a value", flag)
		}
		v := args[i+1]
		i += 2
		var err error
		switch flag {
		case "-s", "-d":
			var p netip.Prefix
			if p, err = netip.ParsePrefix(v); err == nil && iptables.FamilyOf(p.Addr()) != f {
				err = fmt.Errorf("%s is not %s", v, f)
			}
			if flag == "-s" {
				r.src = p
			} else {
				r.dst = p
			}
		case "-i":
			r.in = v
		case "-p":
			if r.proto = protocols[v]; r.proto == 0 {
				err = fmt.Errorf("unknown protocol %s", v)
			}
		case "-m":
			var o map[string]string
			if o, err = options(args, &i, matchOptions[v]); err == nil {
				err = r.setMatch(f, v, o)
			}
		case "-j":
			r.target = v
			var o map[string]string
			if o, err = options(args, &i, targetOptions[v]); err == nil && i < len(args) {
				err = fmt.Errorf("%q after the target", args[i])
			}
			if err == nil {
				err = r.setTarget(f, tab, o)
			}
		default:
			err = fmt.Errorf("unknown argument %s", flag)
		}
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", flag, v, err)
		}
	}
	return r, nil
}

// options consumes the options that follow a match or target name at
// args[*i], as allowed lists them, up to the next generic argument.
func options(args []string, i *int, allowed map[string]bool) (map[string]string, error) {
	o := map[string]string{}
	for *i < len(args) {
		key, n := args[*i], 1
		if key == "!" && *i+1 < len(args) {
			key, n = "!"+args[*i+1], 2
		}
		takesValue, ok := allowed[key]
		if !ok {
			if strings.HasPrefix(strings.TrimPrefix(key, "!"), "--") {
				return nil, fmt.Errorf("unsupported option %s", key)
			}
			return o, nil
		}
		*i += n
		if takesValue {
			if *i >= len(args) {
				return nil, fmt.Errorf("%s needs a value", key)
			}
			o[key] = args[*i]
			*i++
		} else {
			o[key] = ""
		}
	}
	return o, nil
}

func (r *rule) setMatch(f iptables.Family, module string, o map[string]string) error {
	switch module {
	case "tcp", "udp", "sctp":
		if r.proto != protocols[module] {
			return fmt.Errorf("needs -p %s before it", module)
		}
		if v, ok := o["--dport"]; ok {
			n, err := strconv.ParseUint(v, 10, 16)
			if err != nil {
				return err
			}
			r.dport = int(n)
		}
	case "comment":
	case "statistic":
		if o["--mode"] != "random" {
			return errors.New("only --mode random is supported")
		}
		p, err := strconv.ParseFloat(o["--probability"], 64)
		if err != nil || p < 0 || p > 1 {
			return fmt.Errorf("bad probability %q", o["--probability"])
		}
		r.prob = p
	case "recent":
		_, rsource := o["--rsource"]
		_, check := o["--rcheck"]
		_, set := o["--set"]
		switch {
		case o["--mask"] != f.HostMask() || !rsource:
			return errors.New("only --rsource with a whole-address --mask is supported")
		case o["--name"] == "":
			return errors.New("needs --name")
		case check == set:
			return errors.New("needs exactly one of --rcheck and --set")
		case check:
			r.rcheck = o["--name"]
		default:
			r.rset = o["--name"]
		}
	case "mark":
		if o["--mark"] != masqMark() {
			return fmt.Errorf("only vipd's masquerade mark: --mark %s", masqMark())
		}
		r.markMatch = true
	case "conntrack":
		switch o["--ctstate"] {
		case "NEW":
		case "DNAT":
			r.ctDNAT = true
		default:
			return errors.New("only --ctstate NEW or DNAT is supported")
		}
	default:
		return errors.New("unsupported match")
	}
	return nil
}

func (r *rule) setTarget(f iptables.Family, tab iptables.Table, o map[string]string) error {
	switch r.target {
	case "DNAT":
		ap, err := netip.ParseAddrPort(o["--to-destination"])
		switch {
		case tab != iptables.NAT:
			return errors.New("DNAT outside the nat table")
		case err != nil:
			return err
		case iptables.FamilyOf(ap.Addr()) != f || r.proto == 0:
			return fmt.Errorf("--to-destination %s needs an %s address and a -p protocol", ap, f)
		}
		r.dnat = ap
	case "MASQUERADE":
		if tab != iptables.NAT {
			return errors.New("MASQUERADE outside the nat table")
		}
	case "REJECT":
		if tab != iptables.Filter || o["--reject-with"] != f.RejectWith(r.proto) {
			return fmt.Errorf("only in the filter table with --reject-with %s", f.RejectWith(r.proto))
		}
	case "CONNMARK":
		if tab != iptables.NAT || o["--set-xmark"] != fmt.Sprintf("%#x/%#x", iptables.FlowMark, iptables.FlowMarkMask) {
			return fmt.Errorf("only vipd's flow mark in the nat table: --set-xmark %#x/%#x", iptables.FlowMark, iptables.FlowMarkMask)
		}
	case "MARK":
		if tab != iptables.NAT || o["--set-xmark"] != masqMark() {
			return fmt.Errorf("only vipd's masquerade mark in the nat table: --set-xmark %s", masqMark())
		}
	case "DROP":
		if tab != iptables.Filter {
			return errors.New("DROP outside the filter table")
		}
	case "RETURN", "ACCEPT":
	default:
		if !strings.HasPrefix(r.target, iptables.ChainPrefix) {
			return errors.New("unsupported target")
		}
		r.jump = r.target
	}
	return nil
}

// tokenize splits a rule spec into arguments as iptables-restore does:
// at blanks, except inside double quotes, which it removes.
func tokenize(s string) ([]string, error) {
	var (
		out    []string
		cur    strings.Builder
		quoted bool
		inArg  bool
	)
	for _, c := range s {
		switch {
		case c == '"':
			quoted, inArg = !quoted, true
		case (c == ' ' || c == '\t') && !quoted:
			if inArg {
				out = append(out, cur.String())
				cur.Reset()
				inArg = false
			}
		default:
			cur.WriteRune(c)
			inArg = true
		}
	}
	if quoted {
		return nil, errors.New("unterminated quote")
	}
	if inArg {
		out = append(out, cur.String())
	}
	return out, nil
}

// masqMark is iptables.MasqueradeMark as value/mask, the only mark the
// tracer models.
func masqMark() string {
	return fmt.Sprintf("%#x/%#x", iptables.MasqueradeMark, iptables.MasqueradeMark)
}
