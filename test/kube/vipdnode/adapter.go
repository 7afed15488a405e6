package vipdnode

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/test/kube/cluster"
)

// AdapterOptions configure an Adapter: a vipd-k8s for a vipd that the
// caller runs itself (on a real dataplane, say), where Start runs both.
type AdapterOptions struct {
	// Bin holds vipd-k8s (BuildBinaries).
	Bin string
	// NodeName is the Kubernetes node the adapter runs for.
	NodeName string
	// VIPD is vipd's API as vipd-k8s --vipd takes it ("unix:///path").
	VIPD string
	// RBAC is the manifest applied for the adapter (default: the
	// repository's deploy/kubernetes/rbac.yaml).
	RBAC string
	// Args are extra vipd-k8s flags.
	Args []string
	// NoWait returns as soon as vipd-k8s runs, without waiting for it to
	// be healthy (for tests that expect it never to be).
	NoWait bool
	// AllowForbidden turns off the check, at cleanup, that the apiserver
	// never refused vipd-k8s a request ("forbidden" in its log): for tests
	// that weaken the RBAC manifest on purpose.
	AllowForbidden bool
}

// Adapter is a running vipd-k8s, authenticated as the ServiceAccount of
// its RBAC manifest.
type Adapter struct {
	// Dir holds its kubeconfig and log.
	Dir     string
	Process *cluster.Process

	metricsURL, healthzURL string
}

// StartAdapter applies the RBAC manifest, mints the ServiceAccount's
// token, starts vipd-k8s against c and opts.VIPD, and (unless
// opts.NoWait) waits until its /healthz says it has synced and programmed
// vipd. Cleanup checks that the apiserver refused it nothing (no
// "forbidden" in its log; unless opts.AllowForbidden), stops it, logs its
// log's tail if the test failed, and removes its directory.
func StartAdapter(t testing.TB, c *cluster.Cluster, opts AdapterOptions) *Adapter {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if opts.RBAC == "" {
		mod, err := cluster.ModuleDir()
		if err != nil {
			t.Fatal(err)
		}
		opts.RBAC = filepath.Join(mod, "..", "..", "deploy", "kubernetes", "rbac.yaml")
	}
	sa, err := ApplyRBAC(ctx, c.Admin, opts.RBAC)
	if err != nil {
		t.Fatal(err)
	}
	token, err := Token(ctx, c.Admin, sa)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "vipd-kube-adapter-")
	if err != nil {
		t.Fatal(err)
	}
	a := &Adapter{Dir: dir}
	t.Cleanup(func() {
		if a.Process != nil {
			if lines := notWhileRBACWarms(a.Forbidden(), c.APIServerRestarts()); len(lines) > 0 && !opts.AllowForbidden {
				t.Errorf("the apiserver refused vipd-k8s requests with %s's rights:\n%s", opts.RBAC, strings.Join(lines, "\n"))
			}
			if err := a.Process.Stop(10 * time.Second); err != nil {
				t.Log(err)
			}
			if t.Failed() {
				t.Logf("vipd-k8s log (last lines):\n%s", a.Process.Tail(40))
			}
		}
		os.RemoveAll(dir)
	})
	kubeconfig := filepath.Join(dir, "vipd-k8s.kubeconfig")
	if err := c.WriteTokenKubeconfig(kubeconfig, token); err != nil {
		t.Fatal(err)
	}
	ports, err := cluster.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	a.metricsURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[0])
	a.healthzURL = fmt.Sprintf("http://127.0.0.1:%d/healthz", ports[1])
	a.Process = &cluster.Process{Name: "vipd-k8s", Bin: filepath.Join(opts.Bin, "vipd-k8s"), LogFile: filepath.Join(dir, "vipd-k8s.log"), Args: append([]string{
		"--kubeconfig", kubeconfig, "--node-name", opts.NodeName, "--vipd", opts.VIPD,
		fmt.Sprintf("--metrics-address=127.0.0.1:%d", ports[0]), fmt.Sprintf("--healthz-address=127.0.0.1:%d", ports[1]),
		"--log-level", "debug",
	}, opts.Args...)}
	if err := a.Process.Start(); err != nil {
		t.Fatal(err)
	}
	if !opts.NoWait {
		if err := a.WaitHealthy(60 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	return a
}

// WaitHealthy waits until vipd-k8s's /healthz answers 200 (it has synced
// its informers and programmed vipd), and fails if vipd-k8s exits first.
func (a *Adapter) WaitHealthy(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		if !a.Process.Running() {
			return fmt.Errorf("vipd-k8s exited:\n%s", a.Process.Tail(30))
		}
		resp, err := http.Get(a.healthzURL)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, body)
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("vipd-k8s /healthz not ok after %v: %s\n%s", timeout, last, a.Process.Tail(30))
}

// Forbidden returns the lines of vipd-k8s's log that say the apiserver
// refused a request for lack of rights.
func (a *Adapter) Forbidden() []string {
	b, err := os.ReadFile(a.Process.LogFile)
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "forbidden") {
			out = append(out, line)
		}
	}
	return out
}

// rbacWarmup is how long after it starts an apiserver may refuse requests
// that its RBAC rules allow: its authorizer reads the roles and bindings
// through informers of its own, which can lag its readiness.
const rbacWarmup = 30 * time.Second

// notWhileRBACWarms returns the log lines that were not written within
// rbacWarmup after one of restarts (a line without a time is kept).
func notWhileRBACWarms(lines []string, restarts []time.Time) []string {
	var out []string
	for _, line := range lines {
		at, ok := logTime(line)
		warming := false
		for _, r := range restarts {
			if ok && !at.Before(r.Add(-time.Second)) && at.Before(r.Add(rbacWarmup)) {
				warming = true
			}
		}
		if !warming {
			out = append(out, line)
		}
	}
	return out
}

// logTime returns when a vipd-k8s log line was written: hclog's RFC 3339
// time that starts the line, or the "Lmmdd hh:mm:ss.uuuuuu" header of
// client-go's klog lines (local time, this year).
func logTime(line string) (time.Time, bool) {
	f := strings.Fields(line)
	if len(f) == 0 {
		return time.Time{}, false
	}
	if t, err := time.Parse(time.RFC3339Nano, f[0]); err == nil {
		return t, true
	}
	if len(f) > 1 && len(f[0]) == 5 && strings.ContainsRune("IWEF", rune(f[0][0])) {
		if t, err := time.ParseInLocation("0102 15:04:05.000000", f[0][1:]+" "+f[1], time.Local); err == nil {
			return t.AddDate(time.Now().Year(), 0, 0), true
		}
	}
	return time.Time{}, false
}

// Metrics scrapes vipd-k8s's Prometheus endpoint.
func (a *Adapter) Metrics() (Metrics, error) { return scrape(a.metricsURL) }
