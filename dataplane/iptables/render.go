package iptables

import (
	"cmp"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/vipd/vipd/dataplane"
)

// Family is an address family. IPv4 rules are for iptables, IPv6 rules for
// ip6tables.
type Family int

// Address families. Their values index the slice that Payload returns.
const (
	IPv4 Family = iota
	IPv6
)

var families = []Family{IPv4, IPv6}

func (f Family) String() string {
	if f == IPv6 {
		return "ipv6"
	}
	return "ipv4"
}

// FamilyOf is the family of a, as dataplane.Service.EligibleBackends sees it.
func FamilyOf(a netip.Addr) Family {
	if a.Is6() {
		return IPv6
	}
	return IPv4
}

// HostMask is the --mask with which a recent match keys on the whole
// address: the one the rendered affinity rules use.
func (f Family) HostMask() string {
	if f == IPv6 {
		return "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
	}
	return "255.255.255.255"
}

// RejectWith is how a port without backends refuses a new connection. TCP
// gets a reset rather than an ICMP error: a pod's connect() holds its
// socket while the SYN crosses the veth, and an ICMPv6 error that arrives
// meanwhile is only a soft error to TCP, so the client would learn of the
// refusal from the retransmitted SYN a second later. A reset is queued for
// the socket instead, and refuses at once in both families.
func (f Family) RejectWith(proto dataplane.Protocol) string {
	switch {
	case proto == dataplane.TCP:
		return "tcp-reset"
	case f == IPv6:
		return "icmp6-port-unreachable"
	default:
		return "icmp-port-unreachable"
	}
}

// Table is an iptables table.
type Table string

// The tables vipd writes to.
const (
	NAT    Table = "nat"
	Filter Table = "filter"
)

var tables = []Table{NAT, Filter}

// Chain names. Every chain vipd owns starts with ChainPrefix, and no name is
// longer than MaxChainName, the kernel's limit.
const (
	ChainPrefix  = "VIPD-"
	MaxChainName = 28

	chainServices = "VIPD-SERVICES"
	chainReject   = "VIPD-REJECT"
	// chainNodePorts is in both tables the root of a trie over protocol
	// and node port: in nat it sends the packets to a node-port address on
	// to their service's EXT chain; in filter it drops or rejects those
	// that nat left untranslated. Both are reached from their table's
	// dispatch root, for each of Node.NodePortAddresses.
	chainNodePorts   = "VIPD-NODEPORTS"
	chainPostrouting = "VIPD-POSTROUTING"
	chainHairpin     = "VIPD-HAIRPIN"
	// chainCanary is an empty chain in every table and family vipd writes
	// to. Nothing jumps to it: it only tells DetectDrift that the table still
	// holds vipd's chains, as kube-proxy's KUBE-PROXY-CANARY does. A firewall
	// reload that deletes foreign chains deletes it too.
	chainCanary = "VIPD-CANARY"
)

// FlowMark is the connmark bit that vipd sets on every connection it DNATs
// to a backend, and FlowMarkMask the only bit of the connmark it writes
// (--set-xmark with a mask leaves the others alone). The flow source asks
// the kernel for the conntrack events and entries that carry it, so it never
// reads the rest of the node's connections. The bit is clear of
// kube-proxy's 0x4000 (masquerade) and 0x8000 (drop) marks and of the low
// bits that other tools like to use.
const (
	FlowMark     uint32 = 0x00400000
	FlowMarkMask uint32 = 0x00400000
)

// MasqueradeMark is the packet mark bit that an EXT chain sets on the first
// packet of an external connection under ExternalTrafficPolicy Cluster, and
// VIPD-POSTROUTING masquerades the packets that carry it (so that replies
// return through this node). It is the bit above FlowMark, clear of
// kube-proxy's 0x4000 and 0x8000 and of the low bits; --set-xmark with
// the bit as mask leaves the rest of the mark alone.
const MasqueradeMark uint32 = 0x00800000

// masqTarget is how vipd masquerades (the marked external flows and
// hairpin flows): plain MASQUERADE, which keeps the client's source port
// when the node address:port -> backend tuple is free in conntrack and
// picks another port only when it is not. Not --random-fully (kube-proxy's
// choice): conntrack forgets a flow's backend-side tuple as soon as the
// client reuses its source port (a SYN on a TIME_WAIT entry replaces the
// entry), while the backend keeps that tuple's TIME_WAIT for 60 s; a
// random port then lands on such a tuple for another client tuple, whose
// TCP timestamps the backend's TIME_WAIT refuses (PAWS): the SYN is
// answered with an ACK, reset, and retried (after 1 s when the retry is
// refused too). With the client's port kept, a tuple comes back with the
// same client's timestamps, which the TIME_WAIT accepts. README: Node
// ports and external traffic.
const masqTarget = "-j MASQUERADE"

var (
	masqMarkRule = fmt.Sprintf("-j MARK --set-xmark %#x/%#x", MasqueradeMark, MasqueradeMark)
	masqRule     = fmt.Sprintf("-m mark --mark %#x/%#x %s", MasqueradeMark, MasqueradeMark, masqTarget)
)

// flowMarkRule marks a new connection as vipd's. It heads every SVC chain
// (after the chain's comment, see addChoice): each path through one ends
// in a DNAT, and the nat table sees only a connection's first packet.
// Spelled as iptables-save prints it.
var flowMarkRule = fmt.Sprintf("-j CONNMARK --set-xmark %#x/%#x", FlowMark, FlowMarkMask)

// DefaultMaxLeafRules is the most leaf rules a trie chain holds before it
// splits.
const DefaultMaxLeafRules = 32

// Options tune Render. The zero value uses the defaults.
type Options struct {
	// MaxLeafRules is the most leaf rules (per VIP, protocol and port, per
	// backend address for hairpin, or per protocol and node port) a
	// dispatch, reject, hairpin or node-port chain holds; a chain with more
	// splits on the next nibble of the address (or protocol and port).
	// Zero means DefaultMaxLeafRules.
	MaxLeafRules int
}

func (o Options) withDefaults() (Options, error) {
	if o.MaxLeafRules == 0 {
		o.MaxLeafRules = DefaultMaxLeafRules
	}
	if o.MaxLeafRules < 1 {
		return o, fmt.Errorf("max leaf rules %d: must be positive", o.MaxLeafRules)
	}
	return o, nil
}

// Capabilities is what this dataplane honours: random (weighted) load
// balancing over TCP, UDP and SCTP, and external traffic (node ports,
// external and load-balancer IPs, the external traffic policy and source
// ranges).
func Capabilities() dataplane.Capabilities {
	return dataplane.Capabilities{
		LoadBalancing: []dataplane.LoadBalancing{dataplane.LoadBalancingRandom},
		Protocols:     []dataplane.Protocol{dataplane.TCP, dataplane.UDP, dataplane.SCTP},
		External:      true,
		Hint:          "use the eBPF dataplane (--dataplane ebpf) for Maglev",
	}
}

// HookRule is a rule in a builtin chain that sends packets into vipd's chains.
// Every full sync inserts the ones missing, for both families, at the top of
// their chains, in the restore that creates the chains they jump to;
// DetectDrift looks for each one; Cleanup removes them before it deletes
// the chains.
type HookRule struct {
	Table Table
	// Chain is the builtin chain, such as PREROUTING.
	Chain string
	// Args is the rule specification as separate arguments, ready for exec.
	Args []string
}

// Target is the vipd chain that h jumps to.
func (h HookRule) Target() string { return h.Args[len(h.Args)-1] }

// Hooks lists the hook rules of family f. They are the same for both
// families today.
func Hooks(f Family) []HookRule {
	services := []string{"-m", "comment", "--comment", "vipd service VIPs", "-j", chainServices}
	reject := []string{"-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", "vipd services without backends", "-j", chainReject}
	return []HookRule{
		{NAT, "PREROUTING", services},
		{NAT, "OUTPUT", services},
		{NAT, "POSTROUTING", []string{"-m", "comment", "--comment", "vipd hairpin masquerade", "-j", chainPostrouting}},
		{Filter, "INPUT", reject},
		{Filter, "FORWARD", reject},
		{Filter, "OUTPUT", reject},
	}
}

// Ruleset is every vipd chain with its rules, per family and table. A nil
// *Ruleset has no chains. A Ruleset is never modified after Render returns.
type Ruleset struct {
	chains [2]map[Table]map[string][]string
	// services keeps, by name, what each service rendered to, for the next
	// Render to reuse while the *Service is the same (immutable) value.
	services map[string]renderedService
	// tries keeps each family's tries, for the next Render to reuse while
	// their entries are the same.
	tries [2][len(trieKinds)]*renderedTrie
	// external is the node's external interfaces that services were
	// rendered for: their EXT chains and drops name them.
	external []string
	// nodePorts is the Node.NodePortAddresses the roots were rendered
	// for, and maxLeafRules the tries' Options.MaxLeafRules.
	nodePorts    []netip.Addr
	maxLeafRules int
	// id tells Rulesets apart for delta.
	id uint64
	// delta, when not nil, lists the only chains that may differ from
	// the Ruleset whose id is delta.from (see renderChanges).
	delta *rulesetDelta
}

// renderedService is a service and what it rendered to.
type renderedService struct {
	svc   *dataplane.Service
	rules *[2]serviceRules
}

// rulesetIDs numbers Rulesets.
var rulesetIDs atomic.Uint64

// renderedTrie is a trie as Render built it: the entries it was built from,
// in the order Render collected them, and the chains they became.
//
// A trie that renderChanges patched has neither entries nor chains (its
// chains are only in the Ruleset): a later Render builds it again.
type renderedTrie struct {
	entries []trieEntry
	k       int
	chains  map[string][]string
	// sorted is what buildTrie got for a dedup kind: entries sorted by
	// address, one per address, and refs how many entries each stands for
	// (how many services have the address). Neither is ever modified: the
	// next Render patches copies (sortedUnique, renderChanges).
	sorted []trieEntry
	refs   []int32
}

// trieKind describes one of the prefix tries of a family.
type trieKind struct {
	table Table
	root  string
	// namePrefix names the inner chains, followed by the family's digit.
	namePrefix string
	// dedup keeps one entry per address; entries for one address must then
	// be equal.
	dedup bool
	// match spells the match of an inner chain's prefix; nil means
	// "-d <prefix>".
	match func(netip.Prefix) string
}

// trieNamePrefix names the inner chains of the kind's trie in family f.
func (kind trieKind) trieNamePrefix(f Family) string {
	return kind.namePrefix + strings.TrimPrefix(f.String(), "ipv")
}

// Indexes of trieKinds.
const (
	dispatchTrie = iota
	rejectTrie
	hairpinTrie
	natNodePortTrie
	filterNodePortTrie
)

// The tries of a family, in the order of the entry slices of serviceRules.
var trieKinds = [...]trieKind{
	{NAT, chainServices, "VIPD-D", false, nil},
	{Filter, chainReject, "VIPD-R", false, nil},
	// Services share backends; each address needs its rule once.
	{NAT, chainHairpin, "VIPD-H", true, nil},
	// Node ports, keyed by nodePortKey: a trie over protocol and port.
	{NAT, chainNodePorts, "VIPD-N", false, nodePortMatch},
	{Filter, chainNodePorts, "VIPD-N", false, nodePortMatch},
}

// serviceRules is what a service renders to in one family: its nat chains
// and its entries in the dispatch, reject, hairpin and node-port tries (see
// trieKinds).
type serviceRules struct {
	chains map[string][]string
	tries  [len(trieKinds)][]trieEntry
}

// Chains returns the names of the chains of family f in table t, sorted.
func (r *Ruleset) Chains(f Family, t Table) []string {
	return slices.Sorted(maps.Keys(r.table(f, t)))
}

// Rules returns the rules of a chain. Each rule is what follows
// "-A <chain> " in iptables-restore syntax.
func (r *Ruleset) Rules(f Family, t Table, chain string) []string {
	return r.table(f, t)[chain]
}

func (r *Ruleset) table(f Family, t Table) map[string][]string {
	if r == nil {
		return nil
	}
	return r.chains[f][t]
}

// add appends rules to chain, creating it (even with no rules).
func (r *Ruleset) add(f Family, t Table, chain string, rules ...string) {
	r.chains[f][t][chain] = append(r.chains[f][t][chain], rules...)
}

// Render turns s into vipd's chains. The output is a pure, deterministic
// function of s and opts. prev, the result of an earlier Render or nil, only
// saves work: the chains of every service that is the same *Service value as
// in prev (the dataplane contract makes a *Service immutable) are reused
// rather than rendered again, as they do not depend on opts; and so is each
// trie whose entries and MaxLeafRules are unchanged. When s.Changed is set,
// Render takes it at its word (as dataplane.State defines it, relative to
// the State that prev was rendered from) and, where renderChanges can,
// renders only the services it names, in time that grows with the change
// rather than with the services; the result is the same.
//
// Render fails, wrapping dataplane.ErrUnsupported, when a service asks for
// something Capabilities does not list, and on bad options.
func Render(s *dataplane.State, opts Options, prev *Ruleset) (*Ruleset, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	caps := Capabilities()
	external := s.Node.ExternalInterfaces()
	if r, ok, err := renderChanges(s, opts, prev, external); ok || err != nil {
		return r, err
	}
	r := &Ruleset{services: make(map[string]renderedService, s.Len()), external: external,
		nodePorts: slices.Clone(s.Node.NodePortAddresses), maxLeafRules: opts.MaxLeafRules, id: rulesetIDs.Add(1)}
	rendered := make([]*[2]serviceRules, 0, s.Len())
	var size [2]int
	var entries [2][len(trieKinds)]int
	for name, svc := range s.All() { // in name order
		if err := caps.Check(svc); err != nil {
			return nil, err
		}
		var sr *[2]serviceRules
		// Only the external half of a service depends on the Node.
		if prev != nil && (!svc.HasExternal() || slices.Equal(prev.external, external)) {
			if old := prev.services[name]; old.svc == svc {
				sr = old.rules
			}
		}
		if sr == nil {
			sr = &[2]serviceRules{renderService(svc, IPv4, external), renderService(svc, IPv6, external)}
		}
		r.services[name] = renderedService{svc, sr}
		rendered = append(rendered, sr)
		for _, f := range families {
			size[f] += len(sr[f].chains)
			for k, es := range sr[f].tries {
				entries[f][k] += len(es)
			}
		}
	}
	for _, f := range families {
		r.chains[f] = map[Table]map[string][]string{NAT: make(map[string][]string, size[f]+size[f]/8+16), Filter: {}}
		collected := [len(trieKinds)][]trieEntry{}
		for k := range trieKinds {
			collected[k] = make([]trieEntry, 0, entries[f][k])
		}
		for _, sr := range rendered {
			maps.Copy(r.chains[f][NAT], sr[f].chains)
			for k, es := range sr[f].tries {
				collected[k] = append(collected[k], es...)
			}
		}
		for k, kind := range trieKinds {
			var old *renderedTrie
			if prev != nil {
				old = prev.tries[f][k]
			}
			t := old
			if old == nil || old.chains == nil || old.k != opts.MaxLeafRules || !slices.Equal(old.entries, collected[k]) {
				var es, sorted []trieEntry
				var refs []int32
				if kind.dedup {
					es, refs = sortedUnique(old, collected[k])
					sorted = es
				} else {
					es = slices.Clone(collected[k])
				}
				t = &renderedTrie{collected[k], opts.MaxLeafRules, buildTrie(kind.root, kind.trieNamePrefix(f), es, opts.MaxLeafRules, kind.match), sorted, refs}
			}
			r.tries[f][k] = t
			maps.Copy(r.chains[f][kind.table], t.chains)
		}
		r.addNodePortJumps(f, s.Node.NodePortAddresses)
		// Rules are spelled the way iptables-save prints them, so that a sync
		// after a restart finds them equal and leaves them alone.
		r.add(f, NAT, chainPostrouting, masqRule, "-m conntrack --ctstate DNAT -j "+chainHairpin)
		for _, t := range tables {
			r.add(f, t, chainCanary)
		}
	}
	return r, nil
}

// renderService renders the chains of svc's ports in family f, its entries
// for the dispatch, reject and hairpin tries, and its node-port rules, for
// a node whose external interfaces are external.
//
// A port's SVC chain picks a backend at random, by weight, and DNATs to it in
// the same rule: one chain per service port. Only a service with ClientIP
// affinity has a SEP chain per backend, because the chosen backend must both
// record the client (recent --set) and DNAT, and a returning client must reach
// that pair again.
func renderService(svc *dataplane.Service, f Family, external []string) serviceRules {
	out := serviceRules{chains: map[string][]string{}}
	var vips []netip.Addr
	for _, v := range svc.VIPs {
		if FamilyOf(v) == f {
			vips = append(vips, v)
		}
	}
	if len(vips) == 0 {
		return out
	}
	ports := slices.Clone(svc.Ports)
	slices.SortFunc(ports, func(a, b dataplane.Port) int {
		return cmp.Or(cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Port, b.Port))
	})
	// Each port has its own eligible backends (a backend may not serve
	// every port); hairpin needs every backend that some chain may DNAT to.
	var hairpin []*dataplane.Backend
	for _, p := range ports {
		backends := sortedEligible(svc, p, f)
		hairpin = append(hairpin, backends...)
		comment := commentMatch(svc.Name, p)
		key := portKey(svc, p, f)
		svcChain := hashName("VIPD-SVC-", key)
		if len(backends) == 0 {
			for _, v := range vips {
				out.tries[rejectTrie] = append(out.tries[rejectTrie], trieEntry{v, vipMatch(v, p) + comment + " -j REJECT --reject-with " + f.RejectWith(p.Protocol)})
			}
		} else {
			for _, v := range vips {
				out.tries[dispatchTrie] = append(out.tries[dispatchTrie], trieEntry{v, vipMatch(v, p) + comment + " -j " + svcChain})
			}
			out.addChoice(svcChain, svc, p, f, key, backends)
		}
		hairpin = append(hairpin, out.renderExternal(svc, p, f, external, svcChain)...)
	}
	slices.SortFunc(hairpin, func(a, b *dataplane.Backend) int { return a.IP.Compare(b.IP) })
	hairpin = slices.CompactFunc(hairpin, func(a, b *dataplane.Backend) bool { return a.IP == b.IP })
	for _, b := range hairpin {
		h := hostPrefix(b.IP)
		out.tries[hairpinTrie] = append(out.tries[hairpinTrie], trieEntry{b.IP, "-s " + h + " -d " + h + " " + masqTarget})
	}
	return out
}

// addChoice adds the chain name that picks one of backends (sorted by IP)
// for a new connection to port p of svc, whose key is key, and marks it
// as vipd's (FlowMark); with ClientIP affinity also the SEP chain of each
// backend, which every chain of the port that picks that backend shares.
//
// The chain names the service port once, in a comment on its first rule,
// and not on each DNAT rule: the comment is stored in the rule, and the
// larger rules made nf_tables' validation of the table after every commit
// slower (doc.go: about 12 ms of a 10,000-service move).
func (out *serviceRules) addChoice(name string, svc *dataplane.Service, p dataplane.Port, f Family, key string, backends []*dataplane.Backend) {
	comment := commentMatch(svc.Name, p)
	dnat := func(b *dataplane.Backend, statistic, comment string) string {
		return dnatRule(p, statistic, comment, netip.AddrPortFrom(b.IP, b.TargetPort(p)))
	}
	rules, seps := []string{strings.TrimPrefix(comment, " ") + " " + flowMarkRule}, []string(nil)
	if svc.Affinity.ClientIP {
		affinity := " --mask " + f.HostMask() + " --rsource"
		secs := strconv.Itoa(max(1, int(svc.Affinity.Timeout.Seconds())))
		for _, b := range backends {
			sep := sepChain(key, b.IP)
			seps = append(seps, sep)
			rules = append(rules, "-m recent --rcheck --seconds "+secs+" --reap --name "+sep+affinity+" -j "+sep)
			out.chains[sep] = []string{"-m recent --set --name " + sep + affinity, dnat(b, "", comment)}
		}
	}
	total := 0
	for _, b := range backends {
		total += weight(b)
	}
	for i, b := range backends {
		statistic := ""
		if i < len(backends)-1 {
			// kube-proxy's scheme: the i-th rule sees only the traffic the
			// earlier ones left, so its probability is w_i over what remains.
			statistic = "-m statistic --mode random --probability " + probability(weight(b), total)
			total -= weight(b)
		}
		if seps != nil {
			rules = append(rules, strings.TrimPrefix(statistic+" -j "+seps[i], " "))
		} else {
			rules = append(rules, dnat(b, statistic, ""))
		}
	}
	out.chains[name] = rules
}

// sortedEligible returns the backends of family f eligible for a new
// connection to port p of svc, sorted by IP: the order of a SVC chain's rules.
func sortedEligible(svc *dataplane.Service, p dataplane.Port, f Family) []*dataplane.Backend {
	backends := svc.EligibleBackends(p, f == IPv6)
	slices.SortFunc(backends, func(a, b *dataplane.Backend) int { return a.IP.Compare(b.IP) })
	return backends
}

// portKey names port p of svc in family f; the names of its SVC and SEP
// chains are hashes of it.
func portKey(svc *dataplane.Service, p dataplane.Port, f Family) string {
	return strings.Join([]string{svc.Name, p.Name, p.Protocol.String(), strconv.Itoa(int(p.Port)), f.String()}, "\x00")
}

// sepChain is the SEP chain of backend ip of the port named key, and the
// name of the recent list that holds its affinity entries.
func sepChain(key string, ip netip.Addr) string {
	return hashName("VIPD-SEP-", key+"\x00"+ip.String())
}

// probability formats w/total as the statistic match stores and prints it:
// xt_statistic keeps round(p × 2³¹) and iptables-save prints that with 11
// decimals.
func probability(w, total int) string {
	const scale = 1 << 31
	return strconv.FormatFloat(math.Round(scale*float64(w)/float64(total))/scale, 'f', 11, 64)
}

// weight is b's weight; like the API, zero means 1.
func weight(b *dataplane.Backend) int { return max(1, int(b.Weight)) }

// protoMatch is the one place that spells a protocol match: -p, which
// matches the protocol alone, then the protocol's own match, whose
// options (--dport) follow.
func protoMatch(p dataplane.Protocol) string {
	return protocol(p) + " -m " + strings.ToLower(p.String())
}

// protocol matches protocol p alone, with -p.
func protocol(p dataplane.Protocol) string { return "-p " + strings.ToLower(p.String()) }

// dnatRule DNATs port p's packets to dst, when the optional statistic match
// (or none) matches. It matches the protocol with -p alone, which a DNAT
// to a port needs, and not with the protocol's own match (-m tcp): in the
// nat table that would match every packet -p does, as the table sees only
// the first packet of a tracked connection (whole, as defragmentation
// comes first, and with a valid header, or conntrack does not track it),
// while each rule it is in would cost nf_tables' validation of the table
// more (doc.go: about 15 ms of a 10,000-service move). The matches come
// in the order iptables-save prints them.
func dnatRule(p dataplane.Port, statistic, comment string, dst netip.AddrPort) string {
	s := protocol(p.Protocol)
	if statistic != "" {
		s += " " + statistic
	}
	return s + comment + " -j DNAT --to-destination " + dst.String()
}

// vipMatch matches packets for port p of a service on vip.
func vipMatch(vip netip.Addr, p dataplane.Port) string {
	return "-d " + hostPrefix(vip) + " " + protoMatch(p.Protocol) + " --dport " + strconv.Itoa(int(p.Port))
}

func hostPrefix(a netip.Addr) string { return netip.PrefixFrom(a, a.BitLen()).String() }

// commentMatch names a service port for humans: "svc:port-name", or
// "svc:80/tcp" for an unnamed port. The text is reduced to characters that
// need no escaping inside double quotes and cut to the kernel's 255 bytes.
func commentMatch(service string, p dataplane.Port) string {
	c := service + ":" + p.Name
	if p.Name == "" {
		c = service + ":" + strconv.Itoa(int(p.Port)) + "/" + strings.ToLower(p.Protocol.String())
	}
	c = strings.Map(func(r rune) rune {
		if r < 0x80 && (r == '-' || r == '.' || r == '/' || r == '_' || r == ':' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return r
		}
		return '_'
	}, c)
	if len(c) > 255 {
		c = c[:255]
	}
	return ` -m comment --comment "` + c + `"`
}

// hashName is prefix followed by 16 base32 characters of the SHA-256 of key,
// as kube-proxy names its per-service chains.
func hashName(prefix, key string) string {
	h := sha256.Sum256([]byte(key))
	return prefix + base32.StdEncoding.EncodeToString(h[:])[:16]
}
