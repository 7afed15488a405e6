package kubeadapter_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/kubeadapter"
	"github.com/vipd/vipd/internal/testkit/testserver"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

const waitFor = 10 * time.Second

// eventually polls f until it returns nil, and fails the test with its
// last error after waitFor.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, waitFor, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// calls counts the RPCs a client makes, by method name (UpsertService, ...);
// the UpsertService calls with create_only (CreateService) are counted
// under createOnly too.
type calls struct {
	mu sync.Mutex
	n  map[string]int
}

const createOnly = "UpsertService(create_only)"

func (c *calls) interceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	c.mu.Lock()
	c.n[method[strings.LastIndex(method, "/")+1:]]++
	if u, ok := req.(*vipdv1.UpsertServiceRequest); ok && u.GetCreateOnly() {
		c.n[createOnly]++
	}
	c.mu.Unlock()
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (c *calls) get(method string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[method]
}

// env is a fake apiserver and a real vipd API over the fake dataplane,
// with a client whose socket can be switched to a restarted vipd.
type env struct {
	t     *testing.T
	kube  *fake.Clientset
	srv   *testserver.Server
	sock  atomic.Pointer[string]
	vipd  *client.Client
	calls *calls
	// sentinels counts settle's sentinel Services.
	sentinels int
	// sentinelLabels label settle's Services and slices, so that an
	// adapter with a service proxy name programs them.
	sentinelLabels map[string]string
	// wrap, when set, is what the adapter gets instead of vipd.
	wrap func(*client.Client) kubeadapter.VIPD
}

func newEnv(t *testing.T, objs ...runtime.Object) *env {
	t.Helper()
	e := &env{t: t, kube: fake.NewClientset(objs...), srv: testserver.Start(t), calls: &calls{n: map[string]int{}}}
	e.setServer(e.srv)
	dial := func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", *e.sock.Load())
	}
	c, err := client.New("unix:///vipd-test.sock", client.WithDialOptions(
		grpc.WithContextDialer(dial),
		grpc.WithChainUnaryInterceptor(e.calls.interceptor)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	e.vipd = c
	return e
}

// setServer points the client at srv, as after a vipd restart.
func (e *env) setServer(srv *testserver.Server) {
	e.srv = srv
	s := srv.Socket()
	e.sock.Store(&s)
}

// adapter is a running Adapter.
type adapter struct {
	*kubeadapter.Adapter
	reg  *prometheus.Registry
	stop func()
}

// start runs an adapter until the test ends or stop is called.
func (e *env) start(opts ...kubeadapter.Option) *adapter {
	e.t.Helper()
	reg := prometheus.NewRegistry()
	opts = append([]kubeadapter.Option{kubeadapter.WithNodeName("node-a"), kubeadapter.WithRetryBackoff(10*time.Millisecond, 200*time.Millisecond)}, opts...)
	var vipd kubeadapter.VIPD = e.vipd
	if e.wrap != nil {
		vipd = e.wrap(e.vipd)
	}
	a, err := kubeadapter.New(testLogger(e.t), e.kube, vipd, reg, opts...)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					e.t.Errorf("adapter Run: %v", err)
				}
			case <-time.After(waitFor):
				e.t.Errorf("adapter did not stop within %v", waitFor)
			}
		})
	}
	e.t.Cleanup(stop)
	return &adapter{Adapter: a, reg: reg, stop: stop}
}

// summary is the part of a vipd service that the tests compare, in one
// line: VIPs, ports, backends (state, ports, node-local), affinity, policy.
func summary(s *vipdv1.Service) string {
	var ports []string
	for _, p := range s.Ports {
		ports = append(ports, fmt.Sprintf("%s/%s:%d", p.Name, strings.TrimPrefix(p.Protocol.String(), "PROTOCOL_"), p.Port))
	}
	var bs []string
	for _, b := range s.Backends {
		var ps []string
		for n, p := range b.Ports {
			ps = append(ps, fmt.Sprintf("%s=%d", n, p))
		}
		sort.Strings(ps)
		x := b.Ip + " " + strings.TrimPrefix(b.State.String(), "BACKEND_STATE_") + " " + strings.Join(ps, ",")
		if b.NodeLocal {
			x += " local"
		}
		bs = append(bs, x)
	}
	out := fmt.Sprintf("vips=%s ports=%s backends=[%s]", strings.Join(s.Vips, ","), strings.Join(ports, ","), strings.Join(bs, "; "))
	if s.SessionAffinity.GetMode() == vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP {
		out += fmt.Sprintf(" affinity=%d", s.SessionAffinity.GetTimeoutSeconds())
	}
	if s.InternalTrafficPolicy == vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL {
		out += " itp=local"
	}
	return out
}

const sentinelNS = "zz-sentinel"

// state is vipd's kubernetes-owned services but the sentinels, by name.
func (e *env) state() map[string]string {
	e.t.Helper()
	svcs, err := e.vipd.ListServices(context.Background(), "kubernetes")
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]string{}
	for _, s := range svcs {
		if !strings.HasPrefix(s.Name, sentinelNS+"/") {
			out[s.Name] = summary(s)
		}
	}
	return out
}

func diffState(want, got map[string]string) error {
	var d []string
	for _, n := range sortedKeys(want, got) {
		if want[n] != got[n] {
			d = append(d, fmt.Sprintf("%s:\n  want %q\n  got  %q", n, want[n], got[n]))
		}
	}
	if len(d) > 0 {
		return fmt.Errorf("vipd's services differ:\n%s", strings.Join(d, "\n"))
	}
	return nil
}

func sortedKeys(ms ...map[string]string) []string {
	var ks []string
	for _, m := range ms {
		for k := range m {
			if !slices.Contains(ks, k) {
				ks = append(ks, k)
			}
		}
	}
	sort.Strings(ks)
	return ks
}

// waitState waits until vipd's kubernetes services are want.
func (e *env) waitState(want map[string]string) {
	e.t.Helper()
	eventually(e.t, "vipd's state", func() error { return diffState(want, e.state()) })
}

// settle returns once the adapter has handled every change made before
// it: it adds a sentinel Service and EndpointSlice and waits for vipd to
// have them. Each informer delivers events in order, and a pass takes the
// whole dirty set, so changes seen before the sentinel are applied by then.
func (e *env) settle() {
	e.t.Helper()
	e.sentinels++
	n := e.sentinels
	name := fmt.Sprintf("s%d", n)
	vip := fmt.Sprintf("198.19.255.%d", n)
	svc := service(sentinelNS, name, []string{vip}, svcPort("", "", 80, 80))
	sl := slice(sentinelNS, name, name, discoveryv1.AddressTypeIPv4,
		[]discoveryv1.EndpointPort{slicePort("", "", 80)}, endpoint(fmt.Sprintf("198.18.255.%d", n), ready, ""))
	for k, v := range e.sentinelLabels {
		if svc.Labels == nil {
			svc.Labels = map[string]string{}
		}
		svc.Labels[k], sl.Labels[k] = v, v
	}
	e.createService(svc)
	e.createSlice(sl)
	eventually(e.t, "sentinel "+name, func() error {
		s, err := e.vipd.GetService(context.Background(), sentinelNS+"/"+name)
		if err != nil {
			return err
		}
		if len(s.Backends) != 1 {
			return fmt.Errorf("sentinel has %d backends", len(s.Backends))
		}
		return nil
	})
}

// Kubernetes objects.

func service(ns, name string, ips []string, ports ...corev1.ServicePort) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIPs: ips, Ports: ports},
	}
	if len(ips) > 0 {
		s.Spec.ClusterIP = ips[0]
	}
	return s
}

func svcPort(name string, proto corev1.Protocol, port int32, target any) corev1.ServicePort {
	p := corev1.ServicePort{Name: name, Protocol: proto, Port: port}
	switch t := target.(type) {
	case int:
		p.TargetPort = intstr.FromInt(t)
	case string:
		p.TargetPort = intstr.FromString(t)
	}
	return p
}

func slicePort(name string, proto corev1.Protocol, port int32) discoveryv1.EndpointPort {
	p := discoveryv1.EndpointPort{Name: ptr.To(name), Port: ptr.To(port)}
	if proto != "" {
		p.Protocol = ptr.To(proto)
	}
	return p
}

func slice(ns, svc, name string, family discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc},
		},
		AddressType: family, Ports: ports, Endpoints: eps,
	}
}

type condition int

const (
	ready condition = iota
	terminating
	drained
)

func endpoint(ip string, c condition, node string) discoveryv1.Endpoint {
	ep := discoveryv1.Endpoint{Addresses: []string{ip}}
	switch c {
	case ready:
		ep.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}
	case terminating:
		ep.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
	case drained:
		ep.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(true)}
	}
	if node != "" {
		ep.NodeName = ptr.To(node)
	}
	return ep
}

func (e *env) createService(s *corev1.Service) {
	e.t.Helper()
	if _, err := e.kube.CoreV1().Services(s.Namespace).Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) updateService(s *corev1.Service) {
	e.t.Helper()
	if _, err := e.kube.CoreV1().Services(s.Namespace).Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) deleteService(ns, name string) {
	e.t.Helper()
	if err := e.kube.CoreV1().Services(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) createSlice(s *discoveryv1.EndpointSlice) {
	e.t.Helper()
	if _, err := e.kube.DiscoveryV1().EndpointSlices(s.Namespace).Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) updateSlice(s *discoveryv1.EndpointSlice) {
	e.t.Helper()
	if _, err := e.kube.DiscoveryV1().EndpointSlices(s.Namespace).Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) deleteSlice(ns, name string) {
	e.t.Helper()
	if err := e.kube.DiscoveryV1().EndpointSlices(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func metaNS(ns, name string) metav1.ObjectMeta { return metav1.ObjectMeta{Namespace: ns, Name: name} }

// testLogger logs to the test's log with VIPD_K8S_TEST_LOGS set, and
// nowhere otherwise.
func testLogger(t *testing.T) hclog.Logger {
	if os.Getenv("VIPD_K8S_TEST_LOGS") == "" {
		return hclog.NewNullLogger()
	}
	return hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Debug, Output: tWriter{t}})
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
