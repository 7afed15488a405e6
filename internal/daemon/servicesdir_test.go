package daemon_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/daemon"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// applyWithin is how soon a change of the services directory must be in
// force: the "within a second".
const applyWithin = time.Second

// dirConfig is config with a services directory, and the directory.
func dirConfig(t *testing.T) (daemon.Config, string) {
	cfg := config(t)
	cfg.ServicesDir = filepath.Join(t.TempDir(), "services.d")
	if err := os.Mkdir(cfg.ServicesDir, 0o755); err != nil {
		t.Fatal(err)
	}
	return cfg, cfg.ServicesDir
}

// svcYAML is a service file of one service.
func svcYAML(name, vip string, port int, backends ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "name: %s\nvips: [%s]\nports:\n- {name: http, protocol: tcp, port: %d, targetPort: 8080}\nbackends:\n", name, vip, port)
	for _, ip := range backends {
		fmt.Fprintf(&b, "- {ip: %s}\n", ip)
	}
	return b.String()
}

func putFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// services is every service vipd has, by name.
func services(t *testing.T, r *running) map[string]*vipdv1.Service {
	t.Helper()
	svcs, err := r.local.ListServices(ctxT(t), "")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*vipdv1.Service{}
	for _, s := range svcs {
		out[s.GetName()] = s
	}
	return out
}

func backendIPs(s *vipdv1.Service) []string {
	var out []string
	for _, b := range s.GetBackends() {
		out = append(out, b.GetIp())
	}
	slices.Sort(out)
	return out
}

// waitFor polls vipd's services until cond holds, for at most within, and
// returns how long it took.
func waitFor(t *testing.T, r *running, within time.Duration, what string, cond func(map[string]*vipdv1.Service) bool) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		svcs := services(t, r)
		if cond(svcs) {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("%s: not within %v; services %v\nlog:\n%s", what, within, svcs, r.log)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestServicesDirWatch: vipd applies the files present at start (ready
// only once they are), then, each within a second, a file written in
// place, one renamed in atomically, and a file deleted (its services go).
// Each file's services are owned by file:<name>.
func TestServicesDirWatch(t *testing.T) {
	cfg, dir := dirConfig(t)
	putFile(t, filepath.Join(dir, "web.yaml"), svcYAML("default/web", "198.19.0.10", 80, "198.18.1.10"))
	putFile(t, filepath.Join(dir, "notes.txt"), "not a service file")
	putFile(t, filepath.Join(dir, ".hidden.yaml"), "not: [a service")
	r := start(t, cfg, healthpb.HealthCheckResponse_SERVING)

	// Ready means the directory is in force: no wait here.
	svcs := services(t, r)
	if web := svcs["default/web"]; web == nil || web.GetOwner() != "file:web.yaml" || !slices.Equal(backendIPs(web), []string{"198.18.1.10"}) {
		t.Fatalf("at ready: services %v, want default/web of owner file:web.yaml with backend 198.18.1.10", svcs)
	}
	if len(svcs) != 1 {
		t.Fatalf("services %v: only web.yaml is a service file", svcs)
	}

	// In place: truncate and write, as an editor or "cat >" does.
	putFile(t, filepath.Join(dir, "web.yaml"), svcYAML("default/web", "198.19.0.10", 80, "198.18.1.10", "198.18.1.11"))
	d := waitFor(t, r, applyWithin, "in-place write", func(s map[string]*vipdv1.Service) bool {
		return len(backendIPs(s["default/web"])) == 2
	})
	t.Logf("in-place write applied in %v", d)

	// Atomically: write a temporary file, then rename it in, as Nomad's
	// and consul-template's templates do.
	tmp := filepath.Join(dir, "db.yaml.tmp123")
	putFile(t, tmp, svcYAML("default/db", "198.19.0.11", 5432, "198.18.2.10"))
	time.Sleep(200 * time.Millisecond) // the temporary file is not a service file
	if _, ok := services(t, r)["default/db"]; ok {
		t.Fatal("a file not named *.yaml, *.yml or *.json was applied")
	}
	if err := os.Rename(tmp, filepath.Join(dir, "db.yaml")); err != nil {
		t.Fatal(err)
	}
	d = waitFor(t, r, applyWithin, "atomic rename", func(s map[string]*vipdv1.Service) bool {
		return s["default/db"].GetOwner() == "file:db.yaml"
	})
	t.Logf("renamed-in file applied in %v", d)

	// A rename over an existing file replaces it.
	putFile(t, tmp, svcYAML("default/db", "198.19.0.11", 5432, "198.18.2.11"))
	if err := os.Rename(tmp, filepath.Join(dir, "db.yaml")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, r, applyWithin, "atomic replace", func(s map[string]*vipdv1.Service) bool {
		return slices.Equal(backendIPs(s["default/db"]), []string{"198.18.2.11"})
	})

	if err := os.Remove(filepath.Join(dir, "web.yaml")); err != nil {
		t.Fatal(err)
	}
	d = waitFor(t, r, applyWithin, "delete", func(s map[string]*vipdv1.Service) bool {
		_, ok := s["default/web"]
		return !ok && s["default/db"] != nil
	})
	t.Logf("deleted file's services removed in %v", d)
}

// TestServicesDirBadFileKeepsLastGood: a file that does not parse, or
// whose service vipd refuses, leaves its last good version in force, and
// is reported in the log, in GetStatus and in vipd_services_dir_errors,
// naming the file and the field; fixing it applies it and clears all
// three.
func TestServicesDirBadFileKeepsLastGood(t *testing.T) {
	cfg, dir := dirConfig(t)
	cfg.MetricsAddr = freeAddr(t, "tcp", "127.0.0.1")
	path := filepath.Join(dir, "web.yaml")
	putFile(t, path, svcYAML("default/web", "198.19.0.10", 80, "198.18.1.10"))
	r := start(t, cfg, healthpb.HealthCheckResponse_SERVING)

	for _, tc := range []struct {
		name, data, field, words string
	}{
		{"unknown field", svcYAML("default/web", "198.19.0.10", 80, "198.18.1.99") + "colour: blue\n", "colour", "unknown field"},
		{"refused by vipd", svcYAML("default/web", "198.19.0.300", 80, "198.18.1.99"), "vips[0]", "198.19.0.300"},
		{"no services", "# emptied\n", "", "no services found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			putFile(t, path, tc.data)
			w := waitWarning(t, r, "services-dir/web.yaml", func(w *vipdv1.StatusWarning) bool {
				return strings.Contains(w.GetMessage(), tc.words)
			})
			t.Logf("warning: %s", w.GetMessage())
			if !strings.Contains(w.GetMessage(), "web.yaml") || (tc.field != "" && !strings.Contains(w.GetMessage(), tc.field)) {
				t.Errorf("warning %q names not the file and the field %q", w.GetMessage(), tc.field)
			}
			if !strings.Contains(w.GetMessage(), "last good version stays in force") || w.GetRemedy() == "" || w.GetSince() == nil {
				t.Errorf("warning %v: want it to say the last good version stays, with a remedy and since", w)
			}
			if web := services(t, r)["default/web"]; !slices.Equal(backendIPs(web), []string{"198.18.1.10"}) {
				t.Errorf("bad file changed the service: %v", web)
			}
			if v := dirErrorsMetric(t, cfg.MetricsAddr); v[fmt.Sprintf(`field=%q,file="web.yaml"`, tc.field)] != "1" {
				t.Errorf("vipd_services_dir_errors: %v, want web.yaml with field %q at 1", v, tc.field)
			}
			if line := logLine(r.log.String(), "file not applied; its last good version stays in force: file=web.yaml"); line == "" || !strings.Contains(line, tc.words) || !strings.Contains(line, "field="+tc.field) {
				t.Errorf("log has no line for the bad file and its field %q:\n%s", tc.field, r.log)
			}
		})
	}

	putFile(t, path, svcYAML("default/web", "198.19.0.10", 80, "198.18.1.12"))
	waitFor(t, r, applyWithin, "fixed file", func(s map[string]*vipdv1.Service) bool {
		return slices.Equal(backendIPs(s["default/web"]), []string{"198.18.1.12"})
	})
	if ws, _ := warningsOf(t, r); len(ws) != 0 {
		t.Errorf("warnings after the fix: %v", ws)
	}
	if v := dirErrorsMetric(t, cfg.MetricsAddr); len(v) != 0 {
		t.Errorf("vipd_services_dir_errors after the fix: %v", v)
	}
}

// TestServicesDirConflict: a file that claims a VIP:port (or a service
// name) that another file holds is refused, naming both files, while the
// file that held it first keeps it, whatever the names' order; once the
// holder lets go, the refused file is applied without being written again.
func TestServicesDirConflict(t *testing.T) {
	cfg, dir := dirConfig(t)
	putFile(t, filepath.Join(dir, "b.yaml"), svcYAML("default/web", "198.19.0.10", 80, "198.18.1.10"))
	r := start(t, cfg, healthpb.HealthCheckResponse_SERVING)

	// a.yaml comes later but first in name order: still refused.
	putFile(t, filepath.Join(dir, "a.yaml"), svcYAML("default/web2", "198.19.0.10", 80, "198.18.1.20"))
	w := waitWarning(t, r, "services-dir/a.yaml", func(*vipdv1.StatusWarning) bool { return true })
	t.Logf("warning: %s (remedy: %s)", w.GetMessage(), w.GetRemedy())
	for _, want := range []string{"a.yaml", "b.yaml", "198.19.0.10:80/TCP", "vips[0]"} {
		if !strings.Contains(w.GetMessage(), want) {
			t.Errorf("conflict warning %q does not name %s", w.GetMessage(), want)
		}
	}
	svcs := services(t, r)
	if _, ok := svcs["default/web2"]; ok || svcs["default/web"].GetOwner() != "file:b.yaml" {
		t.Fatalf("services %v: b.yaml must keep the VIP:port", svcs)
	}

	// The same service name in two files is a conflict too.
	putFile(t, filepath.Join(dir, "c.yaml"), svcYAML("default/web", "198.19.0.12", 80, "198.18.1.30"))
	w = waitWarning(t, r, "services-dir/c.yaml", func(*vipdv1.StatusWarning) bool { return true })
	if !strings.Contains(w.GetMessage(), "c.yaml") || !strings.Contains(w.GetMessage(), "b.yaml") {
		t.Errorf("name conflict warning %q does not name c.yaml and b.yaml", w.GetMessage())
	}
	if err := os.Remove(filepath.Join(dir, "c.yaml")); err != nil {
		t.Fatal(err)
	}

	// A node port that another file's service holds: refused, naming
	// both files, the node port and the field that claims it.
	nodePortYAML := func(name, vip string) string {
		return strings.Replace(svcYAML(name, vip, 80, "198.18.1.40"), "targetPort: 8080}", "targetPort: 8080, nodePort: 30080}", 1)
	}
	putFile(t, filepath.Join(dir, "d.yaml"), nodePortYAML("default/np1", "198.19.0.20"))
	waitFor(t, r, applyWithin, "d.yaml", func(s map[string]*vipdv1.Service) bool {
		ps := s["default/np1"].GetPorts()
		return len(ps) == 1 && ps[0].GetNodePort() == 30080
	})
	putFile(t, filepath.Join(dir, "e.yaml"), nodePortYAML("default/np2", "198.19.0.21"))
	w = waitWarning(t, r, "services-dir/e.yaml", func(*vipdv1.StatusWarning) bool { return true })
	for _, want := range []string{"e.yaml", "d.yaml", "node port 30080/TCP", "ports[0].node_port"} {
		if !strings.Contains(w.GetMessage(), want) {
			t.Errorf("node port conflict warning %q does not name %s", w.GetMessage(), want)
		}
	}
	for _, f := range []string{"d.yaml", "e.yaml"} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}

	// b.yaml gives the VIP:port up: a.yaml, unchanged, gets it.
	putFile(t, filepath.Join(dir, "b.yaml"), svcYAML("default/web", "198.19.0.11", 80, "198.18.1.10"))
	waitFor(t, r, applyWithin, "a.yaml after b.yaml let go", func(s map[string]*vipdv1.Service) bool {
		return s["default/web2"].GetOwner() == "file:a.yaml"
	})
	if ws, _ := warningsOf(t, r); len(ws) != 0 {
		t.Errorf("warnings once the conflict is gone: %v", ws)
	}
}

// TestServicesDirKubernetes: a file may hold Kubernetes Service and
// EndpointSlice manifests, converted as vipctl apply converts them.
func TestServicesDirKubernetes(t *testing.T) {
	cfg, dir := dirConfig(t)
	cfg.NodeName = "node-a"
	putFile(t, filepath.Join(dir, "web.yaml"), `apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 198.19.0.20
  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-abc
  namespace: shop
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [198.18.3.10]
  conditions: {ready: true}
  nodeName: node-a
- addresses: [198.18.3.11]
  conditions: {ready: true}
  nodeName: node-b
`)
	r := start(t, cfg, healthpb.HealthCheckResponse_SERVING)
	web := services(t, r)["shop/web"]
	if web.GetOwner() != "file:web.yaml" || !slices.Equal(backendIPs(web), []string{"198.18.3.10", "198.18.3.11"}) ||
		!slices.Equal(web.GetVips(), []string{"198.19.0.20"}) {
		t.Fatalf("shop/web %v: want the Service's cluster IP and its slice's endpoints, owned by file:web.yaml", web)
	}
	local := 0
	for _, b := range web.GetBackends() {
		if b.GetNodeLocal() {
			local++
			if b.GetIp() != "198.18.3.10" {
				t.Errorf("backend %s is node-local; only node-a's is", b.GetIp())
			}
		}
	}
	if local != 1 {
		t.Errorf("%d node-local backends, want 1 (--node-name node-a)", local)
	}
}

// TestServicesDirReloadRemovesOrphans: the services of a file: owner whose
// file is not there (deleted while vipd was stopped) are deleted at start,
// and on a reload (SIGHUP) too; other owners' are left alone.
func TestServicesDirReloadRemovesOrphans(t *testing.T) {
	cfg, dir := dirConfig(t)
	putFile(t, filepath.Join(dir, "old.yaml"), svcYAML("default/old", "198.19.0.30", 80, "198.18.4.10"))
	r := start(t, cfg, healthpb.HealthCheckResponse_SERVING)
	if services(t, r)["default/old"] == nil {
		t.Fatal("old.yaml not applied")
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "old.yaml")); err != nil {
		t.Fatal(err)
	}
	reload := make(chan os.Signal, 1)
	cfg.Reload = reload
	r = start(t, cfg, healthpb.HealthCheckResponse_SERVING)
	if s := services(t, r); len(s) != 0 {
		t.Fatalf("at ready after old.yaml went: services %v, want none", s)
	}

	// Services written through the API as a file's owner: a reload
	// removes them, as the file is not there; another owner's stay.
	for _, s := range []struct{ name, owner, vip string }{
		{"default/gone", "file:gone.yaml", "198.19.0.31"},
		{"default/kube", "kube", "198.19.0.32"},
	} {
		svc := &vipdv1.Service{Name: s.name, Owner: s.owner, Vips: []string{s.vip}, Ports: []*vipdv1.Port{{Name: "http", Port: 80, TargetPort: 8080}}}
		if _, err := r.local.LoadBalancerClient().UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: svc}); err != nil {
			t.Fatalf("upsert owner %s: %v", s.owner, err)
		}
	}
	reload <- os.Interrupt
	waitFor(t, r, applyWithin, "reload", func(s map[string]*vipdv1.Service) bool {
		_, gone := s["default/gone"]
		return !gone && s["default/kube"] != nil
	})
}

// logLine is the last line of log that contains what, or "".
func logLine(log, what string) string {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], what) {
			return lines[i]
		}
	}
	return ""
}

// waitWarning waits up to applyWithin for the GetStatus warning check to
// satisfy cond.
func waitWarning(t *testing.T, r *running, check string, cond func(*vipdv1.StatusWarning) bool) *vipdv1.StatusWarning {
	t.Helper()
	deadline := time.Now().Add(applyWithin)
	for {
		ws, _ := warningsOf(t, r)
		if w := ws[check]; w != nil && cond(w) {
			return w
		}
		if time.Now().After(deadline) {
			t.Fatalf("no warning %s as wanted within %v: %v\nlog:\n%s", check, applyWithin, ws, r.log)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// dirErrorsMetric reads the vipd_services_dir_errors series: labels →
// value.
func dirErrorsMetric(t *testing.T, addr string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, line := range strings.Split(metricsText(t, addr), "\n") {
		if rest, ok := strings.CutPrefix(line, "vipd_services_dir_errors{"); ok {
			labels, v, _ := strings.Cut(rest, "} ")
			out[labels] = v
		}
	}
	return out
}
