package iptables

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/vipd/vipd/dataplane"
)

// service builds a ClusterIP-style service with the defaults validation fills in.
func service(name string, vips []string, ports []dataplane.Port, backends ...dataplane.Backend) *dataplane.Service {
	s := &dataplane.Service{
		Name: name, Owner: "default", Generation: 1,
		Ports:         ports,
		Backends:      slices.Clone(backends),
		TrafficPolicy: dataplane.TrafficPolicyCluster,
		LoadBalancing: dataplane.LoadBalancingRandom,
	}
	for _, v := range vips {
		s.VIPs = append(s.VIPs, netip.MustParseAddr(v))
	}
	slices.SortFunc(s.Backends, func(a, b dataplane.Backend) int { return a.IP.Compare(b.IP) })
	return s
}

func port(name string, proto dataplane.Protocol, p, target uint16) dataplane.Port {
	return dataplane.Port{Name: name, Protocol: proto, Port: p, TargetPort: target}
}

func tcp(p, target uint16) []dataplane.Port {
	return []dataplane.Port{port("", dataplane.TCP, p, target)}
}

func backend(ip string, st dataplane.BackendState, weight uint16) dataplane.Backend {
	return dataplane.Backend{IP: netip.MustParseAddr(ip), State: st, Weight: weight}
}

func ready(ip string) dataplane.Backend { return backend(ip, dataplane.BackendReady, 1) }

func local(b dataplane.Backend) dataplane.Backend { b.NodeLocal = true; return b }

func state(svcs ...*dataplane.Service) *dataplane.State {
	s := &dataplane.State{Generation: 1, Services: map[string]*dataplane.Service{}}
	for _, svc := range svcs {
		s.Services[svc.Name] = svc
	}
	return s
}

func mustRender(t testing.TB, s *dataplane.State, opts Options) *Ruleset {
	t.Helper()
	rs, err := Render(s, opts, nil)
	if err != nil {
		t.Fatalf("Render: %v", err)
	}
	return rs
}

func nodePort(p dataplane.Port, np uint16) dataplane.Port { p.NodePort = np; return p }

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// testNode is a node with node-port addresses in both families, an
// external uplink eth0 and a pod veth.
func testNode() dataplane.Node {
	return dataplane.Node{
		NodePortAddresses: addrs("192.168.1.5", "fd00:1::5"),
		Interfaces: []dataplane.Interface{
			{Name: "eth0", Index: 2, Addrs: addrs("192.168.1.5", "fd00:1::5"), External: true},
			{Name: "vethweb", Index: 3},
		},
	}
}

// withNode sets testNode as s's Node.
func withNode(s *dataplane.State) *dataplane.State { s.Node = testNode(); return s }
