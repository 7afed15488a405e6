// Package statelessdnat is the data-path benchmark's reference: a minimal
// tcx program pair, of the benchmark's own, that DNATs a VIP's TCP
// connections to backends by a hash of the client's address and port, and
// reverse-translates the replies, with no conntrack, no events and no map
// lookups. Its connection rate and BPF time per connection are the "what
// eBPF can reach here" line beside vipd's. It is not a load balancer: it
// does not survive backend changes and serves one TCP VIP port.
package statelessdnat
