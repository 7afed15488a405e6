package cli

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/manifest"
	"github.com/vipd/vipd/internal/testkit/testserver"
	"github.com/vipd/vipd/internal/version"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/protobuf/testing/protocmp"
)

// result is what one vipctl run printed and returned.
type result struct {
	stdout, stderr string
	code           int
}

// vipctl runs the command line args against the vipd at sock, with stdin as
// standard input.
func vipctl(t *testing.T, sock, stdin string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	app := New(Streams{In: strings.NewReader(stdin), Out: &out, Err: &errb})
	if sock != "" {
		args = append([]string{"--socket", sock}, args...)
	}
	code := app.Run(context.Background(), args)
	return result{stdout: out.String(), stderr: errb.String(), code: code}
}

// check compares a run with the expected output and exit code.
func (r result) check(t *testing.T, wantStdout, wantStderr string, wantCode int) {
	t.Helper()
	if r.code != wantCode {
		t.Errorf("exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, wantCode, r.stdout, r.stderr)
	}
	if diff := cmp.Diff(wantStdout, r.stdout); diff != "" {
		t.Errorf("stdout (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantStderr, r.stderr); diff != "" {
		t.Errorf("stderr (-want +got):\n%s", diff)
	}
}

// checkCode checks only the exit code, for runs whose messages are checked
// elsewhere or depend on the system.
func (r result) checkCode(t *testing.T, want int) {
	t.Helper()
	if r.code != want {
		t.Errorf("exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, want, r.stdout, r.stderr)
	}
}

// writeFile writes a file in a temporary directory and returns its path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// stored returns the named service as vipd stores it, or nil if there is none.
func stored(t *testing.T, vipd *testserver.Server, name string) *vipdv1.Service {
	t.Helper()
	c, err := client.New(vipd.Target())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	svc, err := c.GetService(context.Background(), name)
	if client.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatalf("get service %s: %v", name, err)
	}
	return svc
}

// clockRE matches what status prints from vipd's clock: when the last sync
// finished and how long it took.
var clockRE = regexp.MustCompile(`\d{4}-\d\d-\d\dT[\d:.]+Z|\(took [^)]+\)|lastSyncDuration: \S+`)

// withoutClock replaces the clock's readings in out with TIME and DURATION,
// checking that each time lies between since and now.
func withoutClock(t *testing.T, out string, since time.Time) string {
	t.Helper()
	return clockRE.ReplaceAllStringFunc(out, func(m string) string {
		switch {
		case strings.HasPrefix(m, "(took "):
			return "(took DURATION)"
		case strings.HasPrefix(m, "lastSyncDuration: "):
			return "lastSyncDuration: DURATION"
		}
		at, err := time.Parse(time.RFC3339, m)
		if err != nil || at.Before(since.Truncate(time.Second)) || at.After(time.Now()) {
			t.Errorf("last sync at %s, want a time since %s (%v)", m, since.Format(time.RFC3339Nano), err)
		}
		return "TIME"
	})
}

const twoServices = `
name: default/web
vips: [10.96.0.10]
ports:
- {name: http, protocol: tcp, port: 80, target_port: 8080}
- {name: dns, protocol: udp, port: 53}
backends:
- {ip: 10.0.1.5, zone: z1, ports: {http: 8081}}
- {ip: 10.0.2.7, state: terminating, weight: 3, node_local: true}
session_affinity: {mode: client_ip, timeout_seconds: 600}
labels: {app: web}
---
name: kube-system/dns
owner: kube
vips: [10.96.0.53]
ports: [{port: 53, protocol: udp}]
`

func TestApplyListGetDelete(t *testing.T) {
	sock := testserver.Start(t).Socket()
	file := writeFile(t, "svc.yaml", twoServices)

	vipctl(t, sock, "", "service", "list").check(t,
		"NAME  OWNER  VIPS  PORTS  BACKENDS  AFFINITY  GEN\n", "", ExitOK)

	vipctl(t, sock, "", "apply", "-f", file).check(t, `service/default/web created (generation 1)
service/kube-system/dns created (generation 2)
`, "", ExitOK)

	vipctl(t, sock, "", "service", "list").check(t, `NAME             OWNER    VIPS        PORTS               BACKENDS  AFFINITY        GEN
default/web      default  10.96.0.10  80/TCP→8080,53/UDP  1/2       client-ip:600s  1
kube-system/dns  kube     10.96.0.53  53/UDP              0/0       none            2
`, "", ExitOK)

	vipctl(t, sock, "", "svc", "ls", "--owner", "kube").check(t, `NAME             OWNER  VIPS        PORTS   BACKENDS  AFFINITY  GEN
kube-system/dns  kube   10.96.0.53  53/UDP  0/0       none      2
`, "", ExitOK)

	vipctl(t, sock, "", "service", "get", "default/web").check(t, `Name:                     default/web
Owner:                    default
Generation:               1
VIPs:                     10.96.0.10
Ports:                    http 80/TCP→8080, dns 53/UDP
Session affinity:         client-ip:600s
Internal traffic policy:  cluster
Load balancing:           random
Labels:                   app=web
Backends:                 1 ready of 2
  IP        STATE        WEIGHT  NODE-LOCAL  ZONE  PORTS
  10.0.1.5  ready        1       false       z1    http=8081
  10.0.2.7  terminating  3       true        -     -
`, "", ExitOK)

	vipctl(t, sock, "", "service", "get", "nope").check(t, "",
		"Error: NotFound: service nope not found\n", ExitNotFound)

	vipctl(t, sock, "", "service", "delete", "default/web", "--expected-generation", "9").check(t, "",
		"Error: Aborted: service default/web: expected generation 9, but it is at generation 1\n", ExitConflict)
	vipctl(t, sock, "", "service", "delete", "default/web", "--expected-generation", "1").check(t,
		"service/default/web deleted\n", "", ExitOK)
	vipctl(t, sock, "", "service", "delete", "default/web").check(t, "",
		"Error: NotFound: service default/web not found\n", ExitNotFound)
}

func TestApplyOwnerAndGeneration(t *testing.T) {
	vipd := testserver.Start(t)
	sock := vipd.Socket()
	file := writeFile(t, "svc.yaml", "name: a\nvips: [10.96.0.1]\nports: [{port: 80}]\n---\nname: b\nowner: ctl\nvips: [10.96.0.2]\nports: [{port: 80}]\n")

	// What apply sends, in order: the owner filled in and the output-only
	// generation moved to the expected generation.
	docs, err := New(Streams{}).loadDocuments(manifest.Options{}, []string{writeFile(t, "gen.yaml", "name: a\ngeneration: 42\nvips: [10.96.0.1]\nports: [{port: 80}]\n")}, "ctl")
	if err != nil {
		t.Fatal(err)
	}
	want := &vipdv1.UpsertServiceRequest{
		Service:            &vipdv1.Service{Name: "a", Owner: "ctl", Vips: []string{"10.96.0.1"}, Ports: []*vipdv1.Port{{Port: 80}}},
		ExpectedGeneration: 42,
		TakeOwnership:      true,
	}
	if diff := cmp.Diff(want, docs[0].upsertRequest(applyOptions{takeOwnership: true}, false), protocmp.Transform()); diff != "" {
		t.Errorf("request apply sends (-want +got):\n%s", diff)
	}
	vipctl(t, sock, "", "apply", "-f", file, "--owner", "ctl").check(t,
		"service/a created (generation 1)\nservice/b created (generation 2)\n", "", ExitOK)
	for _, name := range []string{"a", "b"} {
		if got := stored(t, vipd, name).GetOwner(); got != "ctl" {
			t.Errorf("service %s is stored with owner %q, want ctl", name, got)
		}
	}

	vipctl(t, sock, "", "apply", "-f", file, "--owner", "other").check(t, "",
		"Error: "+file+": document 2 (line 5, service \"b\"): owner: \"ctl\" is not --owner \"other\"\n", ExitInvalid)

	vipctl(t, sock, "", "apply", "-f", file, "-f", file).check(t, "",
		"Error: "+file+": document 1 (service \"a\"): service \"a\" appears more than once in the files (first in "+file+": document 1)\n", ExitInvalid)
}

func TestApplyErrors(t *testing.T) {
	vipd := testserver.Start(t)
	sock := vipd.Socket()

	// vipd checks every document before it writes any: a file whose
	// second document is bad writes nothing.
	bad := writeFile(t, "bad.yaml", "name: good\nvips: [10.96.0.2]\nports: [{port: 80}]\n---\nname: bad\nvips: [10.96.0.1, 10.0.0.256, not-an-ip]\nports: [{port: 80}]\nbackends: [{ip: 10.0.0.1, weight: 70000}]\n")
	before := len(vipd.Dataplane().Records())
	vipctl(t, sock, "", "apply", "-f", bad).check(t, "", `Error: `+bad+`: document 2 (line 5, service "bad"): vips[1]: "10.0.0.256" is not an IP address
Error: `+bad+`: document 2 (line 5, service "bad"): vips[2]: "not-an-ip" is not an IP address
Error: `+bad+`: document 2 (line 5, service "bad"): backends[0].weight: 70000 is out of range; 1 to 65535 are allowed, or 0 for 1
Error: nothing was applied: vipd rejected 1 of 2 services (InvalidArgument)
`, ExitInvalid)
	if stored(t, vipd, "good") != nil || len(vipd.Dataplane().Records()) != before {
		t.Errorf("apply wrote the first document of a file whose second is invalid")
	}

	// A conflict with a service vipd has, the same.
	vipctl(t, sock, "", "apply", "-f", writeFile(t, "x.yaml", "name: x\nvips: [10.96.0.9]\nports: [{port: 80}]\n")).checkCode(t, ExitOK)
	conflict := writeFile(t, "conflict.yaml", `
- {name: a, vips: [10.96.0.8], ports: [{port: 80}]}
- {name: b, vips: [10.96.0.9], ports: [{port: 80}]}
`)
	before = len(vipd.Dataplane().Records())
	vipctl(t, sock, "", "apply", "-f", conflict).check(t, "",
		`Error: `+conflict+`: document 1 (service "b"): [1]: AlreadyExists: service b: 10.96.0.9:80/TCP is already used by service x
Error: nothing was applied: vipd rejected 1 of 2 services (AlreadyExists)
`, ExitConflict)
	// And two documents that claim one VIP:port: vipd would accept each
	// alone.
	twice := writeFile(t, "twice.yaml", `
- {name: a, vips: [10.96.0.7], ports: [{port: 80}]}
- {name: b, vips: ["::ffff:10.96.0.7"], ports: [{port: 80, protocol: tcp}]}
`)
	vipctl(t, sock, "", "apply", "-f", twice).check(t, "",
		`Error: `+twice+`: document 1 (service "b"): [1].vips[0]: 10.96.0.7:80/TCP is also claimed by service "a" (`+twice+`: document 1); nothing was applied
`, ExitInvalid)
	// Or a backend of one that is a VIP of another.
	vipAsBackend := writeFile(t, "vip-as-backend.yaml", `
name: a
vips: [10.96.0.7]
ports: [{port: 80}]
---
name: b
vips: [10.96.0.6]
ports: [{port: 80}]
backends: [{ip: 10.0.0.1}, {ip: "::ffff:10.96.0.7"}]
`)
	vipctl(t, sock, "", "apply", "-f", vipAsBackend).check(t, "",
		`Error: `+vipAsBackend+`: document 2 (line 6, service "b"): backends[1].ip: 10.96.0.7 is a VIP of service "a" (`+vipAsBackend+`: document 1), which cannot be a backend; nothing was applied
`, ExitInvalid)
	if stored(t, vipd, "a") != nil || stored(t, vipd, "b") != nil || len(vipd.Dataplane().Records()) != before {
		t.Errorf("apply wrote part of a file with a conflict")
	}

	// Valid but for the typo, so that vipd would apply it if it got it.
	unknown := writeFile(t, "unknown.yaml", "name: c\nvips: [10.96.0.3]\nports: [{port: 80, protcol: tcp}]\n")
	before = len(vipd.Dataplane().Records())
	vipctl(t, sock, "", "apply", "-f", unknown).check(t, "",
		"Error: "+unknown+": document 1 (service \"c\"): ports[0].protcol: unknown field\n", ExitInvalid)
	if len(vipd.Dataplane().Records()) != before || stored(t, vipd, "c") != nil {
		t.Errorf("a bad file reached vipd")
	}

	vipctl(t, sock, "", "apply", "-f", filepath.Join(t.TempDir(), "missing.yaml")).checkCode(t, ExitError)
	vipctl(t, sock, "", "apply", "-f", unknown, "--prune").check(t, "",
		"Error: --prune needs --owner, whose services not in the files it deletes\nRun 'vipctl apply --help' for usage.\n", ExitUsage)
	vipctl(t, sock, "", "apply").check(t, "",
		"Error: required flag(s) \"filename\" not set\nRun 'vipctl apply --help' for usage.\n", ExitUsage)
}

func TestApplyPrune(t *testing.T) {
	vipd := testserver.Start(t)
	sock := vipd.Socket()
	first := writeFile(t, "first.yaml", `services:
- {name: a, vips: [10.96.0.1], ports: [{port: 80}]}
- {name: b, vips: [10.96.0.2], ports: [{port: 80}]}
- {name: c, vips: [10.96.0.3], ports: [{port: 80}]}
`)
	vipctl(t, sock, "name: x\nvips: [10.96.0.100]\nports: [{port: 80}]\n", "apply", "-f", "-", "--owner", "other").check(t,
		"service/x created (generation 1)\n", "", ExitOK)
	vipctl(t, sock, "", "apply", "-f", first, "--prune", "--owner", "ctl", "--dry-run").check(t, `service/a created (dry run)
service/b created (dry run)
service/c created (dry run)
owner ctl: 3 created, 0 configured, 0 deleted, 0 unchanged (dry run)
`, "", ExitOK)
	if stored(t, vipd, "a") != nil {
		t.Errorf("apply --prune --dry-run created a service")
	}
	vipctl(t, sock, "", "apply", "-f", first, "--prune", "--owner", "ctl").check(t, `service/a created
service/b created
service/c created
owner ctl: 3 created, 0 configured, 0 deleted, 0 unchanged
`, "", ExitOK)

	second := writeFile(t, "second.json", `[
  {"name": "a", "vips": ["10.96.0.1"], "ports": [{"port": 80}]},
  {"name": "b", "vips": ["10.96.0.22"], "ports": [{"port": 80}]},
  {"name": "d", "vips": ["10.96.0.4"], "ports": [{"port": 80}]}
]`)
	vipctl(t, sock, "", "apply", "-f", second, "--prune", "--owner", "ctl").check(t, `service/d created
service/b configured
service/c deleted
service/a unchanged
owner ctl: 1 created, 1 configured, 1 deleted, 1 unchanged
`, "", ExitOK)
	if stored(t, vipd, "x") == nil {
		t.Errorf("prune deleted another owner's service")
	}

	vipctl(t, sock, "", "-o", "json", "apply", "-f", second, "--prune", "--owner", "ctl").check(t, `{
  "created": [],
  "updated": [],
  "deleted": [],
  "unchanged": [
    "a",
    "b",
    "d"
  ]
}
`, "", ExitOK)

	bad := writeFile(t, "bad.yaml", "- {name: a, vips: [10.96.0.1], ports: [{port: 80}]}\n- {name: b, vips: [nope], ports: [{port: 80}]}\n")
	vipctl(t, sock, "", "apply", "-f", bad, "--prune", "--owner", "ctl").check(t, "",
		`Error: `+bad+`: document 1 (service "b"): [1].vips[0]: "nope" is not an IP address
Error: nothing was applied (InvalidArgument)
`, ExitInvalid)
}

func TestBackends(t *testing.T) {
	vipd := testserver.Start(t)
	sock := vipd.Socket()
	vipctl(t, sock, "", "apply", "-f", writeFile(t, "svc.yaml", "name: web\nvips: [10.96.0.10]\nports: [{name: http, port: 80}]\n")).checkCode(t, ExitOK)

	vipctl(t, sock, "", "backends", "add", "web", "10.0.0.1", "10.0.0.2",
		"--weight", "3", "--state", "not-serving", "--node-local", "--zone", "z1", "--port", "http=8080", "--expected-generation", "1").check(t,
		"service/web backends 10.0.0.1, 10.0.0.2 added or replaced (generation 2)\n", "", ExitOK)
	want := []*vipdv1.Backend{
		{Ip: "10.0.0.1", Weight: 3, State: vipdv1.BackendState_BACKEND_STATE_NOT_SERVING, NodeLocal: true, Zone: "z1", Ports: map[string]uint32{"http": 8080}},
		{Ip: "10.0.0.2", Weight: 3, State: vipdv1.BackendState_BACKEND_STATE_NOT_SERVING, NodeLocal: true, Zone: "z1", Ports: map[string]uint32{"http": 8080}},
	}
	if diff := cmp.Diff(want, stored(t, vipd, "web").GetBackends(), protocmp.Transform()); diff != "" {
		t.Errorf("backends (-want +got):\n%s", diff)
	}

	vipctl(t, sock, "", "backends", "add", "web", "10.0.0.3").checkCode(t, ExitOK)
	vipctl(t, sock, "", "backends", "list", "web").check(t, `IP        STATE        WEIGHT  NODE-LOCAL  ZONE  PORTS
10.0.0.1  not-serving  3       true        z1    http=8080
10.0.0.2  not-serving  3       true        z1    http=8080
10.0.0.3  ready        1       false       -     -
`, "", ExitOK)

	// An IP that is not there is named, and fails the command only when
	// nothing was removed.
	vipctl(t, sock, "", "backends", "remove", "web", "10.0.0.1", "10.0.0.9").check(t,
		"service/web backends 10.0.0.1 removed (generation 4)\n", "service/web has no backend 10.0.0.9\n", ExitOK)
	vipctl(t, sock, "", "backends", "remove", "web", "10.0.0.1", "10.0.0.9").check(t,
		"", "Error: NotFound: service/web has no backend 10.0.0.1, 10.0.0.9: nothing removed\n", ExitNotFound)
	// --dry-run: vipd checks, nothing changes.
	vipctl(t, sock, "", "backends", "remove", "web", "10.0.0.3", "--dry-run").check(t,
		"service/web backends 10.0.0.3 removed (dry run)\n", "", ExitOK)
	vipctl(t, sock, "", "backends", "add", "web", "10.0.0.4", "--dry-run").check(t,
		"service/web backends 10.0.0.4 added or replaced (dry run)\n", "", ExitOK)
	vipctl(t, sock, "", "backends", "add", "web", "10.0.0.4", "--weight", "70000", "--dry-run").check(t, "",
		"Error: InvalidArgument: invalid request\n  upsert[0].weight: 70000 is out of range; 1 to 65535 are allowed, or 0 for 1\n", ExitInvalid)
	if got := stored(t, vipd, "web"); got.GetGeneration() != 4 || len(got.GetBackends()) != 2 {
		t.Errorf("backends --dry-run changed the service: %v", got)
	}
	vipctl(t, sock, "", "-o", "json", "backends", "list", "web").check(t, `{
  "backends": [
    {
      "ip": "10.0.0.2",
      "nodeLocal": true,
      "ports": {
        "http": 8080
      },
      "state": "BACKEND_STATE_NOT_SERVING",
      "weight": 3,
      "zone": "z1"
    },
    {
      "ip": "10.0.0.3",
      "state": "BACKEND_STATE_READY",
      "weight": 1
    }
  ]
}
`, "", ExitOK)

	vipctl(t, sock, "", "backends", "add", "web", "10.0.0.1", "--expected-generation", "1").check(t, "",
		"Error: Aborted: service web: expected generation 1, but it is at generation 4\n", ExitConflict)
	vipctl(t, sock, "", "backends", "add", "nope", "10.0.0.1").check(t, "",
		"Error: NotFound: service nope not found\n", ExitNotFound)
	vipctl(t, sock, "", "backends", "add", "web", "10.0.0.1", "--state", "up").check(t, "",
		"Error: --state: unknown value \"up\" (want ready, terminating, not-serving)\nRun 'vipctl backends add --help' for usage.\n", ExitUsage)
	vipctl(t, sock, "", "backends", "add", "web", "10.0.0.1", "--port", "http").check(t, "",
		"Error: --port \"http\": want NAME=PORT, or =PORT for the service's unnamed port\nRun 'vipctl backends add --help' for usage.\n", ExitUsage)
	vipctl(t, sock, "", "backends", "add", "web", "10.0.0.1", "--port", "http=70000").check(t, "",
		"Error: --port \"http=70000\": \"70000\" is not a port number 1-65535\nRun 'vipctl backends add --help' for usage.\n", ExitUsage)
	vipctl(t, sock, "", "backends", "add", "web").check(t, "",
		"Error: requires at least 2 arg(s), only received 1\nRun 'vipctl backends add --help' for usage.\n", ExitUsage)

	// =PORT names the "" key: the target port of a service's only,
	// unnamed port.
	vipctl(t, sock, "", "apply", "-f", writeFile(t, "dns.yaml", "name: dns\nvips: [10.96.0.53]\nports: [{port: 53, protocol: udp}]\n")).checkCode(t, ExitOK)
	vipctl(t, sock, "", "backends", "add", "dns", "10.0.0.5", "--port", "=5353").checkCode(t, ExitOK)
	wantDNS := []*vipdv1.Backend{{Ip: "10.0.0.5", Weight: 1, State: ready, Ports: map[string]uint32{"": 5353}}}
	if diff := cmp.Diff(wantDNS, stored(t, vipd, "dns").GetBackends(), protocmp.Transform()); diff != "" {
		t.Errorf("--port =5353: backends (-want +got):\n%s", diff)
	}
	vipctl(t, sock, "", "backends", "list", "dns").check(t, `IP        STATE  WEIGHT  NODE-LOCAL  ZONE  PORTS
10.0.0.5  ready  1       false       -     ""=5353
`, "", ExitOK)
}

func TestStatusAndVersion(t *testing.T) {
	start := time.Now()
	srv := testserver.Start(t, testserver.WithVersion("v0.1.0"), testserver.WithTopology("node-1", "zone-a"))
	sock := srv.Socket()
	// The instance ID is random: the output must show this vipd's.
	withoutID := func(out string) string {
		t.Helper()
		id := srv.API().InstanceID()
		if id == "" || strings.Count(out, id) != 1 {
			t.Errorf("status output does not show the instance ID %q once:\n%s", id, out)
		}
		return strings.ReplaceAll(out, id, "ID")
	}
	r := vipctl(t, sock, "", "status")
	r.stdout = withoutID(withoutClock(t, r.stdout, start))
	r.check(t, `Dataplane:           fake
Version:             v0.1.0
Instance ID:         ID
Ready:               true
Node:                node-1
Zone:                zone-a (--zone)
Services:            0
Backends:            0
Applied generation:  0
Last sync:           TIME (took DURATION)
Last error:          -
Load balancing:      random, maglev
Protocols:           TCP, UDP, SCTP
`, "", ExitOK)

	r = vipctl(t, sock, "", "-o", "yaml", "status")
	r.stdout = withoutID(withoutClock(t, r.stdout, start))
	// Zero values are left out, as protojson does.
	r.check(t, `dataplane: fake
instanceId: ID
lastSyncDuration: DURATION
lastSyncTime: "TIME"
nodeName: node-1
ready: true
supportedLoadBalancing:
- LOAD_BALANCING_RANDOM
- LOAD_BALANCING_MAGLEV
supportedProtocols:
- PROTOCOL_TCP
- PROTOCOL_UDP
- PROTOCOL_SCTP
version: v0.1.0
warnings: []
zone: zone-a
zoneSource: flag
`, "", ExitOK)

	// node set-zone changes it at once, and says what it replaced.
	vipctl(t, sock, "", "node", "set-zone", "zone-b").check(t, `Zone:           zone-b
Previous zone:  zone-a
`, "", ExitOK)
	r = vipctl(t, sock, "", "status")
	if !strings.Contains(r.stdout, "Zone:                zone-b (set through the API)\n") {
		t.Errorf("status after set-zone:\n%s", r.stdout)
	}
	vipctl(t, sock, "", "-o", "json", "node", "set-zone", "").check(t, `{
  "previousZone": "zone-b"
}
`, "", ExitOK)
	r = vipctl(t, sock, "", "node", "set-zone", strings.Repeat("z", 64))
	if r.code == ExitOK || !strings.Contains(r.stderr, "zone") {
		t.Errorf("set-zone with a 64-character zone: code %d, stderr:\n%s", r.code, r.stderr)
	}

	r = vipctl(t, sock, "", "version")
	if r.code != ExitOK || !strings.Contains(r.stdout, "Client version:") || !strings.Contains(r.stdout, "Server version:  v0.1.0\n") {
		t.Errorf("version: code %d, stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	r = vipctl(t, "", "", "version", "--client", "-o", "json")
	if r.code != ExitOK || !strings.Contains(r.stdout, `"clientVersion"`) || strings.Contains(r.stdout, "serverVersion") {
		t.Errorf("version --client: code %d, stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	// --version prints what version --client does, and asks no vipd.
	for _, format := range outputFormats {
		want := vipctl(t, "", "", "-o", format, "version", "--client")
		vipctl(t, "/nonexistent.sock", "", "-o", format, "--version").check(t, want.stdout, "", ExitOK)
	}
	vipctl(t, "", "", "--version").check(t, "Client version:  "+version.String()+"\n", "", ExitOK)
}

// TestRoundTrip checks that what "service get" and "service list" print as
// JSON and YAML is what "apply -f" reads back.
func TestRoundTrip(t *testing.T) {
	for _, format := range []string{outputJSON, outputYAML} {
		t.Run(format, func(t *testing.T) {
			vipd := testserver.Start(t)
			sock := vipd.Socket()
			vipctl(t, sock, "", "apply", "-f", writeFile(t, "svc.yaml", twoServices)).checkCode(t, ExitOK)
			before := stored(t, vipd, "default/web")

			got := vipctl(t, sock, "", "-o", format, "service", "get", "default/web")
			got.checkCode(t, ExitOK)
			vipctl(t, sock, got.stdout, "apply", "-f", "-").check(t, "service/default/web unchanged (generation 1)\n", "", ExitOK)
			vipctl(t, sock, "", "service", "delete", "default/web").checkCode(t, ExitOK)
			// What get printed carries generation 1, which vipd no longer has.
			vipctl(t, sock, got.stdout, "apply", "-f", "-").checkCode(t, ExitConflict)
			// Without it, the file is applied as it is. Generations come
			// from one store-wide counter, which the delete moved on too.
			noGeneration := regexp.MustCompile(`(?m)^.*"?generation"?: .*\n`).ReplaceAllString(got.stdout, "")
			vipctl(t, sock, noGeneration, "apply", "-f", "-").check(t, "service/default/web created (generation 4)\n", "", ExitOK)
			after := stored(t, vipd, "default/web")
			if diff := cmp.Diff(before, after, protocmp.Transform(), protocmp.IgnoreFields(&vipdv1.Service{}, "generation")); diff != "" {
				t.Errorf("service get -o %s | apply -f - changed the service (-before +after):\n%s", format, diff)
			}

			list := vipctl(t, sock, "", "-o", format, "service", "list")
			list.checkCode(t, ExitOK)
			applied := vipctl(t, sock, list.stdout, "-o", format, "apply", "-f", "-")
			applied.checkCode(t, ExitOK)
			// apply prints the stored services like service list does; being
			// unchanged, they keep their generations.
			relisted := vipctl(t, sock, "", "-o", format, "service", "list")
			if applied.stdout != relisted.stdout {
				t.Errorf("apply -o %s printed\n%s\nwant what service list prints:\n%s", format, applied.stdout, relisted.stdout)
			}
		})
	}
}

func TestJSONOutput(t *testing.T) {
	sock := testserver.Start(t).Socket()
	vipctl(t, sock, "", "apply", "-f", writeFile(t, "svc.yaml", "name: a\nvips: [10.96.0.1]\nports: [{port: 80, target_port: 8080}]\n")).checkCode(t, ExitOK)
	vipctl(t, sock, "", "-o", "json", "service", "list").check(t, `{
  "services": [
    {
      "name": "a",
      "owner": "default",
      "vips": [
        "10.96.0.1"
      ],
      "ports": [
        {
          "protocol": "PROTOCOL_TCP",
          "port": 80,
          "targetPort": 8080
        }
      ],
      "sessionAffinity": {
        "mode": "SESSION_AFFINITY_NONE"
      },
      "internalTrafficPolicy": "TRAFFIC_POLICY_CLUSTER",
      "loadBalancing": "LOAD_BALANCING_RANDOM",
      "generation": "1",
      "externalTrafficPolicy": "TRAFFIC_POLICY_CLUSTER"
    }
  ]
}
`, "", ExitOK)
	vipctl(t, sock, "", "-o", "json", "service", "delete", "a").check(t, "{}\n", "", ExitOK)
	// An empty list is a list.
	vipctl(t, sock, "", "-o", "json", "service", "list").check(t, "{\n  \"services\": []\n}\n", "", ExitOK)
	vipctl(t, sock, "", "-o", "yaml", "service", "list").check(t, "services: []\n", "", ExitOK)
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		wantStderr string
	}{
		{[]string{"bogus"}, "Error: unknown command \"bogus\" for \"vipctl\"\nRun 'vipctl --help' for usage.\n"},
		{[]string{"service"}, "Error: vipctl service needs a subcommand: delete, get, list\nRun 'vipctl service --help' for usage.\n"},
		{[]string{"service", "get"}, "Error: accepts 1 arg(s), received 0\nRun 'vipctl service get --help' for usage.\n"},
		{[]string{"service", "list", "--bogus"}, "Error: unknown flag: --bogus\nRun 'vipctl service list --help' for usage.\n"},
		{[]string{"-o", "xml", "status"}, "Error: unknown output format \"xml\" (want table, json, yaml)\nRun 'vipctl status --help' for usage.\n"},
		{[]string{"--timeout", "soon", "status"}, "Error: invalid argument \"soon\" for \"--timeout\" flag: time: invalid duration \"soon\"\nRun 'vipctl status --help' for usage.\n"},
		{[]string{"--server", "localhost", "--insecure", "status"}, "Error: vipd client: target \"localhost\" is neither an absolute socket path, unix:///path, tcp://host:port, nor host:port\nRun 'vipctl status --help' for usage.\n"},
		{[]string{"--server", "127.0.0.1:1", "status"}, "Error: --server needs mutual TLS: set --cacert, --cert, --key (or --insecure for a plaintext loopback address)\nRun 'vipctl status --help' for usage.\n"},
		{[]string{"--server", "tcp://[::1]:1", "--cacert", "ca.pem", "status"}, "Error: --server needs mutual TLS: set --cert, --key (or --insecure for a plaintext loopback address)\nRun 'vipctl status --help' for usage.\n"},
		{[]string{"--server", "tcp://198.19.0.1:9650", "--insecure", "status"}, "Error: --insecure is only for a loopback address (127.0.0.1, [::1], localhost), not 198.19.0.1: use --cacert, --cert and --key\nRun 'vipctl status --help' for usage.\n"},
		{[]string{"--server", "127.0.0.1:1", "--insecure", "--cert", "c.pem", "status"}, "Error: --insecure turns TLS off: drop it, or drop --cacert, --cert and --key\nRun 'vipctl status --help' for usage.\n"},
		{[]string{"--socket", "/tmp/x.sock", "--key", "k.pem", "status"}, "Error: --key applies to --server only; the Unix socket needs no credentials\nRun 'vipctl status --help' for usage.\n"},
		{[]string{"--server", "127.0.0.1:1", "--cacert", "/nonexistent/ca.pem", "--cert", "c.pem", "--key", "k.pem", "status"}, "Error: read CA bundle: open /nonexistent/ca.pem: no such file or directory\nRun 'vipctl status --help' for usage.\n"},
		{[]string{"--server", "127.0.0.1:1", "--socket", "/tmp/x.sock", "status"}, "Error: if any flags in the group [socket server] are set none of the others can be; [server socket] were all set\nRun 'vipctl status --help' for usage.\n"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			vipctl(t, "", "", tc.args...).check(t, "", tc.wantStderr, ExitUsage)
		})
	}
}

func TestSocketFromEnvironment(t *testing.T) {
	sock := testserver.Start(t).Socket()
	t.Setenv(client.SocketEnv, sock)
	vipctl(t, "", "", "status").checkCode(t, ExitOK)
}

// TestUnavailable checks that with no vipd to answer, every kind of
// command fails within --timeout with one line that names the socket and
// the cause.
func TestUnavailable(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.sock")

	// A socket file that nobody listens on, as a crashed vipd leaves it.
	refused := filepath.Join(dir, "refused.sock")
	l, err := net.Listen("unix", refused)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()

	// A vipd that accepts connections and never answers, as a stopped one
	// (kill -STOP) does.
	stuck := filepath.Join(dir, "stuck.sock")
	sl, err := net.Listen("unix", stuck)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sl.Close() })
	go func() {
		for {
			c, err := sl.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()

	const timeout = time.Second
	commands := [][]string{
		{"service", "list"},
		{"status"},
		{"apply", "-f", writeFile(t, "svc.yaml", "name: a\nvips: [10.96.0.1]\nports: [{port: 80}]\n")},
		{"backends", "remove", "a", "10.0.0.1"},
		{"flows", "--follow"},
		{"version"},
	}
	for _, tc := range []struct {
		name, sock, want string
	}{
		{"missing", missing, "Error: cannot reach vipd at unix://" + missing + ": no such file (is vipd running? is --socket right?)\n"},
		{"refused", refused, "Error: cannot reach vipd at unix://" + refused + ": connection refused: nothing listens on the socket (is vipd running?)\n"},
		{"stuck", stuck, "Error: cannot reach vipd at unix://" + stuck + ": it accepts connections but did not answer within 1s (--timeout); is it stopped or overloaded?\n"},
	} {
		for _, args := range commands {
			t.Run(tc.name+" "+args[0], func(t *testing.T) {
				t.Parallel()
				start := time.Now()
				r := vipctl(t, tc.sock, "", append([]string{"--timeout", timeout.String()}, args...)...)
				if took := time.Since(start); took > timeout+schedulingMargin {
					t.Errorf("took %v, want at most --timeout %v and %v", took, timeout, schedulingMargin)
				}
				r.checkCode(t, ExitUnavailable)
				stderr := r.stderr
				if args[0] == "version" {
					// Besides its own version, which it prints first.
					if !strings.HasPrefix(r.stdout, "Client version:") {
						t.Errorf("version printed %q, want the client's version", r.stdout)
					}
				}
				if stderr != tc.want {
					t.Errorf("stderr:\n%s\nwant:\n%s", stderr, tc.want)
				}
			})
		}
	}
}

func TestUnavailableServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	start := time.Now()
	vipctl(t, "", "", "--server", addr, "--insecure", "--timeout", "1s", "status").check(t, "",
		"Error: cannot reach vipd at tcp://"+addr+": connection refused (is vipd running, with --listen on this address?)\n", ExitUnavailable)
	if took := time.Since(start); took > time.Second+schedulingMargin {
		t.Errorf("took %v, want at most --timeout 1s and %v", took, schedulingMargin)
	}
}

// schedulingMargin is how much longer than --timeout a vipctl run that
// gives up may take: a goroutine's scheduling, not another attempt.
const schedulingMargin = 400 * time.Millisecond

// TestUnavailableDropped checks that vipctl fails within --timeout when
// vipd's TCP address drops connection attempts: the probe that finds out
// why fits within the deadline of the call, not after it.
func TestUnavailableDropped(t *testing.T) {
	addr := droppingListener(t)
	for _, timeout := range []time.Duration{time.Second, 3 * time.Second} {
		start := time.Now()
		r := vipctl(t, "", "", "--server", addr, "--insecure", "--timeout", timeout.String(), "status")
		took := time.Since(start)
		r.check(t, "", fmt.Sprintf("Error: cannot reach vipd at tcp://%s: no connection within %v\n", addr, min(time.Second, timeout/2)), ExitUnavailable)
		if took > timeout+schedulingMargin {
			t.Errorf("--timeout %v: took %v, want at most %v more", timeout, took, schedulingMargin)
		}
	}
}

// droppingListener returns the address of a TCP socket on 127.0.0.1 that
// drops new connection attempts, as a firewall or a lost host does: it
// listens with a backlog of 0, never accepts, and one connection fills
// its queue, so that the kernel drops every later SYN.
func droppingListener(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	filler, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { filler.Close() })
	// The queue is full once a second attempt gets no answer.
	if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
		c.Close()
		t.Fatalf("%s accepted a second connection; cannot make it drop attempts", addr)
	}
	return addr
}

func TestEmptyAddress(t *testing.T) {
	vipctl(t, "", "", "--socket", "", "status").check(t, "",
		"Error: --socket is empty: give the path of vipd's socket (default /run/vipd/vipd.sock)\nRun 'vipctl status --help' for usage.\n", ExitUsage)
	vipctl(t, "", "", "--server", "", "service", "list").check(t, "",
		"Error: --server is empty: give vipd's address, [tcp://]host:port, or leave the flag out for --socket\nRun 'vipctl service list --help' for usage.\n", ExitUsage)
}

func TestRelativeSocket(t *testing.T) {
	sock := testserver.Start(t).Socket()
	t.Chdir(filepath.Dir(sock))
	vipctl(t, "./"+filepath.Base(sock), "", "status").checkCode(t, ExitOK)
	vipctl(t, "unix://"+sock, "", "status").checkCode(t, ExitOK)
}
