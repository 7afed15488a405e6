package conformance

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/vipd/vipd/internal/testkit/netlab"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// The external half of the table: node ports, external IPs, load-balancer
// IPs, external traffic policy and source ranges, with clients behind the
// upstream router (env.out, env.out2) whose traffic enters node1 on its
// uplink, as another machine's would. Every scenario covers IPv4 and IPv6.

const (
	// nodePort is the node port of the external scenarios' services (TCP
	// and UDP), hcPort their health check node port.
	nodePort = 30080
	hcPort   = 30999
	// healthWait bounds the wait for the health check node port to report a
	// change of local backends.
	healthWait = 5 * time.Second
)

// External and load-balancer IP ranges: the upstream router sends them to
// node1, and no interface owns them.
var (
	extRange4 = netip.MustParsePrefix("198.19.200.0/23")
	extRange6 = netip.MustParsePrefix("fd00:198:ffff::/48")
)

// externalIP returns the family's external IP number n: 198.19.200.n or
// fd00:198:ffff::n.
func (f family) externalIP(n int) netip.Addr {
	if f == ipv6 {
		b := extRange6.Addr().As16()
		b[15] = byte(n)
		return netip.AddrFrom16(b)
	}
	return netip.AddrFrom4([4]byte{198, 19, 200, byte(n)})
}

// lbIP returns the family's load-balancer IP number n: 198.19.201.n or
// fd00:198:ffff:1::n.
func (f family) lbIP(n int) netip.Addr {
	if f == ipv6 {
		b := extRange6.Addr().As16()
		b[7], b[15] = 1, byte(n)
		return netip.AddrFrom16(b)
	}
	return netip.AddrFrom4([4]byte{198, 19, 201, byte(n)})
}

func familyOf(a netip.Addr) family {
	if a.Is4() {
		return ipv4
	}
	return ipv6
}

// fmtAddrs says "a" or "one of a, b".
func fmtAddrs(as []netip.Addr) string {
	var ss []string
	for _, a := range as {
		ss = append(ss, a.String())
	}
	if len(ss) == 1 {
		return ss[0]
	}
	return "one of " + strings.Join(ss, ", ")
}

// families is both address families, for scenarios that cover both.
var families = []family{ipv4, ipv6}

// single returns the prefix of a alone.
func single(a netip.Addr) string { return netip.PrefixFrom(a, a.BitLen()).String() }

func withNodePort(p *vipdv1.Port, np uint16) *vipdv1.Port {
	p.NodePort = uint32(np)
	return p
}

// externalService returns a dual-stack service on VIP number 10 with ports
// p and backends hosts in both families, node1's pods marked node-local.
func (e *env) externalService(p []*vipdv1.Port, hosts ...host) *vipdv1.Service {
	svc := service(vips(ipv4.vip(10), ipv6.vip(10)), p)
	svc.Backends = e.backendsOf(hosts...)
	return svc
}

// backendsOf returns hosts as backends in both families; node1's pods are
// node-local.
func (e *env) backendsOf(hosts ...host) []*vipdv1.Backend {
	var bs []*vipdv1.Backend
	for _, f := range families {
		for _, h := range hosts {
			var opts []backendOpt
			if e.lab.Node(1).Pod(h.name) != nil {
				opts = append(opts, nodeLocal)
			}
			bs = append(bs, backend(h, f, opts...))
		}
	}
	return bs
}

// upsertExternal applies svc, a service with node ports, external IPs or
// load-balancer IPs, and reports whether the scenario may go on. A dataplane
// that declares no external support (dataplane.Capabilities.External) must
// refuse such a service with FailedPrecondition instead of half-serving it:
// upsertExternal checks that the refusal left the service and its node port
// out of the kernel, marks the scenario "refused" in the results table, and
// returns false. Any other error fails the scenario.
func (e *env) upsertExternal(svc *vipdv1.Service) bool {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	_, err := e.api.UpsertService(ctx, svc, 0)
	switch {
	case err == nil:
		return true
	case status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "external"):
		e.fatalf("UpsertService %s with external traffic: want success, or FailedPrecondition from a dataplane without external support, got %v", svc.GetName(), err)
	}
	if _, gerr := e.api.GetService(ctx, svc.GetName()); status.Code(gerr) != codes.NotFound {
		e.fatalf("UpsertService %s was refused (%v), but GetService answers %v, want NotFound", svc.GetName(), err, gerr)
	}
	for _, f := range families {
		for _, p := range svc.GetPorts() {
			if p.GetNodePort() != 0 && p.GetProtocol() == vipdv1.Protocol_PROTOCOL_TCP {
				e.expectRefused(e.out, "tcp", ap(e.node1.addr(f), uint16(p.GetNodePort())))
			}
		}
	}
	e.externalRefused = err.Error()
	e.logf("the dataplane refuses external services, as one without external support must: %v", err)
	return false
}

// node1Addrs returns node1's addresses of family f, primary first: what a
// backend may see as the client of masqueraded traffic.
func (e *env) node1Addrs(f family) []netip.Addr {
	n1 := e.lab.Node(1)
	if f == ipv6 {
		return []netip.Addr{n1.IPv6(), n1.SecondaryIPv6()}
	}
	return []netip.Addr{n1.IPv4(), n1.SecondaryIPv4()}
}

// masqueraded is the peer a backend sees for external traffic under
// CLUSTER: one of node1's addresses. (Which one is the dataplane's choice:
// iptables' MASQUERADE takes the outgoing interface's address, or the first
// of the node's for a pod's veth, which has none.)
func (e *env) masqueraded(f family) []netip.Addr { return e.node1Addrs(f) }

// as is the peer a backend sees for traffic whose client address is kept.
func as(h host, f family) []netip.Addr { return []netip.Addr{h.addr(f)} }

// expectSeenAs makes n requests from h to dst: every one must be answered,
// from dst, by a backend that saw the client as one of peers; the answering
// set must be exactly want. It returns how often each answered. Callers
// pick n as for expectBackends: two equal backends both answer 20 requests
// but with a chance of 2 in a million; 10 missed one in 512 runs.
func (e *env) expectSeenAs(h host, proto string, dst netip.AddrPort, peers []netip.Addr, n int, want ...string) map[string]int {
	e.t.Helper()
	counts := map[string]int{}
	for i := range n {
		r, err := request(h, proto, dst, replyDeadline)
		if err != nil {
			e.fatalf("%s %v from %s: request %d of %d: want a reply, got %v (so far %s)", upper(proto), dst, h.name, i+1, n, err, fmtCounts(counts))
		}
		if r.Remote != dst {
			e.fatalf("%s %v from %s: reply from %s came from %v, want it from %v", upper(proto), dst, h.name, r.Backend, r.Remote, dst)
		}
		if !slices.Contains(peers, r.Peer.Addr()) {
			e.fatalf("%s %v from %s (%v): backend %s saw the client as %v, want %s", upper(proto), dst, h.name, h.addr(familyOf(dst.Addr())), r.Backend, r.Peer.Addr(), fmtAddrs(peers))
		}
		counts[r.Backend]++
	}
	var extra, missing []string
	for b := range counts {
		if !slices.Contains(want, b) {
			extra = append(extra, b)
		}
	}
	for _, b := range want {
		if counts[b] == 0 {
			missing = append(missing, b)
		}
	}
	if len(extra) > 0 || len(missing) > 0 {
		e.fatalf("%s %v from %s: want exactly %v to answer %d requests, got %s (unexpected %v, never hit %v)",
			upper(proto), dst, h.name, want, n, fmtCounts(counts), extra, missing)
	}
	return counts
}

// probe is one request that must be dropped: from h to dst over proto.
type probe struct {
	h     host
	proto string
	dst   netip.AddrPort
}

// expectDropped requires every probe to be dropped: no reply and no
// refusal or ICMP error within deadWait, only silence. The probes run in
// parallel, since each one waits out deadWait.
func (e *env) expectDropped(probes ...probe) { e.t.Helper(); e.expectUnanswered(true, probes...) }

// expectNoBackend requires every probe to reach no backend: refused,
// unreachable or unanswered are all fine (expectDead, in parallel).
func (e *env) expectNoBackend(probes ...probe) { e.t.Helper(); e.expectUnanswered(false, probes...) }

func (e *env) expectUnanswered(silence bool, probes ...probe) {
	e.t.Helper()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		problems []string
	)
	for _, p := range probes {
		wg.Go(func() {
			start := time.Now()
			r, err := request(p.h, p.proto, p.dst, deadWait)
			took := time.Since(start).Round(time.Millisecond)
			var problem string
			switch {
			case err == nil:
				problem = fmt.Sprintf("got a reply from %s (seeing the client as %v)", r.Backend, r.Peer)
			case silence && !netlab.IsTimeout(err):
				problem = fmt.Sprintf("got %v after %v: rejected, not dropped", err, took)
			}
			if problem != "" {
				mu.Lock()
				want := "dropped (no answer within " + deadWait.String() + ")"
				if !silence {
					want = "no backend to answer (refused or timeout)"
				}
				problems = append(problems, fmt.Sprintf("%s %v from %s: want %s, %s", upper(p.proto), p.dst, p.h.name, want, problem))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(problems) > 0 {
		slices.Sort(problems)
		e.fatalf("%s", strings.Join(problems, "; "))
	}
}

// healthReply is kube-proxy's health check node port answer.
type healthReply struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

// getHealth makes one HTTP GET from h to dst.
func getHealth(h host, dst netip.AddrPort) (int, healthReply, error) {
	var hr healthReply
	ctx, cancel := context.WithTimeout(context.Background(), replyDeadline)
	defer cancel()
	code, err := h.NS.GetJSON(ctx, "http://"+dst.String()+"/", &hr)
	return code, hr, err
}

// expectHealth waits up to healthWait for the health check node port at dst
// to answer h with code, in kube-proxy's JSON naming the service, with
// localEndpoints counting localPods dual-stack pods. kube-proxy counts
// endpoints per family, vipd may count each pod's addresses: either count
// passes.
func (e *env) expectHealth(h host, dst netip.AddrPort, code, localPods int) {
	e.t.Helper()
	deadline := time.Now().Add(healthWait)
	for {
		got, hr, err := getHealth(h, dst)
		ok := err == nil && got == code && (hr.LocalEndpoints == localPods || hr.LocalEndpoints == 2*localPods) &&
			hr.ServiceProxyHealthy && hr.Service.Namespace+"/"+hr.Service.Name == svcName
		if ok {
			return
		}
		if time.Now().After(deadline) {
			e.fatalf("health check node port %v from %s: want HTTP %d with localEndpoints %d (or %d: per address), serviceProxyHealthy and service %s within %v; got HTTP %d %+v, error %v",
				dst, h.name, code, localPods, 2*localPods, svcName, healthWait, got, hr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ---- scenarios ----

// should be able to create a functioning NodePort service: from outside,
// a node port reaches local and remote backends with the client
// masqueraded to the node (CLUSTER), on every node address by default; from
// a pod it gets cluster semantics; with no backend it is rejected.
func nodePortCluster(e *env) {
	svc := e.externalService(ports(withNodePort(tcpPort(80, 8080), nodePort)), e.be1, e.be4)
	if !e.upsertExternal(svc) {
		return
	}
	n1 := e.lab.Node(1)
	for _, f := range families {
		np := ap(e.node1.addr(f), nodePort)
		e.expectSeenAs(e.out, "tcp", np, e.masqueraded(f), 40, echoes(8080, e.be1, e.be4)...)
		e.expectSeenAs(e.out2, "tcp", np, e.masqueraded(f), 20, echoes(8080, e.be1, e.be4)...)
		// By default every node address but loopback is a node-port address.
		secondary := n1.SecondaryIPv4()
		if f == ipv6 {
			secondary = n1.SecondaryIPv6()
		}
		e.expectSeenAs(e.out, "tcp", ap(secondary, nodePort), e.masqueraded(f), 20, echoes(8080, e.be1, e.be4)...)
		// The service's VIP port is not a node port, nor is any other port.
		e.expectRefused(e.out, "tcp", ap(e.node1.addr(f), 80))
		e.expectRefused(e.out, "tcp", ap(e.node1.addr(f), nodePort+1))
		// From a pod of the node: cluster semantics, the client's address
		// kept; and from the node itself.
		e.expectSeenAs(e.client, "tcp", np, as(e.client, f), 40, echoes(8080, e.be1, e.be4)...)
		e.expectBackends(e.node1, "tcp", np, 40, echoes(8080, e.be1, e.be4)...)
	}

	// A remote backend alone: the reply comes back through node1.
	e.updateBackends(svcName, nil, e.be1.v4, e.be1.v6)
	for _, f := range families {
		e.expectSeenAs(e.out, "tcp", ap(e.node1.addr(f), nodePort), e.masqueraded(f), 10, e.be4.echo(8080))
	}
	// No backend: rejected, as through the VIP.
	svc.Backends = nil
	e.upsert(svc)
	for _, f := range families {
		e.expectRefused(e.out, "tcp", ap(e.node1.addr(f), nodePort))
	}
}

// should serve UDP on a node port, replies from the node port's address.
func nodePortUDP(e *env) {
	svc := e.externalService(ports(withNodePort(udpPort(53, 8081), nodePort)), e.be1, e.be4)
	if !e.upsertExternal(svc) {
		return
	}
	for _, f := range families {
		np := ap(e.node1.addr(f), nodePort)
		e.expectSeenAs(e.out, "udp", np, e.masqueraded(f), 40, echoes(8081, e.be1, e.be4)...)
		e.expectSeenAs(e.client, "udp", np, as(e.client, f), 40, echoes(8081, e.be1, e.be4)...)
		e.expectBackends(e.node1, "udp", np, 40, echoes(8081, e.be1, e.be4)...)
		// A long flow from one socket stays on one backend, both ways.
		c := e.dial(e.out, "udp", np)
		first := e.on(c, "")
		for range 20 {
			if got := e.on(c, ""); got != first {
				e.fatalf("UDP %v from one socket of out: answered by %s, then %s; want one backend per flow", np, first, got)
			}
		}
		c.Close()
		// TCP on the same node port is not the service's.
		e.expectRefused(e.out, "tcp", np)
	}
}

// should be able to create a service with external IPs: served on the
// service's ports from outside (CLUSTER: masqueraded) and from pods
// (the client's address kept), and nothing else of the address forwards.
func externalIPs(e *env) {
	svc := e.externalService(ports(tcpPort(80, 8080), udpPort(80, 8080)), e.be1, e.be4)
	for _, f := range families {
		svc.ExternalIps = append(svc.ExternalIps, f.externalIP(10).String())
	}
	if !e.upsertExternal(svc) {
		return
	}
	var dead []probe
	for _, f := range families {
		ext := ap(f.externalIP(10), 80)
		for _, proto := range []string{"tcp", "udp"} {
			e.expectSeenAs(e.out, proto, ext, e.masqueraded(f), 40, echoes(8080, e.be1, e.be4)...)
			e.expectSeenAs(e.client, proto, ext, as(e.client, f), 40, echoes(8080, e.be1, e.be4)...)
		}
		dead = append(dead, probe{e.out, "tcp", ap(f.externalIP(10), 8080)}, probe{e.out, "tcp", ap(f.externalIP(11), 80)})
	}
	e.expectNoBackend(dead...)
	// Dropped from the service, the address stops forwarding.
	svc.ExternalIps = nil
	e.upsert(svc)
	e.expectNoBackend(probe{e.out, "tcp", ap(ipv4.externalIP(10), 80)}, probe{e.out, "tcp", ap(ipv6.externalIP(10), 80)})
}

// should be able to create a functioning LoadBalancer service: its
// load-balancer IPs serve every outside client, masqueraded (CLUSTER).
func loadBalancerIP(e *env) {
	svc := e.externalService(ports(withNodePort(tcpPort(80, 8080), nodePort), udpPort(80, 8080)), e.be1, e.be4)
	for _, f := range families {
		svc.LoadBalancerIps = append(svc.LoadBalancerIps, f.lbIP(10).String())
	}
	if !e.upsertExternal(svc) {
		return
	}
	for _, f := range families {
		lb := ap(f.lbIP(10), 80)
		for _, from := range []host{e.out, e.out2} {
			e.expectSeenAs(from, "tcp", lb, e.masqueraded(f), 30, echoes(8080, e.be1, e.be4)...)
			e.expectSeenAs(from, "udp", lb, e.masqueraded(f), 30, echoes(8080, e.be1, e.be4)...)
		}
		e.expectSeenAs(e.out, "tcp", ap(e.node1.addr(f), nodePort), e.masqueraded(f), 20, echoes(8080, e.be1, e.be4)...)
	}
}

// should only allow access from service loadbalancer source ranges:
// sources outside them are dropped (not rejected), from outside the node and
// from its pods alike; the ranges apply to the load-balancer IPs only.
func loadBalancerSourceRanges(e *env) {
	svc := e.externalService(ports(withNodePort(tcpPort(80, 8080), nodePort), udpPort(80, 8080)), e.be1, e.be4)
	for _, f := range families {
		svc.LoadBalancerIps = append(svc.LoadBalancerIps, f.lbIP(10).String())
		svc.LoadBalancerSourceRanges = append(svc.LoadBalancerSourceRanges, single(e.out.addr(f)), single(e.client.addr(f)))
	}
	if !e.upsertExternal(svc) {
		return
	}
	var dropped []probe
	for _, f := range families {
		lb := ap(f.lbIP(10), 80)
		for _, proto := range []string{"tcp", "udp"} {
			e.expectSeenAs(e.out, proto, lb, e.masqueraded(f), 20, echoes(8080, e.be1, e.be4)...)
			e.expectSeenAs(e.client, proto, lb, as(e.client, f), 20, echoes(8080, e.be1, e.be4)...)
			dropped = append(dropped, probe{e.out2, proto, lb}, probe{e.client2, proto, lb})
		}
		// Not a load-balancer IP: the ranges do not apply.
		e.expectSeenAs(e.out2, "tcp", ap(e.node1.addr(f), nodePort), e.masqueraded(f), 20, echoes(8080, e.be1, e.be4)...)
		e.expectSeenAs(e.client2, "tcp", ap(f.vip(10), 80), as(e.client2, f), 20, echoes(8080, e.be1, e.be4)...)
	}
	e.expectDropped(dropped...)

	// Without ranges, every source is served again.
	svc.LoadBalancerSourceRanges = nil
	e.upsert(svc)
	for _, f := range families {
		e.expectSeenAs(e.out2, "tcp", ap(f.lbIP(10), 80), e.masqueraded(f), 20, echoes(8080, e.be1, e.be4)...)
		e.expectSeenAs(e.client2, "tcp", ap(f.lbIP(10), 80), as(e.client2, f), 20, echoes(8080, e.be1, e.be4)...)
	}
}

// should apply load-balancer source ranges to the node's own connections
// too: the node's addresses are outside the ranges, so no backend answers
// it; without ranges it is served.
func loadBalancerSourceRangesFromNode(e *env) {
	svc := e.externalService(ports(tcpPort(80, 8080)), e.be1, e.be4)
	for _, f := range families {
		svc.LoadBalancerIps = append(svc.LoadBalancerIps, f.lbIP(10).String())
		svc.LoadBalancerSourceRanges = append(svc.LoadBalancerSourceRanges, single(e.out.addr(f)))
	}
	if !e.upsertExternal(svc) {
		return
	}
	for _, f := range families {
		e.expectSeenAs(e.out, "tcp", ap(f.lbIP(10), 80), e.masqueraded(f), 20, echoes(8080, e.be1, e.be4)...)
	}
	// The node's own packets may meet the drop on their way out, which its
	// socket sees as EPERM: no backend may answer, however the failure shows.
	e.expectNoBackend(probe{e.node1, "tcp", ap(ipv4.lbIP(10), 80)}, probe{e.node1, "tcp", ap(ipv6.lbIP(10), 80)})

	svc.LoadBalancerSourceRanges = nil
	e.upsert(svc)
	for _, f := range families {
		e.expectBackends(e.node1, "tcp", ap(f.lbIP(10), 80), 20, echoes(8080, e.be1, e.be4)...)
	}
}

// should only target nodes with endpoints (externalTrafficPolicy Local):
// from outside, only node-local backends, the client's address preserved,
// and packets dropped when there is none; the health check node port says
// 200 or 503 as local backends come and go.
func externalTrafficPolicyLocal(e *env) {
	svc := e.externalService(ports(withNodePort(tcpPort(80, 8080), nodePort), withNodePort(udpPort(80, 8080), nodePort)), e.be1, e.be4)
	for _, f := range families {
		svc.LoadBalancerIps = append(svc.LoadBalancerIps, f.lbIP(10).String())
	}
	svc.ExternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	svc.HealthCheckNodePort = hcPort
	if !e.upsertExternal(svc) {
		return
	}
	targets := func(f family) []netip.AddrPort {
		return []netip.AddrPort{ap(e.node1.addr(f), nodePort), ap(f.lbIP(10), 80)}
	}
	for _, f := range families {
		for _, dst := range targets(f) {
			for _, proto := range []string{"tcp", "udp"} {
				e.expectSeenAs(e.out, proto, dst, as(e.out, f), 20, e.be1.echo(8080))
			}
		}
		e.expectHealth(e.out, ap(e.node1.addr(f), hcPort), http.StatusOK, 1)
	}

	// Two local backends, and the remote one still never.
	e.updateBackends(svcName, e.backendsOf(e.be2))
	for _, f := range families {
		e.expectSeenAs(e.out, "tcp", ap(f.lbIP(10), 80), as(e.out, f), 40, echoes(8080, e.be1, e.be2)...)
		e.expectHealth(e.out, ap(e.node1.addr(f), hcPort), http.StatusOK, 2)
	}

	// No local backend left: dropped, so that a load balancer steers away;
	// pods still reach the remote one.
	e.updateBackends(svcName, nil, e.be1.v4, e.be1.v6, e.be2.v4, e.be2.v6)
	var dropped []probe
	for _, f := range families {
		e.expectHealth(e.out, ap(e.node1.addr(f), hcPort), http.StatusServiceUnavailable, 0)
		for _, dst := range targets(f) {
			for _, proto := range []string{"tcp", "udp"} {
				dropped = append(dropped, probe{e.out, proto, dst})
			}
			e.expectSeenAs(e.client, "tcp", dst, as(e.client, f), 5, e.be4.echo(8080))
		}
	}
	e.expectDropped(dropped...)

	// A local backend comes back.
	e.updateBackends(svcName, e.backendsOf(e.be3))
	for _, f := range families {
		e.expectHealth(e.out, ap(e.node1.addr(f), hcPort), http.StatusOK, 1)
		for _, dst := range targets(f) {
			e.expectSeenAs(e.out, "tcp", dst, as(e.out, f), 10, e.be3.echo(8080))
		}
	}
}

// should give pods cluster semantics on a load-balancer IP: any backend,
// the pod's address kept, whatever the external traffic policy.
func podToLoadBalancerIP(e *env) {
	svc := e.externalService(ports(tcpPort(80, 8080), udpPort(80, 8080)), e.be1, e.be4)
	for _, f := range families {
		svc.LoadBalancerIps = append(svc.LoadBalancerIps, f.lbIP(10).String())
	}
	if !e.upsertExternal(svc) {
		return
	}
	for _, policy := range []vipdv1.TrafficPolicy{vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER, vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL} {
		svc.ExternalTrafficPolicy = policy
		e.upsert(svc)
		for _, f := range families {
			lb := ap(f.lbIP(10), 80)
			for _, proto := range []string{"tcp", "udp"} {
				e.expectSeenAs(e.client, proto, lb, as(e.client, f), 40, echoes(8080, e.be1, e.be4)...)
			}
			// From the node itself, too.
			e.expectBackends(e.node1, "tcp", lb, 40, echoes(8080, e.be1, e.be4)...)
		}
	}
}

// should serve node ports only on --nodeport-addresses: node1's secondary
// addresses lie outside them and are not served, while its primary ones are.
func nodePortAddresses(e *env) {
	svc := e.externalService(ports(withNodePort(tcpPort(80, 8080), nodePort), withNodePort(udpPort(80, 8080), nodePort)), e.be1, e.be4)
	if !e.upsertExternal(svc) {
		return
	}
	n1 := e.lab.Node(1)
	for _, f := range families {
		e.expectSeenAs(e.out, "tcp", ap(e.node1.addr(f), nodePort), e.masqueraded(f), 20, echoes(8080, e.be1, e.be4)...)
		e.expectSeenAs(e.out, "udp", ap(e.node1.addr(f), nodePort), e.masqueraded(f), 20, echoes(8080, e.be1, e.be4)...)
		secondary := n1.SecondaryIPv4()
		if f == ipv6 {
			secondary = n1.SecondaryIPv6()
		}
		// Refused by node1's own stack, which nothing listens on: proof
		// that the packet got there and nothing translated it.
		e.expectRefused(e.out, "tcp", ap(secondary, nodePort))
		e.expectRefused(e.out, "udp", ap(secondary, nodePort))
		e.expectRefused(e.client, "tcp", ap(secondary, nodePort))
	}
}

// nodePortAddressesArgs keep node1's primary uplink addresses
// (198.18.0.3, fd00:198:0:1::2) and leave out its secondary ones
// (198.18.251.1, fd00:198:fb::1); eth0 is named as the external interface
// rather than found by its default route.
var nodePortAddressesArgs = []string{"--nodeport-addresses", "198.18.0.0/24,fd00:198:0:1::/64", "--external-interfaces", "eth0"}

// should keep external flows alive while vipd is down, masqueraded ones
// included, TCP connections and UDP flows, each on its backend after the
// restart too, and serve new external connections during and after a
// restart.
func vipdDownExternalFlowsUp(e *env) {
	svc := e.externalService(ports(withNodePort(tcpPort(80, 8080), nodePort), withNodePort(udpPort(80, 8081), nodePort)), e.be1, e.be4)
	if !e.upsertExternal(svc) {
		return
	}
	type pinned struct {
		c       *netlab.Conn
		proto   string
		backend string
	}
	var conns []pinned
	for _, f := range families {
		for _, proto := range []string{"tcp", "udp"} {
			np := ap(e.node1.addr(f), nodePort)
			// One flow to each backend: the remote one's replies need
			// node1's masquerade state.
			seen := map[string]bool{}
			for i := 0; len(seen) < 2; i++ {
				if i == 60 {
					e.fatalf("%s %v from out: 60 flows reached only %v, want be1 and be4", upper(proto), np, seen)
				}
				c := e.dial(e.out, proto, np)
				b := e.on(c, "")
				if seen[b] {
					c.Close()
					continue
				}
				seen[b] = true
				conns = append(conns, pinned{c, proto, b})
			}
		}
	}
	// check sends on every flow (of TCP alone, once be1 left: UDP flows
	// move when their backend leaves).
	check := func(when string, protos ...string) {
		e.t.Helper()
		for _, p := range conns {
			if !slices.Contains(protos, p.proto) {
				continue
			}
			if got := e.on(p.c, when); got != p.backend {
				e.fatalf("established %s flow %v -> %v answered by %s %s, want %s", upper(p.proto), p.c.LocalAddr(), p.c.RemoteAddr(), got, when, p.backend)
			}
		}
	}

	e.vipd.kill9()
	check("with vipd killed", "tcp", "udp")
	for _, f := range families {
		e.expectSeenAs(e.out, "tcp", ap(e.node1.addr(f), nodePort), e.masqueraded(f), 30, echoes(8080, e.be1, e.be4)...)
	}
	e.startVipd()
	check("after the vipd restart", "tcp", "udp")
	for _, f := range families {
		e.expectSeenAs(e.out2, "tcp", ap(e.node1.addr(f), nodePort), e.masqueraded(f), 30, echoes(8080, e.be1, e.be4)...)
	}
	// Converged: vipd manages the service again.
	e.updateBackends(svcName, nil, e.be1.v4, e.be1.v6)
	check("after its service changed", "tcp")
	for _, f := range families {
		e.expectSeenAs(e.out, "tcp", ap(e.node1.addr(f), nodePort), e.masqueraded(f), 10, e.be4.echo(8080))
	}
}
