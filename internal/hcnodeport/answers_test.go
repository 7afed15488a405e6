package hcnodeport_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/internal/hcnodeport"
)

func backend(ip string, local bool, state dataplane.BackendState) dataplane.Backend {
	return dataplane.Backend{IP: netip.MustParseAddr(ip), NodeLocal: local, State: state, Weight: 1}
}

func TestAnswers(t *testing.T) {
	ready, term, down := dataplane.BackendReady, dataplane.BackendTerminating, dataplane.BackendNotServing
	local, cluster := dataplane.TrafficPolicyLocal, dataplane.TrafficPolicyCluster
	ports := []dataplane.Port{{Name: "http", Protocol: dataplane.TCP, Port: 80, TargetPort: 8080}, {Name: "dns", Protocol: dataplane.UDP, Port: 53, TargetPort: 53}}
	st := &dataplane.State{Services: map[string]*dataplane.Service{
		"default/web": {Ports: ports, ExternalTrafficPolicy: local, HealthCheckNodePort: 30100, Backends: []dataplane.Backend{
			backend("198.18.1.10", true, ready), backend("198.18.1.11", true, down), backend("198.18.2.10", false, ready),
			backend("fd00:198:1::a", true, ready), backend("fd00:198:1::b", true, ready), backend("fd00:198:1::c", true, down),
		}},
		// A dual-stack pod is one endpoint: the larger family's count.
		"dual": {Ports: ports, ExternalTrafficPolicy: local, HealthCheckNodePort: 30105, Backends: []dataplane.Backend{
			backend("198.18.1.16", true, ready), backend("fd00:198:1::16", true, ready)}},
		// Only terminating local backends: they still take external
		// traffic, but, as in kube-proxy, only READY ones count, so that
		// a load balancer steers away from a draining node.
		"ns/draining": {Ports: ports, ExternalTrafficPolicy: local, HealthCheckNodePort: 30101, Backends: []dataplane.Backend{
			backend("198.18.1.12", true, term), backend("198.18.2.11", false, ready)}},
		// A backend that serves only one named port counts once.
		"named": {Ports: ports, ExternalTrafficPolicy: local, HealthCheckNodePort: 30102, Backends: []dataplane.Backend{
			{IP: netip.MustParseAddr("198.18.1.13"), NodeLocal: true, State: ready, OnlyNamedPorts: true, Ports: map[string]uint16{"dns": 5353}}}},
		"none/local": {Ports: ports, ExternalTrafficPolicy: local, HealthCheckNodePort: 30103, Backends: []dataplane.Backend{backend("198.18.2.12", false, ready)}},
		"cluster":    {Ports: ports, ExternalTrafficPolicy: cluster, HealthCheckNodePort: 30104, Backends: []dataplane.Backend{backend("198.18.1.14", true, ready)}},
		"noport":     {Ports: ports, ExternalTrafficPolicy: local, Backends: []dataplane.Backend{backend("198.18.1.15", true, ready)}},
		"zz/dup":     {Ports: ports, ExternalTrafficPolicy: local, HealthCheckNodePort: 30100},
	}}
	got, conflicts := hcnodeport.Answers(st)
	want := map[uint16]hcnodeport.Answer{
		30100: {Service: "default/web", LocalEndpoints: 2},
		30101: {Service: "ns/draining", LocalEndpoints: 0},
		30105: {Service: "dual", LocalEndpoints: 1},
		30102: {Service: "named", LocalEndpoints: 1},
		30103: {Service: "none/local", LocalEndpoints: 0},
	}
	if len(got) != len(want) {
		t.Errorf("answers %v, want %v", got, want)
	}
	for port, w := range want {
		if got[port] != w {
			t.Errorf("port %d: %+v, want %+v", port, got[port], w)
		}
	}
	if len(conflicts) != 1 || !strings.Contains(conflicts[0], "zz/dup") || !strings.Contains(conflicts[0], "30100") {
		t.Errorf("conflicts %q, want one naming zz/dup and 30100", conflicts)
	}
}

func TestBody(t *testing.T) {
	for _, tc := range []struct {
		a    hcnodeport.Answer
		want string
	}{
		{hcnodeport.Answer{Service: "default/web", LocalEndpoints: 2}, `{"service":{"namespace":"default","name":"web"},"localEndpoints":2,"serviceProxyHealthy":true}`},
		{hcnodeport.Answer{Service: "a/b/c"}, `{"service":{"namespace":"a","name":"b/c"},"localEndpoints":0,"serviceProxyHealthy":true}`},
		{hcnodeport.Answer{Service: "web", LocalEndpoints: 1}, `{"service":{"namespace":"","name":"web"},"localEndpoints":1,"serviceProxyHealthy":true}`},
	} {
		if got := string(tc.a.Body()); got != tc.want {
			t.Errorf("%+v: body %s, want %s", tc.a, got, tc.want)
		}
	}
}
