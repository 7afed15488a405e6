package cli

import (
	"testing"

	"github.com/vipd/vipd/internal/testkit/testserver"
)

// TestExternalApplyAndGet checks that apply -f takes the external fields
// in vipd's own format and that service get and list show them.
func TestExternalApplyAndGet(t *testing.T) {
	vipd := testserver.Start(t)
	sock := vipd.Socket()
	lb := writeFile(t, "lb.yaml", `
name: default/ingress
vips: [10.96.0.10]
ports:
- {name: http, port: 80, target_port: 8080, node_port: 30080}
- {name: dns, protocol: udp, port: 53, node_port: 30053}
external_ips: [198.19.5.1]
load_balancer_ips: [198.19.6.1]
load_balancer_source_ranges: [198.18.7.9/24]
external_traffic_policy: local
health_check_node_port: 32000
backends: [{ip: 10.0.1.5, node_local: true}]
`)
	vipctl(t, sock, "", "apply", "-f", lb).check(t, "service/default/ingress created (generation 1)\n", "", ExitOK)
	vipctl(t, sock, "", "service", "get", "default/ingress").check(t, `Name:                     default/ingress
Owner:                    default
Generation:               1
VIPs:                     10.96.0.10
Ports:                    http 80:30080/TCP→8080, dns 53:30053/UDP
Session affinity:         none
Internal traffic policy:  cluster
External IPs:             198.19.5.1
Load-balancer IPs:        198.19.6.1
Source ranges:            198.18.7.0/24
External traffic policy:  local
Health-check node port:   32000/TCP
Load balancing:           random
Labels:                   -
Backends:                 1 ready of 1
  IP        STATE  WEIGHT  NODE-LOCAL  ZONE  PORTS
  10.0.1.5  ready  1       true        -     -
`, "", ExitOK)
	vipctl(t, sock, "", "service", "list").check(t, `NAME             OWNER    VIPS        PORTS                           BACKENDS  AFFINITY  GEN
default/ingress  default  10.96.0.10  80:30080/TCP→8080,53:30053/UDP  1/1       none      1
`, "", ExitOK)
	// What get -o yaml prints applies back unchanged.
	out := vipctl(t, sock, "", "-o", "yaml", "service", "get", "default/ingress")
	out.checkCode(t, ExitOK)
	vipctl(t, sock, out.stdout, "apply", "-f", "-").check(t, "service/default/ingress unchanged (generation 1)\n", "", ExitOK)

	// A node port alone shows the (default) external policy; a
	// ClusterIP-only service shows no external field (see
	// TestApplyListGetDelete).
	vipctl(t, sock, "name: np\nvips: [10.96.0.11]\nports: [{port: 80, node_port: 30081}]\n", "apply", "-f", "-").checkCode(t, ExitOK)
	vipctl(t, sock, "", "service", "get", "np").check(t, `Name:                     np
Owner:                    default
Generation:               2
VIPs:                     10.96.0.11
Ports:                    80:30081/TCP
Session affinity:         none
Internal traffic policy:  cluster
External traffic policy:  cluster
Load balancing:           random
Labels:                   -
Backends:                 0 ready of 0
`, "", ExitOK)

	// vipd's errors name the field in the file.
	bad := writeFile(t, "bad.yaml", "name: x\nvips: [10.96.0.12]\nports: [{port: 80}]\nhealth_check_node_port: 32001\n")
	vipctl(t, sock, "", "apply", "-f", bad).check(t, "",
		"Error: "+bad+": document 1 (service \"x\"): health_check_node_port: may be set only with external_traffic_policy TRAFFIC_POLICY_LOCAL\n", ExitInvalid)
	taken := writeFile(t, "taken.yaml", "name: x\nvips: [10.96.0.12]\nports: [{port: 80, node_port: 32000}]\n")
	vipctl(t, sock, "", "apply", "-f", taken).check(t, "",
		"Error: "+taken+": document 1 (service \"x\"): AlreadyExists: service x: node port 32000/TCP (its ports[0].node_port) is already used by service default/ingress (its health_check_node_port)\n", ExitConflict)
}

// TestExternalClaimsAcrossDocuments checks that two documents of the files
// that claim one node port, or one external address and port, or that use
// an address as an external IP and as a VIP or a backend, are an error
// before anything is sent; and that a node port may move from one service
// to another when the one that gives it up comes first.
func TestExternalClaimsAcrossDocuments(t *testing.T) {
	vipd := testserver.Start(t)
	sock := vipd.Socket()
	for _, tc := range []struct {
		name, file, stderr string
	}{
		{"one node port twice", `
- {name: a, vips: [10.96.0.7], ports: [{port: 80, node_port: 30080}]}
- {name: b, vips: [10.96.0.8], ports: [{port: 8080, node_port: 30080}]}
`, `document 1 (service "b"): [1].ports[0].node_port: node port 30080/TCP is also claimed by service "a" (FILE: document 1); nothing was applied`},
		{"a health-check node port that is a node port", `
- {name: a, vips: [10.96.0.7], ports: [{port: 80, node_port: 30080}]}
- {name: b, vips: [10.96.0.8], ports: [{port: 80}], external_traffic_policy: local, health_check_node_port: 30080}
`, `document 1 (service "b"): [1].health_check_node_port: node port 30080/TCP is also claimed by service "a" (FILE: document 1); nothing was applied`},
		{"one load-balancer IP and port twice", `
- {name: a, vips: [10.96.0.7], ports: [{port: 80}], load_balancer_ips: [198.19.6.1]}
- {name: b, vips: [10.96.0.8], ports: [{port: 80}], external_ips: [198.19.6.1]}
`, `document 1 (service "b"): [1].external_ips[0]: 198.19.6.1:80/TCP is also claimed by service "a" (FILE: document 1); nothing was applied`},
		{"an external IP that is a VIP of another", `
- {name: a, vips: [10.96.0.7], ports: [{port: 80}]}
- {name: b, vips: [10.96.0.8], ports: [{port: 81}], external_ips: [10.96.0.7]}
`, `document 1 (service "b"): [1].external_ips[0]: 10.96.0.7 is a VIP of service "a" (FILE: document 1), which cannot be an external IP; nothing was applied`},
		{"a backend that is a load-balancer IP of another", `
- {name: a, vips: [10.96.0.7], ports: [{port: 80}], load_balancer_ips: [198.19.6.1]}
- {name: b, vips: [10.96.0.8], ports: [{port: 80}], backends: [{ip: 198.19.6.1}]}
`, `document 1 (service "b"): [1].backends[0].ip: 198.19.6.1 is a load-balancer IP of service "a" (FILE: document 1), which cannot be a backend; nothing was applied`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := writeFile(t, "f.yaml", tc.file)
			before := len(vipd.Dataplane().Records())
			vipctl(t, sock, "", "apply", "-f", f).check(t, "", "Error: "+f+": "+replaceFile(tc.stderr, f)+"\n", ExitInvalid)
			if len(vipd.Dataplane().Records()) != before {
				t.Errorf("apply wrote part of a file with a conflict")
			}
		})
	}

	vipctl(t, sock, "name: a\nvips: [10.96.0.10]\nports: [{port: 80, node_port: 30080}]\nload_balancer_ips: [198.19.6.1]\n---\n"+
		"name: b\nvips: [10.96.0.11]\nports: [{port: 80}]\n", "apply", "-f", "-").checkCode(t, ExitOK)
	// b first: b cannot take the node port while a has it.
	reversed := writeFile(t, "reversed.yaml", "name: b\nvips: [10.96.0.11]\nports: [{port: 80, node_port: 30080}]\n---\n"+
		"name: a\nvips: [10.96.0.10]\nports: [{port: 80}]\n")
	vipctl(t, sock, "", "apply", "-f", reversed).check(t, "",
		"Error: "+reversed+": document 1 (service \"b\"): AlreadyExists: service b: node port 30080/TCP (its ports[0].node_port) is already used by service a (its ports[0].node_port)\n"+
			"Error: nothing was applied: vipd rejected 1 of 2 services (AlreadyExists)\n", ExitConflict)
	// a first: the node port moves to b, and a's load-balancer IP becomes
	// b's backend.
	moves := writeFile(t, "moves.yaml", "name: a\nvips: [10.96.0.10]\nports: [{port: 80}]\n---\n"+
		"name: b\nvips: [10.96.0.11]\nports: [{port: 80, node_port: 30080}]\n---\n"+
		"name: c\nvips: [10.96.0.12]\nports: [{port: 80}]\nbackends: [{ip: 198.19.6.1}]\n")
	vipctl(t, sock, "", "apply", "-f", moves, "--dry-run").check(t,
		"service/a configured (dry run)\nservice/b configured (dry run, once service a is written)\nservice/c created (dry run, once service a is written)\n", "", ExitOK)
	vipctl(t, sock, "", "apply", "-f", moves).check(t,
		"service/a configured (generation 3)\nservice/b configured (generation 4)\nservice/c created (generation 5)\n", "", ExitOK)
}

// replaceFile writes f for FILE in s.
func replaceFile(s, f string) string {
	out := ""
	for {
		i := indexOf(s, "FILE")
		if i < 0 {
			return out + s
		}
		out += s[:i] + f
		s = s[i+len("FILE"):]
	}
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}
