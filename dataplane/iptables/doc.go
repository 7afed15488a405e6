// Package iptables is vipd's iptables dataplane. This part is pure: it turns a
// dataplane.State into vipd-owned iptables chains (Render), computes the
// `iptables-restore --noflush` input that moves the kernel from one rendering
// to the next (Payload). The tests follow packets through the rendered rule
// text with iptablestest.Tracer, a test-only kernel model, so that they
// check the rules themselves.
//
// It never executes anything and never touches the kernel. The applier that
// runs iptables-restore/ip6tables-restore, installs the Hooks and deletes
// conntrack entries is a thin layer on top of these functions, and so are
// the flow source (flows.go: conntrack events and dumps of the connections
// that carry FlowMark, filtered by the kernel), the explainer (explain.go:
// the xt_recent affinity lists) and the drift detector (drift.go: one
// `iptables -S` per canary, hooked builtin chain and hook target).
//
// Layout of the rules, per family (iptables for IPv4, ip6tables for IPv6):
//
//	nat    PREROUTING, OUTPUT -> VIPD-SERVICES    prefix trie over VIPs (VIPD-D4-*/VIPD-D6-*)
//	                                              -> VIPD-SVC-*, one per service port:
//	                                                 CONNMARK FlowMark first, then
//	                                                 weighted choice and DNAT in one rule
//	                                              (ClientIP affinity only: recent --rcheck,
//	                                              weighted choice -> VIPD-SEP-* per backend:
//	                                              recent --set, DNAT)
//	nat    POSTROUTING        -> VIPD-POSTROUTING ctstate DNAT -> VIPD-HAIRPIN
//	                                              prefix trie (VIPD-H4-*/VIPD-H6-*) over the
//	                                              destination, one rule per backend address:
//	                                              MASQUERADE when source = destination = it
//	filter INPUT, FORWARD, OUTPUT (ctstate NEW) -> VIPD-REJECT
//	                                              prefix trie (VIPD-R4-*/VIPD-R6-*) over
//	                                              ports of services without backends
//	nat, filter       VIPD-CANARY                 empty, nothing jumps to it: its loss
//	                                              shows DetectDrift a flushed table
//
// Chains are what iptables-nft-restore pays for, more than rules, so a
// service costs one chain per port and family unless it needs affinity.
package iptables
