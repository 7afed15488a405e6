package kubee2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/vipd/vipd/internal/kubeadapter"
	"github.com/vipd/vipd/internal/testkit/netlab"
	"github.com/vipd/vipd/test/soak"
)

// TestServiceFromOutside runs, for each dataplane, the real vipd in a lab
// node (with its defaults: node ports on every node address, the uplink
// as the external interface) and the adapter over a fake apiserver loaded
// from testdata/external.yaml, and checks with real connections from a
// host outside the node, behind the upstream router:
//   - the NodePort Service (externalTrafficPolicy: Cluster) answers on the
//     node's IPv4 and IPv6 addresses, TCP and UDP, from both backends,
//     which see the node's address as the client's (masqueraded);
//   - the LoadBalancer Service answers on its ingress IP once the load
//     balancer writes it into the Service's status, and with
//     externalTrafficPolicy: Local only from its node-local endpoint,
//     which sees the outside client's own address; its health-check node
//     port says 200 with one local endpoint;
//   - a pod reaching the same ingress IP gets cluster semantics: both
//     endpoints, its own address kept.
func TestServiceFromOutside(t *testing.T) {
	netlab.RequireRoot(t)
	for _, dp := range soak.Dataplanes() {
		t.Run(dp, func(t *testing.T) {
			soak.RequireDataplane(t, dp)
			testServiceFromOutside(t, dp)
		})
	}
}

func testServiceFromOutside(t *testing.T, dp string) {
	env := soak.NewEnv(t, filepath.Join(bins, "vipd"), dp, soak.Spec{Clients: []string{"client"}, Backends: []string{"be1", "be2"}})
	ctx := context.Background()
	outside, err := env.Lab.AddExternalHost(ctx, "outside")
	if err != nil {
		t.Fatal(err)
	}
	lbIP := netip.MustParseAddr("198.19.21.1")
	if err := env.Lab.RouteToNode(netip.PrefixFrom(lbIP, 32), env.Node); err != nil {
		t.Fatal(err)
	}
	be1, be2 := env.Pod("be1"), env.Pod("be2")
	kube := fake.NewClientset(loadManifests(t, "testdata/external.yaml", map[string]string{
		"be1v4": be1.IPv4().String(), "be2v4": be2.IPv4().String(),
		"be1v6": be1.IPv6().String(), "be2v6": be2.IPv6().String(),
	})...)
	runAdapter(t, env, kube)

	nodeAddrs := env.Node.UplinkAddrs()
	masqueraded := func(r netlab.Reply) error {
		if !slices.Contains(nodeAddrs, r.Peer.Addr()) {
			return fmt.Errorf("%s saw the client as %v; want one of the node's addresses %v (masqueraded)", r.Backend, r.Peer.Addr(), nodeAddrs)
		}
		return nil
	}
	for _, target := range []struct {
		network string
		addr    netip.AddrPort
	}{
		{"tcp", netip.AddrPortFrom(env.Node.IPv4(), 30080)},
		{"tcp", netip.AddrPortFrom(env.Node.IPv6(), 30080)},
		{"udp", netip.AddrPortFrom(env.Node.IPv4(), 30053)},
		{"udp", netip.AddrPortFrom(env.Node.IPv6(), 30053)},
	} {
		what := fmt.Sprintf("node port %s %v from outside", target.network, target.addr)
		waitFor(t, what, func() error {
			_, err := requestFrom(outside.NS, target.network, target.addr)
			return err
		})
		expectBackends(t, what, outside.NS, target.network, target.addr, []string{"be1", "be2"}, masqueraded)
	}

	// The load balancer assigns the ingress IP: a change of the Service's
	// status only.
	services := kube.CoreV1().Services("shop")
	lb, err := services.Get(ctx, "web-lb", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lbIP.String(), IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)}}
	if _, err := services.UpdateStatus(ctx, lb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	lbAddr := netip.AddrPortFrom(lbIP, 80)
	what := fmt.Sprintf("load-balancer IP %v from outside", lbAddr)
	waitFor(t, what, func() error {
		_, err := requestFrom(outside.NS, "tcp", lbAddr)
		return err
	})
	clientKept := func(want netip.Addr) func(netlab.Reply) error {
		return func(r netlab.Reply) error {
			if r.Peer.Addr() != want {
				return fmt.Errorf("%s saw the client as %v; want %v (the client's own address)", r.Backend, r.Peer.Addr(), want)
			}
			return nil
		}
	}
	expectBackends(t, what+" (externalTrafficPolicy Local)", outside.NS, "tcp", lbAddr, []string{"be1"}, clientKept(outside.IPv4()))
	nodePort := netip.AddrPortFrom(env.Node.IPv4(), 30180)
	expectBackends(t, fmt.Sprintf("node port %v of the Local Service from outside", nodePort), outside.NS, "tcp", nodePort, []string{"be1"}, clientKept(outside.IPv4()))
	client := env.Pod("client")
	expectBackends(t, fmt.Sprintf("load-balancer IP %v from a pod (cluster semantics)", lbAddr), client.NS, "tcp", lbAddr, []string{"be1", "be2"}, clientKept(client.IPv4()))

	hc := netip.AddrPortFrom(env.Node.IPv4(), 32100)
	waitFor(t, fmt.Sprintf("health-check node port %v from outside", hc), func() error {
		code, reply, err := getHealth(outside.NS, hc)
		switch {
		case err != nil:
			return err
		case code != http.StatusOK || reply.Service.Namespace != "shop" || reply.Service.Name != "web-lb" || reply.LocalEndpoints < 1:
			return fmt.Errorf("HTTP %d %+v; want 200 for shop/web-lb with a local endpoint", code, reply)
		}
		return nil
	})
}

// runAdapter runs the adapter for node1 over kube and env's vipd until the
// test ends.
func runAdapter(t *testing.T, env *soak.Env, kube *fake.Clientset) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	adapter, err := kubeadapter.New(hclog.New(&hclog.LoggerOptions{Name: "vipd-k8s", Level: hclog.Debug, Output: testWriter{t}}),
		kube, env.NewClient(), prometheus.NewRegistry(), kubeadapter.WithNodeName("node1"))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- adapter.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("adapter: %v", err)
		}
	})
}

// expectBackends makes 24 requests from ns to addr and fails the test
// unless exactly the backends want answer, each reply passing check.
func expectBackends(t *testing.T, what string, ns *netlab.NS, network string, addr netip.AddrPort, want []string, check func(netlab.Reply) error) {
	t.Helper()
	seen := map[string]int{}
	for range 24 {
		r, err := requestFrom(ns, network, addr)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if err := check(r); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		seen[r.Backend]++
	}
	for _, b := range want {
		if seen[b] == 0 {
			t.Errorf("%s: answered by %v; want %v", what, seen, want)
			return
		}
	}
	if len(seen) != len(want) {
		t.Errorf("%s: answered by %v; want only %v", what, seen, want)
	}
}

// requestFrom makes one request from ns to addr and returns the reply,
// which must come from addr.
func requestFrom(ns *netlab.NS, network string, addr netip.AddrPort) (netlab.Reply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	r, err := ns.Request(ctx, network, addr.String())
	if err != nil {
		return r, err
	}
	if r.Remote != addr {
		return r, fmt.Errorf("reply from %s came from %v, want %v", r.Backend, r.Remote, addr)
	}
	return r, nil
}

// healthReply is kube-proxy's health-check node port answer.
type healthReply struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

// getHealth makes one HTTP GET from ns to addr.
func getHealth(ns *netlab.NS, addr netip.AddrPort) (int, healthReply, error) {
	var hr healthReply
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	code, err := ns.GetJSON(ctx, "http://"+addr.String()+"/", &hr)
	return code, hr, err
}
