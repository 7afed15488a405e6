package cli

import (
	"strings"
	"testing"

	"github.com/vipd/vipd/internal/testserver"
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
