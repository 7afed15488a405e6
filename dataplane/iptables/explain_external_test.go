package iptables

import (
	"context"
	"net/netip"
	"testing"

	"github.com/vipd/vipd/dataplane"
)

// TestExplainExternalDrops: Explain names the drops of external traffic
// that the rules make, for LB IPs, external IPs and node ports, and none
// where the rules forward.
func TestExplainExternalDrops(t *testing.T) {
	s := withNode(state(
		func() *dataplane.Service {
			svc := service("ranged", []string{"10.96.0.50"}, []dataplane.Port{nodePort(port("http", dataplane.TCP, 80, 8080), 30090)},
				ready("10.244.1.1"), local(ready("10.244.1.2")))
			svc.LoadBalancerIPs = addrs("198.51.100.20")
			svc.LoadBalancerSourceRanges = prefixes("192.0.2.0/24")
			return svc
		}(),
		func() *dataplane.Service {
			svc := service("nolocal", []string{"10.96.0.51"}, []dataplane.Port{nodePort(port("http", dataplane.TCP, 80, 8080), 30091)},
				ready("10.244.2.1"))
			svc.ExternalTrafficPolicy = dataplane.TrafficPolicyLocal
			svc.ExternalIPs = addrs("203.0.113.51")
			return svc
		}(),
	))
	rs := mustRender(t, s, Options{})
	d := &Dataplane{applied: rs, state: s.Map(), nodePorts: s.Node.NodePortAddresses}
	for _, tc := range []struct {
		name, client, to string
		want             string
	}{
		{"LB IP, source in the ranges", "192.0.2.7:5000", "198.51.100.20:80", ""},
		{"LB IP, source outside the ranges", "203.0.113.9:5000", "198.51.100.20:80", dropSourceRanges},
		{"the VIP has no ranges", "203.0.113.9:5000", "10.96.0.50:80", ""},
		{"node port of a CLUSTER service", "203.0.113.9:5000", "192.168.1.5:30090", ""},
		{"LOCAL without a local backend: node port", "203.0.113.9:5000", "192.168.1.5:30091", dropNoLocal},
		{"LOCAL without a local backend: external IP", "203.0.113.9:5000", "203.0.113.51:80", dropNoLocal},
		{"LOCAL without a local backend: the VIP is internal", "203.0.113.9:5000", "10.96.0.51:80", ""},
		{"a node port off the node-port addresses", "203.0.113.9:5000", "192.168.1.6:30091", ""},
	} {
		ex, err := d.ExplainFlow(context.Background(), dataplane.ExplainQuery{
			Protocol: dataplane.TCP, Client: netip.MustParseAddrPort(tc.client), VIP: netip.MustParseAddrPort(tc.to)})
		if err != nil {
			t.Fatal(err)
		}
		if ex.Drop != tc.want {
			t.Errorf("%s: Drop %q; want %q", tc.name, ex.Drop, tc.want)
		}
	}
}
