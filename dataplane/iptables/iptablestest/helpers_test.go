package iptablestest

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/vipd/vipd/dataplane"
	. "github.com/vipd/vipd/dataplane/iptables"
)

// The builders of package iptables's tests, which this package's tests
// cannot share: those are in-package tests of a package this one imports.

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

// kernel returns a Tracer for family f that has applied payloads in order.
var kernel = Loaded

// tracer renders s and loads it, in full, into a Tracer for family f.
func tracer(t testing.TB, s *dataplane.State, opts Options, f Family) *Tracer {
	t.Helper()
	return kernel(t, f, Payload(nil, mustRender(t, s, opts), true, nil)[f].Restore)
}

var (
	packet    = NewPacket
	mustTrace = MustTrace
)

var families = []Family{IPv4, IPv6}
