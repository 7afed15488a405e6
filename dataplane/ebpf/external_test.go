package ebpf

// External traffic on real packets: the lab's upstream router is the
// client from outside the node; it reaches the node's uplink (eth0, the
// external interface) at node ports, external IPs and load-balancer IPs.

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/internal/nsdo"
	"github.com/vipd/vipd/internal/testkit/cgroup2test"
	"github.com/vipd/vipd/internal/testkit/netlab"
)

const extNodePort = 30080

var (
	extIP = netip.MustParseAddr("198.19.0.20") // an external IP
	extLB = netip.MustParseAddr("198.19.0.21") // a load-balancer IP
	// IPv6 ones, in a pod range of a node number netlab never uses.
	extIP6 = netip.MustParseAddr("fd00:198:ff00::20")
	extLB6 = netip.MustParseAddr("fd00:198:ff00::21")
)

// extEnv is a dpEnv whose node's uplink is its external interface, and
// whose upstream router routes extIP and extLB to the node.
type extEnv struct {
	*dpEnv
	nodeNet dataplane.Node
}

func newExtEnv(t *testing.T, pods []string) *extEnv {
	t.Helper()
	return newExtEnvWith(t, newDPEnv(t, pods, dpSmallMaps))
}

// newExtEnvRemote is newExtEnv with a second node whose pods remote (those
// named be* with an echo server) are backends on another node.
func newExtEnvRemote(t *testing.T, pods, remote []string) *extEnv {
	t.Helper()
	netlab.RequireRoot(t)
	lab := netlab.New(t, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: pods}, {Pods: remote}}})
	for k, names := range [][]string{pods, remote} {
		for _, p := range names {
			if strings.HasPrefix(p, "be") {
				if _, err := lab.Node(k+1).Pod(p).StartEcho(p, dpTargetPort); err != nil {
					t.Fatalf("start echo: %v", err)
				}
			}
		}
	}
	cg := cgroup2test.New(t)
	bpffs := filepath.Join(t.TempDir(), "bpf")
	node := lab.Node(1)
	e := &dpEnv{
		t: t, lab: lab, node: node, cgroup: cg, bpffs: bpffs,
		cfg: Config{
			NetNS: node.Path(), BPFFS: bpffs, CgroupPath: cg,
			PodInterfaces: []string{"veth*"}, Maps: dpSmallMaps, GCInterval: time.Hour,
		},
	}
	t.Cleanup(e.cleanup)
	return newExtEnvWith(t, e)
}

func newExtEnvWith(t *testing.T, dp *dpEnv) *extEnv {
	t.Helper()
	e := &extEnv{dpEnv: dp}
	var idx int
	err := e.node.Do(func() error {
		l, err := netlink.LinkByName(e.node.Uplink())
		if err == nil {
			idx = l.Attrs().Index
		}
		return err
	})
	if err != nil {
		t.Fatalf("uplink: %v", err)
	}
	addrs := []netip.Addr{e.node.IPv4(), e.node.IPv6()}
	slices.SortFunc(addrs, netip.Addr.Compare)
	e.nodeNet = dataplane.Node{
		NodePortAddresses: addrs,
		Interfaces:        []dataplane.Interface{{Name: e.node.Uplink(), Index: idx, Addrs: addrs, External: true}},
	}
	err = nsdo.Do(e.lab.Upstream().Path(), func() error {
		for _, a := range []netip.Addr{extIP, extLB, extIP6, extLB6} {
			gw := e.node.IPv4()
			if a.Is6() {
				gw = e.node.IPv6()
			}
			r := &netlink.Route{
				Dst: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())},
				Gw:  gw.AsSlice(),
			}
			if err := netlink.RouteAdd(r); err != nil {
				return fmt.Errorf("route %s: %w", a, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("route external addresses on the upstream router: %v", err)
	}
	return e
}

// state is a State of svcs on the env's node.
func (e *extEnv) state(gen uint64, svcs ...*dataplane.Service) *dataplane.State {
	s := dpState(gen, nil, svcs...)
	s.Node = e.nodeNet
	return s
}

// extService is a TCP or UDP service on dpVIPA:80 with node port
// extNodePort, the given external traffic policy, and the backends pods
// (node-local when local).
func (e *extEnv) extService(proto dataplane.Protocol, policy dataplane.TrafficPolicy, local bool, pods ...string) *dataplane.Service {
	var bes []dpBE
	for _, p := range pods {
		bes = append(bes, dpReady(p))
	}
	svc := e.service("ext", dpVIPA, proto, bes...)
	svc.Ports[0].NodePort = extNodePort
	svc.ExternalTrafficPolicy = policy
	// IPv6 too: the node port is served on both of the node's addresses.
	for _, p := range pods {
		svc.Backends = append(svc.Backends, dataplane.Backend{IP: e.pod(p).IPv6(), State: dataplane.BackendReady, Weight: 1})
	}
	for i := range svc.Backends {
		svc.Backends[i].NodeLocal = local
	}
	sortBackends(svc)
	return svc
}

// outside makes one request from the upstream router (outside the node).
func (e *extEnv) outside(network string, to netip.AddrPort, timeout time.Duration) (netlab.Reply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return e.lab.Upstream().Request(ctx, network, to.String())
}

// upstreamAddr is the router's address on the node's fabric link: the
// outside client's address.
func (e *extEnv) upstreamAddr() netip.Addr {
	a := e.node.IPv4().As4()
	a[3]--
	return netip.AddrFrom4(a)
}

// upstreamAddrOf is upstreamAddr of the family of node address a.
func (e *extEnv) upstreamAddrOf(a netip.Addr) netip.Addr {
	if a.Is4() {
		return e.upstreamAddr()
	}
	b := a.As16()
	b[15]-- // fd00:198:0:k::2 is the node's, ::1 the router's
	return netip.AddrFrom16(b)
}

// nodeAddrs are the node's addresses, IPv4 then IPv6.
func (e *extEnv) nodeAddrs() []netip.Addr { return []netip.Addr{e.node.IPv4(), e.node.IPv6()} }

// podAddrOf is the address of pod of the family of a.
func (e *extEnv) podAddrOf(pod string, a netip.Addr) netip.Addr {
	if a.Is4() {
		return e.pod(pod).IPv4()
	}
	return e.pod(pod).IPv6()
}

func protoNet(p dataplane.Protocol) string {
	if p == dataplane.UDP {
		return "udp"
	}
	return "tcp"
}

// TestExternalNodePortCluster: a node port under policy Cluster, reached
// from outside the node, masquerades the client to the node's address
// (the backend sees the node), and the reply reaches the client from the
// node port; a pod reaching the same node port gets cluster semantics
// (its own address kept).
func TestExternalNodePortCluster(t *testing.T) {
	for _, proto := range []dataplane.Protocol{dataplane.TCP, dataplane.UDP} {
		t.Run(protoNet(proto), func(t *testing.T) {
			e := newExtEnv(t, []string{"client", "be1"})
			e.open(nil)
			e.apply(e.state(1, e.extService(proto, dataplane.TrafficPolicyCluster, true, "be1")))
			for _, na := range e.nodeAddrs() {
				np := netip.AddrPortFrom(na, extNodePort)
				e.expectFromOutside(protoNet(proto), np, "be1", na)
				ctx, cancel := context.WithTimeout(context.Background(), dpReplyTimeout)
				defer cancel()
				r, err := e.pod("client").Request(ctx, protoNet(proto), np.String())
				if err != nil {
					t.Fatalf("request from a pod to node port %s: %v", np, err)
				}
				if want := e.podAddrOf("client", na); r.Backend != "be1" || r.Peer.Addr() != want || r.Remote != np {
					t.Fatalf("request from a pod to %s: backend %s saw client %s, reply from %s; want be1, the pod's address %s, from %s",
						np, r.Backend, r.Peer, r.Remote, want, np)
				}
			}
		})
	}
}

// expectFromOutside makes three requests from outside to to and checks
// that each reaches backend, which sees the client as peer, and that the
// reply comes from to.
func (e *extEnv) expectFromOutside(network string, to netip.AddrPort, backend string, peer netip.Addr) {
	e.t.Helper()
	for i := range 3 {
		r, err := e.outside(network, to, dpReplyTimeout)
		if err != nil {
			e.t.Fatalf("request %d from outside to %s: %v", i, to, err)
		}
		if r.Backend != backend || r.Peer.Addr() != peer || r.Remote != to {
			e.t.Fatalf("request %d from outside to %s: backend %s saw client %s, reply from %s; want %s, client %s, from %s",
				i, to, r.Backend, r.Peer, r.Remote, backend, peer, to)
		}
	}
}

// expectDropped checks that a request from outside to to gets no answer
// at all: a timeout, not a refusal (an ICMP error or a RST would fail the
// request at once).
func (e *extEnv) expectDropped(network string, to netip.AddrPort, what string) {
	e.t.Helper()
	r, err := e.outside(network, to, dpDeadTimeout)
	if err == nil {
		e.t.Fatalf("%s: request to %s answered by %s, want it dropped", what, to, r.Backend)
	}
	if !netlab.IsTimeout(err) {
		e.t.Fatalf("%s: request to %s failed with %v, want a timeout (dropped, not refused)", what, to, err)
	}
}

// TestExternalNodePortLocal: under policy Local, traffic from outside goes
// to node-local backends only, with the client's address kept; with none
// it is dropped (not refused), while pods still reach the cluster's
// backends.
func TestExternalNodePortLocal(t *testing.T) {
	for _, proto := range []dataplane.Protocol{dataplane.TCP, dataplane.UDP} {
		t.Run(protoNet(proto), func(t *testing.T) {
			e := newExtEnv(t, []string{"client", "be1"})
			e.open(nil)
			e.apply(e.state(1, e.extService(proto, dataplane.TrafficPolicyLocal, true, "be1")))
			for _, na := range e.nodeAddrs() {
				np := netip.AddrPortFrom(na, extNodePort)
				client := e.upstreamAddrOf(na)
				e.expectFromOutside(protoNet(proto), np, "be1", client)
			}
			// The only backend is not node-local any more.
			e.apply(e.state(2, e.extService(proto, dataplane.TrafficPolicyLocal, false, "be1")))
			for _, na := range e.nodeAddrs() {
				np := netip.AddrPortFrom(na, extNodePort)
				e.expectDropped(protoNet(proto), np, "no node-local backend")
				ctx, cancel := context.WithTimeout(context.Background(), dpReplyTimeout)
				r, err := e.pod("client").Request(ctx, protoNet(proto), np.String())
				cancel()
				if err != nil || r.Backend != "be1" {
					t.Fatalf("request from a pod to node port %s with no node-local backend: %v, %v; want be1 (cluster semantics)", np, r, err)
				}
			}
		})
	}
}

// TestExternalIPsAndLoadBalancerSourceRanges: external IPs and
// load-balancer IPs are served on the service port from outside; with
// source ranges that leave the client out, its packets to the
// load-balancer IP are dropped (the external IP still works), and with a
// range that holds it they pass again.
func TestExternalIPsAndLoadBalancerSourceRanges(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		t.Run(map[bool]string{false: "ipv4", true: "ipv6"}[v6], func(t *testing.T) { testExternalIPs(t, v6) })
	}
}

func testExternalIPs(t *testing.T, v6 bool) {
	e := newExtEnv(t, []string{"client", "be1"})
	e.open(nil)
	eip, lbip, node, upstream, pod := extIP, extLB, e.node.IPv4(), e.upstreamAddr(), e.pod("client").IPv4()
	if v6 {
		eip, lbip, node, pod = extIP6, extLB6, e.node.IPv6(), e.pod("client").IPv6()
		upstream = e.upstreamAddrOf(node)
	}
	svc := func(ranges ...string) *dataplane.Service {
		s := e.extService(dataplane.TCP, dataplane.TrafficPolicyCluster, true, "be1")
		s.ExternalIPs = []netip.Addr{eip}
		s.LoadBalancerIPs = []netip.Addr{lbip}
		for _, r := range ranges {
			s.LoadBalancerSourceRanges = append(s.LoadBalancerSourceRanges, netip.MustParsePrefix(r))
		}
		return s
	}
	ext, lb := netip.AddrPortFrom(eip, 80), netip.AddrPortFrom(lbip, 80)
	works := func(to netip.AddrPort, what string) {
		t.Helper()
		r, err := e.outside("tcp", to, dpReplyTimeout)
		if err != nil {
			t.Fatalf("%s: request from outside to %s: %v", what, to, err)
		}
		if r.Backend != "be1" || r.Peer.Addr() != node || r.Remote != to {
			t.Fatalf("%s: request to %s: backend %s saw %s, reply from %s; want be1, the node's address, from %s",
				what, to, r.Backend, r.Peer, r.Remote, to)
		}
	}
	e.apply(e.state(1, svc()))
	works(ext, "external IP")
	works(lb, "load-balancer IP without source ranges")
	// A pod reaching the load-balancer IP gets cluster semantics: its own
	// address kept.
	for _, to := range []netip.AddrPort{lb, ext} {
		ctx, cancel := context.WithTimeout(context.Background(), dpReplyTimeout)
		r, err := e.pod("client").Request(ctx, "tcp", to.String())
		cancel()
		if err != nil || r.Backend != "be1" || r.Peer.Addr() != pod || r.Remote != to {
			t.Fatalf("request from a pod to %s: %+v (err %v), want be1 seeing the pod's address, reply from %s", to, r, err, to)
		}
	}

	e.apply(e.state(2, svc("203.0.113.0/24", "fd00:198:ffff::/48")))
	e.expectDropped("tcp", lb, "client outside load_balancer_source_ranges")
	works(ext, "external IP, source ranges set (they are for load-balancer IPs only)")
	// A pod outside the ranges is dropped too, whatever its origin.
	ctx, cancel := context.WithTimeout(context.Background(), dpDeadTimeout)
	defer cancel()
	if r, err := e.pod("client").Request(ctx, "tcp", lb.String()); err == nil {
		t.Fatalf("pod outside load_balancer_source_ranges reached %s through %s", r.Backend, lb)
	}

	e.apply(e.state(3, svc("203.0.113.0/24", netip.PrefixFrom(upstream, upstream.BitLen()-1).Masked().String())))
	works(lb, "client inside load_balancer_source_ranges")
}

// TestExternalFlowSurvivesRestart: an established external connection
// (SNAT through the node port) keeps working while vipd is down and after
// a new vipd took over the pinned maps.
func TestExternalFlowSurvivesRestart(t *testing.T) {
	e := newExtEnv(t, []string{"client", "be1", "be2"})
	e.open(nil)
	s := e.state(1, e.extService(dataplane.TCP, dataplane.TrafficPolicyCluster, true, "be1", "be2"))
	e.apply(s)
	np := netip.AddrPortFrom(e.node.IPv4(), extNodePort)
	ctx, cancel := context.WithTimeout(context.Background(), dpReplyTimeout)
	defer cancel()
	c, err := e.lab.Upstream().Dial(ctx, "tcp", np.String())
	if err != nil {
		t.Fatalf("dial %s from outside: %v", np, err)
	}
	defer c.Close()
	first := connRequest(t, c, "before the restart")
	e.close()
	if got := connRequest(t, c, "while vipd is down"); got != first {
		t.Fatalf("connection answered by %s while vipd is down, want %s", got, first)
	}
	e.open(nil)
	e.apply(s)
	if got := connRequest(t, c, "after the restart"); got != first {
		t.Fatalf("connection answered by %s after the restart, want %s", got, first)
	}
	if _, err := e.outside("tcp", np, dpReplyTimeout); err != nil {
		t.Fatalf("new connection after the restart: %v", err)
	}
}

// TestExternalNodePortRemoteBackend: under policy Cluster, a node port
// whose backend runs on another node sends the client's packets on,
// masqueraded to the node's address, so that the backend's replies come
// back through this node, which sends them to the client from the node
// port; a pod of this node reaching the node port keeps its address.
func TestExternalNodePortRemoteBackend(t *testing.T) {
	for _, proto := range []dataplane.Protocol{dataplane.TCP, dataplane.UDP} {
		t.Run(protoNet(proto), func(t *testing.T) {
			e := newExtEnvRemote(t, []string{"client"}, []string{"berem"})
			e.open(nil)
			svc := e.service("ext", dpVIPA, proto)
			svc.Ports[0].NodePort = extNodePort
			svc.ExternalTrafficPolicy = dataplane.TrafficPolicyCluster
			remote := e.lab.Pod("berem")
			svc.Backends = []dataplane.Backend{{IP: remote.IPv4(), State: dataplane.BackendReady, Weight: 1}}
			e.apply(e.state(1, svc))
			np := netip.AddrPortFrom(e.node.IPv4(), extNodePort)
			e.expectFromOutside(protoNet(proto), np, "berem", e.node.IPv4())
			ctx, cancel := context.WithTimeout(context.Background(), dpReplyTimeout)
			defer cancel()
			r, err := e.pod("client").Request(ctx, protoNet(proto), np.String())
			if err != nil {
				t.Fatalf("request from a pod to node port %s: %v", np, err)
			}
			if r.Backend != "berem" || r.Peer.Addr() != e.pod("client").IPv4() || r.Remote != np {
				t.Fatalf("request from a pod to %s: backend %s saw %s, reply from %s; want berem, the pod's address, from %s",
					np, r.Backend, r.Peer, r.Remote, np)
			}
		})
	}
}

// TestExternalFromNodeProcesses: the node's own processes reach node
// ports, external IPs and load-balancer IPs through the socket hooks with
// cluster semantics; a load-balancer IP whose source ranges hold no node
// address refuses them.
func TestExternalFromNodeProcesses(t *testing.T) {
	e := newExtEnv(t, []string{"client", "be1"})
	e.open(nil)
	svc := func(ranges ...string) *dataplane.Service {
		s := e.extService(dataplane.TCP, dataplane.TrafficPolicyLocal, false, "be1")
		s.ExternalIPs = []netip.Addr{extIP}
		s.LoadBalancerIPs = []netip.Addr{extLB}
		for _, r := range ranges {
			s.LoadBalancerSourceRanges = append(s.LoadBalancerSourceRanges, netip.MustParsePrefix(r))
		}
		return s
	}
	e.apply(e.state(1, svc()))
	local, err := e.node.StartClient(context.Background(), e.cgroup)
	if err != nil {
		t.Fatalf("start a node process in the test cgroup: %v", err)
	}
	t.Cleanup(func() { local.Close() })
	request := func(to netip.AddrPort) (netlab.Reply, error) {
		ctx, cancel := context.WithTimeout(context.Background(), dpReplyTimeout)
		defer cancel()
		return local.Request(ctx, "tcp", to.String())
	}
	// Policy Local with no node-local backend: the node's processes still
	// get the cluster's backends.
	for _, to := range []netip.AddrPort{
		netip.AddrPortFrom(e.node.IPv4(), extNodePort), netip.AddrPortFrom(e.node.IPv6(), extNodePort),
		netip.AddrPortFrom(extIP, 80), netip.AddrPortFrom(extLB, 80),
	} {
		r, err := request(to)
		if err != nil {
			t.Fatalf("request from a node process to %s: %v", to, err)
		}
		if r.Backend != "be1" || r.Remote != to {
			t.Fatalf("request from a node process to %s: backend %s, peer %s; want be1, peer %s", to, r.Backend, r.Remote, to)
		}
	}
	e.apply(e.state(2, svc("203.0.113.0/24")))
	if r, err := request(netip.AddrPortFrom(extLB, 80)); err == nil {
		t.Fatalf("node process outside load_balancer_source_ranges reached %s", r.Backend)
	}
	e.apply(e.state(3, svc("203.0.113.0/24", netip.PrefixFrom(e.node.IPv4(), 32).String())))
	if _, err := request(netip.AddrPortFrom(extLB, 80)); err != nil {
		t.Fatalf("node process inside load_balancer_source_ranges: %v", err)
	}
}

// TestExternalNodePortAddresses: a node port is served on the
// NodePortAddresses only.
func TestExternalNodePortAddresses(t *testing.T) {
	e := newExtEnv(t, []string{"client", "be1"})
	e.nodeNet.NodePortAddresses = []netip.Addr{e.node.IPv4()}
	e.open(nil)
	e.apply(e.state(1, e.extService(dataplane.TCP, dataplane.TrafficPolicyCluster, true, "be1")))
	if _, err := e.outside("tcp", netip.AddrPortFrom(e.node.IPv4(), extNodePort), dpReplyTimeout); err != nil {
		t.Fatalf("node port on a node-port address: %v", err)
	}
	if r, err := e.outside("tcp", netip.AddrPortFrom(e.node.IPv6(), extNodePort), dpDeadTimeout); err == nil {
		t.Fatalf("node port on %s, not a node-port address, answered by %s", e.node.IPv6(), r.Backend)
	}
}

// TestExternalFlows: an external flow through a node port (SNAT) is
// reported with the real client, the node port it used and its backend;
// ListFlows counts its replies (found under the SNAT reply key), and its
// close is reported once.
func TestExternalFlows(t *testing.T) {
	e := newExtEnv(t, []string{"client", "be1"})
	dp := e.open(nil)
	e.apply(e.state(1, e.extService(dataplane.TCP, dataplane.TrafficPolicyCluster, true, "be1")))
	w := flWatchFlows(t, dp, nil)
	np := netip.AddrPortFrom(e.node.IPv4(), extNodePort)
	ctx, cancel := context.WithTimeout(context.Background(), dpReplyTimeout)
	defer cancel()
	c, err := e.lab.Upstream().Dial(ctx, "tcp", np.String())
	if err != nil {
		t.Fatalf("dial %s from outside: %v", np, err)
	}
	defer c.Close()
	var r netlab.Reply
	for i := range 3 {
		if r, err = c.Request(ctx); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	check := func(what string, f dataplane.Flow) {
		t.Helper()
		be := netip.AddrPortFrom(e.pod("be1").IPv4(), dpTargetPort)
		if f.Protocol != dataplane.TCP || f.Client != r.Local || f.VIP != np || f.Backend != be {
			t.Errorf("%s: flow %s %s -> %s -> %s, want TCP %s -> %s -> %s", what, f.Protocol, f.Client, f.VIP, f.Backend, r.Local, np, be)
		}
	}
	evs, _ := w.waitFor("the NEW event", 3*time.Second, func(evs []dataplane.FlowEvent, _ uint64) bool { return len(evs) > 0 })
	check("NEW event", evs[0].Flow)
	flows, err := dp.ListFlows(context.Background())
	if err != nil || len(flows) != 1 {
		t.Fatalf("ListFlows: %+v (err %v), want one flow", flows, err)
	}
	check("listed flow", flows[0])
	if flows[0].ReplyPackets < 4 || flows[0].TCPState != dataplane.TCPEstablished {
		t.Errorf("listed flow: %d reply packets, state %v; want at least 4 (SYN-ACK, 3 replies), ESTABLISHED", flows[0].ReplyPackets, flows[0].TCPState)
	}
	c.Close()
	evs, _ = w.waitFor("the CLOSED event", 3*time.Second, func(evs []dataplane.FlowEvent, _ uint64) bool {
		return flCount(evs, dataplane.FlowClosed) == 1
	})
	for _, ev := range evs {
		if ev.Type == dataplane.FlowClosed {
			check("CLOSED event", ev.Flow)
		}
	}
}

// extPrograms counts the tcx programs on the node's uplink, by direction.
func (e *extEnv) extPrograms() map[string]int {
	e.t.Helper()
	out := map[string]int{}
	idx := e.nodeNet.Interfaces[0].Index
	err := e.node.Do(func() error {
		for dir, a := range map[string]ebpf.AttachType{"ingress": ebpf.AttachTCXIngress, "egress": ebpf.AttachTCXEgress} {
			res, err := link.QueryPrograms(link.QueryOptions{Target: idx, Attach: a})
			if err != nil {
				return err
			}
			if n := len(res.Programs); n > 0 {
				out[dir] = n
			}
		}
		return nil
	})
	if err != nil {
		e.t.Fatalf("query the uplink's tcx programs: %v", err)
	}
	return out
}

// TestExternalDriftAndNodeChanges: the external programs follow the
// Node's external interfaces; one detached by hand is reported by
// DetectDrift and put back by a full apply.
func TestExternalDriftAndNodeChanges(t *testing.T) {
	e := newExtEnv(t, []string{"client", "be1"})
	e.cfg.TCAttach = TCAttachTCX
	e.open(nil)
	svc := e.extService(dataplane.TCP, dataplane.TrafficPolicyCluster, true, "be1")
	e.apply(e.state(1, svc))
	np := netip.AddrPortFrom(e.node.IPv4(), extNodePort)
	works := func(what string) {
		t.Helper()
		if _, err := e.outside("tcp", np, dpReplyTimeout); err != nil {
			t.Fatalf("%s: request from outside to %s: %v", what, np, err)
		}
	}
	works("after the first apply")
	if got, want := e.extPrograms(), map[string]int{"ingress": 1, "egress": 1}; !maps.Equal(got, want) {
		t.Fatalf("uplink programs %v, want %v", got, want)
	}
	if d, err := e.dp.DetectDrift(context.Background()); err != nil || len(d) > 0 {
		t.Fatalf("DetectDrift after the first apply: %v (err %v), want nothing", d, err)
	}

	uplink := e.node.Uplink()
	if err := unpinLink(e.dp.ext.pinPath(e.nodeNet.Interfaces[0].Index, "ingress")); err != nil {
		t.Fatalf("unpin the uplink's ingress link: %v", err)
	}
	if r, err := e.outside("tcp", np, dpDeadTimeout); err == nil {
		t.Fatalf("node port answered by %s with vipd_from_ext detached", r.Backend)
	}
	e.dp.entriesChecked = time.Time{}
	d, err := e.dp.DetectDrift(context.Background())
	if err != nil || !slices.ContainsFunc(d, func(d dataplane.Drift) bool {
		return d.What == driftTCLink && strings.Contains(d.Detail, uplink+" ingress: vipd_from_ext not attached")
	}) {
		t.Fatalf("DetectDrift with vipd_from_ext detached: %v (err %v)", d, err)
	}
	e.apply(e.state(2, svc)) // full: Changed is nil
	works("after the repair")

	// Entries of the external maps deleted or added by another tool.
	if err := e.dp.objs.VipdExtIfaces.Delete(uint32(e.nodeNet.Interfaces[0].Index)); err != nil {
		t.Fatalf("delete the uplink's vipd_ext_ifaces entry: %v", err)
	}
	bogus := srcRangeKeyOf(12345, netip.MustParsePrefix("192.0.2.0/24"))
	if err := e.dp.objs.VipdSrcRanges.Put(&bogus, uint8(1)); err != nil {
		t.Fatalf("put a source range: %v", err)
	}
	if r, err := e.outside("tcp", np, dpDeadTimeout); err == nil {
		t.Fatalf("node port answered by %s with no SNAT address for the uplink", r.Backend)
	}
	e.dp.entriesChecked = time.Time{}
	d, err = e.dp.DetectDrift(context.Background())
	for _, want := range []string{"vipd_ext_ifaces: 1 entries missing", "vipd_src_ranges: 0 entries missing, 0 wrong, 1 no"} {
		if err != nil || !slices.ContainsFunc(d, func(d dataplane.Drift) bool {
			return d.What == driftMapEntries && strings.Contains(d.Detail, want)
		}) {
			t.Fatalf("DetectDrift: %v (err %v), want a drift saying %q", d, err, want)
		}
	}
	e.apply(e.state(3, svc))
	works("after the repair of the external maps")
	e.dp.entriesChecked = time.Time{}
	if d, err := e.dp.DetectDrift(context.Background()); err != nil || len(d) > 0 {
		t.Fatalf("DetectDrift after the repair: %v (err %v), want nothing", d, err)
	}

	// The uplink stops being external: its programs go, and the node port
	// is no longer served from outside.
	node := e.nodeNet
	e.nodeNet.Interfaces = slices.Clone(node.Interfaces)
	e.nodeNet.Interfaces[0].External = false
	e.apply(e.state(4, svc))
	if got := e.extPrograms(); len(got) != 0 {
		t.Fatalf("uplink programs %v after it stopped being external, want none", got)
	}
	if r, err := e.outside("tcp", np, dpDeadTimeout); err == nil {
		t.Fatalf("node port answered by %s from outside with no external interface", r.Backend)
	}
	e.nodeNet = node
	e.apply(e.state(5, svc))
	works("with the uplink external again")
}

// TestExternalRestartAfterNodeChange: a vipd restarted with a Node whose
// uplink is no longer external removes the external programs the
// previous one left on it.
func TestExternalRestartAfterNodeChange(t *testing.T) {
	e := newExtEnv(t, []string{"client", "be1"})
	e.cfg.TCAttach = TCAttachTCX
	e.open(nil)
	svc := e.extService(dataplane.TCP, dataplane.TrafficPolicyCluster, true, "be1")
	e.apply(e.state(1, svc))
	if got := e.extPrograms(); len(got) != 2 {
		t.Fatalf("uplink programs %v, want ingress and egress", got)
	}
	e.close()
	e.nodeNet.Interfaces = slices.Clone(e.nodeNet.Interfaces)
	e.nodeNet.Interfaces[0].External = false
	e.open(nil)
	e.apply(e.state(2, svc))
	if got := e.extPrograms(); len(got) != 0 {
		t.Fatalf("uplink programs %v after a restart with it not external, want none", got)
	}
}

// TestExternalClsact: the external programs work attached as clsact
// filters too, and leave with the interface's external mark.
func TestExternalClsact(t *testing.T) {
	e := newExtEnv(t, []string{"client", "be1"})
	e.cfg.TCAttach = TCAttachClsact
	e.open(nil)
	svc := e.extService(dataplane.TCP, dataplane.TrafficPolicyCluster, true, "be1")
	e.apply(e.state(1, svc))
	np := netip.AddrPortFrom(e.node.IPv4(), extNodePort)
	if r, err := e.outside("tcp", np, dpReplyTimeout); err != nil || r.Peer.Addr() != e.node.IPv4() {
		t.Fatalf("node port from outside with clsact filters: %+v (err %v)", r, err)
	}
	e.nodeNet.Interfaces = slices.Clone(e.nodeNet.Interfaces)
	e.nodeNet.Interfaces[0].External = false
	e.apply(e.state(2, svc))
	if r, err := e.outside("tcp", np, dpDeadTimeout); err == nil {
		t.Fatalf("node port answered by %s from outside after the uplink stopped being external", r.Backend)
	}
}

// TestExternalRestartAfterNodeChangeClsact: TestExternalRestartAfterNodeChange
// with clsact filters, which no pin records: a vipd restarted with the
// uplink no longer external removes the external filters the previous one
// left on it (and the pod interfaces keep theirs); the node port is not
// served from outside any more.
func TestExternalRestartAfterNodeChangeClsact(t *testing.T) {
	e := newExtEnv(t, []string{"client", "be1"})
	e.cfg.TCAttach = TCAttachClsact
	e.open(nil)
	svc := e.extService(dataplane.TCP, dataplane.TrafficPolicyCluster, true, "be1")
	e.apply(e.state(1, svc))
	pods := e.clsactFilters() - 2 // less the uplink's
	if got := e.uplinkClsactFilters(); got != 2 {
		t.Fatalf("%d vipd clsact filters on the uplink, want ingress and egress", got)
	}
	np := netip.AddrPortFrom(e.node.IPv4(), extNodePort)
	if r, err := e.outside("tcp", np, dpReplyTimeout); err != nil {
		t.Fatalf("node port from outside: %+v (err %v)", r, err)
	}
	e.close()
	e.nodeNet.Interfaces = slices.Clone(e.nodeNet.Interfaces)
	e.nodeNet.Interfaces[0].External = false
	e.open(nil)
	e.apply(e.state(2, svc))
	if got := e.uplinkClsactFilters(); got != 0 {
		t.Fatalf("%d vipd clsact filters on the uplink after a restart with it not external, want none", got)
	}
	if got := e.clsactFilters(); got != pods {
		t.Fatalf("%d vipd clsact filters on the pod interfaces after the restart, want %d as before", got, pods)
	}
	if r, err := e.outside("tcp", np, dpDeadTimeout); err == nil {
		t.Fatalf("node port answered by %s from outside after a restart with no external interface", r.Backend)
	}
	// The drift check neither misses them nor puts them back.
	if d, err := e.dp.DetectDrift(context.Background()); err != nil || len(d) > 0 {
		t.Fatalf("drift after the restart: %v (err %v), want none", d, err)
	}
	if got := e.uplinkClsactFilters(); got != 0 {
		t.Fatalf("%d vipd clsact filters on the uplink after the drift check, want none", got)
	}
}

// uplinkClsactFilters counts vipd's clsact filters on the node's uplink.
func (e *extEnv) uplinkClsactFilters() int {
	e.t.Helper()
	n := 0
	idx := e.nodeNet.Interfaces[0].Index
	err := e.node.Do(func() error {
		l, err := netlink.LinkByIndex(idx)
		if err != nil {
			return err
		}
		n = vipdClsactFilters(l)
		return nil
	})
	if err != nil {
		e.t.Fatalf("list the uplink's clsact filters: %v", err)
	}
	return n
}
