// Package vipdnode runs one node's vipd (on the none dataplane) and
// vipd-k8s against a test cluster (package cluster), with vipd-k8s
// authenticated as the ServiceAccount of deploy/kubernetes/rbac.yaml: so
// the manifests' RBAC, and nothing more, is what the adapter has.
package vipdnode

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/test/kube/cluster"
)

// BuildBinaries builds vipd and vipd-k8s from the repository's root module
// into a new temporary directory and returns it with a function that
// removes it. Call it once from TestMain.
func BuildBinaries() (dir string, cleanup func(), err error) {
	mod, err := cluster.ModuleDir()
	if err != nil {
		return "", nil, err
	}
	root := filepath.Clean(filepath.Join(mod, "..", ".."))
	dir, err = os.MkdirTemp("", "vipd-kube-node-bin")
	if err != nil {
		return "", nil, err
	}
	cleanup = func() { os.RemoveAll(dir) }
	cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/vipd", "./cmd/vipd-k8s")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("build vipd and vipd-k8s in %s: %w\n%s", root, err, out)
	}
	return dir, cleanup, nil
}

// Options configure a Node.
type Options struct {
	// Bin holds vipd and vipd-k8s (BuildBinaries).
	Bin string
	// NodeName is the Kubernetes node the adapter runs for.
	NodeName string
	// RBAC is the manifest applied for the adapter (default: the
	// repository's deploy/kubernetes/rbac.yaml).
	RBAC string
	// AdapterArgs are extra vipd-k8s flags (such as --service-proxy-name).
	AdapterArgs []string
	// NoWait returns as soon as vipd-k8s runs, without waiting for it to
	// be healthy (for tests that expect it never to be).
	NoWait bool
	// AllowForbidden turns off the check, at cleanup, that the apiserver
	// never refused vipd-k8s a request ("forbidden" in its log): for tests
	// that weaken the RBAC manifest on purpose.
	AllowForbidden bool
}

// Node is a running vipd and vipd-k8s pair.
type Node struct {
	Dir                                           string
	VIPD                                          *cluster.Process
	Adapter                                       *cluster.Process
	API                                           *client.Client
	vipdMetricsURL, adapterMetricsURL, healthzURL string
}

// Start applies the RBAC manifest, mints the ServiceAccount's token,
// starts vipd and then vipd-k8s, and waits until both serve. Cleanup stops
// them and removes their directory.
func Start(t testing.TB, c *cluster.Cluster, opts Options) *Node {
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
	dir, err := os.MkdirTemp("", "vipd-kube-node-")
	if err != nil {
		t.Fatal(err)
	}
	n := &Node{Dir: dir}
	t.Cleanup(func() {
		if n.Adapter != nil && !opts.AllowForbidden {
			if lines := n.Forbidden(); len(lines) > 0 {
				t.Errorf("the apiserver refused vipd-k8s requests with %s's rights:\n%s", opts.RBAC, strings.Join(lines, "\n"))
			}
		}
		for _, p := range []*cluster.Process{n.Adapter, n.VIPD} {
			if p == nil {
				continue
			}
			if err := p.Stop(10 * time.Second); err != nil {
				t.Log(err)
			}
			if t.Failed() {
				t.Logf("%s log (last lines):\n%s", p.Name, p.Tail(40))
			}
		}
		if n.API != nil {
			n.API.Close()
		}
		os.RemoveAll(dir)
	})
	kubeconfig := filepath.Join(dir, "vipd-k8s.kubeconfig")
	if err := c.WriteTokenKubeconfig(kubeconfig, token); err != nil {
		t.Fatal(err)
	}
	ports, err := cluster.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "vipd.sock")
	n.vipdMetricsURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[0])
	n.adapterMetricsURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[1])
	n.healthzURL = fmt.Sprintf("http://127.0.0.1:%d/healthz", ports[2])
	n.VIPD = &cluster.Process{Name: "vipd", Bin: filepath.Join(opts.Bin, "vipd"), LogFile: filepath.Join(dir, "vipd.log"), Args: []string{
		"run", "--dataplane", "none", "--socket", socket, "--state-dir", filepath.Join(dir, "state"),
		fmt.Sprintf("--metrics-addr=127.0.0.1:%d", ports[0]), "--log-level", "debug",
	}}
	if err := n.VIPD.Start(); err != nil {
		t.Fatal(err)
	}
	if n.API, err = client.New("unix://" + socket); err != nil {
		t.Fatal(err)
	}
	waitCtx, waitCancel := context.WithTimeout(ctx, 30*time.Second)
	defer waitCancel()
	if err := n.API.WaitServing(waitCtx); err != nil {
		t.Fatalf("vipd not serving: %v\n%s", err, n.VIPD.Tail(30))
	}
	n.Adapter = &cluster.Process{Name: "vipd-k8s", Bin: filepath.Join(opts.Bin, "vipd-k8s"), LogFile: filepath.Join(dir, "vipd-k8s.log"), Args: append([]string{
		"--kubeconfig", kubeconfig, "--node-name", opts.NodeName, "--vipd", "unix://" + socket,
		fmt.Sprintf("--metrics-address=127.0.0.1:%d", ports[1]), fmt.Sprintf("--healthz-address=127.0.0.1:%d", ports[2]),
		"--log-level", "debug",
	}, opts.AdapterArgs...)}
	if err := n.Adapter.Start(); err != nil {
		t.Fatal(err)
	}
	if !opts.NoWait {
		if err := n.WaitHealthy(60 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// RestartVIPD stops vipd and starts it again on the same socket, with its
// state directory kept or, with wipe, emptied first (a node that lost its
// disk), and waits until it serves. vipd-k8s keeps running throughout.
func (n *Node) RestartVIPD(ctx context.Context, wipe bool) error {
	if err := n.VIPD.Stop(10 * time.Second); err != nil {
		return err
	}
	if wipe {
		if err := os.RemoveAll(filepath.Join(n.Dir, "state")); err != nil {
			return err
		}
	}
	if err := n.VIPD.Start(); err != nil {
		return err
	}
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := n.API.WaitServing(waitCtx); err != nil {
		return fmt.Errorf("vipd not serving after its restart: %w\n%s", err, n.VIPD.Tail(20))
	}
	return nil
}

// Forbidden returns the lines of vipd-k8s's log (client-go's, through
// klog) that say the apiserver refused a request for lack of rights.
func (n *Node) Forbidden() []string {
	b, err := os.ReadFile(n.Adapter.LogFile)
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

// WaitHealthy waits until vipd-k8s's /healthz answers 200 (it has synced
// its informers and programmed vipd).
func (n *Node) WaitHealthy(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		if !n.Adapter.Running() {
			return fmt.Errorf("vipd-k8s exited:\n%s", n.Adapter.Tail(30))
		}
		resp, err := http.Get(n.healthzURL)
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
	return fmt.Errorf("vipd-k8s /healthz not ok after %v: %s\n%s", timeout, last, n.Adapter.Tail(30))
}

// Services lists vipd's services of owner "kubernetes", by name.
func (n *Node) Services(ctx context.Context) (map[string]*vipdv1.Service, error) {
	svcs, err := n.API.ListServices(ctx, "kubernetes")
	if err != nil {
		return nil, err
	}
	m := make(map[string]*vipdv1.Service, len(svcs))
	for _, s := range svcs {
		m[s.GetName()] = s
	}
	return m, nil
}

// AdapterMetrics and VIPDMetrics scrape the two processes' Prometheus
// endpoints.
func (n *Node) AdapterMetrics() (Metrics, error) { return scrape(n.adapterMetricsURL) }
func (n *Node) VIPDMetrics() (Metrics, error)    { return scrape(n.vipdMetricsURL) }

// Metrics maps each sample line's name with labels, as the text format
// writes it (`name{a="b"}`), to its value.
type Metrics map[string]float64

// Sum adds the samples of metric name whose labels contain every one of
// labels (each `key="value"`).
func (m Metrics) Sum(name string, labels ...string) float64 {
	var sum float64
	for k, v := range m {
		base, rest, _ := strings.Cut(k, "{")
		if base != name {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(rest, l) {
				ok = false
			}
		}
		if ok {
			sum += v
		}
	}
	return sum
}

func scrape(url string) (Metrics, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	m := Metrics{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		m[line[:i]] = v
	}
	return m, sc.Err()
}
