package conformance

import (
	"strings"
)

// snatPortRangeArgs narrow the masquerade's ports to 61000-61099, outside
// Linux's default ip_local_port_range.
var snatPortRangeArgs = []string{"--snat-port-range", "61000-61099"}

// should masquerade external flows under CLUSTER to the ports of
// --snat-port-range with the eBPF dataplane; the iptables dataplane, whose
// MASQUERADE picks its ports itself, serves as before and warns that it
// ignores the flag.
func snatPortRange(e *env) {
	svc := e.externalService(ports(withNodePort(tcpPort(80, 8080), nodePort), withNodePort(udpPort(80, 8081), nodePort)), e.be1, e.be4)
	if !e.upsertExternal(svc) {
		return
	}
	for _, f := range families {
		np := ap(e.node1.addr(f), nodePort)
		for _, proto := range []string{"tcp", "udp"} {
			for i := range 20 {
				r, err := request(e.out, proto, np, replyDeadline)
				if err != nil {
					e.fatalf("%s %v from out: request %d: %v", upper(proto), np, i+1, err)
				}
				if p := r.Peer.Port(); e.dp == "ebpf" && (p < 61000 || p > 61099) {
					e.fatalf("%s %v from out: backend %s saw the client as %v, want a port of --snat-port-range 61000-61099", upper(proto), np, r.Backend, r.Peer)
				}
			}
		}
	}
	const warning = "--snat-port-range applies to the eBPF dataplane only"
	if got := strings.Contains(e.vipd.log.String(), warning); got != (e.dp == "iptables") {
		e.fatalf("vipd's log has the warning %q: %v, want it only with the iptables dataplane\n%s", warning, got, e.vipd.logTail(30))
	}
}
