package iptables

import (
	"cmp"
	"net/netip"
	"slices"
	"strconv"

	"github.com/vipd/vipd/dataplane"
)

// The external half of a service (dataplane.Service.HasExternal): its node
// ports, external IPs and load-balancer IPs, per port and family.
//
//	nat    VIPD-SERVICES trie    -d <external or LB IP> --dport <port>  -> VIPD-EXT-* (or VIPD-FW-*)
//	       VIPD-SERVICES root    -d <node-port address>                 -> VIPD-NODEPORTS
//	       VIPD-NODEPORTS        -p <proto> --dport <node port>         -> VIPD-EXT-*
//	       VIPD-FW-*             -s <range>, for each source range      -> VIPD-EXT-*
//	       VIPD-EXT-*            the traffic classes, then the cluster choice
//	filter VIPD-REJECT trie      drops and rejects of what nat left untranslated,
//	       VIPD-REJECT root      -d <node-port address> -> VIPD-NODEPORTS (the same for node ports)
//
// An EXT chain sorts the packets by where they come from. Those that
// entered the node on an external interface (`-i <name>`, for each of
// Node.ExternalInterfaces) are external traffic: under the Cluster
// external policy they get MasqueradeMark and go on to the cluster choice,
// under Local they go to the choice among node-local backends (VIPD-SVL-*,
// or the SVC chain when the internal policy is Local too), or RETURN
// untranslated when there is none. Every other packet (from a pod, or from
// the node itself, which never matches -i) goes to the cluster choice: the
// SVC chain when the internal policy is Cluster, else a second SVC chain
// over ExternalBackends with policy Cluster.
//
// nat only translates; the filter table's rules, hooked like the rejects
// of ports without backends (ctstate NEW), see the packets nat left
// untranslated and still addressed to the external address: they drop
// external traffic under Local without a local backend, drop packets to an
// LB IP from outside its source ranges, and reject (as a ClusterIP does)
// what has no backend under cluster semantics.

// renderExternal adds the external half of port p of svc in family f, for
// the external interfaces external; svcChain is the port's SVC chain, which
// exists when the port has eligible backends. It returns the backends its
// chains may DNAT to, for hairpin.
func (out *serviceRules) renderExternal(svc *dataplane.Service, p dataplane.Port, f Family, external []string, svcChain string) []*dataplane.Backend {
	var extIPs, lbIPs []netip.Addr
	for _, a := range svc.ExternalIPs {
		if FamilyOf(a) == f {
			extIPs = append(extIPs, a)
		}
	}
	for _, a := range svc.LoadBalancerIPs {
		if FamilyOf(a) == f {
			lbIPs = append(lbIPs, a)
		}
	}
	if len(extIPs)+len(lbIPs) == 0 && p.NodePort == 0 {
		return nil
	}
	key := portKey(svc, p, f)
	comment := commentMatch(svc.Name, p)
	internalLocal := svc.TrafficPolicy == dataplane.TrafficPolicyLocal
	externalLocal := svc.ExternalTrafficPolicy == dataplane.TrafficPolicyLocal

	// The cluster choice: the SVC chain when it picks from the same set.
	cluster := sortedExternal(svc, p, f, dataplane.TrafficPolicyCluster)
	clusterChain := ""
	if len(cluster) > 0 {
		clusterChain = svcChain
		if internalLocal {
			clusterChain = hashName("VIPD-SVC-", key+"\x00cluster")
			out.addChoice(clusterChain, svc, p, f, key, cluster)
		}
	}
	// The local choice, for external traffic under Local only.
	var local []*dataplane.Backend
	localChain := ""
	if externalLocal && len(external) > 0 {
		local = sortedExternal(svc, p, f, dataplane.TrafficPolicyLocal)
	}
	if len(local) > 0 {
		localChain = svcChain
		if !internalLocal {
			localChain = hashName("VIPD-SVL-", key)
			out.addChoice(localChain, svc, p, f, key, local)
		}
	}

	// A node-local backend is eligible under Cluster when one is under
	// Local (ready ones first, in both), so an EXT chain exists exactly
	// when the cluster choice does.
	extChain := ""
	if clusterChain != "" {
		extChain = hashName("VIPD-EXT-", key)
		var rules []string
		for _, name := range external {
			switch {
			case externalLocal && localChain != "":
				rules = append(rules, "-i "+name+" -j "+localChain)
			case externalLocal:
				// Dropped in the filter table.
				rules = append(rules, "-i "+name+" -j RETURN")
			default:
				rules = append(rules, "-i "+name+" "+masqMarkRule)
			}
		}
		out.chains[extChain] = append(rules, "-j "+clusterChain)
	}

	// What the filter table does with a packet that nat left untranslated.
	localDrop := externalLocal && localChain == ""
	untranslated := func(dst netip.Addr, dport uint16, ranges bool) []string {
		var rules []string
		d := netip.Prefix{}
		if dst.IsValid() {
			d = netip.PrefixFrom(dst, dst.BitLen())
		}
		if localDrop {
			for _, name := range external {
				rules = append(rules, l4Match(netip.Prefix{}, d, name, p.Protocol, dport)+comment+" -j DROP")
			}
		}
		reject := comment + " -j REJECT --reject-with " + f.RejectWith(p.Protocol)
		switch {
		case ranges:
			// Allowed sources that found no backend are refused; every
			// other packet left here comes from outside the ranges.
			if clusterChain == "" {
				for _, r := range familyRanges(svc, f) {
					rules = append(rules, l4Match(r, d, "", p.Protocol, dport)+reject)
				}
			}
			rules = append(rules, l4Match(netip.Prefix{}, d, "", p.Protocol, dport)+comment+" -j DROP")
		case clusterChain == "":
			rules = append(rules, l4Match(netip.Prefix{}, d, "", p.Protocol, dport)+reject)
		}
		return rules
	}

	var hairpin []*dataplane.Backend
	if extChain != "" {
		hairpin = append(cluster, local...)
	}
	ranged := len(svc.LoadBalancerSourceRanges) > 0
	fwChain := ""
	if ranged && extChain != "" {
		var rules []string
		for _, r := range familyRanges(svc, f) {
			rules = append(rules, "-s "+r.String()+" -j "+extChain)
		}
		if len(rules) > 0 {
			fwChain = hashName("VIPD-FW-", key)
			out.chains[fwChain] = rules
		}
	}
	for _, a := range extIPs {
		out.addExternalAddr(a, p, comment, extChain, untranslated(a, p.Port, false))
	}
	for _, a := range lbIPs {
		if ranged {
			out.addExternalAddr(a, p, comment, fwChain, untranslated(a, p.Port, true))
		} else {
			out.addExternalAddr(a, p, comment, extChain, untranslated(a, p.Port, false))
		}
	}
	if p.NodePort != 0 {
		if extChain != "" {
			out.nodePorts[0] = append(out.nodePorts[0], nodePortEntry{p.Protocol, p.NodePort,
				l4Match(netip.Prefix{}, netip.Prefix{}, "", p.Protocol, p.NodePort) + comment + " -j " + extChain})
		}
		for _, rule := range untranslated(netip.Addr{}, p.NodePort, false) {
			out.nodePorts[1] = append(out.nodePorts[1], nodePortEntry{p.Protocol, p.NodePort, rule})
		}
	}
	return hairpin
}

// addExternalAddr adds the dispatch entry of port p on the external or
// load-balancer IP a, jumping to chain (none when chain is ""), and the
// filter rules for the packets it leaves untranslated.
func (out *serviceRules) addExternalAddr(a netip.Addr, p dataplane.Port, comment, chain string, filter []string) {
	if chain != "" {
		out.tries[dispatchTrie] = append(out.tries[dispatchTrie], trieEntry{a, vipMatch(a, p) + comment + " -j " + chain})
	}
	for _, rule := range filter {
		out.tries[rejectTrie] = append(out.tries[rejectTrie], trieEntry{a, rule})
	}
}

// sortedExternal is ExternalBackends of family f under policy, sorted by IP.
func sortedExternal(svc *dataplane.Service, p dataplane.Port, f Family, policy dataplane.TrafficPolicy) []*dataplane.Backend {
	backends := svc.ExternalBackends(p, f == IPv6, policy)
	slices.SortFunc(backends, func(a, b *dataplane.Backend) int { return a.IP.Compare(b.IP) })
	return backends
}

// familyRanges is svc's load-balancer source ranges of family f.
func familyRanges(svc *dataplane.Service, f Family) []netip.Prefix {
	var out []netip.Prefix
	for _, r := range svc.LoadBalancerSourceRanges {
		if FamilyOf(r.Addr()) == f {
			out = append(out, r)
		}
	}
	return out
}

// l4Match matches packets of proto to dport, from src, to dst and in
// through the interface in, where those are given; spelled in the order
// iptables-save prints them.
func l4Match(src, dst netip.Prefix, in string, proto dataplane.Protocol, dport uint16) string {
	s := ""
	if src.IsValid() {
		s += "-s " + src.String() + " "
	}
	if dst.IsValid() {
		s += "-d " + dst.String() + " "
	}
	if in != "" {
		s += "-i " + in + " "
	}
	return s + protoMatch(proto) + " --dport " + strconv.Itoa(int(dport))
}

// addNodePorts adds the VIPD-NODEPORTS chains of family f, whatever they
// hold, with the services' node-port rules (indexed like tables) in the
// order of protocol and node port, and the jumps to them from the roots of
// the nat dispatch and filter reject tries for each node-port address of
// f. Those jumps come after the trie's rules: a packet reaches them only if
// no VIP, external or LB IP took it. The roots may be shared with an
// earlier Ruleset's tries, so they are copied, not appended to.
func (r *Ruleset) addNodePorts(f Family, addrs []netip.Addr, entries [2][]nodePortEntry) {
	for i, t := range tables {
		es := entries[i]
		slices.SortStableFunc(es, func(a, b nodePortEntry) int {
			return cmp.Or(cmp.Compare(a.proto, b.proto), cmp.Compare(a.port, b.port))
		})
		r.add(f, t, chainNodePorts)
		for _, e := range es {
			r.add(f, t, chainNodePorts, e.rule)
		}
		root := map[Table]string{NAT: chainServices, Filter: chainReject}[t]
		rules := slices.Clone(r.chains[f][t][root])
		for _, a := range addrs {
			if FamilyOf(a) == f {
				rules = append(rules, "-d "+hostPrefix(a)+" -j "+chainNodePorts)
			}
		}
		r.chains[f][t][root] = rules
	}
}
