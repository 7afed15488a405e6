package iptables

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vipd/vipd/dataplane"
)

func TestStaleUDP(t *testing.T) {
	ap := netip.MustParseAddrPort
	dns, metrics := port("dns", dataplane.UDP, 53, 5353), port("metrics", dataplane.UDP, 9000, 9000)
	svc := func(backends ...dataplane.Backend) map[string]*dataplane.Service {
		return map[string]*dataplane.Service{"dns": service("dns", []string{"10.96.0.53"}, []dataplane.Port{dns, metrics}, backends...)}
	}
	only := func(b dataplane.Backend, ports map[string]uint16) dataplane.Backend {
		b.Ports, b.OnlyNamedPorts = ports, true
		return b
	}
	// ext serves dns also on node port 30053 and an external IP.
	ext := func(backends ...dataplane.Backend) map[string]*dataplane.Service {
		s := service("dns", []string{"10.96.0.53"}, []dataplane.Port{nodePort(dns, 30053)}, backends...)
		s.ExternalIPs = addrs("203.0.113.53")
		return map[string]*dataplane.Service{"dns": s}
	}
	nodeA, nodeB := addrs("192.168.1.5", "fd00:1::5"), addrs("192.168.1.6")
	for _, tc := range []struct {
		name         string
		old, next    map[string]*dataplane.Service
		oldNP, newNP []netip.Addr
		flows        map[udpTarget]bool
		whole        map[netip.AddrPort]bool
	}{
		{
			name: "no change",
			old:  svc(ready("10.244.1.1"), only(ready("10.244.1.2"), map[string]uint16{"dns": 5353})),
			next: svc(ready("10.244.1.1"), only(ready("10.244.1.2"), map[string]uint16{"dns": 5353})),
		},
		{
			// As kube-proxy does when an endpoint leaves a service port's
			// endpoints: its UDP flows on that port go, the others stay.
			name: "a backend stops serving one port",
			old:  svc(ready("10.244.1.1"), ready("10.244.1.2")),
			next: svc(ready("10.244.1.1"), only(ready("10.244.1.2"), map[string]uint16{"dns": 5353})),
			flows: map[udpTarget]bool{
				{vip: ap("10.96.0.53:9000"), backend: ap("10.244.1.2:9000")}: true,
			},
		},
		{
			name: "a backend stops serving every port",
			old:  svc(ready("10.244.1.1"), ready("10.244.1.2")),
			next: svc(ready("10.244.1.1"), only(ready("10.244.1.2"), nil)),
			flows: map[udpTarget]bool{
				{vip: ap("10.96.0.53:53"), backend: ap("10.244.1.2:5353")}:   true,
				{vip: ap("10.96.0.53:9000"), backend: ap("10.244.1.2:9000")}: true,
			},
		},
		{
			// Flows that the port refused while no backend served it are
			// flushed once one does, so that clients are not stuck.
			name: "a port gets its first backend that serves it",
			old:  svc(only(ready("10.244.1.1"), map[string]uint16{"dns": 5353})),
			next: svc(ready("10.244.1.1")),
			flows: map[udpTarget]bool{
				{vip: ap("10.96.0.53:9000")}: true,
			},
		},
		{
			name:  "the service goes",
			old:   svc(only(ready("10.244.1.1"), map[string]uint16{"dns": 5353})),
			next:  map[string]*dataplane.Service{},
			whole: map[netip.AddrPort]bool{ap("10.96.0.53:53"): true, ap("10.96.0.53:9000"): true},
		},
		{
			name: "a backend leaves: its flows through node ports and external IPs go too",
			old:  ext(ready("10.244.1.1"), ready("10.244.1.2")), oldNP: nodeA,
			next: ext(ready("10.244.1.1")), newNP: nodeA,
			flows: map[udpTarget]bool{
				{vip: ap("10.96.0.53:53"), backend: ap("10.244.1.2:5353")}:     true,
				{vip: ap("203.0.113.53:53"), backend: ap("10.244.1.2:5353")}:   true,
				{vip: ap("192.168.1.5:30053"), backend: ap("10.244.1.2:5353")}: true,
			},
		},
		{
			name: "a node-port address goes",
			old:  ext(ready("10.244.1.1")), oldNP: nodeA,
			next: ext(ready("10.244.1.1")), newNP: nodeB,
			// The IPv6 one served nothing: the service has no IPv6 VIP.
			// Flows the new address saw before it served are flushed, as
			// for any new frontend.
			whole: map[netip.AddrPort]bool{ap("192.168.1.5:30053"): true},
			flows: map[udpTarget]bool{{vip: ap("192.168.1.6:30053")}: true},
		},
		{
			name: "the first backend: refused node-port flows are flushed",
			old:  ext(), oldNP: nodeA,
			next: ext(ready("10.244.1.1")), newNP: nodeA,
			flows: map[udpTarget]bool{
				{vip: ap("10.96.0.53:53")}:     true,
				{vip: ap("203.0.113.53:53")}:   true,
				{vip: ap("192.168.1.5:30053")}: true,
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flows, whole := staleUDP(udpView{tc.old, tc.oldNP}, udpView{tc.next, tc.newNP})
			if tc.flows == nil {
				tc.flows = map[udpTarget]bool{}
			}
			if tc.whole == nil {
				tc.whole = map[netip.AddrPort]bool{}
			}
			opt := cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })
			if diff := cmp.Diff(tc.flows, flows, opt, cmp.AllowUnexported(udpTarget{})); diff != "" {
				t.Errorf("stale flows (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.whole, whole, opt); diff != "" {
				t.Errorf("stale VIP:ports (-want +got):\n%s", diff)
			}
		})
	}
}
