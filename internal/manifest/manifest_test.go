package manifest

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/protobuf/testing/protocmp"
)

// svc is a small service for expectations.
func svc(name string, ports ...*vipdv1.Port) *vipdv1.Service {
	return &vipdv1.Service{Name: name, Vips: []string{"10.96.0.10"}, Ports: ports}
}

func port(p uint32, proto vipdv1.Protocol) *vipdv1.Port {
	return &vipdv1.Port{Port: p, Protocol: proto}
}

var (
	tcp = vipdv1.Protocol_PROTOCOL_TCP
	udp = vipdv1.Protocol_PROTOCOL_UDP
)

func TestLoad(t *testing.T) {
	full := &vipdv1.Service{
		Name:  "default/web",
		Owner: "ctl",
		Vips:  []string{"10.96.0.10", "fd00::10"},
		Ports: []*vipdv1.Port{
			{Name: "http", Protocol: tcp, Port: 80, TargetPort: 8080, NodePort: 30080},
			{Name: "dns", Protocol: udp, Port: 53},
			{Name: "sig", Protocol: vipdv1.Protocol_PROTOCOL_SCTP, Port: 3868},
		},
		Backends: []*vipdv1.Backend{
			{Ip: "10.0.0.1", Ports: map[string]uint32{"http": 8081}, State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 2, NodeLocal: true, Zone: "z1"},
			{Ip: "10.0.0.2", State: vipdv1.BackendState_BACKEND_STATE_TERMINATING},
			{Ip: "10.0.0.3", State: vipdv1.BackendState_BACKEND_STATE_NOT_SERVING},
		},
		SessionAffinity:       &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP, TimeoutSeconds: 60},
		InternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL,
		LoadBalancing:         vipdv1.LoadBalancing_LOAD_BALANCING_MAGLEV,
		Labels:                map[string]string{"app": "web", "tier": "front"},
		// The external fields (issue 17).
		ExternalIps:              []string{"198.19.5.1"},
		LoadBalancerIps:          []string{"198.19.6.1", "fd00::6"},
		LoadBalancerSourceRanges: []string{"198.18.0.0/16", "fd00:198::/32"},
		ExternalTrafficPolicy:    vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL,
		HealthCheckNodePort:      32000,
	}
	for _, tc := range []struct {
		name string
		in   string
		want []*vipdv1.Service
	}{
		{
			name: "yaml service with short enums",
			in: `
name: default/web
owner: ctl
vips: [10.96.0.10, "fd00::10"]
ports:
- {name: http, protocol: tcp, port: 80, target_port: 8080, node_port: 30080}
- {name: dns, protocol: UDP, port: 53}
- {name: sig, protocol: Sctp, port: 3868}
external_ips: [198.19.5.1]
load_balancer_ips: [198.19.6.1, "fd00::6"]
load_balancer_source_ranges: [198.18.0.0/16, "fd00:198::/32"]
external_traffic_policy: Local
health_check_node_port: 32000
backends:
- ip: 10.0.0.1
  ports: {http: 8081}
  state: ready
  weight: 2
  node_local: true
  zone: z1
- {ip: 10.0.0.2, state: terminating}
- {ip: 10.0.0.3, state: not-serving}
session_affinity: {mode: ClientIP, timeout_seconds: 60}
internal_traffic_policy: local
load_balancing: maglev
labels: {app: web, tier: front}
`,
			want: []*vipdv1.Service{full},
		},
		{
			name: "json service with camelCase names and full enum names",
			in: `{
  "name": "default/web", "owner": "ctl", "vips": ["10.96.0.10", "fd00::10"],
  "ports": [
    {"name": "http", "protocol": "PROTOCOL_TCP", "port": 80, "targetPort": 8080, "nodePort": 30080},
    {"name": "dns", "protocol": "PROTOCOL_UDP", "port": 53},
    {"name": "sig", "protocol": 3, "port": 3868}
  ],
  "backends": [
    {"ip": "10.0.0.1", "ports": {"http": 8081}, "state": "BACKEND_STATE_READY", "weight": 2, "nodeLocal": true, "zone": "z1"},
    {"ip": "10.0.0.2", "state": "TERMINATING"},
    {"ip": "10.0.0.3", "state": "notServing"}
  ],
  "sessionAffinity": {"mode": "client_ip", "timeoutSeconds": 60},
  "internalTrafficPolicy": "TRAFFIC_POLICY_LOCAL",
  "loadBalancing": "Maglev",
  "labels": {"app": "web", "tier": "front"},
  "externalIps": ["198.19.5.1"],
  "loadBalancerIps": ["198.19.6.1", "fd00::6"],
  "loadBalancerSourceRanges": ["198.18.0.0/16", "fd00:198::/32"],
  "externalTrafficPolicy": "TRAFFIC_POLICY_LOCAL",
  "healthCheckNodePort": 32000
}`,
			want: []*vipdv1.Service{full},
		},
		{
			name: "json indented with tabs",
			in:   "{\n\t\"name\": \"a\",\n\t\"vips\": [\"10.96.0.10\"]\n}\n",
			want: []*vipdv1.Service{svc("a")},
		},
		{
			name: "yaml list",
			in:   "- {name: a, vips: [10.96.0.10]}\n- name: b\n  vips: [10.96.0.10]\n",
			want: []*vipdv1.Service{svc("a"), svc("b")},
		},
		{
			name: "json list",
			in:   `[{"name": "a", "vips": ["10.96.0.10"]}, {"name": "b", "vips": ["10.96.0.10"]}]`,
			want: []*vipdv1.Service{svc("a"), svc("b")},
		},
		{
			name: "wrapper object as vipctl service list -o json prints it",
			in:   `{"services": [{"name": "a", "vips": ["10.96.0.10"], "generation": "7"}, {"name": "b", "vips": ["10.96.0.10"]}]}`,
			want: []*vipdv1.Service{{Name: "a", Vips: []string{"10.96.0.10"}, Generation: 7}, svc("b")},
		},
		{
			name: "wrapper object in yaml",
			in:   "services:\n- name: a\n  vips: [10.96.0.10]\n",
			want: []*vipdv1.Service{svc("a")},
		},
		{
			name: "multi-document yaml mixing the forms",
			in: `# leading comment
---
name: a
vips: [10.96.0.10]
---
# a document of comments only is skipped
---
- {name: b, vips: [10.96.0.10]}
- {name: c, vips: [10.96.0.10]}
---   
services:
- {name: d, vips: [10.96.0.10]}
---
`,
			want: []*vipdv1.Service{svc("a"), svc("b"), svc("c"), svc("d")},
		},
		{
			name: "crlf line endings",
			in:   "name: a\r\nvips: [10.96.0.10]\r\n---\r\nname: b\r\nvips: [10.96.0.10]\r\n",
			want: []*vipdv1.Service{svc("a"), svc("b")},
		},
		{
			name: "every short protocol and state spelling",
			in: `
name: a
vips: [10.96.0.10]
ports: [{port: 1, protocol: tcp}, {port: 2, protocol: udp}, {port: 3, protocol: PROTOCOL_UDP}]
backends:
- {ip: 10.0.0.1, state: not_serving}
- {ip: 10.0.0.2, state: NOT-SERVING}
- {ip: 10.0.0.3, state: Ready}
`,
			want: []*vipdv1.Service{{
				Name: "a", Vips: []string{"10.96.0.10"},
				Ports: []*vipdv1.Port{port(1, tcp), port(2, udp), port(3, udp)},
				Backends: []*vipdv1.Backend{
					{Ip: "10.0.0.1", State: vipdv1.BackendState_BACKEND_STATE_NOT_SERVING},
					{Ip: "10.0.0.2", State: vipdv1.BackendState_BACKEND_STATE_NOT_SERVING},
					{Ip: "10.0.0.3", State: vipdv1.BackendState_BACKEND_STATE_READY},
				},
			}},
		},
		{
			name: "affinity none and cluster policy and random",
			in:   "name: a\nsession_affinity: {mode: none}\ninternal_traffic_policy: Cluster\nload_balancing: RANDOM\n",
			want: []*vipdv1.Service{{
				Name:                  "a",
				SessionAffinity:       &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_NONE},
				InternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
				LoadBalancing:         vipdv1.LoadBalancing_LOAD_BALANCING_RANDOM,
			}},
		},
		{
			name: "affinity clientip",
			in:   "name: a\nsession_affinity: {mode: clientip}\n",
			want: []*vipdv1.Service{{Name: "a", SessionAffinity: &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP}}},
		},
		{
			name: "null fields are unset",
			in:   "name: a\nports: null\nsession_affinity: ~\n",
			want: []*vipdv1.Service{{Name: "a"}},
		},
		{name: "explicit empty list", in: "[]\n", want: nil},
		{name: "explicit empty wrapper", in: "services: []\n", want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Load(strings.NewReader(tc.in), "test.yaml")
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if diff := cmp.Diff(tc.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("Load (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLoadErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		// want is the *Error expected, less Err; wantMsg is the whole message.
		want    Error
		wantMsg string
	}{
		{
			name:    "empty file",
			in:      "",
			want:    Error{Source: "test.yaml"},
			wantMsg: "test.yaml: no services found",
		},
		{
			name:    "only comments and separators",
			in:      "# nothing\n---\n---\n",
			want:    Error{Source: "test.yaml"},
			wantMsg: "test.yaml: no services found",
		},
		{
			name:    "garbage",
			in:      "name: [a\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1},
			wantMsg: "test.yaml: document 1: yaml: line 1: did not find expected ',' or ']'",
		},
		{
			name:    "binary garbage",
			in:      "\x00\x01\x02",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1},
			wantMsg: "test.yaml: document 1: yaml: control characters are not allowed",
		},
		{
			name:    "yaml syntax error in a later document counts lines from the file's start",
			in:      "name: a\n---\nname: b\nvips: [1\nports: x\n",
			want:    Error{Source: "test.yaml", Document: 2, Line: 3},
			wantMsg: "test.yaml: document 2 (line 3): yaml: line 4: did not find expected ',' or ']'",
		},
		{
			name:    "scalar document",
			in:      "hello\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1},
			wantMsg: "test.yaml: document 1: want a service, a list of services or {services: [...]}, got a string",
		},
		{
			name:    "unknown field",
			in:      "name: a\nvip: [10.96.0.10]\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Service: "a", Path: "vip"},
			wantMsg: `test.yaml: document 1 (service "a"): vip: unknown field`,
		},
		{
			name:    "unknown nested field",
			in:      "name: a\nports:\n- {port: 80}\n- {port: 81, targetport: 8080}\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Service: "a", Path: "ports[1].targetport"},
			wantMsg: `test.yaml: document 1 (service "a"): ports[1].targetport: unknown field`,
		},
		{
			name:    "unknown field in a list item of a later document",
			in:      "name: a\n---\n- name: b\n- name: c\n  colour: blue\n",
			want:    Error{Source: "test.yaml", Document: 2, Line: 3, Service: "c", Path: "[1].colour"},
			wantMsg: `test.yaml: document 2 (line 3, service "c"): [1].colour: unknown field`,
		},
		{
			name:    "unknown field in a wrapped service",
			in:      `{"services": [{"name": "a", "session_affinity": {"mode": "none", "timeout": 3}}]}`,
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Service: "a", Path: "services[0].session_affinity.timeout"},
			wantMsg: `test.yaml: document 1 (service "a"): services[0].session_affinity.timeout: unknown field`,
		},
		{
			name:    "wrapper with another field",
			in:      "services: []\nowner: x\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "owner"},
			wantMsg: `test.yaml: document 1: owner: unknown field (an object with "services" may have no other fields)`,
		},
		{
			name:    "wrapper services not a list",
			in:      "services: {name: a}\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "services"},
			wantMsg: "test.yaml: document 1: services: want a list, got an object",
		},
		{
			name:    "list item not an object",
			in:      "[1, 2]",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "[0]"},
			wantMsg: "test.yaml: document 1: [0]: want a service object, got a number",
		},
		{
			name:    "bad protocol",
			in:      "name: a\nports: [{port: 80, protocol: tpc}]\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Service: "a", Path: "ports[0].protocol"},
			wantMsg: `test.yaml: document 1 (service "a"): ports[0].protocol: unknown value "tpc" (want tcp, udp, sctp)`,
		},
		{
			name:    "bad backend state",
			in:      "name: a\nbackends: [{ip: 10.0.0.1, state: up}]\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Service: "a", Path: "backends[0].state"},
			wantMsg: `test.yaml: document 1 (service "a"): backends[0].state: unknown value "up" (want ready, terminating, not-serving)`,
		},
		{
			name:    "bad affinity",
			in:      "name: a\nsession_affinity: {mode: sticky}\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Service: "a", Path: "session_affinity.mode"},
			wantMsg: `test.yaml: document 1 (service "a"): session_affinity.mode: unknown value "sticky" (want none, client-ip)`,
		},
		{
			name:    "bad load balancing",
			in:      "name: a\nloadBalancing: roundrobin\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Service: "a", Path: "loadBalancing"},
			wantMsg: `test.yaml: document 1 (service "a"): loadBalancing: unknown value "roundrobin" (want random, maglev)`,
		},
		{
			name:    "bad traffic policy",
			in:      "name: a\ninternal_traffic_policy: nodelocal\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Service: "a", Path: "internal_traffic_policy"},
			wantMsg: `test.yaml: document 1 (service "a"): internal_traffic_policy: unknown value "nodelocal" (want cluster, local)`,
		},
		{
			name:    "port not a number",
			in:      "name: a\nports: [{port: http}]\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Service: "a", Path: "ports[0].port"},
			wantMsg: `test.yaml: document 1 (service "a"): ports[0].port: invalid value for uint32 field port: "http"`,
		},
		{
			name:    "port not a number in a list item",
			in:      "- name: a\n  ports: [{port: http}]\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Service: "a", Path: "[0].ports[0].port"},
			wantMsg: `test.yaml: document 1 (service "a"): [0].ports[0].port: invalid value for uint32 field port: "http"`,
		},
		{
			name:    "label value that yaml reads as a boolean",
			in:      "name: a\nlabels: {canary: yes}\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Service: "a", Path: `labels["canary"]`},
			wantMsg: `test.yaml: document 1 (service "a"): labels["canary"]: invalid value for string field value: true`,
		},
		{
			name:    "vips not a list",
			in:      "name: a\nvips: 10.96.0.10\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Service: "a", Path: "vips"},
			wantMsg: "test.yaml: document 1 (service \"a\"): vips: want a list, got a string",
		},
		{
			name:    "message field not an object",
			in:      "name: a\nsession_affinity: clientip\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Service: "a", Path: "session_affinity"},
			wantMsg: "test.yaml: document 1 (service \"a\"): session_affinity: want an object, got a string",
		},
		{
			name:    "map field not an object",
			in:      "name: a\nlabels: [a, b]\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Service: "a", Path: "labels"},
			wantMsg: "test.yaml: document 1 (service \"a\"): labels: want an object, got a list",
		},
		{
			name:    "kubernetes service of an unread apiVersion after a vipd service",
			in:      "name: a\n---\napiVersion: apps/v1\nkind: Service\nmetadata: {name: web}\n",
			want:    Error{Source: "test.yaml", Document: 2, Line: 3, Path: "apiVersion"},
			wantMsg: `test.yaml: document 2 (line 3): apiVersion: "apps/v1" is not read; kind Service needs apiVersion v1`,
		},
		{
			name:    "kubernetes object of an unread kind in a list",
			in:      "- name: a\n- apiVersion: apps/v1\n  kind: Deployment\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "[1].kind"},
			wantMsg: `test.yaml: document 1: [1].kind: "Deployment" is not read (apiVersion "apps/v1"); want Service (v1), EndpointSlice (discovery.k8s.io/v1), or a List, ServiceList or EndpointSliceList of them`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Load(strings.NewReader(tc.in), "test.yaml")
			if err == nil {
				t.Fatalf("Load succeeded with %v, want an error", got)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Load error %T %v is not an *Error", err, err)
			}
			gotFields := *e
			gotFields.Err = nil
			if diff := cmp.Diff(tc.want, gotFields); diff != "" {
				t.Errorf("Load error fields (-want +got):\n%s", diff)
			}
			if err.Error() != tc.wantMsg {
				t.Errorf("Load error:\n got %s\nwant %s", err, tc.wantMsg)
			}
		})
	}
}

func TestLoadFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "svc.yaml")
	if err := os.WriteFile(path, []byte("name: a\nvips: [10.96.0.10]\nports: [{port: 80, protocol: bogus}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadFile(path)
	if err == nil || !strings.HasPrefix(err.Error(), path+`: document 1 (service "a"): ports[0].protocol: `) {
		t.Errorf("LoadFile(%s) error = %v, want one naming the file and field", path, err)
	}

	if _, err := LoadFile(filepath.Join(dir, "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadFile(missing) error = %v, want ErrNotExist", err)
	}

	// "-" reads standard input.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin := os.Stdin
	os.Stdin = r
	t.Cleanup(func() { os.Stdin = stdin; r.Close() })
	if _, err := w.WriteString("name: a\nvips: [10.96.0.10]\n"); err != nil {
		t.Fatal(err)
	}
	w.Close()
	got, err := LoadFile("-")
	if err != nil {
		t.Fatalf("LoadFile(-): %v", err)
	}
	if diff := cmp.Diff([]*vipdv1.Service{svc("a")}, got, protocmp.Transform()); diff != "" {
		t.Errorf("LoadFile(-) (-want +got):\n%s", diff)
	}
}

func TestParseEnum(t *testing.T) {
	state := vipdv1.BackendState(0).Descriptor()
	for _, s := range []string{"not_serving", "notServing", "not-serving", "NOT_SERVING", "BACKEND_STATE_NOT_SERVING", "backend-state-not-serving"} {
		n, err := ParseEnum(state, s)
		if err != nil || n != vipdv1.BackendState_BACKEND_STATE_NOT_SERVING.Number() {
			t.Errorf("ParseEnum(BackendState, %q) = %v, %v; want NOT_SERVING", s, n, err)
		}
	}
	affinity := vipdv1.SessionAffinity(0).Descriptor()
	for _, s := range []string{"clientip", "client_ip", "ClientIP", "CLIENT_IP"} {
		n, err := ParseEnum(affinity, s)
		if err != nil || n != vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP.Number() {
			t.Errorf("ParseEnum(SessionAffinity, %q) = %v, %v; want CLIENT_IP", s, n, err)
		}
	}
	for _, s := range []string{"", "up", "PROTOCOL_TCP", "client"} {
		if n, err := ParseEnum(affinity, s); err == nil {
			t.Errorf("ParseEnum(SessionAffinity, %q) = %v, want an error", s, n)
		}
	}
}

func TestShortEnumNames(t *testing.T) {
	for _, tc := range []struct {
		got, want []string
	}{
		{ShortEnumNames(vipdv1.Protocol(0).Descriptor()), []string{"tcp", "udp", "sctp"}},
		{ShortEnumNames(vipdv1.BackendState(0).Descriptor()), []string{"ready", "terminating", "not-serving"}},
		{ShortEnumNames(vipdv1.SessionAffinity(0).Descriptor()), []string{"none", "client-ip"}},
		{ShortEnumNames(vipdv1.TrafficPolicy(0).Descriptor()), []string{"cluster", "local"}},
		{ShortEnumNames(vipdv1.LoadBalancing(0).Descriptor()), []string{"random", "maglev"}},
	} {
		if diff := cmp.Diff(tc.want, tc.got); diff != "" {
			t.Errorf("ShortEnumNames (-want +got):\n%s", diff)
		}
	}
	if got := ShortEnumName(vipdv1.Protocol(0).Descriptor(), 42); got != "42" {
		t.Errorf("ShortEnumName(Protocol, 42) = %q, want 42", got)
	}
}

func TestUpperSnake(t *testing.T) {
	for in, want := range map[string]string{
		"Protocol":        "PROTOCOL",
		"BackendState":    "BACKEND_STATE",
		"SessionAffinity": "SESSION_AFFINITY",
		"IPFamily":        "IP_FAMILY",
		"HTTPVersion2":    "HTTP_VERSION2",
	} {
		if got := upperSnake(in); got != want {
			t.Errorf("upperSnake(%q) = %q, want %q", in, got, want)
		}
	}
}

// ignoreOrigins leaves Result.Origins out of a comparison; TestOrigins
// checks them.
var ignoreOrigins = cmpopts.IgnoreFields(Result{}, "Origins")

func TestOrigins(t *testing.T) {
	const in = `name: a
---
- name: b
- apiVersion: v1
  kind: Service
  metadata: {name: web}
  spec: {clusterIP: 198.19.0.10, ports: [{port: 80}]}
---
services:
- name: c
`
	l := NewLoader(Options{})
	if err := l.Read(strings.NewReader(in), "in.yaml"); err != nil {
		t.Fatal(err)
	}
	res, err := l.Result()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range res.Services {
		names = append(names, s.GetName())
	}
	if diff := cmp.Diff([]string{"a", "b", "c", "default/web"}, names); diff != "" {
		t.Fatalf("services (-want +got):\n%s", diff)
	}
	want := []Origin{
		{Source: "in.yaml", Document: 1, Line: 1},
		{Source: "in.yaml", Document: 2, Line: 3, Path: "[0]"},
		{Source: "in.yaml", Document: 3, Line: 9, Path: "services[0]"},
		{Source: "in.yaml", Document: 2, Line: 3, Path: "[1]", Kubernetes: true},
	}
	if diff := cmp.Diff(want, res.Origins); diff != "" {
		t.Errorf("origins (-want +got):\n%s", diff)
	}

	for _, tc := range []struct {
		origin         Origin
		service, field string
		want           string
	}{
		{want[0], "a", "backends[0].weight", `in.yaml: document 1 (service "a"): backends[0].weight: bad`},
		{want[1], "b", "vips[1]", `in.yaml: document 2 (line 3, service "b"): [0].vips[1]: bad`},
		{want[2], "c", "", `in.yaml: document 3 (line 9, service "c"): services[0]: bad`},
		{want[3], "default/web", "vips[0]", `in.yaml: document 2 (line 3, service "default/web"): [1]: converted to vips[0]: bad`},
	} {
		if got := tc.origin.Error(tc.service, tc.field, errors.New("bad")).Error(); got != tc.want {
			t.Errorf("Origin.Error(%q, %q):\n got %s\nwant %s", tc.service, tc.field, got, tc.want)
		}
	}
}
