package iptables_test

// Packets of external traffic traced through the external golden states
// (external-cluster, external-local, external-internal-local), in
// iptablestest's kernel model. Their node (testNode in helpers_test.go) has the
// node-port addresses 192.168.1.5 and fd00:1::5, the external interface
// eth0 and the pod interface vethweb.

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vipd/vipd/dataplane"
	. "github.com/vipd/vipd/dataplane/iptables"
	. "github.com/vipd/vipd/dataplane/iptables/iptablestest"
)

func TestTraceExternal(t *testing.T) {
	cases := map[string]*dataplane.State{}
	for _, tc := range goldenCases() {
		cases[tc.name] = tc.state
	}
	const (
		outside  = "192.0.2.7"   // in external-local's source ranges
		stranger = "203.0.113.9" // in no range
		pod      = "10.244.9.9"
	)
	// in is a packet from src that enters the node through iface.
	in := func(iface, src, dst string, proto dataplane.Protocol, port uint16) Packet {
		p := packet(src, dst, proto, port)
		p.In = iface
		return p
	}
	ext := func(src, dst string, port uint16) Packet { return in("eth0", src, dst, dataplane.TCP, port) }
	fromPod := func(dst string, port uint16) Packet { return in("vethweb", pod, dst, dataplane.TCP, port) }
	fromNode := func(dst string, port uint16) Packet {
		p := packet("192.168.1.5", dst, dataplane.TCP, port)
		p.Hook = HookOutput
		return p
	}
	for _, tc := range []struct {
		name  string
		state string
		f     Family
		p     Packet
		want  Verdict
		dests map[string]float64
	}{
		// CLUSTER: any backend, masqueraded when external.
		{"node port, external, CLUSTER: any backend, masqueraded", "external-cluster", IPv4, ext(outside, "192.168.1.5", 30080), DNAT,
			map[string]float64{"10.244.1.1:8080 masq": 0.5, "10.244.1.2:8080 masq": 0.5}},
		{"UDP node port, external, CLUSTER", "external-cluster", IPv4, in("eth0", outside, "192.168.1.5", dataplane.UDP, 30053), DNAT,
			map[string]float64{"10.244.1.1:5353 masq": 0.5, "10.244.1.2:5353 masq": 0.5}},
		{"IPv6 node port, external, CLUSTER", "external-cluster", IPv6, ext("2001:db8:9::9", "fd00:1::5", 30080), DNAT,
			map[string]float64{"[fd00:244::1]:8080 masq": 1}},
		{"external IP, external, CLUSTER", "external-cluster", IPv4, ext(outside, "203.0.113.10", 80), DNAT,
			map[string]float64{"10.244.1.1:8080 masq": 0.5, "10.244.1.2:8080 masq": 0.5}},
		{"IPv6 external IP, external, CLUSTER", "external-cluster", IPv6, ext("2001:db8:9::9", "2001:db8::10", 80), DNAT,
			map[string]float64{"[fd00:244::1]:8080 masq": 1}},
		{"LB IP, external, CLUSTER", "external-cluster", IPv4, ext(outside, "198.51.100.10", 80), DNAT,
			map[string]float64{"10.244.1.1:8080 masq": 0.5, "10.244.1.2:8080 masq": 0.5}},
		{"node port from a pod: cluster semantics, not masqueraded", "external-cluster", IPv4, fromPod("192.168.1.5", 30080), DNAT,
			map[string]float64{"10.244.1.1:8080": 0.5, "10.244.1.2:8080": 0.5}},
		{"node port from the node: cluster semantics, not masqueraded", "external-cluster", IPv4, fromNode("192.168.1.5", 30080), DNAT,
			map[string]float64{"10.244.1.1:8080": 0.5, "10.244.1.2:8080": 0.5}},
		{"pod to LB IP: cluster semantics", "external-cluster", IPv4, fromPod("198.51.100.10", 80), DNAT,
			map[string]float64{"10.244.1.1:8080": 0.5, "10.244.1.2:8080": 0.5}},
		{"hairpin through a node port", "external-cluster", IPv4, in("vethweb", "10.244.1.1", "192.168.1.5", dataplane.TCP, 30080), DNAT,
			map[string]float64{"10.244.1.1:8080 masq": 0.5, "10.244.1.2:8080": 0.5}},
		{"node port on an address that is not a node-port address is not served", "external-cluster", IPv4, ext(outside, "192.168.1.6", 30080), NoMatch, nil},
		{"node port of the other family's address is not served", "external-cluster", IPv4, ext(outside, "192.168.1.5", 30081+1000), NoMatch, nil},
		{"the service port on a node-port address is not served", "external-cluster", IPv4, ext(outside, "192.168.1.5", 80), NoMatch, nil},
		{"node port without backends: rejected", "external-cluster", IPv4, ext(outside, "192.168.1.5", 30081), Reject, nil},
		{"node port without backends from a pod: rejected", "external-cluster", IPv4, fromPod("192.168.1.5", 30081), Reject, nil},
		{"LB IP without backends: rejected", "external-cluster", IPv4, ext(outside, "198.51.100.11", 80), Reject, nil},

		// LOCAL: node-local backends only for external traffic, client kept.
		{"node port, external, LOCAL: local backend only, not masqueraded", "external-local", IPv4, ext(outside, "192.168.1.5", 30090), DNAT,
			map[string]float64{"10.244.1.2:8080": 1}},
		{"node port, external, LOCAL, affinity to a remote backend not kept", "external-local", IPv4, func() Packet {
			p := ext(outside, "192.168.1.5", 30090)
			p.Affinity = netip.MustParseAddr("10.244.1.1")
			return p
		}(), DNAT, map[string]float64{"10.244.1.2:8080": 1}},
		{"node port from a pod, LOCAL: cluster semantics", "external-local", IPv4, fromPod("192.168.1.5", 30090), DNAT,
			map[string]float64{"10.244.1.1:8080": 0.5, "10.244.1.2:8080": 0.5}},
		{"LOCAL without a local backend: external traffic dropped", "external-local", IPv4, ext(outside, "192.168.1.5", 30091), Drop, nil},
		{"LOCAL without a local backend: external IP dropped", "external-local", IPv4, ext(outside, "203.0.113.51", 80), Drop, nil},
		{"LOCAL without a local backend: pods get the remote one", "external-local", IPv4, fromPod("192.168.1.5", 30091), DNAT,
			map[string]float64{"10.244.2.1:8080": 1}},
		{"LOCAL without a local backend: the node gets the remote one", "external-local", IPv4, fromNode("203.0.113.51", 80), DNAT,
			map[string]float64{"10.244.2.1:8080": 1}},
		{"LOCAL without any backend: external traffic dropped", "external-local", IPv4, ext(outside, "198.51.100.52", 443), Drop, nil},
		{"LOCAL without any backend: a pod in the ranges is rejected", "external-local", IPv4, in("vethweb", "192.0.2.8", "198.51.100.52", dataplane.TCP, 443), Reject, nil},

		// Source ranges.
		{"LB IP, source in the ranges", "external-local", IPv4, ext(outside, "198.51.100.20", 80), DNAT,
			map[string]float64{"10.244.1.2:8080": 1}},
		{"LB IP, source outside the ranges: dropped", "external-local", IPv4, ext(stranger, "198.51.100.20", 80), Drop, nil},
		{"LB IP from a pod outside the ranges: dropped", "external-local", IPv4, fromPod("198.51.100.20", 80), Drop, nil},
		{"LB IP from the node outside the ranges: dropped", "external-local", IPv4, fromNode("198.51.100.20", 80), Drop, nil},
		{"LB IP from a pod inside the ranges: cluster semantics", "external-local", IPv4, in("vethweb", "198.18.5.5", "198.51.100.20", dataplane.TCP, 80), DNAT,
			map[string]float64{"10.244.1.1:8080": 0.5, "10.244.1.2:8080": 0.5}},
		{"LB IP without backends, source outside the ranges: dropped", "external-local", IPv4, fromPod("198.51.100.52", 443), Drop, nil},
		{"the VIP ignores the source ranges", "external-local", IPv4, fromPod("10.96.0.50", 80), DNAT,
			map[string]float64{"10.244.1.1:8080": 0.5, "10.244.1.2:8080": 0.5}},

		// Internal policy LOCAL, external CLUSTER.
		{"internal LOCAL: the VIP gets the local backend", "external-internal-local", IPv4, fromPod("10.96.0.60", 80), DNAT,
			map[string]float64{"10.244.1.2:8080": 1}},
		{"internal LOCAL: a pod to the node port gets any backend", "external-internal-local", IPv4, fromPod("192.168.1.5", 30100), DNAT,
			map[string]float64{"10.244.1.1:8080": 0.5, "10.244.1.2:8080": 0.5}},
		{"internal LOCAL: external traffic gets any backend, masqueraded", "external-internal-local", IPv4, ext(outside, "203.0.113.60", 80), DNAT,
			map[string]float64{"10.244.1.1:8080 masq": 0.5, "10.244.1.2:8080 masq": 0.5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := tracer(t, cases[tc.state], Options{}, tc.f)
			o := mustTrace(t, tr, tc.p)
			if o.Verdict != tc.want {
				t.Fatalf("verdict %v; want %v (%+v)", o.Verdict, tc.want, o)
			}
			if tc.dests == nil {
				tc.dests = map[string]float64{}
			}
			if diff := cmp.Diff(tc.dests, dests(o), approx); diff != "" {
				t.Errorf("destinations (-want +got):\n%s", diff)
			}
		})
	}
}

// TestTraceExternalNodeChange checks that a change of the Node alone moves
// the node ports to the new addresses, as a partial sync from the previous
// rules, and that the external interfaces decide what is external.
func TestTraceExternalNodeChange(t *testing.T) {
	var s *dataplane.State
	for _, tc := range goldenCases() {
		if tc.name == "external-cluster" {
			s = tc.state
		}
	}
	old := mustRender(t, s, Options{})
	moved := *s
	moved.Node = dataplane.Node{
		NodePortAddresses: []netip.Addr{netip.MustParseAddr("192.168.1.6")},
		Interfaces:        []dataplane.Interface{{Name: "eth1", External: true}, {Name: "eth0"}},
	}
	moved.Changed = []string{}
	next, err := Render(&moved, Options{}, old)
	if err != nil {
		t.Fatal(err)
	}
	u := Payload(old, next, false, nil)[IPv4]
	tr := kernel(t, IPv4, Payload(nil, old, true, nil)[IPv4].Restore, u.Restore)
	assertKernel(t, tr, next, IPv4)
	// Only the roots (node-port addresses) and the EXT chains (interfaces).
	for i, tab := range tables {
		for _, name := range u.Rewritten[i] {
			if name != chainServices && name != chainReject && !strings.HasPrefix(name, "VIPD-EXT-") {
				t.Errorf("%s: a Node change rewrote %s", tab, name)
			}
		}
	}
	for _, tc := range []struct {
		name string
		p    Packet
		want Verdict
	}{
		{"old node-port address", func() Packet { p := packet("192.0.2.7", "192.168.1.5", dataplane.TCP, 30080); p.In = "eth1"; return p }(), NoMatch},
		{"new node-port address", func() Packet { p := packet("192.0.2.7", "192.168.1.6", dataplane.TCP, 30080); p.In = "eth1"; return p }(), DNAT},
	} {
		if o := mustTrace(t, tr, tc.p); o.Verdict != tc.want {
			t.Errorf("%s: verdict %v; want %v", tc.name, o.Verdict, tc.want)
		}
	}
	// eth0 is no longer external: not masqueraded; eth1 is.
	p := packet("192.0.2.7", "192.168.1.6", dataplane.TCP, 30080)
	p.In = "eth0"
	if diff := cmp.Diff(map[string]float64{"10.244.1.1:8080": 0.5, "10.244.1.2:8080": 0.5}, dests(mustTrace(t, tr, p)), approx); diff != "" {
		t.Errorf("from eth0 (-want +got):\n%s", diff)
	}
	p.In = "eth1"
	if diff := cmp.Diff(map[string]float64{"10.244.1.1:8080 masq": 0.5, "10.244.1.2:8080 masq": 0.5}, dests(mustTrace(t, tr, p)), approx); diff != "" {
		t.Errorf("from eth1 (-want +got):\n%s", diff)
	}
}
