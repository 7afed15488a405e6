package cli

import (
	"strings"
	"testing"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

func TestPortString(t *testing.T) {
	for _, tc := range []struct {
		port *vipdv1.Port
		want string
	}{
		{&vipdv1.Port{Port: 80, Protocol: vipdv1.Protocol_PROTOCOL_TCP, TargetPort: 8080}, "80/TCP→8080"},
		{&vipdv1.Port{Port: 53, Protocol: vipdv1.Protocol_PROTOCOL_UDP}, "53/UDP"},
		{&vipdv1.Port{Port: 53, Protocol: vipdv1.Protocol_PROTOCOL_UDP, TargetPort: 53}, "53/UDP"},
		{&vipdv1.Port{Port: 3868, Protocol: vipdv1.Protocol_PROTOCOL_SCTP, TargetPort: 3869}, "3868/SCTP→3869"},
		{&vipdv1.Port{Port: 1}, "1/UNSPECIFIED"},
		{&vipdv1.Port{Port: 80, Protocol: vipdv1.Protocol_PROTOCOL_TCP, TargetPort: 8080, NodePort: 30080}, "80:30080/TCP→8080"},
		{&vipdv1.Port{Port: 53, Protocol: vipdv1.Protocol_PROTOCOL_UDP, TargetPort: 53, NodePort: 30053}, "53:30053/UDP"},
	} {
		if got := portString(tc.port, nil); got != tc.want {
			t.Errorf("portString(%v) = %q, want %q", tc.port, got, tc.want)
		}
	}
}

// TestPortStringTargets: the target shown is where the backends listen.
func TestPortStringTargets(t *testing.T) {
	tcp := vipdv1.Protocol_PROTOCOL_TCP
	// As vipd stores a Kubernetes Service's port with a named targetPort:
	// the adapter leaves target_port 0, vipd fills in the port.
	kube := &vipdv1.Port{Name: "http", Port: 80, Protocol: tcp, TargetPort: 80}
	named := func(ports map[string]uint32) *vipdv1.Backend {
		return &vipdv1.Backend{Ip: "198.18.1.1", Ports: ports, OnlyNamedPorts: true}
	}
	plain := &vipdv1.Backend{Ip: "198.18.1.9"}
	for _, tc := range []struct {
		name     string
		port     *vipdv1.Port
		backends []*vipdv1.Backend
		want     string
	}{
		{"named target port, pods on different numbers", kube,
			[]*vipdv1.Backend{named(map[string]uint32{"http": 8080}), named(map[string]uint32{"http": 9090})}, "80/TCP→per-backend"},
		{"named target port, pods on one number", kube,
			[]*vipdv1.Backend{named(map[string]uint32{"http": 8080}), named(map[string]uint32{"http": 8080})}, "80/TCP→8080"},
		{"named target port, pods on the port's number", kube,
			[]*vipdv1.Backend{named(map[string]uint32{"http": 80})}, "80/TCP"},
		{"named target port, no backend serves it", kube,
			[]*vipdv1.Backend{named(map[string]uint32{"metrics": 9100})}, "80/TCP"},
		{"named target port, no backends", kube, nil, "80/TCP"},
		{"the port's target_port is used by a backend: shown, overrides aside",
			&vipdv1.Port{Name: "http", Port: 80, Protocol: tcp, TargetPort: 8080},
			[]*vipdv1.Backend{plain, {Ip: "198.18.1.2", Ports: map[string]uint32{"http": 8081}}}, "80/TCP→8080"},
		{"every backend overrides the target_port, each its own way",
			&vipdv1.Port{Name: "http", Port: 80, Protocol: tcp, TargetPort: 8080},
			[]*vipdv1.Backend{{Ip: "198.18.1.1", Ports: map[string]uint32{"http": 8081}}, {Ip: "198.18.1.2", Ports: map[string]uint32{"http": 8082}}}, "80/TCP→per-backend"},
		{"an unnamed port's backends (the empty key)",
			&vipdv1.Port{Port: 80, Protocol: tcp, TargetPort: 80},
			[]*vipdv1.Backend{named(map[string]uint32{"": 8080})}, "80/TCP→8080"},
	} {
		if got := portString(tc.port, tc.backends); got != tc.want {
			t.Errorf("%s: portString = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestAffinityString(t *testing.T) {
	for _, tc := range []struct {
		a    *vipdv1.SessionAffinityConfig
		want string
	}{
		{nil, "unspecified"},
		{&vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_NONE}, "none"},
		{&vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP, TimeoutSeconds: 10800}, "client-ip:10800s"},
	} {
		if got := affinityString(tc.a); got != tc.want {
			t.Errorf("affinityString(%v) = %q, want %q", tc.a, got, tc.want)
		}
	}
}

func TestBackendPortsString(t *testing.T) {
	http := &vipdv1.Port{Name: "http", Port: 80, TargetPort: 8080}
	metrics := &vipdv1.Port{Name: "metrics", Port: 9090}
	unnamed := &vipdv1.Port{Port: 80, TargetPort: 8080}
	for _, tc := range []struct {
		name  string
		b     *vipdv1.Backend
		ports []*vipdv1.Port
		want  string
	}{
		{"no overrides", &vipdv1.Backend{}, []*vipdv1.Port{http, metrics}, ""},
		{"overrides sorted", &vipdv1.Backend{Ports: map[string]uint32{"metrics": 9091, "http": 8081}}, []*vipdv1.Port{http, metrics}, "http=8081,metrics=9091"},
		{"the unnamed port", &vipdv1.Backend{Ports: map[string]uint32{"": 8081}}, []*vipdv1.Port{unnamed}, `""=8081`},
		{"only named ports: the others not served", &vipdv1.Backend{Ports: map[string]uint32{"http": 8081}, OnlyNamedPorts: true},
			[]*vipdv1.Port{http, metrics}, "http=8081,metrics=-"},
		{"only named ports, naming none: no port served", &vipdv1.Backend{OnlyNamedPorts: true}, []*vipdv1.Port{http, metrics}, "http=-,metrics=-"},
		{"only named ports, serving every port", &vipdv1.Backend{Ports: map[string]uint32{"http": 8080, "metrics": 9090}, OnlyNamedPorts: true},
			[]*vipdv1.Port{http, metrics}, "http=8080,metrics=9090"},
		{"only named ports, the unnamed port not served", &vipdv1.Backend{OnlyNamedPorts: true}, []*vipdv1.Port{unnamed}, `""=-`},
		{"only named ports, the unnamed port served", &vipdv1.Backend{Ports: map[string]uint32{"": 8080}, OnlyNamedPorts: true}, []*vipdv1.Port{unnamed}, `""=8080`},
		{"only named ports, the service's ports unknown", &vipdv1.Backend{Ports: map[string]uint32{"http": 8081}, OnlyNamedPorts: true}, nil, "http=8081,*=-"},
		{"only named ports, none named, the service's ports unknown", &vipdv1.Backend{OnlyNamedPorts: true}, nil, "*=-"},
	} {
		if got := backendPortsString(tc.b, tc.ports); got != tc.want {
			t.Errorf("%s: backendPortsString = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestServiceViewNotServedPorts checks that "service get" shows which ports
// a backend with only_named_ports does not serve.
func TestServiceViewNotServedPorts(t *testing.T) {
	svc := &vipdv1.Service{
		Name: "default/web", Owner: "kube", Generation: 3, Vips: []string{"10.96.0.10"},
		Ports: []*vipdv1.Port{
			{Name: "http", Protocol: vipdv1.Protocol_PROTOCOL_TCP, Port: 80, TargetPort: 8080},
			{Name: "metrics", Protocol: vipdv1.Protocol_PROTOCOL_TCP, Port: 9090, TargetPort: 9090},
		},
		Backends: []*vipdv1.Backend{
			{Ip: "10.0.1.5", State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 1},
			{Ip: "10.0.1.6", State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 1, Ports: map[string]uint32{"http": 8081}, OnlyNamedPorts: true},
			{Ip: "10.0.1.7", State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 1, OnlyNamedPorts: true},
		},
	}
	var out strings.Builder
	tbl := newTable(&out)
	serviceView(svc)(tbl)
	if err := tbl.flush(); err != nil {
		t.Fatal(err)
	}
	want := `  IP        STATE  WEIGHT  NODE-LOCAL  ZONE  PORTS
  10.0.1.5  ready  1       false       -     -
  10.0.1.6  ready  1       false       -     http=8081,metrics=-
  10.0.1.7  ready  1       false       -     http=-,metrics=-
`
	if got := out.String(); !strings.HasSuffix(got, want) {
		t.Errorf("service view ends\n%s\nwant it to end\n%s", got, want)
	}

	out.Reset()
	tbl = newTable(&out)
	backendsView(svc.GetBackends())(tbl)
	if err := tbl.flush(); err != nil {
		t.Fatal(err)
	}
	want = `IP        STATE  WEIGHT  NODE-LOCAL  ZONE  PORTS
10.0.1.5  ready  1       false       -     -
10.0.1.6  ready  1       false       -     http=8081,*=-
10.0.1.7  ready  1       false       -     *=-
`
	if got := out.String(); got != want {
		t.Errorf("backends view without the service's ports:\n%s\nwant\n%s", got, want)
	}
}

// TestTopologyView: "service get" shows a traffic distribution that is
// set, and the backend tables gain a HINTS column when a backend has
// topology hints.
func TestTopologyView(t *testing.T) {
	svc := &vipdv1.Service{Name: "web", Vips: []string{"198.19.0.1"}, Ports: []*vipdv1.Port{{Port: 80}},
		TrafficDistribution: vipdv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_PREFER_SAME_ZONE,
		Backends: []*vipdv1.Backend{
			{Ip: "198.18.1.1", State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 1, Zone: "zone-a", ForZones: []string{"zone-a", "zone-c"}, ForNodes: []string{"node-1"}},
			{Ip: "198.18.2.1", State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 1, Zone: "zone-b"},
		}}
	var out strings.Builder
	tbl := newTable(&out)
	serviceView(svc)(tbl)
	if err := tbl.flush(); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	if !strings.Contains(got, "Traffic distribution:") || !strings.Contains(got, "prefer-same-zone") {
		t.Errorf("service view without the traffic distribution:\n%s", got)
	}
	want := `  IP          STATE  WEIGHT  NODE-LOCAL  ZONE    PORTS  HINTS
  198.18.1.1  ready  1       false       zone-a  -      zones=zone-a,zone-c nodes=node-1
  198.18.2.1  ready  1       false       zone-b  -      -
`
	if !strings.HasSuffix(got, want) {
		t.Errorf("service view ends\n%s\nwant it to end\n%s", got, want)
	}
}
