package iptables_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/iptables"
	"github.com/vipd/vipd/internal/testkit/netlab"
)

// externalLab is a lab for external traffic: node 1 runs the pods web1 and
// pod, node 2 the pod web2; the upstream router is the outside client. It
// reaches node 1's uplink addresses, and the test routes 198.19.0.0/16 and
// fd00:198:ff::/48 (external and LB IPs) from upstream to node 1, and gives
// node 1 a second address, 198.18.250.1 and fd00:198:250::1, that is not a
// node-port address.
type externalLab struct {
	node                 *netlab.Node
	upstream             *netlab.NS
	web1, web2, pod      *netlab.Pod
	other4, other6       netip.Addr
	upstream4, upstream6 netip.Addr
	uplinkV4, uplinkV6   netip.Addr
}

func newExternalLab(t *testing.T) *externalLab {
	t.Helper()
	lab := netlab.New(t, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: []string{"web1", "pod"}}, {Pods: []string{"web2"}}}})
	x := &externalLab{
		node: lab.Node(1), upstream: lab.Upstream(),
		web1: lab.Pod("web1"), web2: lab.Pod("web2"), pod: lab.Pod("pod"),
		other4: netip.MustParseAddr("198.18.250.1"), other6: netip.MustParseAddr("fd00:198:250::1"),
		// netlab's address plan: the upstream end of node 1's fabric link.
		upstream4: netip.MustParseAddr("198.18.0.2"), upstream6: netip.MustParseAddr("fd00:198:0:1::1"),
	}
	x.uplinkV4, x.uplinkV6 = x.node.IPv4(), x.node.IPv6()
	ctx := context.Background()
	for _, cmd := range [][]string{
		{"ip", "route", "add", "198.19.0.0/16", "via", x.uplinkV4.String()},
		{"ip", "-6", "route", "add", "fd00:198:ff::/48", "via", x.uplinkV6.String()},
		{"ip", "route", "add", x.other4.String() + "/32", "via", x.uplinkV4.String()},
		{"ip", "-6", "route", "add", x.other6.String() + "/128", "via", x.uplinkV6.String()},
	} {
		if out, err := x.upstream.Exec(ctx, cmd[0], cmd[1:]...); err != nil {
			t.Fatalf("%v: %v\n%s", cmd, err, out)
		}
	}
	for _, a := range []string{x.other4.String() + "/32", x.other6.String() + "/128"} {
		// nodad: usable at once, without duplicate address detection.
		if out, err := x.node.Exec(ctx, "ip", "addr", "add", a, "dev", "lo", "nodad"); err != nil {
			t.Fatalf("add %s to the node: %v\n%s", a, err, out)
		}
	}
	for _, p := range []*netlab.Pod{x.web1, x.web2} {
		if _, err := p.StartEcho("", 7000); err != nil {
			t.Fatal(err)
		}
	}
	return x
}

// nodeState is the Node vipd would see with --nodeport-addresses set to
// the uplink's addresses: eth0 external.
func (x *externalLab) nodeState() dataplane.Node {
	return dataplane.Node{
		NodePortAddresses: []netip.Addr{x.uplinkV4, x.uplinkV6},
		Interfaces: []dataplane.Interface{{
			Name: x.node.Uplink(), Index: 1000, Addrs: []netip.Addr{x.uplinkV4, x.uplinkV6}, External: true,
		}},
	}
}

// extService is a dual-stack service with TCP and UDP port 80 (node ports
// nodePort over TCP and UDP when not 0) and the given backends, all on
// target port 7000; local ones are node-local.
func extService(name string, vip4, vip6 string, nodePort uint16, policy dataplane.TrafficPolicy, local []*netlab.Pod, remote ...*netlab.Pod) *dataplane.Service {
	svc := &dataplane.Service{
		Name: name, Owner: "default", Generation: 1,
		VIPs: []netip.Addr{netip.MustParseAddr(vip4), netip.MustParseAddr(vip6)},
		Ports: []dataplane.Port{
			{Name: "tcp", Protocol: dataplane.TCP, Port: 80, TargetPort: 7000, NodePort: nodePort},
			{Name: "udp", Protocol: dataplane.UDP, Port: 80, TargetPort: 7000, NodePort: nodePort},
		},
		TrafficPolicy: dataplane.TrafficPolicyCluster, ExternalTrafficPolicy: policy,
		LoadBalancing: dataplane.LoadBalancingRandom,
	}
	add := func(p *netlab.Pod, isLocal bool) {
		for _, a := range []netip.Addr{p.IPv4(), p.IPv6()} {
			svc.Backends = append(svc.Backends, dataplane.Backend{IP: a, State: dataplane.BackendReady, Weight: 1, NodeLocal: isLocal})
		}
	}
	for _, p := range local {
		add(p, true)
	}
	for _, p := range remote {
		add(p, false)
	}
	slices.SortFunc(svc.Backends, func(a, b dataplane.Backend) int { return a.IP.Compare(b.IP) })
	return svc
}

func hostPort(a netip.Addr, port uint16) string { return netip.AddrPortFrom(a, port).String() }

// TestExternalTraffic programs node ports, external IPs and LB IPs into a
// lab node and sends real TCP and UDP from outside (the upstream router),
// from a pod and from the node itself, over IPv4 and IPv6, in both modes.
func TestExternalTraffic(t *testing.T) {
	for _, mode := range []iptables.Mode{iptables.ModeNFT, iptables.ModeLegacy} {
		t.Run(string(mode), func(t *testing.T) { testExternalTraffic(t, mode) })
	}
}

func testExternalTraffic(t *testing.T, mode iptables.Mode) {
	x := newExternalLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dp, err := iptables.New(ctx, hclog.NewNullLogger(), iptables.Config{NetNS: x.node.Path(), Mode: mode})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()

	local := []*netlab.Pod{x.web1}
	cluster := extService("cluster", "198.19.0.10", "fd00:198:ff::10", 30080, dataplane.TrafficPolicyCluster, local)
	cluster.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.19.1.10"), netip.MustParseAddr("fd00:198:ff:1::10")}
	remote := extService("remote", "198.19.0.11", "fd00:198:ff::11", 30081, dataplane.TrafficPolicyCluster, nil, x.web2)
	localSvc := extService("local", "198.19.0.12", "fd00:198:ff::12", 30082, dataplane.TrafficPolicyLocal, local, x.web2)
	noLocal := extService("nolocal", "198.19.0.13", "fd00:198:ff::13", 30083, dataplane.TrafficPolicyLocal, nil, x.web2)
	lb := extService("lb", "198.19.0.14", "fd00:198:ff::14", 0, dataplane.TrafficPolicyCluster, local)
	lb.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.19.2.10"), netip.MustParseAddr("fd00:198:ff:2::10")}
	lbOpen := extService("lb-open", "198.19.0.15", "fd00:198:ff::15", 0, dataplane.TrafficPolicyLocal, local)
	lbOpen.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.19.2.11"), netip.MustParseAddr("fd00:198:ff:2::11")}
	lbOpen.LoadBalancerSourceRanges = []netip.Prefix{netip.PrefixFrom(x.upstream4, 32), netip.PrefixFrom(x.upstream6, 128)}
	lbOpen.Affinity = dataplane.SessionAffinity{ClientIP: true, Timeout: time.Hour}
	lbClosed := extService("lb-closed", "198.19.0.16", "fd00:198:ff::16", 0, dataplane.TrafficPolicyCluster, local)
	lbClosed.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.19.2.12"), netip.MustParseAddr("fd00:198:ff:2::12")}
	lbClosed.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("198.18.200.0/24"), netip.MustParsePrefix("fd00:198:200::/48")}
	s := liveState(nil, cluster, remote, localSvc, noLocal, lb, lbOpen, lbClosed)
	s.Node = x.nodeState()
	if err := dp.Apply(ctx, s); err != nil {
		t.Fatal(err)
	}

	type want int
	const (
		masqueraded want = iota // reaches a backend, which sees a node address
		preserved               // reaches a backend, which sees the client
		dropped                 // no answer
		refused                 // TCP reset / ICMP unreachable
	)
	for _, tc := range []struct {
		name     string
		from     *netlab.NS
		to4, to6 netip.Addr
		port     uint16
		want     want
		backends []string
	}{
		{"node port, CLUSTER: local backend, masqueraded", x.upstream, x.uplinkV4, x.uplinkV6, 30080, masqueraded, []string{"web1"}},
		{"node port, CLUSTER: remote backend, masqueraded", x.upstream, x.uplinkV4, x.uplinkV6, 30081, masqueraded, []string{"web2"}},
		{"node port, LOCAL: local backend only, client kept", x.upstream, x.uplinkV4, x.uplinkV6, 30082, preserved, []string{"web1"}},
		{"node port, LOCAL without a local backend: dropped", x.upstream, x.uplinkV4, x.uplinkV6, 30083, dropped, nil},
		{"node port, LOCAL without a local backend, from a pod: cluster semantics", x.pod.NS, x.uplinkV4, x.uplinkV6, 30083, preserved, []string{"web2"}},
		{"node port from a pod: cluster semantics, not masqueraded", x.pod.NS, x.uplinkV4, x.uplinkV6, 30080, preserved, []string{"web1"}},
		{"node port on an address that is not a node-port address: not served", x.upstream, x.other4, x.other6, 30080, refused, nil},
		{"external IP, CLUSTER", x.upstream, netip.MustParseAddr("198.19.1.10"), netip.MustParseAddr("fd00:198:ff:1::10"), 80, masqueraded, []string{"web1"}},
		{"LB IP without source ranges", x.upstream, netip.MustParseAddr("198.19.2.10"), netip.MustParseAddr("fd00:198:ff:2::10"), 80, masqueraded, []string{"web1"}},
		{"LB IP from a pod: cluster semantics", x.pod.NS, netip.MustParseAddr("198.19.2.10"), netip.MustParseAddr("fd00:198:ff:2::10"), 80, preserved, []string{"web1"}},
		{"LB IP, LOCAL, source in the ranges", x.upstream, netip.MustParseAddr("198.19.2.11"), netip.MustParseAddr("fd00:198:ff:2::11"), 80, preserved, []string{"web1"}},
		{"LB IP, source outside the ranges: dropped", x.upstream, netip.MustParseAddr("198.19.2.12"), netip.MustParseAddr("fd00:198:ff:2::12"), 80, dropped, nil},
		{"LB IP from a pod outside the ranges: dropped", x.pod.NS, netip.MustParseAddr("198.19.2.12"), netip.MustParseAddr("fd00:198:ff:2::12"), 80, dropped, nil},
	} {
		for _, proto := range []string{"tcp", "udp"} {
			for _, to := range []netip.Addr{tc.to4, tc.to6} {
				name := fmt.Sprintf("%s/%s/%s", tc.name, proto, map[bool]string{true: "ipv4", false: "ipv6"}[to.Is4()])
				t.Run(name, func(t *testing.T) {
					// A drop shows as a timeout; an answer comes within
					// milliseconds, so only the expected drops wait short.
					wait := 10 * time.Second
					if tc.want == dropped {
						wait = time.Second
					}
					rctx, rcancel := context.WithTimeout(ctx, wait)
					defer rcancel()
					reply, err := tc.from.Request(rctx, proto, hostPort(to, tc.port))
					switch tc.want {
					case dropped:
						if !netlab.IsTimeout(err) {
							t.Fatalf("got %+v, %v; want a timeout (dropped)", reply, err)
						}
						return
					case refused:
						if !errors.Is(err, syscall.ECONNREFUSED) {
							t.Fatalf("got %+v, %v; want ECONNREFUSED", reply, err)
						}
						return
					}
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Contains(tc.backends, reply.Backend) {
						t.Errorf("answered by %s; want one of %v", reply.Backend, tc.backends)
					}
					client := x.upstream4
					if tc.from != x.upstream {
						client = x.pod.IPv4()
					}
					if to.Is6() {
						client = x.upstream6
						if tc.from != x.upstream {
							client = x.pod.IPv6()
						}
					}
					switch tc.want {
					case preserved:
						if reply.Peer.Addr() != client {
							t.Errorf("the backend saw %s; want the client's %s", reply.Peer, client)
						}
					case masqueraded:
						// MASQUERADE picks an address of the node for the
						// interface out: for a pod's veth, which has none in
						// IPv4, any of the node's.
						if node := []netip.Addr{x.uplinkV4, x.uplinkV6, x.other4, x.other6}; !slices.Contains(node, reply.Peer.Addr()) {
							t.Errorf("the backend saw %s; want one of the node's %v", reply.Peer, node)
						}
					}
					if reply.Remote.Addr() != to {
						t.Errorf("the reply came from %s; want %s", reply.Remote, to)
					}
				})
			}
		}
	}
	// The node itself gets cluster semantics on a node port: the LOCAL
	// service without a local backend answers from its remote one.
	t.Run("node port, LOCAL without a local backend, from the node", func(t *testing.T) {
		for _, to := range []netip.Addr{x.uplinkV4, x.uplinkV6} {
			for _, proto := range []string{"tcp", "udp"} {
				reply, err := x.node.Request(ctx, proto, hostPort(to, 30083))
				if err != nil || reply.Backend != "web2" || reply.Peer.Addr() != to {
					t.Errorf("%s to %s: got %+v, %v; want web2 seeing %s", proto, to, reply, err, to)
				}
			}
		}
	})

	// Explain: the affinity entry that the external connection to the LB
	// IP left (the drops are the server's to explain, from the state).
	for _, tc := range []struct {
		name   string
		client netip.Addr
		to     netip.AddrPort
		pick   netip.AddrPort
	}{
		{"affinity through an LB IP", x.upstream4, netip.MustParseAddrPort("198.19.2.11:80"), netip.AddrPortFrom(x.web1.IPv4(), 7000)},
		{"affinity through an IPv6 LB IP", x.upstream6, netip.MustParseAddrPort("[fd00:198:ff:2::11]:80"), netip.AddrPortFrom(x.web1.IPv6(), 7000)},
	} {
		ex, err := dp.ExplainFlow(ctx, dataplane.ExplainQuery{Protocol: dataplane.TCP, Client: netip.AddrPortFrom(tc.client, 0), VIP: tc.to})
		if err != nil || ex.Pick != tc.pick {
			t.Errorf("Explain %s: %+v %v; want pick %v", tc.name, ex, err, tc.pick)
		}
	}

	// Flow events of external flows carry the address and node port the
	// client used and the real client, though the backend saw the node.
	t.Run("flow events", func(t *testing.T) {
		wctx, wcancel := context.WithCancel(ctx)
		events := make(chan dataplane.FlowEvent, 64)
		done := make(chan error, 1)
		go func() {
			done <- dp.WatchFlows(wctx, func(ev dataplane.FlowEvent) {
				select {
				case events <- ev:
				default:
				}
			}, func(uint64) {})
		}()
		defer func() {
			wcancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("WatchFlows: %v", err)
			}
		}()
		want := netip.AddrPortFrom(x.uplinkV4, 30080)
		// The watch subscribes asynchronously: connect until it reports.
		deadline := time.After(5 * time.Second)
		for {
			if _, err := x.upstream.Request(ctx, "tcp", want.String()); err != nil {
				t.Fatal(err)
			}
			select {
			case ev := <-events:
				// Earlier flows may close meanwhile.
				if ev.Type != dataplane.FlowNew || ev.Flow.VIP != want {
					continue
				}
				if ev.Flow.Client.Addr() != x.upstream4 || ev.Flow.Backend != netip.AddrPortFrom(x.web1.IPv4(), 7000) {
					t.Fatalf("event %+v; want NEW %s -> %s -> web1", ev, x.upstream4, want)
				}
				return
			case <-deadline:
				t.Fatal("no flow event for a connection through a node port")
			case <-time.After(200 * time.Millisecond):
			}
		}
	})

	// A flow through a node port is vipd's: the flow source reports it with
	// the address and node port the client used, and the real client.
	conn, err := x.upstream.Dial(ctx, "tcp", hostPort(x.uplinkV4, 30082))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Request(ctx); err != nil {
		t.Fatal(err)
	}
	flows, err := dp.ListFlows(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, f := range flows {
		if f.VIP == netip.AddrPortFrom(x.uplinkV4, 30082) && f.Client.Addr() == x.upstream4 && f.Backend == netip.AddrPortFrom(x.web1.IPv4(), 7000) {
			found = true
		}
	}
	if !found {
		t.Errorf("no flow %s -> %s:30082 -> web1 in %+v", x.upstream4, x.uplinkV4, flows)
	}

	// vipd killed and restarted: the established external flow lives on
	// meanwhile and after the restart's full sync.
	if err := dp.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Request(ctx); err != nil {
		t.Fatalf("the flow broke while vipd was down: %v", err)
	}
	again, err := iptables.New(ctx, hclog.NewNullLogger(), iptables.Config{NetNS: x.node.Path(), Mode: mode})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if err := again.Apply(ctx, s); err != nil {
		t.Fatal(err)
	}
	if st := again.LastSync(); st.ChainsRewritten != 0 {
		t.Errorf("the restart rewrote %d chains; want none", st.ChainsRewritten)
	}
	if _, err := conn.Request(ctx); err != nil {
		t.Fatalf("the flow broke after the restart: %v", err)
	}
}
