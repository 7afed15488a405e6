// Package maglev fills the per-service lookup table of vipd's eBPF load
// balancer with Maglev consistent hashing (Eisenbud et al., "Maglev: A Fast
// and Reliable Software Network Load Balancer", NSDI 2016; the same scheme as
// Cilium's pkg/maglev). The datapath picks a backend as table[hash(flow) % M],
// so a flow keeps its backend as long as its table entry does.
//
// The package owns three promises about that table:
//
//   - Balance: every backend gets a share of the M entries proportional to its
//     weight (to within one entry per backend for equal weights).
//   - Minimal disruption: adding or removing one of N backends remaps about
//     1/N of the entries, not the whole table.
//   - Determinism: the table depends only on the set of (ID, Key, Weight) and
//     M, never on input order, process, or run, so a restarted vipd rebuilds
//     the identical table and established flows keep their backends. The
//     hash functions are therefore part of the contract: changing them remaps
//     every service on upgrade.
//
// It is pure computation: it knows nothing about BPF maps, services or
// addresses beyond the Key string, and never touches the kernel. Writing the
// table into a map (make-before-break) is the ebpf dataplane's job.
package maglev
