package dataplane_test

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vipd/vipd/dataplane"
)

var (
	http    = dataplane.Port{Name: "http", Protocol: dataplane.TCP, Port: 80, TargetPort: 8080}
	metrics = dataplane.Port{Name: "metrics", Protocol: dataplane.TCP, Port: 9090, TargetPort: 9090}
	unnamed = dataplane.Port{Protocol: dataplane.TCP, Port: 80, TargetPort: 8080}
)

func TestBackendTargetPortAndServes(t *testing.T) {
	tests := []struct {
		name   string
		b      dataplane.Backend
		p      dataplane.Port
		target uint16
		serves bool
	}{
		{"no override", dataplane.Backend{}, http, 8080, true},
		{"override by name", dataplane.Backend{Ports: map[string]uint16{"http": 9000}}, http, 9000, true},
		{"override of another port", dataplane.Backend{Ports: map[string]uint16{"metrics": 9000}}, http, 8080, true},
		{"the empty name overrides the unnamed port", dataplane.Backend{Ports: map[string]uint16{"": 9000}}, unnamed, 9000, true},
		{"the empty name is no named port", dataplane.Backend{Ports: map[string]uint16{"": 9000}}, http, 8080, true},
		{"only named ports, named", dataplane.Backend{Ports: map[string]uint16{"http": 9000}, OnlyNamedPorts: true}, http, 9000, true},
		{"only named ports, not named", dataplane.Backend{Ports: map[string]uint16{"http": 9000}, OnlyNamedPorts: true}, metrics, 9090, false},
		{"only named ports, none named", dataplane.Backend{OnlyNamedPorts: true}, http, 8080, false},
		{"only named ports, the unnamed port by the empty name", dataplane.Backend{Ports: map[string]uint16{"": 9000}, OnlyNamedPorts: true}, unnamed, 9000, true},
		{"only named ports, the unnamed port not named", dataplane.Backend{Ports: map[string]uint16{"http": 9000}, OnlyNamedPorts: true}, unnamed, 8080, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.b.TargetPort(tt.p); got != tt.target {
				t.Errorf("TargetPort(%q) = %d, want %d", tt.p.Name, got, tt.target)
			}
			if got := tt.b.Serves(tt.p); got != tt.serves {
				t.Errorf("Serves(%q) = %v, want %v", tt.p.Name, got, tt.serves)
			}
		})
	}
}

func TestEligibleBackendsPerPort(t *testing.T) {
	ip := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	be := func(addr string, state dataplane.BackendState, opts ...func(*dataplane.Backend)) dataplane.Backend {
		b := dataplane.Backend{IP: ip(addr), State: state, Weight: 1}
		for _, o := range opts {
			o(&b)
		}
		return b
	}
	httpOnly := func(b *dataplane.Backend) { b.Ports, b.OnlyNamedPorts = map[string]uint16{"http": 8080}, true }
	noPort := func(b *dataplane.Backend) { b.OnlyNamedPorts = true }
	local := func(b *dataplane.Backend) { b.NodeLocal = true }
	r, term, ns := dataplane.BackendReady, dataplane.BackendTerminating, dataplane.BackendNotServing

	tests := []struct {
		name     string
		svc      dataplane.Service
		p        dataplane.Port
		is6      bool
		wantIPs  []string
		wantNone bool
	}{
		{
			name: "every ready backend that serves the port",
			svc:  dataplane.Service{Ports: []dataplane.Port{http, metrics}, Backends: []dataplane.Backend{be("10.0.0.1", r), be("10.0.0.2", r, httpOnly)}},
			p:    http, wantIPs: []string{"10.0.0.1", "10.0.0.2"},
		},
		{
			name: "a backend that does not serve the port is left out",
			svc:  dataplane.Service{Ports: []dataplane.Port{http, metrics}, Backends: []dataplane.Backend{be("10.0.0.1", r), be("10.0.0.2", r, httpOnly)}},
			p:    metrics, wantIPs: []string{"10.0.0.1"},
		},
		{
			name: "no backend serves the port",
			svc:  dataplane.Service{Ports: []dataplane.Port{http, metrics}, Backends: []dataplane.Backend{be("10.0.0.1", r, httpOnly), be("10.0.0.2", r, noPort)}},
			p:    metrics, wantNone: true,
		},
		{
			// kube-proxy computes the fallback per service port: a READY
			// backend of another port does not hide this port's TERMINATING one.
			name: "terminating fallback per port",
			svc:  dataplane.Service{Ports: []dataplane.Port{http, metrics}, Backends: []dataplane.Backend{be("10.0.0.1", r, httpOnly), be("10.0.0.2", term), be("10.0.0.3", ns)}},
			p:    metrics, wantIPs: []string{"10.0.0.2"},
		},
		{
			name: "ready wins over terminating on the same port",
			svc:  dataplane.Service{Ports: []dataplane.Port{http, metrics}, Backends: []dataplane.Backend{be("10.0.0.1", r, httpOnly), be("10.0.0.2", term)}},
			p:    http, wantIPs: []string{"10.0.0.1"},
		},
		{
			name: "traffic policy local per port",
			svc: dataplane.Service{Ports: []dataplane.Port{http, metrics}, TrafficPolicy: dataplane.TrafficPolicyLocal,
				Backends: []dataplane.Backend{be("10.0.0.1", r, httpOnly, local), be("10.0.0.2", r), be("10.0.0.3", term, local)}},
			p: metrics, wantIPs: []string{"10.0.0.3"},
		},
		{
			name: "the unnamed port by the empty name",
			svc: dataplane.Service{Ports: []dataplane.Port{unnamed}, Backends: []dataplane.Backend{
				be("10.0.0.1", r, func(b *dataplane.Backend) { b.Ports, b.OnlyNamedPorts = map[string]uint16{"": 8081}, true }),
				be("10.0.0.2", r, noPort)}},
			p: unnamed, wantIPs: []string{"10.0.0.1"},
		},
		{
			name: "family",
			svc:  dataplane.Service{Ports: []dataplane.Port{http}, Backends: []dataplane.Backend{be("10.0.0.1", r), be("fd00::1", r), be("fd00::2", r, noPort)}},
			p:    http, is6: true, wantIPs: []string{"fd00::1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.svc.EligibleBackends(tt.p, tt.is6)
			var ips []string
			for _, b := range got {
				if !slices.ContainsFunc(tt.svc.Backends, func(x dataplane.Backend) bool { return x.IP == b.IP }) {
					t.Errorf("EligibleBackends returned %v, which is not one of the service's backends", b.IP)
				}
				ips = append(ips, b.IP.String())
			}
			if tt.wantNone && len(got) != 0 {
				t.Fatalf("EligibleBackends(%q) = %v, want none", tt.p.Name, ips)
			}
			if diff := cmp.Diff(tt.wantIPs, ips); diff != "" {
				t.Errorf("EligibleBackends(%q) (-want +got):\n%s", tt.p.Name, diff)
			}
		})
	}
}
