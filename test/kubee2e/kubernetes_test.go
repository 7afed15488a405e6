package kubee2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"text/template"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/vipd/vipd/internal/kubeconvert"
	"github.com/vipd/vipd/internal/testkit/netlab"
	"github.com/vipd/vipd/internal/testkit/testbin"
	"github.com/vipd/vipd/test/soak"
)

// bins holds vipd, vipd-k8s and vipctl, built once by TestMain.
var bins string

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	dir, cleanup, err := testbin.Build(false, "./cmd/vipd", "./cmd/vipd-k8s", "./cmd/vipctl")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cleanup()
	bins = dir
	return m.Run()
}

// loadManifests reads the YAML documents of path, a text/template filled
// in with data, into typed objects: what kubectl would have created.
func loadManifests(t *testing.T, path string, data any) []runtime.Object {
	t.Helper()
	tmpl, err := template.ParseFiles(path)
	if err != nil {
		t.Fatal(err)
	}
	var text bytes.Buffer
	if err := tmpl.Option("missingkey=error").Execute(&text, data); err != nil {
		t.Fatal(err)
	}
	var objs []runtime.Object
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(text.String(), -1) {
		if len(bytes.TrimSpace(stripComments([]byte(doc)))) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Fatalf("%s, document %d: %v", path, i+1, err)
		}
		objs = append(objs, obj)
	}
	return objs
}

func stripComments(doc []byte) []byte {
	return regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAll(doc, nil)
}

// TestServiceThroughClusterIP runs, for each dataplane, the real vipd in
// a lab node and the adapter over a fake apiserver loaded from
// testdata/cluster.yaml, and checks with real connections from a pod:
// the dual-stack ClusterIP reaches both backends over TCP (named target
// port) and UDP; the headless and the other proxy's Services are not
// programmed; scaling the EndpointSlices to zero refuses connections at
// once; scaling back up restores the service, on the listed backend only.
func TestServiceThroughClusterIP(t *testing.T) {
	netlab.RequireRoot(t)
	for _, dp := range soak.Dataplanes() {
		t.Run(dp, func(t *testing.T) {
			soak.RequireDataplane(t, dp)
			testServiceThroughClusterIP(t, dp)
		})
	}
}

func testServiceThroughClusterIP(t *testing.T, dp string) {
	env := soak.NewEnv(t, filepath.Join(bins, "vipd"), dp, soak.Spec{Clients: []string{"client"}, Backends: []string{"be1", "be2"}})
	be1, be2 := env.Pod("be1"), env.Pod("be2")
	objs := loadManifests(t, "testdata/cluster.yaml", map[string]string{
		"be1v4": be1.IPv4().String(), "be2v4": be2.IPv4().String(),
		"be1v6": be1.IPv6().String(), "be2v6": be2.IPv6().String(),
	})
	kube := fake.NewClientset(objs...)
	runAdapter(t, env, kube)

	vip4, vip6 := netip.MustParseAddr("198.19.20.10"), netip.MustParseAddr("fd00:198:20::10")
	http4, http6 := netip.AddrPortFrom(vip4, 80), netip.AddrPortFrom(vip6, 80)
	waitFor(t, "the ClusterIP to answer", func() error {
		_, err := request(env, "tcp", http4)
		return err
	})
	for _, target := range []struct {
		network string
		addr    netip.AddrPort
	}{{"tcp", http4}, {"tcp", http6}, {"udp", netip.AddrPortFrom(vip4, 53)}, {"udp", netip.AddrPortFrom(vip6, 53)}} {
		seen := map[string]int{}
		for range 24 {
			backend, err := request(env, target.network, target.addr)
			if err != nil {
				t.Fatalf("%s %v: %v", target.network, target.addr, err)
			}
			seen[backend]++
		}
		if len(seen) != 2 || seen["be1"] == 0 || seen["be2"] == 0 {
			t.Errorf("%s %v: answered by %v; want be1 and be2", target.network, target.addr, seen)
		}
	}
	// vipd programs the kernel before it commits and answers the call:
	// the ClusterIP can answer a moment before ListServices shows it.
	waitFor(t, "vipd to list only shop/web", func() error {
		svcs, err := env.API.ListServices(context.Background(), "")
		if err != nil {
			return err
		}
		if len(svcs) != 1 || svcs[0].GetName() != "shop/web" || svcs[0].GetOwner() != kubeconvert.Owner {
			return fmt.Errorf("vipd's services: %v; want only shop/web, owned by %s (the headless and the other proxy's Services left alone)", svcs, kubeconvert.Owner)
		}
		return nil
	})

	// Scale to zero: every slice of the Service loses its endpoints.
	setEndpoints(t, kube, "web-v4", nil)
	setEndpoints(t, kube, "web-v6", nil)
	// Each slice's update is its own change: wait for both families.
	waitFor(t, "connections to be refused", func() error {
		for _, addr := range []netip.AddrPort{http4, http6} {
			if _, err := request(env, "tcp", addr); !errors.Is(err, syscall.ECONNREFUSED) {
				return fmt.Errorf("request to %v: %v; want connection refused", addr, err)
			}
		}
		return nil
	})
	for _, addr := range []netip.AddrPort{http4, http6} {
		start := time.Now()
		_, err := request(env, "tcp", addr)
		if !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > time.Second {
			t.Errorf("%v without endpoints: %v after %v; want connection refused at once", addr, err, time.Since(start))
		}
	}

	// Back to one: only be2 serves.
	setEndpoints(t, kube, "web-v4", []discoveryv1.Endpoint{readyEndpoint(be2.IPv4())})
	setEndpoints(t, kube, "web-v6", []discoveryv1.Endpoint{readyEndpoint(be2.IPv6())})
	waitFor(t, "the ClusterIP to answer again", func() error {
		for _, addr := range []netip.AddrPort{http4, http6} {
			if _, err := request(env, "tcp", addr); err != nil {
				return err
			}
		}
		return nil
	})
	for _, addr := range []netip.AddrPort{http4, http6} {
		for range 10 {
			if backend, err := request(env, "tcp", addr); err != nil || backend != "be2" {
				t.Fatalf("%v after scaling back up: %q %v; want be2", addr, backend, err)
			}
		}
	}
}

func readyEndpoint(ip netip.Addr) discoveryv1.Endpoint {
	ready := true
	return discoveryv1.Endpoint{Addresses: []string{ip.String()}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}
}

// setEndpoints replaces the endpoints of EndpointSlice shop/name, as the
// EndpointSlice controller does when pods come and go.
func setEndpoints(t *testing.T, kube *fake.Clientset, name string, eps []discoveryv1.Endpoint) {
	t.Helper()
	ctx := context.Background()
	slices := kube.DiscoveryV1().EndpointSlices("shop")
	s, err := slices.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Endpoints = eps
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations["endpoints.kubernetes.io/last-change-trigger-time"] = time.Now().UTC().Format(time.RFC3339Nano)
	if _, err := slices.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// request makes one request from the client pod and returns the backend
// that answered.
func request(env *soak.Env, network string, addr netip.AddrPort) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	r, err := env.Pod("client").Request(ctx, network, addr.String())
	if err != nil {
		return "", err
	}
	if r.Remote != addr {
		return r.Backend, fmt.Errorf("reply from %s came from %v, want %v", r.Backend, r.Remote, addr)
	}
	return r.Backend, nil
}

// waitFor polls cond until it returns nil, failing the test with its last
// error after 30 s.
func waitFor(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// testWriter sends log lines to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}
