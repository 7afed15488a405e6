package manifest_test

import (
	"github.com/vipd/vipd/internal/testkit/fuzzcorpus"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzLoad's seed corpus is committed in testdata/fuzz/FuzzLoad/, where
// "go test" runs it as ordinary test cases and "go test -fuzz" starts from
// it. The named seeds are written from the values below; files with other
// names are inputs the fuzzer found, kept as regression cases.
// TestFuzzCorpus checks that the committed files are what the values give;
// to rewrite them after changing a value, run
//
//	VIPD_WRITE_FUZZ_CORPUS=1 go test -run TestFuzzCorpus ./internal/manifest/

// The README's grpcurl example body, as JSON.
const readmeJSON = `{"name": "default/web", "vips": ["198.19.0.10"],
  "ports": [{"port": 80, "target_port": 8080}],
  "backends": [{"ip": "198.18.1.10"}, {"ip": "198.18.1.11", "weight": 2}]}`

// What "vipctl service get default/web -o yaml" prints for it.
const printedYAML = `backends:
- ip: 198.18.1.10
  state: BACKEND_STATE_READY
  weight: 1
- ip: 198.18.1.11
  state: BACKEND_STATE_READY
  weight: 2
generation: "7"
internal_traffic_policy: TRAFFIC_POLICY_CLUSTER
load_balancing: LOAD_BALANCING_RANDOM
name: default/web
owner: default
ports:
- port: 80
  protocol: PROTOCOL_TCP
  target_port: 8080
session_affinity:
  mode: SESSION_AFFINITY_NONE
vips:
- 198.19.0.10
`

const kubernetes = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 198.19.0.10
  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-abc
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
endpoints:
- addresses: [198.18.1.10]
  conditions: {ready: true}
ports: [{name: http, port: 8080}]
`

func loadSeeds(t *testing.T) map[string]string {
	example, err := os.ReadFile(filepath.Join("..", "..", "examples", "web.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	kubectl, err := os.ReadFile(filepath.Join("testdata", "kubernetes.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var deep strings.Builder
	for range 5000 {
		deep.WriteString("[")
	}
	return map[string]string{
		"examples-web":     string(example),
		"readme-json":      readmeJSON,
		"printed-yaml":     printedYAML,
		"json-list":        "[" + readmeJSON + `, {"name": "default/api", "vips": ["198.19.0.20"], "ports": [{"port": 443, "targetPort": 8443}]}]`,
		"services-wrapper": `{"services": [` + readmeJSON + `]}`,
		"services-yaml":    "services:\n- name: a\n  vips: [198.19.0.1]\n  ports: [{port: 53, protocol: udp}]\n",
		"empty-list":       "[]\n",
		"services-null":    "services: null\n",
		"empty":            "",
		"only-comments":    "# nothing here\n---\n# nor here\n",
		"multi-document": "---\nname: a\nvips: [198.19.0.1]\nports: [{port: 80}]\n---   \n\n--- \n- name: b\n  vips: [\"fd00:198::1\"]\n  ports: [{port: 443}]\n" +
			"  backends: [{ip: \"fd00:198:1::1\", state: not-serving}, {ip: fd00:198:1::2, state: NotServing}]\n",
		"crlf":         "name: a\r\nvips: [198.19.0.1]\r\nports:\r\n- port: 80\r\n---\r\nname: b\r\nvips: [198.19.0.2]\r\nports: [{port: 81}]\r\n",
		"kubernetes":   kubernetes,
		"kubectl-list": string(kubectl),
		"kubernetes-typed-lists": "apiVersion: v1\nkind: ServiceList\nitems:\n- metadata: {name: dns, namespace: kube-system}\n" +
			"  spec: {clusterIPs: [198.19.0.53, \"fd00:198:19::35\"], ports: [{name: dns, port: 53, protocol: UDP, targetPort: dns}]}\n" +
			"---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSliceList\nitems:\n" +
			"- metadata: {name: dns-1, namespace: kube-system, labels: {kubernetes.io/service-name: dns}}\n" +
			"  addressType: IPv6\n  endpoints: [{addresses: [\"fd00:198:2::5\"], nodeName: node-a}]\n  ports: [{name: dns, port: 5353, protocol: UDP}]\n",
		"kubernetes-skipped": "- {apiVersion: v1, kind: Service, metadata: {name: db}, spec: {clusterIP: None}}\n" +
			"- {apiVersion: v1, kind: Service, metadata: {name: mail}, spec: {type: ExternalName, externalName: mail.example.net}}\n" +
			"- {apiVersion: discovery.k8s.io/v1, kind: EndpointSlice, metadata: {name: gone-1, labels: {kubernetes.io/service-name: gone}}, addressType: IPv4}\n",
		"kubernetes-unknown-field": "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {clusterIP: 198.19.0.10, ports: [{port: 80, targetPort: true, prot: x}]}\n",
		"kubernetes-bad-values": "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Service, metadata: {name: a, labels: {app.kubernetes.io/name: 1}}}\n" +
			"- {apiVersion: v1, kind: Service, metadata: {name: b, managedFields: [{time: yesterday}]}, spec: {ports: [{port: 80}, {port: 8.5}]}}\n",
		"mixed-kinds": "name: a\nvips: [198.19.0.1]\nports: [{port: 80}]\n---\nkind: Service\n",
		"all-fields": `name: team/dns
owner: nomad
vips: [10.96.0.53, "fd00:96::53"]
ports:
- {name: dns, protocol: udp, port: 53, target_port: 5353}
- {name: dns-tcp, protocol: PROTOCOL_TCP, port: 53, targetPort: 5353}
- {name: sig, protocol: sctp, port: 3868}
backends:
- {ip: 198.18.3.1, ports: {dns: 5300}, state: terminating, weight: 65535, node_local: true, zone: z1}
- {ip: "fd00:198:1::2", nodeLocal: false, state: 3}
session_affinity: {mode: client-ip, timeoutSeconds: 86400}
internal_traffic_policy: local
loadBalancing: maglev
labels: {app: dns}
generation: 42
`,
		"unknown-field":   "name: a\nvips: [198.19.0.1]\nports: [{port: 80, prot: udp}]\n",
		"bad-enum":        "name: a\nvips: [198.19.0.1]\nports: [{port: 80, protocol: icmp}]\nbackends: [{ip: 198.18.0.1, state: dead}]\n",
		"wrong-types":     "name: 7\nvips: 198.19.0.1\nports: {port: 80}\nbackends: [{ip: 198.18.0.1, weight: -1}, 3]\nlabels: [a]\n",
		"numbers":         `{"name": "a", "vips": ["198.19.0.1"], "ports": [{"port": 1e3}, {"port": "81"}, {"port": 4294967296}, {"port": 80.5}]}`,
		"json-with-tabs":  "{\n\t\"name\": \"a\",\n\t\"vips\": [\"198.19.0.1\"],\n\t\"ports\": [{\"port\": 80}]\n}\n",
		"json-trailing":   `{"name": "a"} {"name": "b"}`,
		"yaml-error":      "name: a\nvips: [198.19.0.1\nports: :\n",
		"anchors":         "- &svc {name: a, vips: [198.19.0.1], ports: [{port: 80}]}\n- *svc\n- {<<: *svc, name: b}\n",
		"billion-laughs":  "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\nname: [*d, *d, *d, *d, *d, *d, *d, *d, *d]\n",
		"deep-nesting":    deep.String(),
		"yaml-specials":   "name: a\nvips: [198.19.0.1]\nports: [{port: 80}]\nlabels: {\"yes\": no, \"on\": off, \"null\": ~, \"0x10\": 1e3, \"<<\": \"=\", \"\": \"\", \"- x\": \"a: b\", \"#\": \"!tag\"}\n",
		"not-utf8":        "name: \"\xff\xfe\"\nvips: [198.19.0.1]\nports: [{port: 80}]\n",
		"duplicate-keys":  "name: a\nname: b\nvips: [198.19.0.1]\nports: [{port: 80}]\n",
		"scalar-document": "42\n",
		"null-items":      "[null, {name: a, vips: [198.19.0.1], ports: [{port: 80}]}]\n",
		"control-chars":   "[{\"backends\":[{\"ip\":\"\x7f\"}]}, {\"name\": \"a\", \"vips\": [\"198.19.0.1\"], \"ports\": [{\"port\": 80}], \"labels\": {\"k\": \"\\u0007\"}}]",
	}
}

func TestFuzzCorpus(t *testing.T) {
	seeds := map[string][][]byte{}
	for name, seed := range loadSeeds(t) {
		seeds[name] = [][]byte{[]byte(seed)}
	}
	fuzzcorpus.Check(t, "FuzzLoad", seeds)
}
