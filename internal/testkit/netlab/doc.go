// Package netlab builds throwaway test networks out of named network
// namespaces: the conformance suite, the demo and the benchmarks run vipd in a
// "node" namespace and talk to echo servers in "pod" namespaces.
//
// netlab owns everything it creates and nothing else. It must never change
// the root network namespace: every link, address, route and sysctl is
// written through a netlink socket or a thread that lives inside a lab
// namespace, and veth pairs are created inside the node namespace with the
// peer placed directly into the other namespace, so no link ever exists in
// the root namespace, even briefly. No lab namespace has a route out of the
// machine.
//
// # Topology
//
//	pod ──veth── node1 ──fabric── upstream ──fabric── node2 ──veth── pod
//	                                 │
//	                         external host(s)
//
// The upstream namespace is a router with one fabric link per node, one
// link per external host and no other links. It routes each node's pod
// range to that node, and each prefix given to Lab.RouteToNode (a service's
// external or load-balancer IPs) to the node chosen; it has no default
// route, so anything else dies there with an ICMP unreachable.
//
// Each node has a default route (IPv4 and IPv6) to upstream, forwarding
// enabled, one route per local pod, and an unreachable route for the rest of
// its pod range (so an unassigned pod address fails fast instead of
// looping between node and router).
//
// A pod has one interface, eth0, the peer of the node's host-side veth
// "veth<pod>" (the eBPF dataplane attaches to veth* interfaces). As in
// Calico, the pod's default routes point at link-local gateways: 169.254.1.1
// (answered by proxy ARP on the host veth, with proxy_delay 0) and fe80::1
// (assigned to every host veth). The node has no address in the pod range.
//
// An external host (Lab.AddExternalHost, Spec.ExternalHosts) stands for a
// machine outside the cluster: its traffic to a node's address, or to an
// address routed to a node, enters that node on its uplink eth0, which is
// where vipd's dataplanes see external traffic. Its one interface, eth0,
// has default routes (IPv4 and IPv6) to upstream. It can send requests and
// run echo servers like a pod. Node.DataplaneNode describes a node's
// network the way vipd's dataplanes get it (eth0 external, node ports on
// the uplink addresses).
//
// Every namespace has IPv6 duplicate address detection and ICMP rate
// limiting off, so that addresses work at once and a rejected or unroutable
// connection fails with an ICMP error rather than a timeout. Build and
// Node.AddPod return only once every link is up and every address usable
// (its local route exists); until then the kernel would drop the first
// packets and cost a retransmit.
//
// # Address plan
//
// Nodes are numbered k = 1..MaxNodes, external hosts e = 1..MaxExternalHosts
// in the order they are added; all addresses lie in 198.18.0.0/16 and
// fd00:198::/32. netlab never assigns an address in 198.19.0.0/16 or
// fd00:198:ffff::/48 (ServiceRangeV4, ServiceRangeV6), which are kept for
// VIPs, external IPs and load-balancer IPs; Lab.RouteToNode routes prefixes
// of these ranges, and only those, to a node.
//
//	fabric link k, IPv4   198.18.0.2k/31 (upstream) and 198.18.0.2k+1/31 (node k)
//	fabric link k, IPv6   fd00:198:0:k::1/64 (upstream) and fd00:198:0:k::2/64 (node k)
//	pods of node k        198.18.k.0/24 and fd00:198:k::/64
//	pod with host number h  198.18.k.h/32 and fd00:198:k::h/128
//	external link e, IPv4   198.18.250.2e/31 (upstream) and 198.18.250.2e+1/31 (host e)
//	external link e, IPv6   fd00:198:fa:e::1/64 (upstream) and fd00:198:fa:e::2/64 (host e)
//	node k, secondary       198.18.251.k/32 and fd00:198:fb::k/128 on its uplink (Node.AddSecondaryAddresses)
//
// k, h and e are written in hex in IPv6 addresses (node 10 owns
// fd00:198:a::/64). 198.18.250-251.0/24 and fd00:198:fa-fb::/48 lie beyond
// every node's pod range, since nodes stop at 100. External host numbers, too, are
// never reused within a lab.
// Host numbers start at 10 and are never reused within a lab, so a removed
// pod's address does not come back as a different pod.
//
// # Client processes
//
// A socket belongs to the cgroup of the process that creates it, whatever
// namespace it is created in, so hooks attached to a cgroup (the eBPF
// dataplane's socket-level load balancing) never see the test process's own
// requests. NS.StartClient starts a Client: the running binary again, born
// in a given cgroup v2 directory (CLONE_INTO_CGROUP, so it never runs
// outside it), that makes NS.Request's requests from inside the namespace
// and reports replies and errors back over a pipe. NS.RequestInCgroup does
// one request with a Client of its own. A binary that uses either must call
// RunClientIfRequested first thing in TestMain. Client processes die with
// the Client, with their NS, or with the process that started them.
//
// # Names and cleanup
//
// Namespaces are bind-mounted under /run/netns, so `ip netns exec NAME` and
// `vipd --netns /run/netns/NAME` work. Their names start with
// "vl<pid>-<random>-", which lets Sweep delete the namespaces of a process
// that died without cleaning up (a go test timeout, a kill -9). Build sweeps
// before it creates anything, tears down what it created when it fails, and
// Lab.Close removes the rest (external hosts included); New registers Close
// with tb.Cleanup.
package netlab
