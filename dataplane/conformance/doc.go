// Package conformance holds vipd's conformance suite: one table of
// scenarios that every dataplane must pass. Each scenario builds a fresh
// netlab topology, runs a real vipd binary that programs node1's namespace,
// and checks real TCP, UDP and SCTP traffic between pod namespaces: what a
// client reaches through a VIP, what the backend sees, and what comes back.
//
// The external-traffic scenarios (external_test.go: node ports, external
// IPs, load-balancer IPs and their source ranges, the external traffic
// policy and its health check node port) send from two external hosts
// behind the upstream router, whose packets enter node1 on its uplink eth0,
// the interface that holds node1's default route: external traffic. The
// router sends 198.19.200.0/23 and fd00:198:ffff::/48 (external and
// load-balancer IPs) to node1, and node1 has secondary uplink addresses, so
// that a --nodeport-addresses range can leave one out. A dataplane without
// external support must refuse such a service with FailedPrecondition; the
// scenario checks that nothing was left behind and is reported as
// "refused", not "pass".
//
// Requests from node1 itself come from a client process (netlab.Client)
// born in a test cgroup of the scenario's own (internal/cgroup2), as a
// program on a node would: the eBPF dataplane attaches its socket hooks to
// that cgroup (vipd --cgroup-path) and pins its objects in a private bpffs
// (vipd --bpffs). Pods' requests come from the test process.
//
// The package has only tests; it must never change the root network
// namespace (no routes, rules or programs there), nor attach anything to
// the machine's root cgroup. The only things of its vipds in the root
// namespace are their Unix sockets and, in the flows metrics scenario, a
// listener on 127.0.0.1; no packet leaves the netlab namespaces. Everything it
// creates lives in netlab namespaces, its test cgroups or temporary
// directories and is removed when a scenario ends, even when it fails.
//
//	go test ./dataplane/conformance/ -count=1 -v          # as root; both dataplanes
//	VIPD_CONFORMANCE_DATAPLANES=ebpf go test ./dataplane/conformance/
//	go test ./dataplane/conformance/ -run 'TestConformance/iptables/basic$'
package conformance
