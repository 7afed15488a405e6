// Package vipdnode runs one node's vipd (on the none dataplane) and
// vipd-k8s against a test cluster (package cluster), with vipd-k8s
// authenticated as the ServiceAccount of deploy/kubernetes/rbac.yaml: so
// the manifests' RBAC, and nothing more, is what the adapter has.
package vipdnode

import (
	"bufio"
	"context"
	"fmt"
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
	Dir     string
	VIPD    *cluster.Process
	Adapter *cluster.Process
	API     *client.Client
	// adapter is vipd-k8s as StartAdapter runs it.
	adapter        *Adapter
	vipdMetricsURL string
}

// Start starts vipd on the none dataplane and waits until it serves, then
// starts vipd-k8s for it (StartAdapter, with opts' RBAC, NoWait and
// AllowForbidden). Cleanup stops vipd-k8s, then vipd, and removes their
// directories.
func Start(t testing.TB, c *cluster.Cluster, opts Options) *Node {
	t.Helper()
	dir, err := os.MkdirTemp("", "vipd-kube-node-")
	if err != nil {
		t.Fatal(err)
	}
	n := &Node{Dir: dir}
	t.Cleanup(func() {
		if n.VIPD != nil {
			if err := n.VIPD.Stop(10 * time.Second); err != nil {
				t.Log(err)
			}
			if t.Failed() {
				t.Logf("vipd log (last lines):\n%s", n.VIPD.Tail(40))
			}
		}
		if n.API != nil {
			n.API.Close()
		}
		os.RemoveAll(dir)
	})
	ports, err := cluster.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "vipd.sock")
	n.vipdMetricsURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[0])
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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.API.WaitServing(ctx); err != nil {
		t.Fatalf("vipd not serving: %v\n%s", err, n.VIPD.Tail(30))
	}
	// Registered after vipd's cleanup, so that vipd-k8s stops first.
	n.adapter = StartAdapter(t, c, AdapterOptions{Bin: opts.Bin, NodeName: opts.NodeName, VIPD: "unix://" + socket,
		RBAC: opts.RBAC, Args: opts.AdapterArgs, NoWait: opts.NoWait, AllowForbidden: opts.AllowForbidden})
	n.Adapter = n.adapter.Process
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
func (n *Node) Forbidden() []string { return n.adapter.Forbidden() }

// WaitHealthy waits until vipd-k8s's /healthz answers 200 (it has synced
// its informers and programmed vipd).
func (n *Node) WaitHealthy(timeout time.Duration) error { return n.adapter.WaitHealthy(timeout) }

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
func (n *Node) AdapterMetrics() (Metrics, error) { return n.adapter.Metrics() }
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
