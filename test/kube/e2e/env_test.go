package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"

	"github.com/vipd/vipd/test/kube/cluster"
	"github.com/vipd/vipd/test/kube/vipdnode"
)

// bin holds vipd and vipd-k8s, built once by TestMain.
var bin string

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	if _, err := cluster.Binaries(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, cleanup, err := vipdnode.BuildBinaries()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cleanup()
	bin = dir
	return m.Run()
}

// The node vipd runs on, and another one; both in zone-a and zone-b.
const (
	thisNode  = "node-a"
	otherNode = "node-b"
	ns        = "shop"
)

// env is one test's control plane with Nodes node-a and node-b, the
// namespace shop, and node-a's vipd and vipd-k8s.
type env struct {
	t    *testing.T
	c    *cluster.Cluster
	node *vipdnode.Node
	ctx  context.Context
	// adapterStopped: the test stopped vipd-k8s on purpose.
	adapterStopped bool
}

func newEnv(t *testing.T, adapterArgs ...string) *env {
	t.Helper()
	c := cluster.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e := &env{t: t, c: c, ctx: ctx}
	createNodesAndNamespace(t, ctx, c)
	e.node = vipdnode.Start(t, c, vipdnode.Options{Bin: bin, NodeName: thisNode, AdapterArgs: adapterArgs})
	return e
}

// createNodesAndNamespace creates the Nodes node-a (zone-a) and node-b
// (zone-b) and the namespace shop.
func createNodesAndNamespace(t *testing.T, ctx context.Context, c *cluster.Cluster) {
	t.Helper()
	for name, zone := range map[string]string{thisNode: "zone-a", otherNode: "zone-b"} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelTopologyZone: zone}}}
		if _, err := c.Admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// service is a ClusterIP Service shop/name selecting app=name, with the
// given ports (each TCP, its targetPort the port's name: a named port).
func service(name string, ports ...int32) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       corev1.ServiceSpec{Selector: map[string]string{"app": name}},
	}
	for i, p := range ports {
		pn := fmt.Sprintf("p%d", i)
		if i == 0 {
			pn = "http"
		}
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: pn, Port: p, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString(pn)})
	}
	return svc
}

var createOpts = metav1.CreateOptions{}

func (e *env) createService(svc *corev1.Service) *corev1.Service {
	e.t.Helper()
	got, err := e.c.Admin.CoreV1().Services(svc.Namespace).Create(e.ctx, svc, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create Service %s/%s: %v", svc.Namespace, svc.Name, err)
	}
	return got
}

var podSeq atomic.Uint32

// podIPs gives each new pod its own addresses in 198.18.0.0/16 and
// fd00:198:18::/64.
func podIPs() (v4, v6 string) {
	n := podSeq.Add(1)
	return netip.AddrFrom4([4]byte{198, 18, byte(n >> 8), byte(n)}).String(), fmt.Sprintf("fd00:198:18::%x", n)
}

// podSpec describes pods to create.
type podSpec struct {
	app       string           // label app=
	version   string           // label version=, a Deployment's template hash
	node      string           // spec.nodeName
	ports     map[string]int32 // named container ports (TCP)
	dualStack bool             // also an IPv6 pod IP
}

// createPods creates n Running, Ready pods as a kubelet would report them
// (status set through the status subresource), and returns their names.
func (e *env) createPods(n int, s podSpec) []string {
	e.t.Helper()
	var names []string
	for range n {
		name, err := e.createPod(e.ctx, s)
		if err != nil {
			e.t.Fatal(err)
		}
		names = append(names, name)
	}
	return names
}

// createPod creates one pod of s, Running and Ready, and returns its name.
// It is safe for concurrent use.
func (e *env) createPod(ctx context.Context, s podSpec) (string, error) {
	pods := e.c.Admin.CoreV1().Pods(ns)
	v4, v6 := podIPs()
	name := fmt.Sprintf("%s-%s-%s", s.app, s.version, strings.NewReplacer(".", "-").Replace(v4))
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": s.app, "version": s.version}},
		Spec: corev1.PodSpec{
			NodeName:   s.node,
			Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app:1"}},
		},
	}
	portNames := make([]string, 0, len(s.ports))
	for pn := range s.ports {
		portNames = append(portNames, pn)
	}
	sort.Strings(portNames)
	for _, pn := range portNames {
		pod.Spec.Containers[0].Ports = append(pod.Spec.Containers[0].Ports, corev1.ContainerPort{Name: pn, ContainerPort: s.ports[pn], Protocol: corev1.ProtocolTCP})
	}
	created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("create pod %s: %w", name, err)
	}
	now := metav1.Now()
	created.Status = corev1.PodStatus{
		Phase:  corev1.PodRunning,
		PodIP:  v4,
		PodIPs: []corev1.PodIP{{IP: v4}},
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
	}
	if s.dualStack {
		created.Status.PodIPs = append(created.Status.PodIPs, corev1.PodIP{IP: v6})
	}
	if _, err := pods.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return "", fmt.Errorf("set pod %s's status: %w", name, err)
	}
	return name, nil
}

// terminate deletes the pods with a long grace period: with no kubelet to
// finish the deletion, each stays terminating (deletionTimestamp set).
func (e *env) terminate(names []string) {
	e.t.Helper()
	grace := int64(3600)
	for _, name := range names {
		if err := e.c.Admin.CoreV1().Pods(ns).Delete(e.ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
			e.t.Fatalf("delete pod %s gracefully: %v", name, err)
		}
	}
}

// remove deletes the pods at once, as the kubelet does when they stopped.
func (e *env) remove(names []string) {
	e.t.Helper()
	zero := int64(0)
	for _, name := range names {
		if err := e.c.Admin.CoreV1().Pods(ns).Delete(e.ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			e.t.Fatalf("delete pod %s: %v", name, err)
		}
	}
}

// waitVIPD polls vipd's kubernetes services until check accepts them.
func (e *env) waitVIPD(what string, check func(svcs map[string]*vipdv1.Service) error) {
	e.t.Helper()
	e.waitVIPDWithin(what, 90*time.Second, check)
}

func (e *env) waitVIPDWithin(what string, timeout time.Duration, check func(svcs map[string]*vipdv1.Service) error) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		svcs, err := e.node.Services(e.ctx)
		if err == nil {
			if err = check(svcs); err == nil {
				return
			}
		}
		last = err
		if err := e.c.Check(); err != nil {
			e.t.Fatalf("vipd: waiting for %s: %v", what, err)
		}
		if !e.node.VIPD.Running() || !e.node.Adapter.Running() && !e.adapterStopped {
			e.t.Fatalf("vipd: waiting for %s: vipd or vipd-k8s exited:\n%s\n%s", what, e.node.VIPD.Tail(20), e.node.Adapter.Tail(20))
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("vipd: waited %v for %s: %v", timeout, what, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// backends describes a service's backends, sorted: "ip state ports".
func backends(svc *vipdv1.Service) []string {
	var out []string
	for _, b := range svc.GetBackends() {
		var ports []string
		for name, p := range b.GetPorts() {
			ports = append(ports, fmt.Sprintf("%s=%d", name, p))
		}
		sort.Strings(ports)
		local := ""
		if b.GetNodeLocal() {
			local = " local"
		}
		state := strings.TrimPrefix(b.GetState().String(), "BACKEND_STATE_")
		out = append(out, fmt.Sprintf("%s %s %s%s", b.GetIp(), state, strings.Join(ports, ","), local))
	}
	sort.Strings(out)
	return out
}

// wantBackends is a check that shop/name has exactly the given backends
// (in any order, as backends formats them).
func wantBackends(name string, want ...string) func(map[string]*vipdv1.Service) error {
	want = slices.Clone(want)
	sort.Strings(want)
	return func(svcs map[string]*vipdv1.Service) error {
		svc, ok := svcs[ns+"/"+name]
		if !ok {
			return fmt.Errorf("no service %s/%s (have %v)", ns, name, keys(svcs))
		}
		if got := backends(svc); !slices.Equal(got, want) {
			return fmt.Errorf("%s/%s backends:\n  %s\nwant:\n  %s", ns, name, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
		return nil
	}
}

// podIP is a pod's IPv4 address.
func (e *env) podIP(name string) string {
	e.t.Helper()
	p, err := e.c.Admin.CoreV1().Pods(ns).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return p.Status.PodIP
}

// slices lists the EndpointSlices of Service shop/name.
func (e *env) slices(name string) []discoveryv1.EndpointSlice {
	e.t.Helper()
	l, err := e.c.Admin.DiscoveryV1().EndpointSlices(ns).List(e.ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
	if err != nil {
		e.t.Fatal(err)
	}
	return l.Items
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// deleteNow deletes without a grace period.
func deleteNow() metav1.DeleteOptions {
	zero := int64(0)
	return metav1.DeleteOptions{GracePeriodSeconds: &zero}
}
