package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vipd/vipd/internal/testkit/netlab"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// scenarios is the conformance table. Names follow kube-proxy's e2e tests
// where one exists; a name may be given to go test -run as
// TestConformance/<dataplane>/<name>.
func scenarios() []scenario {
	return []scenario{
		{name: "basic", run: func(e *env) { basic(e, ipv4) }},
		{name: "per-connection-not-per-packet", run: perConnection},
		{name: "source-ip-preserved", run: func(e *env) { sourceIPPreserved(e, ipv4) }},
		{name: "reply-from-vip", run: func(e *env) { replyFromVIP(e, ipv4) }},
		{name: "vip-is-fiction", run: vipIsFiction},
		{name: "no-endpoints-reject", run: func(e *env) { noEndpointsReject(e, ipv4) }},
		{name: "multi-port-named-target-ports", run: multiPort},
		{name: "endpoint-only-on-its-slice-ports", run: onlyNamedPorts},
		{name: "unnamed-port-by-empty-name", run: unnamedPortByEmptyName},
		{name: "same-port-tcp-and-udp", run: samePortTCPAndUDP},
		{name: "udp", run: udpForwarding},
		{name: "sctp", run: sctpForwarding},
		{name: "session-affinity-client-ip", run: sessionAffinity},
		{name: "terminating-and-not-serving", run: terminatingBackends},
		{name: "internal-traffic-policy-local", run: internalTrafficPolicyLocal},
		{name: "hairpin", run: hairpin},
		{name: "node-local-client", run: nodeLocalClient},
		{name: "cross-node-backend", run: crossNodeBackend},
		{name: "basic-ipv6", run: func(e *env) { basic(e, ipv6) }},
		{name: "source-ip-preserved-ipv6", run: func(e *env) { sourceIPPreserved(e, ipv6) }},
		{name: "reply-from-vip-ipv6", run: func(e *env) { replyFromVIP(e, ipv6) }},
		{name: "no-endpoints-reject-ipv6", run: func(e *env) { noEndpointsReject(e, ipv6) }},
		{name: "dual-stack", run: dualStack},
		{name: "update-and-delete", run: updateAndDelete},
		{name: "stale-udp-conntrack", run: staleUDPConntrack},
		{name: "vipd-down-traffic-up", serial: true, run: vipdDownTrafficUp},
		{name: "many-services", serial: true, run: manyServices},
		{name: "maglev", run: maglev},
		// External traffic: clients behind the upstream router; IPv4 and
		// IPv6 in each (external_test.go).
		{name: "nodeport", run: nodePortCluster},
		{name: "nodeport-udp", run: nodePortUDP},
		{name: "nodeport-addresses", vipdArgs: nodePortAddressesArgs, run: nodePortAddresses},
		{name: "external-ips", run: externalIPs},
		{name: "load-balancer-ip", run: loadBalancerIP},
		{name: "load-balancer-source-ranges", run: loadBalancerSourceRanges},
		{name: "load-balancer-source-ranges-from-node", run: loadBalancerSourceRangesFromNode},
		{name: "external-traffic-policy-local", run: externalTrafficPolicyLocal},
		{name: "pod-to-load-balancer-ip", run: podToLoadBalancerIP},
		{name: "vipd-down-external-flows-up", run: vipdDownExternalFlowsUp},
		{name: "nodeport-pmtu", run: nodePortPMTU},
		{name: "nodeport-address-added-removed", run: nodePortAddressAddedRemoved},
		{name: "nodeport-ttl", run: nodePortTTL},
		{name: "snat-port-range", vipdArgs: snatPortRangeArgs, run: snatPortRange},
		snatTimeWaitScenario(),
	}
}

func ap(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

// allThree is the service most scenarios start from: VIP:80 -> be1..be3:8080.
func (e *env) allThree(f family, p ...*vipdv1.Port) *vipdv1.Service {
	if len(p) == 0 {
		p = ports(tcpPort(80, 8080))
	}
	return service(vips(f.vip(10)), p, backend(e.be1, f), backend(e.be2, f), backend(e.be3, f))
}

// 1. should load-balance new connections over every ready backend, by weight.
func basic(e *env, f family) {
	vip := ap(f.vip(10), 80)
	e.upsert(service(vips(vip.Addr()), ports(tcpPort(80, 8080)),
		backend(e.be1, f, weight(1)), backend(e.be2, f, weight(2)), backend(e.be3, f, weight(3))))
	const n = 300
	counts := e.expectBackends(e.client, "tcp", vip, n, echoes(8080, e.be1, e.be2, e.be3)...)
	e.expectWeightedSplit(fmt.Sprintf("TCP %v from client, %d connections", vip, n), counts,
		map[string]float64{e.be1.echo(8080): 1, e.be2.echo(8080): 2, e.be3.echo(8080): 3})
}

// 2. should balance per connection, not per packet.
func perConnection(e *env) {
	vip := ap(ipv4.vip(10), 80)
	e.upsert(e.allThree(ipv4))
	// New connections do spread, so one backend for a whole connection is
	// stickiness, not a dataplane that only ever picks one.
	e.expectBackends(e.client, "tcp", vip, 60, echoes(8080, e.be1, e.be2, e.be3)...)
	c := e.dial(e.client, "tcp", vip)
	first := e.on(c, "")
	for i := 2; i <= 500; i++ {
		if got := e.on(c, ""); got != first {
			e.fatalf("TCP %v from client: request %d of 500 on one connection was answered by %s, want %s, "+
				"which answered the first: balancing must be per connection, not per packet", vip, i, got, first)
		}
	}
}

// 3. should preserve source pod IP for traffic thru service cluster IP.
func sourceIPPreserved(e *env, f family) {
	vip := ap(f.vip(10), 80)
	e.upsert(e.allThree(f, tcpPort(80, 8080), udpPort(80, 8080)))
	for _, c := range []host{e.client, e.client2} {
		e.expectClientSource(c, f, "tcp", vip, 20)
		e.expectClientSource(c, f, "udp", vip, 20)
	}
}

// 4. should answer from the VIP: the client never sees a backend address.
func replyFromVIP(e *env, f family) {
	vip := ap(f.vip(10), 80)
	e.upsert(e.allThree(f, tcpPort(80, 8080), udpPort(80, 8080)))
	// Control: a UDP reply straight from a backend shows the backend as its
	// source, so Reply.Remote really is where the datagram came from.
	direct := ap(e.be1.addr(f), 8080)
	r, err := request(e.client, "udp", direct, replyDeadline)
	if err != nil || r.Remote != direct {
		e.fatalf("control: UDP %v straight to a backend: want a reply from %v, got %+v, %v", direct, direct, r, err)
	}
	for _, proto := range []string{"tcp", "udp"} {
		for i := range 30 {
			r, err := request(e.client, proto, vip, replyDeadline)
			if err != nil {
				e.fatalf("%s %v from client: request %d: %v", upper(proto), vip, i+1, err)
			}
			if r.Remote != vip {
				e.fatalf("%s %v from client: the client's peer is %v (reply from %s), want the VIP %v", upper(proto), vip, r.Remote, r.Backend, vip)
			}
			if r.Local.Addr() != e.client.addr(f) {
				e.fatalf("%s %v from client: client socket bound to %v, want the client's address %v", upper(proto), vip, r.Local, e.client.addr(f))
			}
		}
	}
}

// 5. should not make the VIP exist: no interface owns it, it answers no
// ping, and only declared ports forward.
func vipIsFiction(e *env) {
	v4, v6 := ipv4.vip(10), ipv6.vip(10)
	e.upsert(service(vips(v4, v6), ports(tcpPort(80, 8080)),
		backend(e.be1, ipv4), backend(e.be2, ipv4), backend(e.be1, ipv6), backend(e.be2, ipv6)))
	for _, vip := range []netip.Addr{v4, v6} {
		e.expectBackends(e.client, "tcp", ap(vip, 80), 40, echoes(8080, e.be1, e.be2)...)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	namespaces := []*netlab.NS{e.lab.Upstream()}
	for _, n := range e.lab.Nodes() {
		namespaces = append(namespaces, n.NS)
		for _, p := range n.Pods() {
			namespaces = append(namespaces, p.NS)
		}
	}
	for _, ns := range namespaces {
		out, err := ns.Exec(ctx, "ip", "-o", "addr")
		if err != nil {
			e.fatalf("%v", err)
		}
		for line := range strings.Lines(out) {
			f := strings.Fields(line)
			if len(f) < 4 || (f[2] != "inet" && f[2] != "inet6") {
				continue
			}
			p, err := netip.ParsePrefix(f[3])
			if err != nil {
				e.fatalf("parse `ip -o addr` in %s: %q: %v", ns.Name(), line, err)
			}
			if vipRange4.Contains(p.Addr()) || vipRange6.Contains(p.Addr()) {
				e.fatalf("namespace %s has VIP-range address %v on an interface, want none: %s", ns.Name(), p, strings.TrimSpace(line))
			}
		}
	}

	for _, from := range []host{e.client, e.node1} {
		// Control: the probe does see replies, from a pod.
		if ok, err := ping(from.NS, e.be3.v4, 2, time.Second); err != nil || !ok {
			e.fatalf("control: ping %v from %s: want a reply, got none (err %v)", e.be3.v4, from.name, err)
		}
		if ok, err := ping(from.NS, e.be3.v6, 2, time.Second); err != nil || !ok {
			e.fatalf("control: ping %v from %s: want a reply, got none (err %v)", e.be3.v6, from.name, err)
		}
	}
	// Waiting for replies that must not come takes a while: in parallel.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var problems []string
	for _, from := range []host{e.client, e.node1} {
		for _, vip := range []netip.Addr{v4, v6} {
			wg.Go(func() {
				ok, err := ping(from.NS, vip, 2, time.Second)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil:
					problems = append(problems, fmt.Sprintf("ping %v from %s: %v", vip, from.name, err))
				case ok:
					problems = append(problems, fmt.Sprintf("ping %v from %s: got an ICMP echo reply from the VIP, want none: "+
						"a VIP answers nothing but its declared ports", vip, from.name))
				}
			})
		}
	}
	wg.Wait()
	if len(problems) > 0 {
		e.fatalf("%s", strings.Join(problems, "; "))
	}

	// The backends listen on 81 and 8080 too (TCP and UDP), and UDP 80: a
	// dataplane that forwarded more than TCP 80 would reach them.
	for _, vip := range []netip.Addr{v4, v6} {
		e.expectDead(e.client, "tcp", ap(vip, 81))
		e.expectDead(e.client, "tcp", ap(vip, 8080))
		e.expectDead(e.client, "udp", ap(vip, 80))
		e.expectDead(e.client, "udp", ap(vip, 81))
	}
}

// 6. should be rejected when no endpoints exist.
func noEndpointsReject(e *env, f family) {
	vip := ap(f.vip(10), 80)
	svc := service(vips(vip.Addr()), ports(tcpPort(80, 8080), udpPort(80, 8080)))
	e.upsert(svc)
	e.expectRefused(e.client, "tcp", vip)
	e.expectRefused(e.client, "udp", vip)

	// Backends that may take no new connection are no endpoints either.
	svc.Backends = []*vipdv1.Backend{backend(e.be1, f, notServing), backend(e.be2, f, notServing)}
	e.upsert(svc)
	e.expectRefused(e.client, "tcp", vip)
	e.expectRefused(e.client, "udp", vip)

	e.updateBackends(svcName, []*vipdv1.Backend{backend(e.be3, f)})
	e.expectBackends(e.client, "tcp", vip, 5, e.be3.echo(8080))
	e.expectBackends(e.client, "udp", vip, 5, e.be3.echo(8080))
}

// 7. should forward each port to its own target port, honouring per-backend
// overrides by port name, and stop only a removed port.
func multiPort(e *env) {
	vip := ipv4.vip(10)
	http := port("http", vipdv1.Protocol_PROTOCOL_TCP, 80, 8080)
	alt := port("alt", vipdv1.Protocol_PROTOCOL_TCP, 81, 8081)
	svc := service(vips(vip), ports(http, alt),
		backend(e.be1, ipv4),
		backend(e.be2, ipv4, targetPorts(map[string]uint32{"alt": 8082})),
		backend(e.be3, ipv4, targetPorts(map[string]uint32{"http": 8082})))
	e.upsert(svc)
	want80 := []string{e.be1.echo(8080), e.be2.echo(8080), e.be3.echo(8082)}
	want81 := []string{e.be1.echo(8081), e.be2.echo(8082), e.be3.echo(8081)}
	e.expectBackends(e.client, "tcp", ap(vip, 80), 60, want80...)
	e.expectBackends(e.client, "tcp", ap(vip, 81), 60, want81...)

	// Overrides may only name ports the service has.
	svc.Ports = ports(http)
	svc.Backends = []*vipdv1.Backend{backend(e.be1, ipv4), backend(e.be2, ipv4),
		backend(e.be3, ipv4, targetPorts(map[string]uint32{"http": 8082}))}
	e.upsert(svc)
	e.expectDead(e.client, "tcp", ap(vip, 81))
	e.expectBackends(e.client, "tcp", ap(vip, 80), 60, want80...)
}

// 7b. should make an endpoint a backend only of the ports its EndpointSlice
// lists (only_named_ports), port by port: new connections to another port
// never reach it, its UDP flows to such a port move, and a port that no
// backend serves is refused at once, as with no endpoints.
func onlyNamedPorts(e *env) {
	vip := ipv4.vip(10)
	http := port("http", vipdv1.Protocol_PROTOCOL_TCP, 80, 8080)
	alt := port("alt", vipdv1.Protocol_PROTOCOL_TCP, 81, 8081)
	dns := port("dns", vipdv1.Protocol_PROTOCOL_UDP, 53, 8081)
	only := func(m map[string]uint32) backendOpt {
		return func(b *vipdv1.Backend) { b.Ports, b.OnlyNamedPorts = m, true }
	}
	svc := service(vips(vip), ports(http, alt, dns),
		backend(e.be1, ipv4),
		backend(e.be2, ipv4, only(map[string]uint32{"http": 8082})),
		backend(e.be3, ipv4, only(nil)))
	got := e.upsert(svc)
	var echoed []string
	for _, b := range got.GetBackends() {
		echoed = append(echoed, fmt.Sprintf("%s only=%v %v", b.GetIp(), b.GetOnlyNamedPorts(), b.GetPorts()))
	}
	want := []string{
		fmt.Sprintf("%s only=false map[]", e.be1.v4),
		fmt.Sprintf("%s only=true map[http:8082]", e.be2.v4),
		fmt.Sprintf("%s only=true map[]", e.be3.v4),
	}
	if !slices.Equal(echoed, want) {
		e.fatalf("UpsertService returned backends %q, want %q", echoed, want)
	}

	// 60 connections to each: all three backends are ready, so a dataplane
	// that ignored only_named_ports would send some to be2 or be3.
	for _, h := range []host{e.client, e.node1} {
		e.expectBackends(h, "tcp", ap(vip, 80), 60, e.be1.echo(8080), e.be2.echo(8082))
		e.expectBackends(h, "tcp", ap(vip, 81), 60, e.be1.echo(8081))
		e.expectBackends(h, "udp", ap(vip, 53), 60, e.be1.echo(8081))
	}

	// A backend that stops serving a port loses its UDP flows to that
	// port, as one removed from the service does (kube-proxy flushes
	// conntrack entries of endpoints that leave a UDP service port).
	svc.Backends = []*vipdv1.Backend{backend(e.be1, ipv4, only(map[string]uint32{"http": 8080})), backend(e.be2, ipv4)}
	e.upsert(svc)
	c := e.dial(e.client, "udp", ap(vip, 53))
	if got := e.on(c, ""); got != e.be2.echo(8081) {
		e.fatalf("UDP %v: answered by %s, want %s, the only backend that serves port dns", ap(vip, 53), got, e.be2.echo(8081))
	}
	e.updateBackends(svcName, []*vipdv1.Backend{backend(e.be1, ipv4), backend(e.be2, ipv4, only(map[string]uint32{"http": 8080}))})
	for i := range 5 {
		if got := e.on(c, "after its backend stopped serving the port"); got != e.be1.echo(8081) {
			e.fatalf("UDP %v from the same client socket, datagram %d after be2 stopped serving port dns: answered by %s, want %s "+
				"(a backend that no longer serves a UDP port must lose its flows to it)", ap(vip, 53), i+1, got, e.be1.echo(8081))
		}
	}

	// A port whose only backend does not serve it is refused at once; the
	// port it serves works.
	svc.Backends = []*vipdv1.Backend{backend(e.be2, ipv4, only(map[string]uint32{"http": 8080}))}
	e.upsert(svc)
	for _, h := range []host{e.client, e.node1} {
		e.expectRefused(h, "tcp", ap(vip, 81))
		e.expectBackends(h, "tcp", ap(vip, 80), 5, e.be2.echo(8080))
	}
	// From pods only: a node's own UDP socket meets iptables' REJECT in
	// OUTPUT as EPERM from sendto, not ECONNREFUSED.
	e.expectRefused(e.client, "udp", ap(vip, 53))
	// And it is served again once a backend serves it.
	e.updateBackends(svcName, []*vipdv1.Backend{backend(e.be3, ipv4, only(map[string]uint32{"alt": 8082, "dns": 8082}))})
	e.expectBackends(e.client, "tcp", ap(vip, 81), 10, e.be3.echo(8082))
	e.expectBackends(e.client, "udp", ap(vip, 53), 10, e.be3.echo(8082))
	e.expectBackends(e.client, "tcp", ap(vip, 80), 10, e.be2.echo(8080))
}

// 7c. should take the empty name in a backend's ports as a service's only,
// unnamed port, as an EndpointSlice of such a service names it.
func unnamedPortByEmptyName(e *env) {
	vip := ap(ipv4.vip(10), 80)
	unnamed := port("", vipdv1.Protocol_PROTOCOL_TCP, 80, 8080)
	only := func(m map[string]uint32) backendOpt {
		return func(b *vipdv1.Backend) { b.Ports, b.OnlyNamedPorts = m, true }
	}
	svc := service(vips(vip.Addr()), ports(unnamed),
		backend(e.be1, ipv4, only(map[string]uint32{"": 8081})),
		backend(e.be2, ipv4, only(map[string]uint32{"": 8082})),
		backend(e.be3, ipv4, only(nil)))
	e.upsert(svc)
	e.expectBackends(e.client, "tcp", vip, 60, e.be1.echo(8081), e.be2.echo(8082))

	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	got, err := e.api.GetService(ctx, svcName)
	if err != nil {
		e.fatalf("GetService %s: %v", svcName, err)
	}
	if b := got.GetBackends()[0]; !b.GetOnlyNamedPorts() || len(b.GetPorts()) != 1 || b.GetPorts()[""] != 8081 {
		e.fatalf("GetService %s: backend %v, want ports {\"\": 8081} and only_named_ports", svcName, b)
	}

	// Without only_named_ports, a backend the empty name does not name
	// serves the port's own target port.
	svc.Backends = []*vipdv1.Backend{backend(e.be1, ipv4, targetPorts(map[string]uint32{"": 8081})), backend(e.be2, ipv4)}
	e.upsert(svc)
	e.expectBackends(e.client, "tcp", vip, 60, e.be1.echo(8081), e.be2.echo(8080))

	// With a named port, the empty name names nothing: refused, and the
	// old service stays.
	named := port("http", vipdv1.Protocol_PROTOCOL_TCP, 80, 8080)
	bad := service(vips(vip.Addr()), ports(named), backend(e.be1, ipv4, only(map[string]uint32{"": 8081})))
	ctx, cancel = context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	if _, err := e.api.UpsertService(ctx, bad, 0); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `ports[""]`) {
		e.fatalf("UpsertService with the empty name for a named port: want InvalidArgument naming ports[\"\"], got %v", err)
	}
	e.expectBackends(e.client, "tcp", vip, 30, e.be1.echo(8081), e.be2.echo(8080))
}

// 8. should forward TCP and UDP on the same port independently.
func samePortTCPAndUDP(e *env) {
	vip := ap(ipv4.vip(10), 80)
	tcp, udp := tcpPort(80, 8080), udpPort(80, 8081)
	svc := service(vips(vip.Addr()), ports(tcp, udp), backend(e.be1, ipv4), backend(e.be2, ipv4))
	e.upsert(svc)
	wantTCP, wantUDP := echoes(8080, e.be1, e.be2), echoes(8081, e.be1, e.be2)
	e.expectBackends(e.client, "tcp", vip, 40, wantTCP...)
	e.expectBackends(e.client, "udp", vip, 40, wantUDP...)

	svc.Ports = ports(tcp)
	e.upsert(svc)
	e.expectDead(e.client, "udp", vip)
	e.expectBackends(e.client, "tcp", vip, 40, wantTCP...)

	svc.Ports = ports(udp)
	e.upsert(svc)
	e.expectDead(e.client, "tcp", vip)
	e.expectBackends(e.client, "udp", vip, 40, wantUDP...)
}

// 9a. should forward UDP, with replies from the VIP.
func udpForwarding(e *env) {
	vip := ap(ipv4.vip(10), 53)
	e.upsert(e.allThree(ipv4, udpPort(53, 8081)))
	e.expectBackends(e.client, "udp", vip, 60, echoes(8081, e.be1, e.be2, e.be3)...)
	e.expectClientSource(e.client, ipv4, "udp", vip, 10)
	e.expectDead(e.client, "tcp", vip)
}

// 9b. should forward SCTP, with replies from the VIP: on the same port
// everywhere, and with a port rewrite where the dataplane can do one. (An
// SCTP port rewrite means recomputing the CRC32c of the whole packet; a
// dataplane may refuse such a service with FailedPrecondition, the one
// exception the API allows. Same-port SCTP must always work.)
func sctpForwarding(e *env) {
	e.requireProtocol(vipdv1.Protocol_PROTOCOL_SCTP)
	vip := ipv4.vip(10)
	e.upsert(service(vips(vip), ports(sctpPort(80, 80)), backend(e.be1, ipv4)))
	e.expectSCTP(ap(vip, 80), ap(e.be1.v4, 80))

	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	rewrite := service(vips(vip), ports(sctpPort(81, 8081)), backend(e.be1, ipv4))
	_, err := e.api.UpsertService(ctx, rewrite, 0)
	switch {
	case status.Code(err) == codes.FailedPrecondition:
		e.logf("the dataplane refuses an SCTP port rewrite, as it may: %v", err)
		e.expectSCTP(ap(vip, 80), ap(e.be1.v4, 80)) // and the old state stays
	case err != nil:
		e.fatalf("UpsertService with an SCTP port rewrite: want success or FailedPrecondition, got %v", err)
	default:
		e.expectSCTP(ap(vip, 81), ap(e.be1.v4, 8081))
	}
}

// expectSCTP checks that SCTP associations from the client to vip reach
// backendAddr, with the client's address preserved and replies from vip:
// with SCTP sockets where the kernel has them, else by playing both ends of
// an association's first exchange with raw sockets.
func (e *env) expectSCTP(vip, backendAddr netip.AddrPort) {
	e.t.Helper()
	name := e.be1.name + ":" + strconv.Itoa(int(backendAddr.Port()))
	if sctpSocketsWork(e.client.NS) {
		e.logf("the kernel has SCTP sockets: using them")
		srv, err := startSCTPEcho(e.be1.NS, name, backendAddr)
		if err != nil {
			e.fatalf("%v", err)
		}
		defer srv.Close()
		for i := range 5 {
			r, err := sctpRequest(e.client.NS, vip, replyDeadline)
			if err != nil {
				e.fatalf("SCTP %v from client: request %d: %v", vip, i+1, err)
			}
			if r.Backend != name || r.Remote != vip || r.Peer.Addr() != e.client.v4 {
				e.fatalf("SCTP %v from client: want %s to answer, seeing the client as %v, with the VIP as the client's peer; got %s seeing %v, peer %v",
					vip, name, e.client.v4, r.Backend, r.Peer, r.Remote)
			}
		}
		return
	}

	e.logf("the kernel has no SCTP sockets: checking an INIT / INIT ACK exchange through raw sockets")
	bfd, err := rawSocket(e.be1.NS, unix.AF_INET, unix.IPPROTO_SCTP)
	if err != nil {
		e.fatalf("%v", err)
	}
	defer unix.Close(bfd)
	cfd, err := rawSocket(e.client.NS, unix.AF_INET, unix.IPPROTO_SCTP)
	if err != nil {
		e.fatalf("%v", err)
	}
	defer unix.Close(cfd)

	for range 3 { // three associations, each from its own port
		client := ap(e.client.v4, uint16(30000+rand.IntN(30000)))
		initTag, ackTag := rand.Uint32()|1, rand.Uint32()|1
		if err := unix.Sendto(cfd, sctpPacket(client.Port(), vip.Port(), 0, sctpInit, initTag, rand.Uint32()), 0, sockaddr(vip.Addr())); err != nil {
			e.fatalf("send SCTP INIT to %v: %v", vip, err)
		}
		got, ok, others, err := recvSCTP(bfd, time.Now().Add(replyDeadline), func(s sctpSeen) bool {
			return s.chunk == sctpInit && s.initTag == initTag
		})
		switch {
		case err != nil:
			e.fatalf("receive SCTP in be1: %v", err)
		case !ok:
			e.fatalf("SCTP INIT %v -> %v: want it at be1 as %v -> %v within %v, got nothing; be1 saw %s", client, vip, client, backendAddr, replyDeadline, fmtSeen(others))
		case got.src != client || got.dst != backendAddr || got.vtag != 0 || !got.checksumOK:
			e.fatalf("SCTP INIT %v -> %v: want it at be1 as %v -> %v with vtag 0 and a valid checksum, got %v", client, vip, client, backendAddr, got)
		}

		ack := sctpPacket(backendAddr.Port(), client.Port(), initTag, sctpInitAck, ackTag, rand.Uint32())
		if err := unix.Sendto(bfd, ack, 0, sockaddr(client.Addr())); err != nil {
			e.fatalf("send SCTP INIT ACK from be1 to %v: %v", client, err)
		}
		got, ok, others, err = recvSCTP(cfd, time.Now().Add(replyDeadline), func(s sctpSeen) bool {
			return s.chunk == sctpInitAck && s.initTag == ackTag
		})
		switch {
		case err != nil:
			e.fatalf("receive SCTP in client: %v", err)
		case !ok:
			e.fatalf("SCTP INIT ACK %v -> %v: want it at the client as %v -> %v within %v, got nothing; the client saw %s",
				backendAddr, client, vip, client, replyDeadline, fmtSeen(others))
		case got.src != vip || got.dst != client || got.vtag != initTag || !got.checksumOK:
			e.fatalf("SCTP INIT ACK %v -> %v: want it at the client as %v -> %v with vtag %#x and a valid checksum, got %v",
				backendAddr, client, vip, client, initTag, got)
		}
	}
}

// 10. should have session affinity work for service with type clusterIP,
// expire it after its timeout, and switch it on and off.
func sessionAffinity(e *env) {
	const timeout = 2 // seconds
	vip := ap(ipv4.vip(10), 80)
	all := echoes(8080, e.be1, e.be2, e.be3)
	svc := e.allThree(ipv4)
	on := &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP, TimeoutSeconds: timeout}
	svc.SessionAffinity = on
	e.upsert(svc)
	first := e.expectOne(e.client, "tcp", vip, 50)

	// After the timeout, a connection chooses afresh (and sticks again). With
	// three backends, 15 rounds all picking the same one happen with
	// probability 3^-14.
	seen := map[string]bool{first: true}
	var history []string
	for round := 1; round <= 15 && len(seen) < 2; round++ {
		time.Sleep(timeout*time.Second + time.Second)
		r, err := request(e.client, "tcp", vip, replyDeadline)
		if err != nil {
			e.fatalf("TCP %v from client after the affinity timeout: %v", vip, err)
		}
		seen[r.Backend] = true
		history = append(history, r.Backend)
	}
	if len(seen) < 2 {
		e.fatalf("TCP %v from client: after the %ds affinity timeout, 15 rounds %ds apart all went to %s (%v); want the choice to change once affinity expires",
			vip, timeout, timeout+1, first, history)
	}

	svc.SessionAffinity = nil
	e.upsert(svc)
	e.expectBackends(e.client, "tcp", vip, 60, all...)
	svc.SessionAffinity = on
	e.upsert(svc)
	e.expectOne(e.client, "tcp", vip, 50)
	e.expectOne(e.client2, "tcp", vip, 50)
	svc.SessionAffinity = &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_NONE}
	e.upsert(svc)
	e.expectBackends(e.client, "tcp", vip, 60, all...)
}

// 11. should honour backend states: terminating backends only when no ready
// one is left, not-serving ones never, and established connections keep
// working whatever happens to their backend.
func terminatingBackends(e *env) {
	vip := ap(ipv4.vip(10), 80)
	set := func(b ...*vipdv1.Backend) { e.upsert(service(vips(vip.Addr()), ports(tcpPort(80, 8080)), b...)) }

	set(backend(e.be1, ipv4), backend(e.be2, ipv4, terminating), backend(e.be3, ipv4, terminating))
	e.expectBackends(e.client, "tcp", vip, 40, e.be1.echo(8080))
	set(backend(e.be1, ipv4, notServing), backend(e.be2, ipv4, terminating), backend(e.be3, ipv4, terminating))
	e.expectBackends(e.client, "tcp", vip, 40, echoes(8080, e.be2, e.be3)...)
	set(backend(e.be1, ipv4, notServing), backend(e.be2, ipv4))
	e.expectBackends(e.client, "tcp", vip, 30, e.be2.echo(8080))
	set(backend(e.be1, ipv4, notServing), backend(e.be3, ipv4, terminating))
	e.expectBackends(e.client, "tcp", vip, 30, e.be3.echo(8080))

	set(backend(e.be1, ipv4))
	c := e.dial(e.client, "tcp", vip)
	if got := e.on(c, ""); got != e.be1.echo(8080) {
		e.fatalf("TCP %v: first request answered by %s, want be1, the only backend", vip, got)
	}
	for _, step := range []struct {
		what     string
		backends []*vipdv1.Backend
	}{
		{"after be1 turned TERMINATING", []*vipdv1.Backend{backend(e.be1, ipv4, terminating), backend(e.be2, ipv4)}},
		{"after be1 turned NOT_SERVING", []*vipdv1.Backend{backend(e.be1, ipv4, notServing), backend(e.be2, ipv4)}},
		{"after be1 was removed from the service", []*vipdv1.Backend{backend(e.be2, ipv4)}},
	} {
		set(step.backends...)
		for range 3 {
			if got := e.on(c, step.what); got != e.be1.echo(8080) {
				e.fatalf("TCP %v: the established connection to be1 was answered by %s %s, want be1", vip, got, step.what)
			}
		}
		e.expectBackends(e.client, "tcp", vip, 20, e.be2.echo(8080))
	}
}

// 12. should use only node-local backends with internal traffic policy Local.
func internalTrafficPolicyLocal(e *env) {
	vip := ap(ipv4.vip(10), 80)
	svc := service(vips(vip.Addr()), ports(tcpPort(80, 8080), udpPort(80, 8080)),
		backend(e.be1, ipv4, nodeLocal), backend(e.be2, ipv4, nodeLocal), backend(e.be4, ipv4))
	svc.InternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	e.upsert(svc)
	e.expectBackends(e.client, "tcp", vip, 40, echoes(8080, e.be1, e.be2)...)

	svc.InternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER
	e.upsert(svc)
	e.expectBackends(e.client, "tcp", vip, 60, echoes(8080, e.be1, e.be2, e.be4)...)

	svc.InternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	svc.Backends = []*vipdv1.Backend{backend(e.be1, ipv4), backend(e.be4, ipv4)}
	e.upsert(svc)
	e.expectRefused(e.client, "tcp", vip)
	e.expectRefused(e.client, "udp", vip)
}

// 13. should allow pods to hairpin back to themselves through services.
func hairpin(e *env) {
	vip := ap(ipv4.vip(10), 80)
	svc := service(vips(vip.Addr()), ports(tcpPort(80, 8080), udpPort(80, 8080)), backend(e.be1, ipv4))
	e.upsert(svc)
	for _, proto := range []string{"tcp", "udp"} {
		e.expectBackends(e.be1, proto, vip, 10, e.be1.echo(8080))
		r, _ := request(e.be1, proto, vip, replyDeadline)
		e.logf("hairpin %s: be1 (%v) saw itself as %v", upper(proto), e.be1.v4, r.Peer)
	}
	svc.Backends = append(svc.Backends, backend(e.be2, ipv4))
	e.upsert(svc)
	e.expectBackends(e.be1, "tcp", vip, 40, echoes(8080, e.be1, e.be2)...)
}

// 14. should balance connections from the node itself.
func nodeLocalClient(e *env) {
	vip := ap(ipv4.vip(10), 80)
	e.upsert(e.allThree(ipv4, tcpPort(80, 8080), udpPort(80, 8080)))
	e.expectBackends(e.node1, "tcp", vip, 60, echoes(8080, e.be1, e.be2, e.be3)...)
	e.expectBackends(e.node1, "udp", vip, 60, echoes(8080, e.be1, e.be2, e.be3)...)
}

// 15. should reach backends on other nodes, with replies translated back.
func crossNodeBackend(e *env) {
	vip := ap(ipv4.vip(10), 80)
	svc := service(vips(vip.Addr()), ports(tcpPort(80, 8080), udpPort(80, 8080)), backend(e.be4, ipv4))
	e.upsert(svc)
	for _, proto := range []string{"tcp", "udp"} {
		e.expectBackends(e.client, proto, vip, 10, e.be4.echo(8080))
		e.expectClientSource(e.client, ipv4, proto, vip, 10)
	}
	svc.Backends = append(svc.Backends, backend(e.be1, ipv4))
	e.upsert(svc)
	e.expectBackends(e.client, "tcp", vip, 40, echoes(8080, e.be1, e.be4)...)
}

// 16. should serve a dual-stack service on both families.
func dualStack(e *env) {
	svc := service(vips(ipv4.vip(10), ipv6.vip(10)), ports(tcpPort(80, 8080), udpPort(80, 8080)))
	for _, f := range []family{ipv4, ipv6} {
		for _, b := range []host{e.be1, e.be2, e.be3} {
			svc.Backends = append(svc.Backends, backend(b, f))
		}
	}
	e.upsert(svc)
	for _, f := range []family{ipv4, ipv6} {
		vip := ap(f.vip(10), 80)
		for _, proto := range []string{"tcp", "udp"} {
			e.expectBackends(e.client, proto, vip, 60, echoes(8080, e.be1, e.be2, e.be3)...)
			e.expectClientSource(e.client, f, proto, vip, 10)
		}
	}
	// Each family has its own backends: with only IPv4 ones left, IPv6 rejects.
	svc.Backends = []*vipdv1.Backend{backend(e.be1, ipv4)}
	e.upsert(svc)
	e.expectBackends(e.client, "tcp", ap(ipv4.vip(10), 80), 10, e.be1.echo(8080))
	e.expectRefused(e.client, "tcp", ap(ipv6.vip(10), 80))
}

// 17. should apply backend changes before the RPC returns, and forget a
// deleted service.
func updateAndDelete(e *env) {
	vip := ap(ipv4.vip(10), 80)
	svc := service(vips(vip.Addr()), ports(tcpPort(80, 8080)), backend(e.be1, ipv4))
	e.upsert(svc)
	e.expectBackends(e.client, "tcp", vip, 10, e.be1.echo(8080))
	// No sleeps: the first connection after each RPC must see the new set.
	svc.Backends = []*vipdv1.Backend{backend(e.be2, ipv4)}
	e.upsert(svc)
	e.expectBackends(e.client, "tcp", vip, 20, e.be2.echo(8080))
	e.updateBackends(svcName, []*vipdv1.Backend{backend(e.be3, ipv4)}, e.be2.v4)
	e.expectBackends(e.client, "tcp", vip, 20, e.be3.echo(8080))
	e.updateBackends(svcName, []*vipdv1.Backend{backend(e.be1, ipv4)})
	e.expectBackends(e.client, "tcp", vip, 40, echoes(8080, e.be1, e.be3)...)

	e.deleteService(svcName)
	e.expectDead(e.client, "tcp", vip)
	e.expectDead(e.client2, "tcp", vip)

	svc.Backends = []*vipdv1.Backend{backend(e.be2, ipv4)}
	e.upsert(svc)
	e.expectBackends(e.client, "tcp", vip, 20, e.be2.echo(8080))
}

// 18. should not keep stale UDP conntrack entries: neither to a removed
// backend, nor from a time the service had no backends.
func staleUDPConntrack(e *env) {
	vip := ap(ipv4.vip(10), 53)
	svc := service(vips(vip.Addr()), ports(udpPort(53, 8080)), backend(e.be1, ipv4), backend(e.be2, ipv4))
	e.upsert(svc)
	c := e.dial(e.client, "udp", vip) // one socket: one source port, one conntrack entry
	first := e.on(c, "")
	for range 5 {
		if got := e.on(c, ""); got != first {
			e.fatalf("UDP %v from one client socket: answered by %s, then by %s; want one backend per flow", vip, first, got)
		}
	}
	removed, remaining := e.be1, e.be2
	if first == e.be2.echo(8080) {
		removed, remaining = e.be2, e.be1
	}
	e.updateBackends(svcName, nil, removed.v4)
	for i := range 5 {
		if got := e.on(c, "after its backend was removed"); got != remaining.echo(8080) {
			e.fatalf("UDP %v from the same client socket, datagram %d after %s was removed from the service: answered by %s, want %s "+
				"(the dataplane must delete conntrack entries of removed UDP backends)", vip, i+1, removed.name, got, remaining.echo(8080))
		}
	}

	svc.Backends = nil
	e.upsert(svc)
	c2 := e.dial(e.client2, "udp", vip)
	ctx, cancel := context.WithTimeout(context.Background(), connectDeadline)
	r, err := c2.Request(ctx)
	cancel()
	if !errors.Is(err, syscall.ECONNREFUSED) {
		e.fatalf("UDP %v from client2 with no backends: want ECONNREFUSED (ICMP port unreachable), got reply %q, error %v", vip, r.Backend, err)
	}
	e.updateBackends(svcName, []*vipdv1.Backend{backend(e.be3, ipv4)})
	for i := range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), replyDeadline)
		r, err := c2.Request(ctx)
		cancel()
		if err != nil || r.Backend != e.be3.echo(8080) {
			e.fatalf("UDP %v from the client2 socket that was refused, datagram %d after be3 was added: want a reply from %s, got %q, %v "+
				"(the dataplane must clear conntrack entries from when the service had no backends)", vip, i+1, e.be3.echo(8080), r.Backend, err)
		}
	}
}

// 19. should keep traffic flowing while vipd is down, and converge after a
// restart without dropping a connection.
func vipdDownTrafficUp(e *env) {
	vip := ap(ipv4.vip(10), 80)
	all := echoes(8080, e.be1, e.be2, e.be3)
	e.upsert(e.allThree(ipv4))
	c := e.dial(e.client, "tcp", vip)
	pinned := e.on(c, "")

	e.vipd.kill9()
	if got := e.on(c, "with vipd killed"); got != pinned {
		e.fatalf("established connection answered by %s with vipd killed, want %s", got, pinned)
	}
	e.expectBackends(e.client, "tcp", vip, 60, all...)

	// A client makes new connections without pause while vipd restarts.
	var (
		mu       sync.Mutex
		total    int
		failures []string
		stop     = make(chan struct{})
		done     = make(chan struct{})
	)
	var stopOnce sync.Once
	stopClient := func() { stopOnce.Do(func() { close(stop) }); <-done }
	defer stopClient() // also when the scenario fails half-way
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			// A short pause keeps the client from using up its ephemeral
			// ports (each closed connection sits in TIME_WAIT for 60 s) if
			// the restart takes long.
			case <-time.After(2 * time.Millisecond):
			}
			start := time.Now()
			r, err := request(e.client2, "tcp", vip, connectDeadline)
			mu.Lock()
			total++
			if err != nil {
				failures = append(failures, fmt.Sprintf("%s: %v", start.Format("15:04:05.000"), err))
			} else if r.Remote != vip {
				failures = append(failures, fmt.Sprintf("%s: reply from %v", start.Format("15:04:05.000"), r.Remote))
			}
			mu.Unlock()
		}
	}()
	time.Sleep(300 * time.Millisecond)
	restart := time.Now()
	e.startVipd()
	ready := time.Since(restart)
	time.Sleep(500 * time.Millisecond) // and on after vipd's first apply
	stopClient()
	mu.Lock()
	defer mu.Unlock()
	e.logf("restart took %v; the background client made %d new connections around it", ready.Round(time.Millisecond), total)
	if len(failures) > 0 {
		e.fatalf("%d of %d new connections failed around the vipd restart, want 0; first: %v", len(failures), total, failures[:min(5, len(failures))])
	}
	if total < 20 {
		e.fatalf("the background client made only %d connections around the restart, too few to tell", total)
	}
	if got := e.on(c, "after the vipd restart"); got != pinned {
		e.fatalf("established connection answered by %s after the restart, want %s", got, pinned)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := e.api.Status(ctx)
	if err != nil || !st.GetReady() || st.GetServices() != 1 || st.GetLastError() != "" {
		e.fatalf("GetStatus after the restart: want ready with 1 service and no error, got %v, %v", st, err)
	}
	// Converged: vipd manages the service again.
	e.upsert(service(vips(vip.Addr()), ports(tcpPort(80, 8080)), backend(e.be3, ipv4)))
	e.expectBackends(e.client, "tcp", vip, 20, e.be3.echo(8080))
	if got := e.on(c, "after its service changed"); got != pinned {
		e.fatalf("established connection answered by %s after the service changed, want %s", got, pinned)
	}
}

// 20. should keep working with 1,000 services programmed.
func manyServices(e *env) {
	const n = 1000
	vipOf := func(i int) netip.Addr { return ipv4.vip(0x100 + (i/250)<<8 + i%250 + 1) } // 198.19.1.1 ... 198.19.4.250
	weighted := []*vipdv1.Backend{backend(e.be1, ipv4, weight(1)), backend(e.be2, ipv4, weight(2)), backend(e.be3, ipv4, weight(3))}
	single := []host{e.be1, e.be2, e.be3}
	svcs := make([]*vipdv1.Service, n)
	for i := range svcs {
		if i == 0 || i == n-1 {
			svcs[i] = service(vips(vipOf(i)), ports(tcpPort(80, 8080), udpPort(80, 8080)), weighted...)
		} else {
			svcs[i] = service(vips(vipOf(i)), ports(tcpPort(80, 8080)), backend(single[i%3], ipv4))
		}
		svcs[i].Name = fmt.Sprintf("conformance/svc-%04d", i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	start := time.Now()
	if _, err := e.api.SyncServices(ctx, owner, svcs); err != nil {
		e.fatalf("SyncServices with %d services: %v", n, err)
	}
	e.logf("SyncServices with %d services took %v", n, time.Since(start).Round(time.Millisecond))

	weights := map[string]float64{e.be1.echo(8080): 1, e.be2.echo(8080): 2, e.be3.echo(8080): 3}
	for _, i := range []int{0, n - 1} {
		vip := ap(vipOf(i), 80)
		counts := e.expectBackends(e.client, "tcp", vip, 300, echoes(8080, e.be1, e.be2, e.be3)...)
		e.expectWeightedSplit(fmt.Sprintf("%s: TCP %v, 300 connections", svcs[i].Name, vip), counts, weights)
	}
	e.expectBackends(e.client, "tcp", ap(vipOf(500), 80), 5, single[500%3].echo(8080))

	for _, i := range []int{0, n - 1} {
		empty := proto.Clone(svcs[i]).(*vipdv1.Service)
		empty.Backends = nil
		start := time.Now()
		e.upsert(empty)
		e.logf("UpsertService %s among %d services took %v", empty.Name, n, time.Since(start).Round(time.Millisecond))
		vip := ap(vipOf(i), 80)
		e.expectRefused(e.client, "tcp", vip)
		e.expectRefused(e.client, "udp", vip)
		e.updateBackends(empty.Name, []*vipdv1.Backend{backend(e.be2, ipv4)})
		e.expectBackends(e.client, "tcp", vip, 5, e.be2.echo(8080))
		e.expectBackends(e.client, "udp", vip, 5, e.be2.echo(8080))
	}
}

// Maglev: the only feature a dataplane may declare unsupported.
func maglev(e *env) {
	e.requireLoadBalancing(vipdv1.LoadBalancing_LOAD_BALANCING_MAGLEV)
	vip := ap(ipv4.vip(10), 80)
	svc := e.allThree(ipv4)
	svc.LoadBalancing = vipdv1.LoadBalancing_LOAD_BALANCING_MAGLEV
	e.upsert(svc)
	e.expectBackends(e.client, "tcp", vip, 90, echoes(8080, e.be1, e.be2, e.be3)...)
	c := e.dial(e.client, "tcp", vip)
	first := e.on(c, "")
	for range 50 {
		if got := e.on(c, ""); got != first {
			e.fatalf("TCP %v: one connection answered by %s, then %s", vip, first, got)
		}
	}
}
