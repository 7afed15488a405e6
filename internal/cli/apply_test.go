package cli

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/internal/testkit/testserver"
	"github.com/vipd/vipd/server/validation"
)

// TestApplyResults checks that apply says, per service, what vipd did,
// as kubectl does.
func TestApplyResults(t *testing.T) {
	vipd := testserver.Start(t)
	sock := vipd.Socket()
	web := writeFile(t, "web.yaml", "name: web\nvips: [10.96.0.10]\nports: [{port: 80}]\n---\nname: api\nvips: [10.96.0.11]\nports: [{port: 80}]\n")
	vipctl(t, sock, "", "apply", "-f", web).check(t, "service/web created (generation 1)\nservice/api created (generation 2)\n", "", ExitOK)
	vipctl(t, sock, "", "apply", "-f", web).check(t, "service/web unchanged (generation 1)\nservice/api unchanged (generation 2)\n", "", ExitOK)
	changed := writeFile(t, "web2.yaml", "name: web\nvips: [10.96.0.10]\nports: [{port: 80}]\nbackends: [{ip: 10.0.0.1}]\n---\nname: api\nvips: [10.96.0.11]\nports: [{port: 80}]\n")
	vipctl(t, sock, "", "apply", "-f", changed).check(t, "service/web configured (generation 3)\nservice/api unchanged (generation 2)\n", "", ExitOK)
}

// TestApplyDryRun checks that --dry-run has vipd check every service and
// says what would happen, and changes nothing.
func TestApplyDryRun(t *testing.T) {
	vipd := testserver.Start(t)
	sock := vipd.Socket()
	web := writeFile(t, "web.yaml", "name: web\nvips: [10.96.0.10]\nports: [{port: 80}]\n")
	before := len(vipd.Dataplane().Records())
	vipctl(t, sock, "", "apply", "-f", web, "--dry-run").check(t, "service/web created (dry run)\n", "", ExitOK)
	if stored(t, vipd, "web") != nil || len(vipd.Dataplane().Records()) != before {
		t.Fatalf("apply --dry-run created the service")
	}
	vipctl(t, sock, "", "apply", "-f", web).checkCode(t, ExitOK)
	vipctl(t, sock, "", "apply", "-f", web, "--dry-run").check(t, "service/web unchanged (dry run)\n", "", ExitOK)

	changed := writeFile(t, "web2.yaml", "name: web\nvips: [10.96.0.10]\nports: [{name: http, port: 80}, {name: https, port: 443}]\n")
	vipctl(t, sock, "", "apply", "-f", changed, "--dry-run").check(t, "service/web configured (dry run)\n", "", ExitOK)
	if got := stored(t, vipd, "web"); got.GetGeneration() != 1 || len(got.GetPorts()) != 1 {
		t.Errorf("apply --dry-run changed the service: %v", got)
	}
	// The check includes conflicts with the services vipd has.
	other := writeFile(t, "other.yaml", "name: other\nvips: [10.96.0.10]\nports: [{port: 80}]\n")
	vipctl(t, sock, "", "apply", "-f", other, "--dry-run").check(t, "",
		"Error: "+other+": document 1 (service \"other\"): AlreadyExists: service other: 10.96.0.10:80/TCP is already used by service web\n", ExitConflict)
}

// TestApplyStaleFile checks that a file with a generation older than
// vipd's fails, naming both, and changes nothing.
func TestApplyStaleFile(t *testing.T) {
	vipd := testserver.Start(t)
	sock := vipd.Socket()
	vipctl(t, sock, "", "apply", "-f", writeFile(t, "web.yaml", "name: web\nvips: [10.96.0.10]\nports: [{port: 80}]\n")).checkCode(t, ExitOK)
	old := vipctl(t, sock, "", "-o", "yaml", "service", "get", "web")
	old.checkCode(t, ExitOK)
	if !strings.Contains(old.stdout, `generation: "1"`) {
		t.Fatalf("service get -o yaml printed no generation:\n%s", old.stdout)
	}
	vipctl(t, sock, "", "backends", "add", "web", "10.0.0.1").checkCode(t, ExitOK)

	edited := strings.Replace(old.stdout, "port: 80", "port: 8080", 1)
	vipctl(t, sock, edited, "apply", "-f", "-").check(t, "",
		`Error: stdin: document 1 (service "web"): the file is stale: it holds generation 1 of service web, which vipd now has at generation 2; get the service again, or remove generation from the file to overwrite it
`, ExitConflict)
	if got := stored(t, vipd, "web"); got.GetGeneration() != 2 || len(got.GetBackends()) != 1 {
		t.Errorf("a stale file changed the service: %v", got)
	}
	// --prune checks generations too.
	vipctl(t, sock, edited, "apply", "-f", "-", "--prune", "--owner", "default").check(t, "",
		`Error: stdin: document 1 (service "web"): the file is stale: it holds generation 1 of service web, which vipd now has at generation 2; get the service again, or remove generation from the file to overwrite it
Error: nothing was applied (Aborted)
`, ExitConflict)

	current := vipctl(t, sock, "", "-o", "yaml", "service", "get", "web").stdout
	vipctl(t, sock, strings.Replace(current, "port: 80", "port: 8080", 1), "apply", "-f", "-").check(t,
		"service/web configured (generation 3)\n", "", ExitOK)
}

// TestApplyOwnership checks that apply keeps a service's owner when the
// file names none, and moves it to another only with --take-ownership.
func TestApplyOwnership(t *testing.T) {
	vipd := testserver.Start(t)
	sock := vipd.Socket()
	const spec = "name: web\nvips: [10.96.0.10]\nports: [{port: 80}]\n"
	vipctl(t, sock, spec, "apply", "-f", "-", "--owner", "nomad").checkCode(t, ExitOK)

	// No owner in the file and no --owner: the stored owner stays.
	vipctl(t, sock, spec+"labels: {a: b}\n", "apply", "-f", "-").check(t, "service/web configured (generation 2)\n", "", ExitOK)
	if got := stored(t, vipd, "web").GetOwner(); got != "nomad" {
		t.Errorf("apply of a file without an owner moved the service to owner %q", got)
	}

	for _, args := range [][]string{{"--owner", "ops"}, {}} {
		in := spec
		if len(args) == 0 {
			in += "owner: ops\n"
		}
		vipctl(t, sock, in, append([]string{"apply", "-f", "-"}, args...)...).check(t, "",
			`Error: stdin: document 1 (service "web"): service web is owned by "nomad", not "ops": apply --take-ownership moves it
`, ExitConflict)
		if got := stored(t, vipd, "web").GetOwner(); got != "nomad" {
			t.Errorf("apply %v moved the service to owner %q", args, got)
		}
	}
	vipctl(t, sock, spec, "apply", "-f", "-", "--owner", "ops", "--take-ownership").check(t, "service/web configured (generation 3)\n", "", ExitOK)
	if got := stored(t, vipd, "web").GetOwner(); got != "ops" {
		t.Errorf("apply --take-ownership left owner %q, want ops", got)
	}
	vipctl(t, sock, spec, "apply", "-f", "-", "--owner", "ops", "--take-ownership", "--prune").check(t, "",
		"Error: --take-ownership does not apply to --prune, which never takes over another owner's service\nRun 'vipctl apply --help' for usage.\n", ExitUsage)
}

// TestApplyPruneStaleOtherOwner checks that --prune, checking generations,
// finds a service stored under another owner: it exists, at its generation.
func TestApplyPruneStaleOtherOwner(t *testing.T) {
	vipd := testserver.Start(t)
	sock := vipd.Socket()
	const spec = "name: web\nvips: [10.96.0.10]\nports: [{port: 80}]\n"
	vipctl(t, sock, spec, "apply", "-f", "-", "--owner", "nomad").checkCode(t, ExitOK)
	vipctl(t, sock, "", "backends", "add", "web", "10.0.0.1").checkCode(t, ExitOK)
	vipctl(t, sock, spec+"generation: 1\n", "apply", "-f", "-", "--prune", "--owner", "ops").check(t, "",
		`Error: stdin: document 1 (service "web"): the file is stale: it holds generation 1 of service web, which vipd now has at generation 2, under owner "nomad"; get the service again, or remove generation from the file to overwrite it
Error: nothing was applied (Aborted)
`, ExitConflict)
	if got := stored(t, vipd, "web"); got.GetGeneration() != 2 || got.GetOwner() != "nomad" {
		t.Errorf("a stale --prune changed the service: %v", got)
	}
}

// TestApplyMovesInOrder checks that a file may move a VIP or an address
// from one service to another when the service that gives it up comes
// first, as writing the documents in order does, and not the other way
// round.
func TestApplyMovesInOrder(t *testing.T) {
	vipd := testserver.Start(t)
	sock := vipd.Socket()
	vipctl(t, sock, "name: a\nvips: [10.96.0.10, 10.96.0.12]\nports: [{port: 80}]\nbackends: [{ip: 10.0.1.5}]\n---\n"+
		"name: b\nvips: [10.96.0.11]\nports: [{port: 80}]\n", "apply", "-f", "-").checkCode(t, ExitOK)

	// b first: b cannot take 10.96.0.10 while a has it.
	reversed := writeFile(t, "reversed.yaml", "name: b\nvips: [10.96.0.10, 10.96.0.11]\nports: [{port: 80}]\n---\n"+
		"name: a\nvips: [10.96.0.12]\nports: [{port: 80}]\n")
	vipctl(t, sock, "", "apply", "-f", reversed).check(t, "",
		"Error: "+reversed+": document 1 (service \"b\"): AlreadyExists: service b: 10.96.0.10:80/TCP is already used by service a\n"+
			"Error: nothing was applied: vipd rejected 1 of 2 services (AlreadyExists)\n", ExitConflict)

	// a first: 10.96.0.10 moves to b, and a's backend 10.0.1.5 becomes
	// the VIP of a new service c.
	moves := writeFile(t, "moves.yaml", "name: a\nvips: [10.96.0.12]\nports: [{port: 80}]\n---\n"+
		"name: b\nvips: [10.96.0.10, 10.96.0.11]\nports: [{port: 80}]\n---\n"+
		"name: c\nvips: [10.0.1.5]\nports: [{port: 53, protocol: udp}]\n")
	vipctl(t, sock, "", "apply", "-f", moves, "--dry-run").check(t,
		"service/a configured (dry run)\nservice/b configured (dry run, once service a is written)\nservice/c created (dry run, once service a is written)\n", "", ExitOK)
	if got := stored(t, vipd, "a"); got.GetGeneration() != 1 {
		t.Fatalf("apply --dry-run changed service a: %v", got)
	}
	vipctl(t, sock, "", "apply", "-f", moves).check(t,
		"service/a configured (generation 3)\nservice/b configured (generation 4)\nservice/c created (generation 5)\n", "", ExitOK)

	// And back: b gives 10.96.0.10 up first, to a, which also takes c's
	// VIP as a backend once c gives it up.
	back := writeFile(t, "back.yaml", "name: c\nvips: [10.0.1.6]\nports: [{port: 53, protocol: udp}]\n---\n"+
		"name: b\nvips: [10.96.0.11]\nports: [{port: 80}]\n---\n"+
		"name: a\nvips: [10.96.0.10, 10.96.0.12]\nports: [{port: 80}]\nbackends: [{ip: 10.0.1.5}]\n")
	vipctl(t, sock, "", "apply", "-f", back).check(t,
		"service/c configured (generation 6)\nservice/b configured (generation 7)\nservice/a configured (generation 8)\n", "", ExitOK)
}

// TestApplyMoveInvalid checks that a document that is invalid on its own
// is refused, and nothing written, even when it also takes a VIP that an
// earlier document gives up.
func TestApplyMoveInvalid(t *testing.T) {
	vipd := testserver.Start(t)
	sock := vipd.Socket()
	vipctl(t, sock, "name: a\nvips: [10.96.0.10, 10.96.0.12]\nports: [{port: 80}]\n---\n"+
		"name: b\nvips: [10.96.0.11]\nports: [{port: 80}]\n", "apply", "-f", "-").checkCode(t, ExitOK)
	bad := writeFile(t, "bad.yaml", "name: a\nvips: [10.96.0.12]\nports: [{port: 80}]\n---\n"+
		"name: b\nvips: [10.96.0.10, 10.96.0.11]\nports: [{port: 80}]\nbackends: [{ip: 10.0.0.1, weight: 70000}]\n")
	vipctl(t, sock, "", "apply", "-f", bad).check(t, "",
		"Error: "+bad+": document 2 (line 5, service \"b\"): backends[0].weight: 70000 is out of range; 1 to 65535 are allowed, or 0 for 1\n"+
			"Error: nothing was applied: vipd rejected 1 of 2 services (InvalidArgument)\n", ExitInvalid)
	if got := stored(t, vipd, "a"); got.GetGeneration() != 1 || len(got.GetVips()) != 2 {
		t.Errorf("a rejected file changed service a: %v", got)
	}
}

// TestApplyOverLimit checks what apply says when the files' services
// together would take vipd past --max-services: vipd checks each service
// alone and does not report its limits, so the write stops part way, and
// apply names the services it applied.
func TestApplyOverLimit(t *testing.T) {
	vipd := testserver.Start(t, testserver.WithLimits(validation.Limits{MaxBackends: validation.DefaultMaxBackends, MaxServices: 2}))
	sock := vipd.Socket()
	vipctl(t, sock, "name: x\nvips: [10.96.0.9]\nports: [{port: 80}]\n", "apply", "-f", "-").checkCode(t, ExitOK)

	two := writeFile(t, "two.yaml", "name: a\nvips: [10.96.0.10]\nports: [{port: 80}]\n---\nname: b\nvips: [10.96.0.11]\nports: [{port: 80}]\n")
	vipctl(t, sock, "", "apply", "-f", two).check(t, "service/a created (generation 2)\n",
		"Error: "+two+": document 2 (line 5, service \"b\"): ResourceExhausted: service b: storing it would make 3 services in all, above the limit of 2 (--max-services); service b was not changed\n"+
			"Error: 1 of 2 services were applied: a\n", ExitError)
	if stored(t, vipd, "a") == nil || stored(t, vipd, "b") != nil {
		t.Errorf("want a stored and b not")
	}

	// Full: the check refuses each new service, placed in the file.
	vipctl(t, sock, "", "apply", "-f", two).check(t, "",
		"Error: "+two+": document 2 (line 5, service \"b\"): ResourceExhausted: service b: storing it would make 3 services in all, above the limit of 2 (--max-services); nothing was changed\n"+
			"Error: nothing was applied: vipd rejected 1 of 2 services (ResourceExhausted)\n", ExitError)
}

// TestApplyStopsPartWay checks that apply, when the kernel refuses a
// service after others were written, says which were applied.
func TestApplyStopsPartWay(t *testing.T) {
	vipd := testserver.Start(t)
	sock := vipd.Socket()
	vipd.Dataplane().SetHook(func(_ context.Context, s *dataplane.State) error {
		if _, ok := s.Map()["c"]; ok {
			return fmt.Errorf("no room for c: %w", dataplane.ErrResourceExhausted)
		}
		return nil
	})
	three := writeFile(t, "three.yaml", "name: a\nvips: [10.96.0.10]\nports: [{port: 80}]\n---\n"+
		"name: b\nvips: [10.96.0.11]\nports: [{port: 80}]\n---\nname: c\nvips: [10.96.0.12]\nports: [{port: 80}]\n")
	r := vipctl(t, sock, "", "apply", "-f", three)
	r.checkCode(t, ExitError)
	if r.stdout != "service/a created (generation 1)\nservice/b created (generation 2)\n" {
		t.Errorf("stdout:\n%s", r.stdout)
	}
	lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "Error: "+three+": document 3 (line 9, service \"c\"): ResourceExhausted: ") ||
		!strings.Contains(lines[0], "no room for c") || lines[1] != "Error: 2 of 3 services were applied: a, b" {
		t.Errorf("stderr:\n%s\nwant the error of c placed in the file, then \"2 of 3 services were applied: a, b\"", r.stderr)
	}
}
