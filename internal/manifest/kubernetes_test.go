package manifest

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/protobuf/testing/protocmp"
	"sigs.k8s.io/yaml"
)

const (
	ready       = vipdv1.BackendState_BACKEND_STATE_READY
	terminating = vipdv1.BackendState_BACKEND_STATE_TERMINATING
	notServing  = vipdv1.BackendState_BACKEND_STATE_NOT_SERVING
)

// Kubernetes objects for the tests: the Service shop/web, whose http port
// targets a named port, and two EndpointSlices that give that name
// different numbers (pods of two versions during a rollout).
const (
	webService = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 198.19.0.10
  ports:
  - {name: http, port: 80, protocol: TCP, targetPort: http}
  - {name: dns, port: 53, protocol: UDP, targetPort: 5353}
`
	webSliceOld = `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-old
  namespace: shop
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
endpoints:
- addresses: [198.18.1.1]
  conditions: {ready: true}
  nodeName: node-a
  zone: z1
- addresses: [198.18.1.2]
  conditions: {ready: false, serving: true, terminating: true}
  nodeName: node-b
ports:
- {name: http, port: 8080, protocol: TCP}
- {name: dns, port: 5353, protocol: UDP}
`
	webSliceNew = `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-new
  namespace: shop
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
endpoints:
- addresses: [198.18.1.3]
  nodeName: node-b
- addresses: [198.18.1.4]
  conditions: {ready: false, serving: false}
ports:
- {name: http, port: 9090}
`
)

// webWant is shop/web as converted from webService, webSliceOld and
// webSliceNew for node-a.
func webWant() *vipdv1.Service {
	return &vipdv1.Service{
		Name: "shop/web",
		Vips: []string{"198.19.0.10"},
		Ports: []*vipdv1.Port{
			{Name: "http", Protocol: tcp, Port: 80},
			{Name: "dns", Protocol: udp, Port: 53, TargetPort: 5353},
		},
		Backends: []*vipdv1.Backend{
			{Ip: "198.18.1.1", Ports: map[string]uint32{"http": 8080, "dns": 5353}, State: ready, NodeLocal: true, Zone: "z1", OnlyNamedPorts: true},
			{Ip: "198.18.1.2", Ports: map[string]uint32{"http": 8080, "dns": 5353}, State: terminating, OnlyNamedPorts: true},
			{Ip: "198.18.1.3", Ports: map[string]uint32{"http": 9090}, State: ready, OnlyNamedPorts: true},
			{Ip: "198.18.1.4", Ports: map[string]uint32{"http": 9090}, State: notServing, OnlyNamedPorts: true},
		},
	}
}

// indent indents every line of s by n spaces, to nest a document in a list.
func indent(s string, n int) string {
	pad := strings.Repeat(" ", n)
	return pad + strings.ReplaceAll(strings.TrimSuffix(s, "\n"), "\n", "\n"+pad) + "\n"
}

// asItems turns documents into the items of a YAML list.
func asItems(docs ...string) string {
	var b strings.Builder
	for _, d := range docs {
		b.WriteString("- " + strings.TrimPrefix(indent(d, 2), "  "))
	}
	return b.String()
}

func TestLoadKubernetes(t *testing.T) {
	kubectlList := "apiVersion: v1\nkind: List\nmetadata: {resourceVersion: \"\"}\nitems:\n" + asItems(webService, webSliceNew, webSliceOld)
	kubectlJSON, err := yaml.YAMLToJSON([]byte(kubectlList))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		in        string
		want      []*vipdv1.Service
		wantNotes []string
	}{
		{
			name: "a service and two slices with named target ports differing per slice",
			in:   webService + "---\n" + webSliceOld + "---\n" + webSliceNew,
			want: []*vipdv1.Service{webWant()},
		},
		{
			name: "the slices before their service",
			in:   webSliceNew + "---\n" + webSliceOld + "---\n" + webService,
			want: []*vipdv1.Service{webWant()},
		},
		{
			name: "a List as kubectl get -o yaml prints it",
			in:   kubectlList,
			want: []*vipdv1.Service{webWant()},
		},
		{
			name: "a List as kubectl get -o json prints it",
			in:   string(kubectlJSON),
			want: []*vipdv1.Service{webWant()},
		},
		{
			name: "a YAML list of objects",
			in:   asItems(webService, webSliceOld, webSliceNew),
			want: []*vipdv1.Service{webWant()},
		},
		{
			name: "a ServiceList and an EndpointSliceList whose items have no apiVersion and kind",
			in: "apiVersion: v1\nkind: ServiceList\nmetadata: {resourceVersion: \"77\"}\nitems:\n" +
				asItems(strings.TrimPrefix(webService, "apiVersion: v1\nkind: Service\n")) +
				"---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSliceList\nitems:\n" +
				asItems(strings.TrimPrefix(webSliceOld, "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n"), webSliceNew),
			want: []*vipdv1.Service{webWant()},
		},
		{
			name: "dual-stack",
			in: `apiVersion: v1
kind: Service
metadata: {name: api, namespace: shop}
spec:
  clusterIP: 198.19.0.20
  clusterIPs: [198.19.0.20, "fd00:198:19::20"]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  ports: [{name: grpc, port: 443, targetPort: 8443}]
  internalTrafficPolicy: Local
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 300}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: api-v4, namespace: shop, labels: {kubernetes.io/service-name: api}}
addressType: IPv4
endpoints: [{addresses: [198.18.2.1], nodeName: node-a}, {addresses: [198.18.2.2], nodeName: node-b}]
ports: [{name: grpc, port: 8443}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: api-v6, namespace: shop, labels: {kubernetes.io/service-name: api}}
addressType: IPv6
endpoints: [{addresses: ["fd00:198:2::1"], nodeName: node-a}]
ports: [{name: grpc, port: 8443}]
`,
			want: []*vipdv1.Service{{
				Name:  "shop/api",
				Vips:  []string{"198.19.0.20", "fd00:198:19::20"},
				Ports: []*vipdv1.Port{{Name: "grpc", Protocol: tcp, Port: 443, TargetPort: 8443}},
				Backends: []*vipdv1.Backend{
					{Ip: "198.18.2.1", Ports: map[string]uint32{"grpc": 8443}, State: ready, NodeLocal: true, OnlyNamedPorts: true},
					{Ip: "198.18.2.2", Ports: map[string]uint32{"grpc": 8443}, State: ready, OnlyNamedPorts: true},
					{Ip: "fd00:198:2::1", Ports: map[string]uint32{"grpc": 8443}, State: ready, NodeLocal: true, OnlyNamedPorts: true},
				},
				SessionAffinity:       &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP, TimeoutSeconds: 300},
				InternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL,
			}},
		},
		{
			name: "a missing namespace is default",
			in: `apiVersion: v1
kind: Service
metadata: {name: web}
spec: {clusterIP: 198.19.0.30, ports: [{port: 80, targetPort: 8080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: [198.18.3.1]}]
ports: [{port: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-2, namespace: other, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: [198.18.3.2]}]
ports: [{port: 8080}]
`,
			want: []*vipdv1.Service{{
				Name:     "default/web",
				Vips:     []string{"198.19.0.30"},
				Ports:    []*vipdv1.Port{{Protocol: tcp, Port: 80, TargetPort: 8080}},
				Backends: []*vipdv1.Backend{{Ip: "198.18.3.1", Ports: map[string]uint32{"": 8080}, State: ready, OnlyNamedPorts: true}},
			}},
			wantNotes: []string{"EndpointSlice other/web-2: no Service other/web in the input; ignored"},
		},
		{
			name: "services kube-proxy would not program are notes",
			in: asItems(
				"apiVersion: v1\nkind: Service\nmetadata: {name: db}\nspec: {clusterIP: None, ports: [{port: 5432}]}\n",
				"apiVersion: v1\nkind: Service\nmetadata: {name: mail}\nspec: {type: ExternalName, externalName: mail.example.net}\n",
				"apiVersion: v1\nkind: Service\nmetadata: {name: mesh, labels: {service.kubernetes.io/service-proxy-name: other}}\n"+
					"spec: {clusterIP: 198.19.0.40, ports: [{port: 80}]}\n",
				"apiVersion: v1\nkind: Service\nmetadata: {name: new, namespace: a}\nspec: {ports: [{port: 80}]}\n",
				"apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: db-1, labels: {kubernetes.io/service-name: db}}\n"+
					"addressType: IPv4\nendpoints: [{addresses: [198.18.4.1]}]\nports: [{port: 5432}]\n",
			),
			wantNotes: []string{
				"skipped Service a/new: it has no cluster IP yet",
				"skipped Service default/db: it is headless (clusterIP: None): DNS serves its endpoints directly",
				"skipped Service default/mail: it is of type ExternalName: DNS serves it",
				`skipped Service default/mesh: it has the label service.kubernetes.io/service-proxy-name="other": another proxy serves it`,
			},
		},
		{
			name: "slices that serve no service read are notes",
			in: webService + "---\n" + asItems(
				"apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: orphan-1, namespace: shop, labels: {kubernetes.io/service-name: gone}}\n"+
					"addressType: IPv4\nendpoints: [{addresses: [198.18.5.1]}]\n",
				"apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: custom, namespace: shop}\naddressType: IPv4\n",
				"apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-fqdn, namespace: shop, labels: {kubernetes.io/service-name: web}}\n"+
					"addressType: FQDN\nendpoints: [{addresses: [db.example.net]}]\nports: [{name: http, port: 80}]\n",
			),
			want: []*vipdv1.Service{{
				Name:  "shop/web",
				Vips:  []string{"198.19.0.10"},
				Ports: webWant().Ports,
			}},
			wantNotes: []string{
				"EndpointSlice shop/custom: no label kubernetes.io/service-name names its Service; ignored",
				"EndpointSlice shop/orphan-1: no Service shop/gone in the input; ignored",
				`EndpointSlice shop/web-fqdn: addressType "FQDN" is not IPv4 or IPv6; ignored`,
			},
		},
		{
			name: "vipd services and kubernetes objects in one file",
			in: webSliceOld + "---\nname: vipd/a\nowner: ctl\nvips: [198.19.1.1]\n---\n" + webService + "---\n" + webSliceNew +
				"---\n- name: vipd/b\n  vips: [198.19.1.2]\n",
			want: []*vipdv1.Service{
				{Name: "vipd/a", Owner: "ctl", Vips: []string{"198.19.1.1"}},
				{Name: "vipd/b", Vips: []string{"198.19.1.2"}},
				webWant(),
			},
		},
		{
			name: "null is the zero value anywhere",
			in: `apiVersion: v1
kind: Service
metadata: {name: web, namespace: null, creationTimestamp: null, labels: null, annotations: null, managedFields: null}
spec:
  clusterIP: 198.19.0.30
  clusterIPs: null
  selector: null
  sessionAffinityConfig: null
  ports: [{name: null, port: 80, targetPort: null, protocol: null}]
status: {loadBalancer: {ingress: null}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}, deletionTimestamp: null}
addressType: IPv4
endpoints: [{addresses: [198.18.3.1], conditions: {ready: null, serving: null}, nodeName: null, zone: null}]
ports: [{port: 80, name: null, protocol: null}]
`,
			want: []*vipdv1.Service{{
				Name:     "default/web",
				Vips:     []string{"198.19.0.30"},
				Ports:    []*vipdv1.Port{{Protocol: tcp, Port: 80}},
				Backends: []*vipdv1.Backend{{Ip: "198.18.3.1", Ports: map[string]uint32{"": 80}, State: ready, OnlyNamedPorts: true}},
			}},
		},
		{
			name: "an explicit empty List",
			in:   "apiVersion: v1\nkind: List\nitems: []\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLoader(Options{NodeName: "node-a"})
			if err := l.Read(strings.NewReader(tc.in), "test.yaml"); err != nil {
				t.Fatalf("Read: %v", err)
			}
			got, err := l.Result()
			if err != nil {
				t.Fatalf("Result: %v", err)
			}
			if diff := cmp.Diff(tc.want, got.Services, protocmp.Transform()); diff != "" {
				t.Errorf("services (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantNotes, got.Notes); diff != "" {
				t.Errorf("notes (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLoadKubernetesAcrossSources checks that a Service and its slices may
// come in different sources, that a source with an error adds nothing,
// and what Load, which has no node name, makes of the same input.
func TestLoadKubernetesAcrossSources(t *testing.T) {
	l := NewLoader(Options{NodeName: "node-a"})
	if err := l.Read(strings.NewReader(webSliceOld), "old.yaml"); err != nil {
		t.Fatal(err)
	}
	err := l.Read(strings.NewReader(webSliceNew+"---\nkind: Deployment\napiVersion: apps/v1\n"), "broken.yaml")
	if err == nil || !strings.HasPrefix(err.Error(), "broken.yaml: document 2 (line 16): kind: \"Deployment\" is not read") {
		t.Fatalf("Read(broken.yaml) = %v, want an unsupported kind error", err)
	}
	// web-new in broken.yaml was not kept: it may be read again.
	if err := l.Read(strings.NewReader(webSliceNew), "new.yaml"); err != nil {
		t.Fatal(err)
	}
	if err := l.Read(strings.NewReader(webService), "svc.yaml"); err != nil {
		t.Fatal(err)
	}
	got, err := l.Result()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(&Result{Services: []*vipdv1.Service{webWant()}}, got, protocmp.Transform(), ignoreOrigins); diff != "" {
		t.Errorf("Result (-want +got):\n%s", diff)
	}

	err = l.Read(strings.NewReader("# nothing\n"+webService), "again.yaml")
	if err == nil || err.Error() != "again.yaml: document 1: Service shop/web appears twice (first in svc.yaml: document 1)" {
		t.Errorf("reading shop/web again: %v, want an error naming both places", err)
	}

	all, err := Load(strings.NewReader(webService+"---\n"+webSliceOld+"---\n"+webSliceNew), "one.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := webWant()
	want.Backends[0].NodeLocal = false // no node name: no endpoint is node-local
	if diff := cmp.Diff([]*vipdv1.Service{want}, all, protocmp.Transform()); diff != "" {
		t.Errorf("Load (-want +got):\n%s", diff)
	}
}

// TestKubernetesExample loads testdata/kubernetes.yaml, what kubectl
// prints for a small cluster (status, managedFields and all), in YAML and
// as JSON.
func TestKubernetesExample(t *testing.T) {
	path := filepath.Join("testdata", "kubernetes.yaml")
	want := &Result{
		Services: []*vipdv1.Service{
			{
				Name:  "default/kubernetes",
				Vips:  []string{"198.19.0.1"},
				Ports: []*vipdv1.Port{{Name: "https", Protocol: tcp, Port: 443, TargetPort: 6443}},
				Backends: []*vipdv1.Backend{
					{Ip: "198.18.0.2", Ports: map[string]uint32{"https": 6443}, State: ready, OnlyNamedPorts: true},
				},
			},
			{
				Name: "default/web",
				Vips: []string{"198.19.0.10", "fd00:198:19::a"},
				Ports: []*vipdv1.Port{
					{Name: "http", Protocol: tcp, Port: 80},
					{Name: "metrics", Protocol: tcp, Port: 9090, TargetPort: 9090},
				},
				Backends: []*vipdv1.Backend{
					{Ip: "198.18.1.10", Ports: map[string]uint32{"http": 8080, "metrics": 9090}, State: ready, NodeLocal: true, Zone: "zone-a", OnlyNamedPorts: true},
					{Ip: "198.18.1.11", Ports: map[string]uint32{"http": 8080, "metrics": 9090}, State: ready, Zone: "zone-b", OnlyNamedPorts: true},
					{Ip: "198.18.1.12", Ports: map[string]uint32{"http": 8081, "metrics": 9090}, State: terminating, NodeLocal: true, Zone: "zone-a", OnlyNamedPorts: true},
					{Ip: "fd00:198:1::10", Ports: map[string]uint32{"http": 8080, "metrics": 9090}, State: ready, NodeLocal: true, Zone: "zone-a", OnlyNamedPorts: true},
				},
				SessionAffinity:       &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP, TimeoutSeconds: 600},
				InternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL,
			},
			{
				Name: "kube-system/kube-dns",
				Vips: []string{"198.19.0.53"},
				Ports: []*vipdv1.Port{
					{Name: "dns", Protocol: udp, Port: 53, TargetPort: 53},
					{Name: "dns-tcp", Protocol: tcp, Port: 53, TargetPort: 53},
					{Name: "metrics", Protocol: tcp, Port: 9153, TargetPort: 9153},
				},
				Backends: []*vipdv1.Backend{
					{Ip: "198.18.2.5", Ports: map[string]uint32{"dns": 53, "dns-tcp": 53, "metrics": 9153}, State: ready, Zone: "zone-b", OnlyNamedPorts: true},
					{Ip: "198.18.2.6", Ports: map[string]uint32{"dns": 53, "dns-tcp": 53, "metrics": 9153}, State: notServing, NodeLocal: true, Zone: "zone-a", OnlyNamedPorts: true},
				},
			},
		},
		Notes: []string{
			"skipped Service default/db: it is headless (clusterIP: None): DNS serves its endpoints directly",
			"skipped Service default/mail: it is of type ExternalName: DNS serves it",
			"EndpointSlice default/legacy-x2x7b: no Service default/legacy in the input; ignored",
		},
	}
	l := NewLoader(Options{NodeName: "node-a"})
	if err := l.ReadFile(path); err != nil {
		t.Fatal(err)
	}
	got, err := l.Result()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got, protocmp.Transform(), ignoreOrigins); diff != "" {
		t.Errorf("%s (-want +got):\n%s", path, diff)
	}

	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		t.Fatal(err)
	}
	l = NewLoader(Options{NodeName: "node-a"})
	if err := l.Read(strings.NewReader(string(js)), "kubernetes.json"); err != nil {
		t.Fatal(err)
	}
	if got, err = l.Result(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got, protocmp.Transform(), ignoreOrigins); diff != "" {
		t.Errorf("%s as JSON (-want +got):\n%s", path, diff)
	}
}

func TestLoadKubernetesErrors(t *testing.T) {
	const svcHead = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\n"
	for _, tc := range []struct {
		name string
		in   string
		// want is the *Error expected, less Err; wantMsg is the whole message.
		want    Error
		wantMsg string
	}{
		{
			name:    "unknown field in a service",
			in:      svcHead + "spec:\n  clusterIP: 198.19.0.10\n  ports: [{port: 80, prot: UDP}]\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "spec.ports[0].prot"},
			wantMsg: "test.yaml: document 1: spec.ports[0].prot: unknown field",
		},
		{
			name:    "field names are case sensitive",
			in:      svcHead + "spec: {clusterip: 198.19.0.10}\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "spec.clusterip"},
			wantMsg: "test.yaml: document 1: spec.clusterip: unknown field",
		},
		{
			name:    "unknown field in a slice of a list",
			in:      "apiVersion: v1\nkind: List\nitems:\n" + asItems(webService, strings.Replace(webSliceOld, "conditions:", "condition:", 1)),
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "items[1].endpoints[0].condition"},
			wantMsg: "test.yaml: document 1: items[1].endpoints[0].condition: unknown field",
		},
		{
			name:    "unknown field in metadata of a later document",
			in:      webService + "---\n" + strings.Replace(webSliceNew, "namespace:", "namspace:", 1),
			want:    Error{Source: "test.yaml", Document: 2, Line: 10, Path: "metadata.namspace"},
			wantMsg: "test.yaml: document 2 (line 10): metadata.namspace: unknown field",
		},
		{
			name:    "unknown field in a list",
			in:      "apiVersion: v1\nkind: List\nitem: []\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "item"},
			wantMsg: "test.yaml: document 1: item: unknown field",
		},
		{
			name:    "service with the apiVersion of a slice",
			in:      "apiVersion: discovery.k8s.io/v1\nkind: Service\nmetadata: {name: web}\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "apiVersion"},
			wantMsg: `test.yaml: document 1: apiVersion: "discovery.k8s.io/v1" is not read; kind Service needs apiVersion v1`,
		},
		{
			name:    "slice of an old apiVersion",
			in:      strings.Replace(webSliceOld, "discovery.k8s.io/v1", "discovery.k8s.io/v1beta1", 1),
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "apiVersion"},
			wantMsg: `test.yaml: document 1: apiVersion: "discovery.k8s.io/v1beta1" is not read; kind EndpointSlice needs apiVersion discovery.k8s.io/v1`,
		},
		{
			name:    "kind without apiVersion",
			in:      "kind: Service\nmetadata: {name: web}\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "apiVersion"},
			wantMsg: "test.yaml: document 1: apiVersion: missing; kind Service needs apiVersion v1",
		},
		{
			name:    "apiVersion without kind",
			in:      "apiVersion: v1\nmetadata: {name: web}\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "kind"},
			wantMsg: `test.yaml: document 1: kind: missing (apiVersion "v1"); want Service (v1), EndpointSlice (discovery.k8s.io/v1), or a List, ServiceList or EndpointSliceList of them`,
		},
		{
			name:    "endpoints are not read",
			in:      "apiVersion: v1\nkind: Endpoints\nmetadata: {name: web}\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "kind"},
			wantMsg: `test.yaml: document 1: kind: "Endpoints" is not read (apiVersion "v1"); want Service (v1), EndpointSlice (discovery.k8s.io/v1), or a List, ServiceList or EndpointSliceList of them`,
		},
		{
			name:    "kind not a string",
			in:      "apiVersion: v1\nkind: 3\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "kind"},
			wantMsg: "test.yaml: document 1: kind: want a string, got a number",
		},
		{
			name:    "list item of another kind",
			in:      "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Pod, metadata: {name: p}}\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "items[0].kind"},
			wantMsg: `test.yaml: document 1: items[0].kind: "Pod" is not read (apiVersion "v1"); want Service (v1), EndpointSlice (discovery.k8s.io/v1), or a List, ServiceList or EndpointSliceList of them`,
		},
		{
			name:    "list item without a kind",
			in:      "apiVersion: v1\nkind: List\nitems:\n- {metadata: {name: p}}\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "items[0].kind"},
			wantMsg: `test.yaml: document 1: items[0].kind: missing (apiVersion ""); want Service (v1), EndpointSlice (discovery.k8s.io/v1), or a List, ServiceList or EndpointSliceList of them`,
		},
		{
			name:    "list in a list",
			in:      "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: List, items: []}\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "items[0].kind"},
			wantMsg: "test.yaml: document 1: items[0].kind: a list in a list is not read; want Service (v1), EndpointSlice (discovery.k8s.io/v1), or a List, ServiceList or EndpointSliceList of them",
		},
		{
			name:    "service list holding a slice",
			in:      "apiVersion: v1\nkind: ServiceList\nitems:\n" + asItems(webSliceOld),
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "items[0].kind"},
			wantMsg: `test.yaml: document 1: items[0].kind: a ServiceList holds kind Service, not "EndpointSlice"`,
		},
		{
			name:    "items not a list",
			in:      "apiVersion: v1\nkind: List\nitems: {a: b}\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "items"},
			wantMsg: "test.yaml: document 1: items: want a list, got an object",
		},
		{
			name:    "item not an object",
			in:      "apiVersion: v1\nkind: List\nitems: [web]\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "items[0]"},
			wantMsg: "test.yaml: document 1: items[0]: want an object, got a string",
		},
		{
			name:    "port as a string",
			in:      svcHead + "spec: {ports: [{port: \"80\"}]}\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "spec.ports[0].port"},
			wantMsg: "test.yaml: document 1: spec.ports[0].port: want a number, got a string",
		},
		{
			name:    "port out of range of int32",
			in:      svcHead + "spec: {ports: [{port: 4294967376}]}\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "spec.ports[0].port"},
			wantMsg: "test.yaml: document 1: spec.ports[0].port: want a whole number from -2147483648 to 2147483647, got 4294967376",
		},
		{
			// IntOrString decodes a non-string as an int32, and says so.
			name:    "target port neither number nor string",
			in:      svcHead + "spec: {ports: [{port: 80, targetPort: true}]}\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "spec.ports[0].targetPort"},
			wantMsg: "test.yaml: document 1: spec.ports[0].targetPort: want a number, got a boolean",
		},
		{
			name:    "target port not a whole number, in the third port",
			in:      svcHead + "spec: {ports: [{port: 80}, {port: 81, targetPort: http}, {port: 82, targetPort: 8.5}]}\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "spec.ports[2].targetPort"},
			wantMsg: "test.yaml: document 1: spec.ports[2].targetPort: want a whole number from -2147483648 to 2147483647, got 8.5",
		},
		{
			name:    "label value that yaml reads as a boolean",
			in:      "apiVersion: v1\nkind: Service\nmetadata: {name: web, labels: {app: web, canary: yes}}\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "metadata.labels.canary"},
			wantMsg: "test.yaml: document 1: metadata.labels.canary: want a string, got a boolean",
		},
		{
			name:    "label value that is a number, under a key with dots",
			in:      "apiVersion: v1\nkind: Service\nmetadata: {name: web, labels: {app.kubernetes.io/version: 1.2}}\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: `metadata.labels["app.kubernetes.io/version"]`},
			wantMsg: `test.yaml: document 1: metadata.labels["app.kubernetes.io/version"]: want a string, got a number`,
		},
		{
			name:    "bad timestamp",
			in:      "apiVersion: v1\nkind: Service\nmetadata: {name: web, creationTimestamp: yesterday}\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "metadata.creationTimestamp"},
			wantMsg: `test.yaml: document 1: metadata.creationTimestamp: want an RFC 3339 time such as 2006-01-02T15:04:05Z, got "yesterday"`,
		},
		{
			name: "bad timestamp in the second managed fields entry of a list item",
			in: "apiVersion: v1\nkind: List\nitems:\n" + asItems(webService, "apiVersion: v1\nkind: Service\nmetadata:\n  name: db\n  managedFields:\n"+
				"  - {manager: kubectl, operation: Update, time: \"2026-03-02T09:31:12Z\", fieldsV1: {f:spec: {}}}\n"+
				"  - {manager: kubectl, operation: Update, time: \"2026-03-02 09:31\"}\n"),
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "items[1].metadata.managedFields[1].time"},
			wantMsg: `test.yaml: document 1: items[1].metadata.managedFields[1].time: want an RFC 3339 time such as 2006-01-02T15:04:05Z, got "2026-03-02 09:31"`,
		},
		{
			name:    "timestamp not a string",
			in:      "apiVersion: v1\nkind: Service\nmetadata: {name: web, creationTimestamp: 1767225600}\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "metadata.creationTimestamp"},
			wantMsg: "test.yaml: document 1: metadata.creationTimestamp: want a string, got a number",
		},
		{
			name:    "a bad value is reported before an unknown field",
			in:      svcHead + "spec: {clusterIP: 198.19.0.10, ports: [{port: 80, prot: UDP}], sessionAffinity: [ClientIP]}\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "spec.sessionAffinity"},
			wantMsg: "test.yaml: document 1: spec.sessionAffinity: want a string, got a list",
		},
		{
			name:    "of several bad values the first in key order",
			in:      svcHead + "spec: {sessionAffinity: 1, clusterIP: 2, ports: [{port: x}]}\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "spec.clusterIP"},
			wantMsg: "test.yaml: document 1: spec.clusterIP: want a string, got a number",
		},
		{
			name:    "several unknown fields",
			in:      svcHead + "spec: {clusterIP: 198.19.0.10, ClusterIP: x, ports: [{port: 80, Protocol: UDP}]}\nstatus: {loadbalancer: {}}\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "spec.ClusterIP"},
			wantMsg: "test.yaml: document 1: spec.ClusterIP: unknown field (also spec.ports[0].Protocol, status.loadbalancer)",
		},
		{
			name: "many unknown fields",
			in:   svcHead + "spec: {a: 1, b: 2, c: 3, d: 4, e: 5, f: 6, g: 7, h: 8}\n",
			want: Error{Source: "test.yaml", Document: 1, Line: 1, Path: "spec.a"},
			wantMsg: "test.yaml: document 1: spec.a: unknown field " +
				"(also spec.b, spec.c, spec.d, spec.e, spec.f, and 2 more)",
		},
		{
			name:    "several unknown fields in a list item",
			in:      "apiVersion: v1\nkind: List\nitems:\n" + asItems(webService, strings.Replace(webSliceOld, "nodeName:", "nodename:", 2)),
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "items[1].endpoints[0].nodename"},
			wantMsg: "test.yaml: document 1: items[1].endpoints[0].nodename: unknown field (also items[1].endpoints[1].nodename)",
		},
		{
			name:    "spec not an object",
			in:      svcHead + "spec: [a]\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "spec"},
			wantMsg: "test.yaml: document 1: spec: want an object, got a list",
		},
		{
			name:    "conditions not booleans",
			in:      strings.Replace(webSliceOld, "{ready: true}", "{ready: \"true\"}", 1),
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "endpoints[0].conditions.ready"},
			wantMsg: "test.yaml: document 1: endpoints[0].conditions.ready: want true or false, got a string",
		},
		{
			name:    "service without a name",
			in:      "apiVersion: v1\nkind: Service\nmetadata: {namespace: shop}\n",
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "metadata.name"},
			wantMsg: "test.yaml: document 1: metadata.name: missing; Service objects need a name",
		},
		{
			name:    "slice without a name in a list",
			in:      asItems(webService, "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\n"),
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "[1].metadata.name"},
			wantMsg: "test.yaml: document 1: [1].metadata.name: missing; EndpointSlice objects need a name",
		},
		{
			name:    "a service twice, the second time in its default namespace",
			in:      "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\n---\n" + svcHead,
			want:    Error{Source: "test.yaml", Document: 2, Line: 5},
			wantMsg: "test.yaml: document 2 (line 5): Service default/web appears twice (first in test.yaml: document 1)",
		},
		{
			name:    "a slice twice in a list",
			in:      asItems(webSliceOld, webSliceOld),
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "[1]"},
			wantMsg: "test.yaml: document 1: [1]: EndpointSlice shop/web-old appears twice (first in test.yaml: document 1)",
		},
		{
			name:    "a cluster IP that is no IP",
			in:      "apiVersion: v1\nkind: List\nitems:\n" + asItems(strings.Replace(webService, "198.19.0.10", "198.19.0.300", 1)),
			want:    Error{Source: "test.yaml", Document: 1, Line: 1, Path: "items[0]"},
			wantMsg: `test.yaml: document 1: items[0]: service shop/web: cluster IP "198.19.0.300": ParseAddr("198.19.0.300"): IPv4 field has value >255`,
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
