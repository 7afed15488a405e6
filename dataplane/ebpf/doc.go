// Package ebpf is vipd's eBPF dataplane: ClusterIP load balancing, and
// node ports, external and load-balancer IPs, in BPF maps and programs,
// with per-packet and per-update cost independent of the number of
// services.
//
// It owns:
//   - the BPF programs (bpf/*.c, compiled by bpf2go into bpf_bpfel.{go,o},
//     committed): tc programs on the host side of pod interfaces and on the
//     node's external interfaces (attached with tcx, or clsact on older
//     kernels) and cgroup sock_addr hooks for the node's own processes;
//   - external traffic (external.go, externalFrontendsOf): the external
//     interfaces, SNAT under policy Cluster (the conntrack's reply entries
//     are its NAT table; a flow takes its client's own port first, then
//     random ones, from Config.SNATPorts less the namespace's
//     ip_local_port_range), and load-balancer source ranges;
//   - the maps, pinned under a bpffs directory so that traffic keeps flowing
//     while vipd is down and a restarted vipd picks up where it left off;
//   - the translation of a dataplane.State into map entries, written in
//     make-before-break order, one step per method (apply.go), with the
//     audit of a full apply (audit.go) and the IDs (programmer.go);
//   - the backend map (backendids.go): an array indexed by backend ID,
//     written and read through mappings of its memory, of the slots in use
//     only (backendslots.go); IDs are recycled (never-used
//     first, then oldest-freed first, a freed slot zeroed), and the
//     programs keep a tracked flow on its backend only while its ID's
//     slot still holds the flow's backend address and port;
//   - drift (drift.go): DetectDrift finds programs detached, pins replaced
//     and map entries written by another tool, and every full Apply
//     repairs them;
//   - conntrack garbage collection and the destruction of node-local UDP
//     sockets stuck on removed backends;
//   - flows (flows.go): the programs' flow events (vipd_events ring buffer,
//     read by eventring.go, losses counted in vipd_event_drops) and the collector's timeouts
//     through WatchFlows, the live conntrack entries through ListFlows, and
//     ExplainFlow's reading of the affinity and Maglev maps (explain.go).
//
// It must not touch anything outside the namespace, bpffs directory and
// cgroup it is configured with.
package ebpf
