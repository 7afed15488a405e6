package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vipd/vipd/internal/testkit/testserver"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/protobuf/testing/protocmp"
)

// kubectlOutput is what "kubectl get svc,endpointslices -A -o yaml" printed
// for a small dual-stack cluster (see internal/manifest).
var kubectlOutput = filepath.Join("..", "manifest", "testdata", "kubernetes.yaml")

// kubectlNotes is what apply says on standard error about what it left
// out of kubectlOutput.
const kubectlNotes = `note: skipped Service default/db: it is headless (clusterIP: None): DNS serves its endpoints directly
note: skipped Service default/mail: it is of type ExternalName: DNS serves it
note: EndpointSlice default/legacy-x2x7b: no Service default/legacy in the input; ignored
`

const (
	ready       = vipdv1.BackendState_BACKEND_STATE_READY
	terminating = vipdv1.BackendState_BACKEND_STATE_TERMINATING
	notServing  = vipdv1.BackendState_BACKEND_STATE_NOT_SERVING
	tcp         = vipdv1.Protocol_PROTOCOL_TCP
	udp         = vipdv1.Protocol_PROTOCOL_UDP
)

// stored form of a service: vipd's defaults filled in.
func storedForm(s *vipdv1.Service, owner string, generation uint64) *vipdv1.Service {
	s.Owner = owner
	s.Generation = generation
	for _, p := range s.Ports {
		if p.TargetPort == 0 {
			p.TargetPort = p.Port
		}
	}
	for _, b := range s.Backends {
		b.Weight = 1
	}
	if s.InternalTrafficPolicy == vipdv1.TrafficPolicy_TRAFFIC_POLICY_UNSPECIFIED {
		s.InternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER
	}
	if s.ExternalTrafficPolicy == vipdv1.TrafficPolicy_TRAFFIC_POLICY_UNSPECIFIED {
		s.ExternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER
	}
	if s.LoadBalancing == vipdv1.LoadBalancing_LOAD_BALANCING_UNSPECIFIED {
		s.LoadBalancing = vipdv1.LoadBalancing_LOAD_BALANCING_RANDOM
	}
	if s.SessionAffinity == nil {
		s.SessionAffinity = &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_NONE}
	}
	return s
}

// kubectlServices are the services of kubectlOutput as vipd stores them
// when applied for node-a.
func kubectlServices(owner string) []*vipdv1.Service {
	return []*vipdv1.Service{
		storedForm(&vipdv1.Service{
			Name:  "default/kubernetes",
			Vips:  []string{"198.19.0.1"},
			Ports: []*vipdv1.Port{{Name: "https", Protocol: tcp, Port: 443, TargetPort: 6443}},
			Backends: []*vipdv1.Backend{
				{Ip: "198.18.0.2", Ports: map[string]uint32{"https": 6443}, State: ready, OnlyNamedPorts: true},
			},
		}, owner, 1),
		storedForm(&vipdv1.Service{
			Name: "default/web",
			Vips: []string{"198.19.0.10", "fd00:198:19::a"},
			// http targets the pods' port named http: each backend names its number.
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
		}, owner, 2),
		storedForm(&vipdv1.Service{
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
		}, owner, 3),
	}
}

// checkStored compares the services vipd stores under the names of want;
// a generation of 0 in want matches any.
func checkStored(t *testing.T, vipd *testserver.Server, want []*vipdv1.Service) {
	t.Helper()
	for _, w := range want {
		opts := cmp.Options{protocmp.Transform()}
		if w.GetGeneration() == 0 {
			opts = append(opts, protocmp.IgnoreFields(w, "generation"))
		}
		if diff := cmp.Diff(w, stored(t, vipd, w.GetName()), opts...); diff != "" {
			t.Errorf("stored service %s (-want +got):\n%s", w.GetName(), diff)
		}
	}
}

func TestApplyKubernetes(t *testing.T) {
	vipd := testserver.Start(t)
	sock := vipd.Socket()

	vipctl(t, sock, "", "apply", "-f", kubectlOutput, "--node-name", "node-a").check(t, `service/default/kubernetes created (generation 1)
service/default/web created (generation 2)
service/kube-system/kube-dns created (generation 3)
`, kubectlNotes, ExitOK)
	checkStored(t, vipd, kubectlServices("default"))
	for _, name := range []string{"default/db", "default/mail", "default/legacy"} {
		if got := stored(t, vipd, name); got != nil {
			t.Errorf("%s was applied: %v", name, got)
		}
	}

	// Again, from standard input: the same services, so vipd keeps their
	// generations.
	data, err := os.ReadFile(kubectlOutput)
	if err != nil {
		t.Fatal(err)
	}
	vipctl(t, sock, string(data), "apply", "-f", "-", "--node-name", "node-a").check(t, `service/default/kubernetes unchanged (generation 1)
service/default/web unchanged (generation 2)
service/kube-system/kube-dns unchanged (generation 3)
`, kubectlNotes, ExitOK)
}

// TestApplyKubernetesAcrossFiles applies a Service and its EndpointSlices
// from separate files, with a vipd service in one of them.
func TestApplyKubernetesAcrossFiles(t *testing.T) {
	vipd := testserver.Start(t)
	svc := writeFile(t, "svc.yaml", `name: team/plain
vips: [198.19.1.1]
ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: api}
spec:
  clusterIP: 198.19.0.20
  ports: [{name: grpc, port: 443, targetPort: grpc}, {name: admin, port: 8000, targetPort: 8000}]
`)
	slices := writeFile(t, "slices.yaml", `apiVersion: discovery.k8s.io/v1
kind: EndpointSliceList
items:
- metadata: {name: api-1, labels: {kubernetes.io/service-name: api}}
  addressType: IPv4
  endpoints:
  - {addresses: [198.18.5.1]}
  - {addresses: [198.18.5.2], conditions: {ready: false, serving: true, terminating: true}}
  ports: [{name: grpc, port: 9443}, {name: admin, port: 8000}]
- metadata: {name: api-2, labels: {kubernetes.io/service-name: api}}
  addressType: IPv4
  endpoints: [{addresses: [198.18.5.3]}]
  ports: [{name: grpc, port: 10443}]
`)
	vipctl(t, vipd.Socket(), "", "apply", "-f", slices, "-f", svc).check(t,
		"service/team/plain created (generation 1)\nservice/default/api created (generation 2)\n", "", ExitOK)
	checkStored(t, vipd, []*vipdv1.Service{storedForm(&vipdv1.Service{
		Name: "default/api",
		Vips: []string{"198.19.0.20"},
		Ports: []*vipdv1.Port{
			{Name: "grpc", Protocol: tcp, Port: 443},
			{Name: "admin", Protocol: tcp, Port: 8000, TargetPort: 8000},
		},
		Backends: []*vipdv1.Backend{
			{Ip: "198.18.5.1", Ports: map[string]uint32{"grpc": 9443, "admin": 8000}, State: ready, OnlyNamedPorts: true},
			{Ip: "198.18.5.2", Ports: map[string]uint32{"grpc": 9443, "admin": 8000}, State: terminating, OnlyNamedPorts: true},
			// Its slice lists no admin port: it serves grpc only.
			{Ip: "198.18.5.3", Ports: map[string]uint32{"grpc": 10443}, State: ready, OnlyNamedPorts: true},
		},
	}, "default", 2)})
	// vipd stores grpc's target_port as 443, which no pod listens on: the
	// named targetPort resolves to 9443 and 10443, so vipctl says
	// per-backend.
	vipctl(t, vipd.Socket(), "", "service", "list", "--owner", "default").check(t, `NAME         OWNER    VIPS         PORTS                         BACKENDS  AFFINITY  GEN
default/api  default  198.19.0.20  443/TCP→per-backend,8000/TCP  2/3       none      2
team/plain   default  198.19.1.1   80/TCP                        0/0       none      1
`, "", ExitOK)
}

func TestApplyKubernetesPrune(t *testing.T) {
	vipd := testserver.Start(t)
	sock := vipd.Socket()
	vipctl(t, sock, "name: x\nvips: [198.19.9.9]\nports: [{port: 80}]\n", "apply", "-f", "-", "--owner", "other").checkCode(t, ExitOK)

	// Converted services have no owner: --owner gives them one.
	vipctl(t, sock, "", "apply", "-f", kubectlOutput, "--owner", "k8s-file", "--prune", "--node-name", "node-a").check(t, `service/default/kubernetes created
service/default/web created
service/kube-system/kube-dns created
owner k8s-file: 3 created, 0 configured, 0 deleted, 0 unchanged
`, kubectlNotes, ExitOK)
	want := kubectlServices("k8s-file")
	for i, s := range want {
		s.Generation = uint64(i + 2) // x has generation 1
	}
	checkStored(t, vipd, want)

	// The web pods moved: only web is left, with one new endpoint.
	web := writeFile(t, "web.yaml", `apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIPs: [198.19.0.10, "fd00:198:19::a"]
  ports: [{name: http, port: 80, targetPort: http}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-z, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: [198.18.1.20], nodeName: node-b}]
ports: [{name: http, port: 8082}]
`)
	vipctl(t, sock, "", "apply", "-f", web, "--owner", "k8s-file", "--prune", "--node-name", "node-a").check(t, `service/default/web configured
service/default/kubernetes deleted
service/kube-system/kube-dns deleted
owner k8s-file: 0 created, 1 configured, 2 deleted, 0 unchanged
`, "", ExitOK)
	checkStored(t, vipd, []*vipdv1.Service{storedForm(&vipdv1.Service{
		Name:     "default/web",
		Vips:     []string{"198.19.0.10", "fd00:198:19::a"},
		Ports:    []*vipdv1.Port{{Name: "http", Protocol: tcp, Port: 80}},
		Backends: []*vipdv1.Backend{{Ip: "198.18.1.20", Ports: map[string]uint32{"http": 8082}, State: ready, OnlyNamedPorts: true}},
	}, "k8s-file", 0)})
	for _, name := range []string{"default/kubernetes", "kube-system/kube-dns"} {
		if got := stored(t, vipd, name); got != nil {
			t.Errorf("%s was not pruned: %v", name, got)
		}
	}
	if stored(t, vipd, "x") == nil {
		t.Errorf("prune deleted another owner's service")
	}
}

// TestApplyKubernetesNodeName checks which endpoints are node-local for
// --node-name, $NODE_NAME and the host name.
func TestApplyKubernetesNodeName(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	host = strings.ToLower(host)
	file := writeFile(t, "local.yaml", fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: cache, namespace: infra}
spec:
  clusterIP: 198.19.0.70
  internalTrafficPolicy: Local
  ports: [{port: 6379, targetPort: 6379}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: cache-1, namespace: infra, labels: {kubernetes.io/service-name: cache}}
addressType: IPv4
endpoints:
- {addresses: [198.18.7.1], nodeName: node-a}
- {addresses: [198.18.7.2], nodeName: node-b}
- {addresses: [198.18.7.3], nodeName: %q}
ports: [{port: 6379}]
`, host))
	for _, tc := range []struct {
		name      string
		env       string
		args      []string
		wantLocal string // the IP of the node-local backend, or none
	}{
		{name: "flag", env: "node-a", args: []string{"--node-name", "node-b"}, wantLocal: "198.18.7.2"},
		{name: "NODE_NAME", env: "node-a", wantLocal: "198.18.7.1"},
		{name: "host name", env: "", wantLocal: "198.18.7.3"},
		{name: "empty flag", env: "node-a", args: []string{"--node-name", ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(NodeNameEnv, tc.env)
			vipd := testserver.Start(t)
			vipctl(t, vipd.Socket(), "", append([]string{"apply", "-f", file}, tc.args...)...).check(t,
				"service/infra/cache created (generation 1)\n", "", ExitOK)
			var backends []*vipdv1.Backend
			for _, ip := range []string{"198.18.7.1", "198.18.7.2", "198.18.7.3"} {
				backends = append(backends, &vipdv1.Backend{
					Ip: ip, Ports: map[string]uint32{"": 6379}, State: ready, NodeLocal: ip == tc.wantLocal, OnlyNamedPorts: true,
				})
			}
			checkStored(t, vipd, []*vipdv1.Service{storedForm(&vipdv1.Service{
				Name:                  "infra/cache",
				Vips:                  []string{"198.19.0.70"},
				Ports:                 []*vipdv1.Port{{Protocol: tcp, Port: 6379, TargetPort: 6379}},
				Backends:              backends,
				InternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL,
			}, "default", 1)})
		})
	}
}

func TestApplyKubernetesErrors(t *testing.T) {
	vipd := testserver.Start(t)
	sock := vipd.Socket()
	data, err := os.ReadFile(kubectlOutput)
	if err != nil {
		t.Fatal(err)
	}

	// Valid but for the typo in kube-dns, so that vipd would apply the
	// rest if it got them.
	const field = "    sessionAffinity: None\n    type: ClusterIP\n  status:\n    loadBalancer: {}\n- apiVersion: v1\n  kind: Service\n  metadata:\n    creationTimestamp: \"2026-03-02T09:31:12Z\""
	if !strings.Contains(string(data), field) {
		t.Fatalf("%s has no kube-dns sessionAffinity to misspell", kubectlOutput)
	}
	typo := writeFile(t, "typo.yaml", strings.Replace(string(data), field, strings.Replace(field, "sessionAffinity", "sessionAffinty", 1), 1))
	before := len(vipd.Dataplane().Records())
	vipctl(t, sock, "", "apply", "-f", typo).check(t, "",
		"Error: "+typo+": document 1: items[2].spec.sessionAffinty: unknown field\n", ExitInvalid)

	old := writeFile(t, "old.yaml", strings.ReplaceAll(string(data), "discovery.k8s.io/v1\n", "discovery.k8s.io/v1beta1\n"))
	vipctl(t, sock, "", "apply", "-f", old).check(t, "",
		"Error: "+old+`: document 1: items[5].apiVersion: "discovery.k8s.io/v1beta1" is not read; kind EndpointSlice needs apiVersion discovery.k8s.io/v1`+"\n", ExitInvalid)

	badIP := writeFile(t, "bad-ip.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: 198.19.0.256, ports: [{port: 80}]}\n")
	vipctl(t, sock, "", "apply", "-f", badIP).check(t, "",
		"Error: "+badIP+`: document 1: service default/a: cluster IP "198.19.0.256": ParseAddr("198.19.0.256"): IPv4 field has value >255`+"\n", ExitInvalid)
	if len(vipd.Dataplane().Records()) != before {
		t.Errorf("a bad file reached vipd")
	}

	// A Service and a vipd service of the same name.
	dup := writeFile(t, "dup.yaml", "name: default/a\nvips: [198.19.0.1]\nports: [{port: 80}]\n---\n"+
		"apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: 198.19.0.2, ports: [{port: 80}]}\n")
	vipctl(t, sock, "", "apply", "-f", dup).check(t, "",
		"Error: "+dup+`: document 2 (line 5, service "default/a"): service "default/a" appears more than once in the files (first in `+dup+": document 1)\n", ExitInvalid)
}

func TestApplyHelpNamesNodeName(t *testing.T) {
	r := vipctl(t, "", "", "apply", "--help")
	r.checkCode(t, ExitOK)
	for _, want := range []string{"EndpointSlices", "--node-name string", "(default $NODE_NAME, else the host name in lower case)", "left out, with a note on"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("apply --help does not say %q:\n%s", want, r.stdout)
		}
	}
}
