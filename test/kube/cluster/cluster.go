// Package cluster runs a real Kubernetes control plane for tests, on
// loopback only: etcd, kube-apiserver (RBAC on, dual-stack Service ranges
// inside vipd's test ranges) and kube-controller-manager running only the
// EndpointSlice and EndpointSliceMirroring controllers. There is no kubelet
// and no scheduler: tests create Nodes and Pods and set the Pods' status
// themselves, and the real controller makes the EndpointSlices.
//
// The binaries come from the nested module controlplane (see its build.sh). Everything the
// cluster writes lives in one temporary directory, removed with every
// process on cleanup even when the test fails.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Ranges the cluster allocates Service cluster IPs from: inside vipd's test
// VIP ranges (198.19.0.0/16 and fd00:198::/32), and inside netlab's
// ServiceRangeV4 and ServiceRangeV6, so that they overlap no lab pod range
// (fd00:198:k::/64 on node k). A Service range must not overlap a pod
// range: a lab node routes its pod range as unreachable, so a packet to a
// VIP there would die in routing before the iptables dataplane's filter
// FORWARD rules could reject it.
const (
	ServiceCIDRv4 = "198.19.0.0/16"
	ServiceCIDRv6 = "fd00:198:ffff::/108"
)

// BinEnv names the environment variable that points at a directory holding
// etcd, kube-apiserver and kube-controller-manager; without it Binaries
// runs controlplane/build.sh.
const BinEnv = "VIPD_KUBE_BIN"

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// Binaries returns the directory of the control-plane binaries: $VIPD_KUBE_BIN,
// or what controlplane/build.sh builds (once per process; the script
// rebuilds only when the module changed).
func Binaries() (string, error) {
	binOnce.Do(func() {
		if d := os.Getenv(BinEnv); d != "" {
			binDir = d
			return
		}
		dir, err := ModuleDir()
		if err != nil {
			binErr = err
			return
		}
		cmd := exec.Command(filepath.Join(dir, "controlplane", "build.sh"))
		cmd.Dir = filepath.Join(dir, "controlplane")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			binErr = fmt.Errorf("build.sh: %w\n%s", err, stderr.String())
			return
		}
		binDir = strings.TrimSpace(string(out))
	})
	return binDir, binErr
}

// ModuleDir is the directory of this module's go.mod (test/kube).
func ModuleDir() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if filepath.Base(filepath.Dir(gomod)) != "kube" {
		return "", fmt.Errorf("not inside the test/kube module (go.mod: %q)", gomod)
	}
	return filepath.Dir(gomod), nil
}

// Cluster is a running control plane.
type Cluster struct {
	// Dir holds the certificates, keys, kubeconfigs, etcd's data and logs.
	Dir string
	// Server is the apiserver's https URL; CAFile its CA certificate.
	Server string
	CAFile string
	// Admin is a system:masters client for the test itself.
	Admin       *kubernetes.Clientset
	AdminConfig *rest.Config

	Etcd, APIServer, ControllerManager *Process
	etcdURL                            string
	apiserverStopped, etcdStopped      bool
	// apiserverRestarts are when StartAPIServer started the apiserver
	// again.
	apiserverRestarts []time.Time
}

// Start starts etcd, the apiserver and the controller manager, waits until
// the apiserver is ready, and registers the cleanup with t.
func Start(t testing.TB) *Cluster {
	t.Helper()
	bin, err := Binaries()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "vipd-kube-")
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{Dir: dir}
	t.Cleanup(func() {
		c.stopAll(t)
		if t.Failed() {
			for _, p := range []*Process{c.ControllerManager, c.APIServer, c.Etcd} {
				if p != nil {
					t.Logf("%s log (last lines):\n%s", p.Name, p.Tail(40))
				}
			}
		}
		os.RemoveAll(dir)
	})
	if err := c.start(bin); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *Cluster) stopAll(t testing.TB) {
	for _, p := range []*Process{c.ControllerManager, c.APIServer, c.Etcd} {
		if p != nil {
			if err := p.Stop(15 * time.Second); err != nil {
				t.Log(err)
			}
		}
	}
}

func (c *Cluster) start(bin string) error {
	pki, err := newPKI(c.Dir)
	if err != nil {
		return err
	}
	c.CAFile = pki.CAFile()
	ports, err := FreePorts(3)
	if err != nil {
		return err
	}
	etcdPort, peerPort, apiPort := ports[0], ports[1], ports[2]
	c.etcdURL = fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	c.Server = fmt.Sprintf("https://127.0.0.1:%d", apiPort)

	// etcd: plaintext, on loopback only, reachable by the apiserver alone.
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	c.Etcd = &Process{Name: "etcd", Bin: filepath.Join(bin, "etcd"), LogFile: logPath(c.Dir, "etcd"), Args: []string{
		"--name=default", "--data-dir=" + filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls=" + c.etcdURL, "--advertise-client-urls=" + c.etcdURL,
		"--listen-peer-urls=" + peerURL, "--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=default=" + peerURL,
		"--unsafe-no-fsync", "--log-level=warn",
	}}
	if err := c.Etcd.Start(); err != nil {
		return err
	}
	if err := waitHTTP(c.Etcd, c.etcdURL+"/health", nil, 30*time.Second); err != nil {
		return err
	}

	serveCert, serveKey, err := pki.issue("apiserver", "kube-apiserver", nil,
		[]net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("198.19.0.1")},
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"})
	if err != nil {
		return err
	}
	saKey, saPub, err := pki.serviceAccountKey()
	if err != nil {
		return err
	}
	c.APIServer = &Process{Name: "kube-apiserver", Bin: filepath.Join(bin, "kube-apiserver"), LogFile: logPath(c.Dir, "kube-apiserver"), Args: []string{
		"--etcd-servers=" + c.etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", apiPort),
		"--cert-dir=" + filepath.Join(c.Dir, "apiserver-certs"),
		"--tls-cert-file=" + serveCert, "--tls-private-key-file=" + serveKey,
		"--client-ca-file=" + c.CAFile,
		"--authorization-mode=RBAC",
		"--service-cluster-ip-range=" + ServiceCIDRv4 + "," + ServiceCIDRv6,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + saPub, "--service-account-signing-key-file=" + saKey,
		// No kubelet, so no one creates a namespace's default ServiceAccount
		// for its pods; the test's pods need none.
		"--disable-admission-plugins=ServiceAccount",
		// On loopback the lease reconciler would publish 127.0.0.1 as the
		// kubernetes Service's endpoint, which the apiserver refuses.
		"--endpoint-reconciler-type=none",
		"--profiling=false", "--v=1",
	}}
	if err := c.StartAPIServer(); err != nil {
		return err
	}

	adminCert, adminKey, err := pki.issue("admin", "vipd-test-admin", []string{"system:masters"}, nil, nil)
	if err != nil {
		return err
	}
	adminKubeconfig := filepath.Join(c.Dir, "admin.kubeconfig")
	if err := writeKubeconfig(adminKubeconfig, c.Server, c.CAFile, clientcmdapi.AuthInfo{ClientCertificate: adminCert, ClientKey: adminKey}); err != nil {
		return err
	}
	if c.AdminConfig, err = clientcmd.BuildConfigFromFlags("", adminKubeconfig); err != nil {
		return err
	}
	c.AdminConfig.QPS, c.AdminConfig.Burst = 500, 1000
	if c.Admin, err = kubernetes.NewForConfig(c.AdminConfig); err != nil {
		return err
	}
	if err := c.WaitReady(60 * time.Second); err != nil {
		return err
	}

	// The controller manager's own identity, bound by the bootstrap RBAC;
	// each controller gets its own ServiceAccount's token, as in a cluster.
	kcmCert, kcmKey, err := pki.issue("controller-manager", "system:kube-controller-manager", nil, nil, nil)
	if err != nil {
		return err
	}
	kcmKubeconfig := filepath.Join(c.Dir, "controller-manager.kubeconfig")
	if err := writeKubeconfig(kcmKubeconfig, c.Server, c.CAFile, clientcmdapi.AuthInfo{ClientCertificate: kcmCert, ClientKey: kcmKey}); err != nil {
		return err
	}
	c.ControllerManager = &Process{Name: "kube-controller-manager", Bin: filepath.Join(bin, "kube-controller-manager"), LogFile: logPath(c.Dir, "kube-controller-manager"), Args: []string{
		"--kubeconfig=" + kcmKubeconfig,
		"--controllers=endpointslice-controller,endpointslice-mirroring-controller",
		"--use-service-account-credentials=true",
		"--leader-elect=false",
		// Its default 20 requests/s would make the 1,000-Service scenario
		// measure the controller's client-side throttle.
		"--kube-api-qps=500", "--kube-api-burst=1000",
		"--bind-address=127.0.0.1", "--secure-port=0",
		"--v=1",
	}}
	return c.ControllerManager.Start()
}

// Check reports a control-plane process that exited on its own (the
// apiserver while stopped by StopAPIServer does not count).
func (c *Cluster) Check() error {
	for _, p := range []*Process{c.Etcd, c.ControllerManager} {
		if p == c.Etcd && c.etcdStopped {
			continue
		}
		if p != nil && p.Exited() != nil && !p.Running() {
			return fmt.Errorf("%s exited:\n%s", p.Name, p.Tail(20))
		}
	}
	if c.APIServer != nil && !c.apiserverStopped && c.APIServer.Exited() != nil && !c.APIServer.Running() {
		return fmt.Errorf("%s exited:\n%s", c.APIServer.Name, c.APIServer.Tail(20))
	}
	return nil
}

// StartAPIServer starts the apiserver (again) with the same flags and
// storage, without waiting for it to be ready (see WaitReady).
func (c *Cluster) StartAPIServer() error {
	c.apiserverStopped = false
	c.apiserverRestarts = append(c.apiserverRestarts, time.Now())
	return c.APIServer.Start()
}

// APIServerRestarts returns when StartAPIServer started the apiserver
// again, in order.
func (c *Cluster) APIServerRestarts() []time.Time { return c.apiserverRestarts }

// StopAPIServer stops the apiserver; etcd and the controller manager keep
// running (the controller manager retries, as in a cluster).
func (c *Cluster) StopAPIServer() error {
	c.apiserverStopped = true
	return c.APIServer.Stop(20 * time.Second)
}

// RestartEtcd stops etcd, waits down, and starts it again on the same data
// and port, waiting until it answers; the apiserver reconnects by itself.
func (c *Cluster) RestartEtcd(down time.Duration) error {
	c.etcdStopped = true
	if err := c.Etcd.Stop(20 * time.Second); err != nil {
		return err
	}
	time.Sleep(down)
	if err := c.Etcd.Start(); err != nil {
		return err
	}
	c.etcdStopped = false
	return waitHTTP(c.Etcd, c.etcdURL+"/health", nil, 30*time.Second)
}

// WaitReady waits until the apiserver answers /readyz with ok.
func (c *Cluster) WaitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if !c.APIServer.Running() {
			return fmt.Errorf("kube-apiserver exited:\n%s", c.APIServer.Tail(30))
		}
		if c.Admin == nil {
			// Before the admin client exists: the port answering is enough.
			conn, err := net.DialTimeout("tcp", strings.TrimPrefix(c.Server, "https://"), time.Second)
			if err == nil {
				conn.Close()
				return nil
			}
			last = err
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			body, err := c.Admin.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
			cancel()
			if err == nil && string(body) == "ok" {
				return nil
			}
			last = fmt.Errorf("/readyz: %s %v", body, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("kube-apiserver not ready after %v: %v\n%s", timeout, last, c.APIServer.Tail(30))
}

// CompactEtcd compacts etcd's history up to its current revision, so that
// a watch from an older resourceVersion fails with "too old resource
// version" once the apiserver's watch cache has to go back to etcd.
func (c *Cluster) CompactEtcd(ctx context.Context) (revision int64, err error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.etcdURL}, DialTimeout: 5 * time.Second})
	if err != nil {
		return 0, fmt.Errorf("etcd client: %w", err)
	}
	defer cli.Close()
	resp, err := cli.Get(ctx, "compact-probe")
	if err != nil {
		return 0, fmt.Errorf("etcd revision: %w", err)
	}
	rev := resp.Header.Revision
	if _, err := cli.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		return 0, fmt.Errorf("compact etcd to %d: %w", rev, err)
	}
	return rev, nil
}

// WriteTokenKubeconfig writes a kubeconfig at path that reaches this
// cluster with a bearer token.
func (c *Cluster) WriteTokenKubeconfig(path, token string) error {
	return writeKubeconfig(path, c.Server, c.CAFile, clientcmdapi.AuthInfo{Token: token})
}

func writeKubeconfig(path, server, caFile string, auth clientcmdapi.AuthInfo) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: caFile}
	cfg.AuthInfos["user"] = &auth
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "user"}
	cfg.CurrentContext = "test"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return nil
}

// waitHTTP polls url until it answers 200, failing early if p exits.
func waitHTTP(p *Process, url string, client *http.Client, timeout time.Duration) error {
	if client == nil {
		client = &http.Client{Timeout: time.Second}
	}
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if !p.Running() {
			return fmt.Errorf("%s exited:\n%s", p.Name, p.Tail(30))
		}
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = errors.New(resp.Status)
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s: %s not answering after %v: %v\n%s", p.Name, url, timeout, last, p.Tail(30))
}
