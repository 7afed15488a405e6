// Package iptables is vipd's iptables dataplane. This part is pure: it turns a
// dataplane.State into vipd-owned iptables chains (Render), computes the
// `iptables-restore --noflush` input that moves the kernel from one rendering
// to the next (Payload). The tests follow packets through the rendered rule
// text with iptablestest.Tracer, a test-only kernel model, so that they
// check the rules themselves.
//
// It never executes anything and never touches the kernel. The applier that
// runs iptables-restore/ip6tables-restore (one table at a time, in the
// order of commit.go, so that a port always has its DNAT or its REJECT),
// installs the Hooks and deletes conntrack entries is a thin layer on top
// of these functions, and so are the flow source (flows.go: conntrack
// events and dumps of the connections that carry FlowMark, filtered by the
// kernel), the explainer (explain.go: the xt_recent affinity lists) and the
// drift detector (drift.go: one `iptables -S` per canary, hooked builtin
// chain and hook target, and in nft mode none at all while the nf_tables
// generation shows that only vipd's own restores committed since the
// rules were last verified).
//
// Layout of the rules, per family (iptables for IPv4, ip6tables for IPv6):
//
//	nat    PREROUTING, OUTPUT -> VIPD-SERVICES    prefix trie over VIPs, external and LB IPs
//	                                              (VIPD-D4-*/VIPD-D6-*)
//	                                              -> VIPD-SVC-*, one per service port:
//	                                                 CONNMARK FlowMark first, then
//	                                                 weighted choice and DNAT in one rule
//	                                              (ClientIP affinity only: recent --rcheck,
//	                                              weighted choice -> VIPD-SEP-* per backend:
//	                                              recent --set, DNAT)
//	                                              -> VIPD-FW-* (LB IPs with source ranges:
//	                                                 -s <range>) -> VIPD-EXT-*
//	                                              then, per node-port address:
//	                                              -> VIPD-NODEPORTS, a trie over protocol
//	                                                 and port range (VIPD-N4-*/VIPD-N6-*)
//	                                                 -> VIPD-EXT-*
//	                          VIPD-EXT-*          one per service port with external
//	                                              addresses: -i <external interface>:
//	                                              MARK MasqueradeMark (CLUSTER), or
//	                                              -> VIPD-SVL-* (LOCAL: node-local
//	                                              backends), or RETURN (LOCAL without
//	                                              one); then -> the cluster choice
//	                                              (VIPD-SVC-*)
//	nat    POSTROUTING        -> VIPD-POSTROUTING MASQUERADE with MasqueradeMark; then
//	                                              ctstate DNAT -> VIPD-HAIRPIN
//	                                              prefix trie (VIPD-H4-*/VIPD-H6-*) over the
//	                                              destination, one rule per backend address:
//	                                              MASQUERADE when source = destination = it
//	filter INPUT, FORWARD, OUTPUT (ctstate NEW) -> VIPD-REJECT
//	                                              prefix trie (VIPD-R4-*/VIPD-R6-*) over
//	                                              what nat left untranslated: DROP (outside
//	                                              source ranges; external under LOCAL
//	                                              without a local backend), REJECT (no
//	                                              backend); then, per node-port address,
//	                                              -> VIPD-NODEPORTS (the same in a trie over
//	                                              protocol and node port)
//	nat, filter       VIPD-CANARY                 empty, nothing jumps to it: its loss
//	                                              shows DetectDrift a flushed table
//
// external.go says how the external half of a service maps onto these.
//
// Chains are what iptables-nft-restore pays for, more than rules, so a
// service costs one chain per port and family unless it needs affinity.
// A partial sync's restore still costs time in proportion to the whole
// table it writes to: the commit of any rule makes nf_tables validate every
// rule reachable from the table's hooked builtin chains, once per hook
// (PREROUTING and OUTPUT both reach every service). That walk is bound by
// memory reads, so the rules are kept small and laid out for it: a DNAT
// rule matches its protocol with -p alone (dnatRule) and names no service
// (its chain's first rule does, addChoice), and a bulk load writes the
// rules in the order the walk reads them (walkOrder). At 10,000 services
// with 5 backends each the walk is about 60 ms of a one-backend move's nat
// commit (about 95 ms without those three), most of the move. Render
// renders only the services that State.Changed names (renderChanges) and
// Payload diffs only the chains that touched, so vipd's own part of such a
// move is under a millisecond.
package iptables
