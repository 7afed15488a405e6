package e2e

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/vipd/vipd/internal/testkit/netlab"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/test/soak"

	"github.com/vipd/vipd/test/kube/cluster"
	"github.com/vipd/vipd/test/kube/labnode"
)

// The traffic scenario's Services' cluster IPs, chosen so that failure
// messages and packet captures are easy to read. They lie in the lowest
// 256 addresses of the apiserver's Service ranges, which its allocator
// hands out dynamically only once the rest is full (see external_test.go).
var (
	trafficVIPs   = []string{"198.19.0.80", "fd00:198:ffff::80"}
	trafficNPVIPs = []string{"198.19.0.81", "fd00:198:ffff::81"}
)

const (
	// trafficPodPort is every backend pod's echo server port, named
	// "http" in the Pods and targeted by name from the Services' port 80.
	trafficPodPort = 8080
	// trafficNodePort is web-np's node port.
	trafficNodePort = 30080
	// trafficQuietProbes is how many requests in a row per VIP must miss
	// a pod to say that it gets no new connections any more: with two
	// backends picked at random, a pod still programmed misses 20 in a
	// row once in a million.
	trafficQuietProbes = 20
	// trafficFlipRounds is how many times the readiness scenario makes a
	// pod not ready and ready again (two measured changes each).
	trafficFlipRounds = 5
)

// TestTraffic runs, for each dataplane, the real vipd on that dataplane
// in a lab node standing for node-a, and vipd-k8s against the real
// apiserver and EndpointSlice controller; pods are lab namespaces running
// echo servers, whose addresses the test writes into the Pod objects'
// status as a kubelet would. Real TCP connections from a client pod (and
// from a host outside the cluster for the NodePort) follow a Deployment
// through its life and check that:
//   - the dual-stack ClusterIP reaches both ready pods over IPv4 and IPv6,
//     from the VIP, with the client's own address kept; the NodePort
//     Service reaches them from outside on the node's IPv4 and IPv6
//     addresses, masqueraded;
//   - a pod patched not ready gets no new connections (its open ones keep
//     flowing), and gets them again once ready; the time from each status
//     update to traffic in the new state is measured and logged (p50);
//   - a rolling update (a new pod ready, then an old one terminating and
//     removed, one at a time) loses none of the connections a client
//     makes back to back all along;
//   - a terminating pod (deleted with a grace period) gets no new
//     connections while a ready pod is left, keeps its open ones, and
//     gets new ones again when every pod is terminating (Kubernetes'
//     fallback to serving terminating endpoints), unless not ready;
//   - scaled to zero, both Services refuse connections at once (REJECT),
//     rather than let them time out.
func TestTraffic(t *testing.T) {
	for _, dp := range soak.Dataplanes() {
		t.Run(dp, func(t *testing.T) {
			start := time.Now()
			testTraffic(t, dp)
			t.Logf("%s: traffic scenario took %v", dp, time.Since(start).Round(100*time.Millisecond))
		})
	}
}

func testTraffic(t *testing.T, dp string) {
	e := newTrafficEnv(t, dp)
	e.createService("web", corev1.ServiceTypeClusterIP, trafficVIPs, 0)
	e.createService("web-np", corev1.ServiceTypeNodePort, trafficNPVIPs, trafficNodePort)
	vips := e.addrs(trafficVIPs, 80)
	nodePorts := []netip.AddrPort{
		netip.AddrPortFrom(e.node.Node.IPv4(), trafficNodePort),
		netip.AddrPortFrom(e.node.Node.IPv6(), trafficNodePort),
	}
	v1, v2 := []string{"web-v1-a", "web-v1-b"}, []string{"web-v2-a", "web-v2-b"}

	// Two ready pods behind both Services. No connection before vipd has
	// programmed them: one that leaves the node untranslated would leave a
	// conntrack entry without NAT behind (see testScaleToZero).
	for _, name := range v1 {
		e.startPod(name, "v1")
	}
	for _, svc := range []string{"web", "web-np"} {
		e.eventually("vipd to program "+svc, func() error { return e.checkVIPDBackends(svc, v1...) })
	}
	e.eventually("the ClusterIP to reach the v1 pods", func() error { return e.checkBackends(vips, v1...) })
	e.expectBackends("the dual-stack ClusterIP", vips, v1...)
	e.eventually("the NodePort to answer from outside", func() error { return e.checkNodePort(nodePorts, v1...) })

	// Each step starts from the state the one before left. Scaling to
	// zero comes last: see testScaleToZero.
	e.step("readiness", func(t *testing.T) { e.testReadiness(t, vips, v1[0], v1[1]) })
	e.step("rolling update", func(t *testing.T) { e.testRollingUpdate(t, vips, v1, v2) })
	e.step("terminating", func(t *testing.T) { e.testTerminating(t, vips, v2[0], v2[1]) })
	e.step("scale to zero", func(t *testing.T) { e.testScaleToZero(t, vips, nodePorts, v2) })
}

// step runs f as subtest name, with e's helpers failing that subtest, and
// ends the test if it failed: the next step needs the state f leaves.
func (e *trafficEnv) step(name string, f func(t *testing.T)) {
	parent := e.t
	ok := parent.Run(name, func(t *testing.T) {
		e.t = t
		defer func() { e.t = parent }()
		f(t)
	})
	if !ok {
		parent.FailNow()
	}
}

// testReadiness flips pod a's readiness trafficFlipRounds times while b stays
// ready, and logs the time each change took to reach the traffic.
func (e *trafficEnv) testReadiness(t *testing.T, vips []netip.AddrPort, a, b string) {
	open := e.dialTo(vips[0], a)
	defer open.Close()
	var notReady, ready []time.Duration
	for round := range trafficFlipRounds {
		notReady = append(notReady, e.measureNotReady(a, vips))
		e.expectBackends(a+" not ready", vips, b)
		if round == 0 {
			e.expectOpen(open, a, a+" not ready")
		}
		ready = append(ready, e.measureReady(a, vips))
		e.expectBackends(a+" ready again", vips, a, b)
	}
	all := slices.Concat(notReady, ready)
	t.Logf("%s: Pod status update → new connections in the new state (both families), over %d changes: p50 %v (max %v); not ready → no new connections: p50 %v (max %v); ready → new connections: p50 %v (max %v)",
		e.dp, len(all), durationP50(all), slices.Max(all), durationP50(notReady), slices.Max(notReady), durationP50(ready), slices.Max(ready))
}

// testRollingUpdate rolls the pods old to the pods next (version v2), one
// at a time and never below two ready pods (maxSurge 1, maxUnavailable
// 0), while the client pod connects back to back through both families
// of the ClusterIP: no connection may fail.
func (e *trafficEnv) testRollingUpdate(t *testing.T, vips []netip.AddrPort, old, next []string) {
	var targets []soak.Target
	for _, vip := range vips {
		targets = append(targets, soak.Target{Addr: vip, Backends: slices.Concat(old, next)})
	}
	traffic := soak.StartTraffic(e.client.NS, soak.TrafficConfig{Workers: 1}, targets...)
	defer traffic.Stop()
	start := time.Now()
	for i := range old {
		e.startPod(next[i], "v2")
		e.terminate(old[i])
		// The old pod drains, as one that handles SIGTERM does for its
		// grace period: it stops only once no Service sends it new
		// connections.
		for _, svc := range []string{"web", "web-np"} {
			e.waitVIPDState(svc, e.podAddrs(old[i]), "TERMINATING")
		}
		time.Sleep(100 * time.Millisecond)
		if err := e.node.RemovePod(old[i]); err != nil {
			t.Fatal(err)
		}
		e.remove(old[i])
	}
	e.eventually("the new pods to get the connections", func() error {
		if err := e.checkVIPDBackends("web", next...); err != nil {
			return err
		}
		st := traffic.Stats()
		if st.Backends[next[0]] < 20 || st.Backends[next[1]] < 20 {
			return fmt.Errorf("traffic so far: %v", st)
		}
		return nil
	})
	st := traffic.Stop()
	t.Logf("%s: rolling update of %d pods took %v; client traffic all along: %v", e.dp, len(old), time.Since(start).Round(time.Millisecond), st)
	if st.Failed > 0 {
		t.Errorf("%s: %d of %d connections failed during the rolling update: %v", e.dp, st.Failed, st.OK+st.Failed, st)
		e.logUnanswered()
	}
	if st.OK < 100 {
		t.Errorf("%s: only %d connections during the rolling update; want at least 100 (a client connecting back to back)", e.dp, st.OK)
	}
	e.expectBackends("after the rolling update", vips, next...)
}

// testTerminating deletes pods a and b with a grace period, which leaves
// them terminating in a cluster without kubelets, and checks Kubernetes'
// rules for terminating endpoints on new and open connections.
func (e *trafficEnv) testTerminating(t *testing.T, vips []netip.AddrPort, a, b string) {
	open := e.dialTo(vips[0], a)
	defer open.Close()
	e.terminate(a)
	e.eventually("terminating "+a+" to get no new connections", func() error { return e.checkQuiet(vips, a) })
	e.expectBackends(a+" terminating, "+b+" ready", vips, b)
	e.expectOpen(open, a, a+" terminating")

	// No ready pod left: new connections go to the terminating pods that
	// still serve, as kube-proxy does, rather than being refused.
	e.terminate(b)
	e.eventually("both terminating pods to get new connections", func() error { return e.checkBackends(vips, a, b) })
	e.expectBackends("both pods terminating", vips, a, b)

	// A terminating pod that is not ready no longer serves.
	e.setReady(a, false)
	e.eventually("terminating, not ready "+a+" to get no new connections", func() error { return e.checkQuiet(vips, a) })
	e.expectBackends(a+" terminating and not ready, "+b+" terminating", vips, b)
	e.expectOpen(open, a, a+" terminating and not ready")
}

// testScaleToZero removes the last pods: both Services must refuse new
// connections at once, from a pod and from outside. On the way from
// answered to refused, every connection must be one or the other: the
// iptables dataplane once committed the nat table (the DNAT gone) before
// the filter table (the REJECT added), and a connection opened in
// between left the node untranslated (an unreachable from the lab's
// router, a hang elsewhere) and left a conntrack entry without NAT that
// sent later connections from the same client port past the Service.
func (e *trafficEnv) testScaleToZero(t *testing.T, vips, nodePorts []netip.AddrPort, pods []string) {
	start := time.Now()
	e.remove(pods...)
	var odd []string
	e.eventually("the ClusterIP to refuse connections", func() error {
		err := e.checkRefused(e.client.NS, vips)
		if err != nil && !errors.Is(err, errTrafficAnswered) {
			odd = append(odd, fmt.Sprintf("%v after the deletion: %v", time.Since(start).Round(time.Millisecond), err))
		}
		return err
	})
	t.Logf("%s: Pods deleted → ClusterIP refusing (both families): %v", e.dp, time.Since(start).Round(time.Millisecond))
	if len(odd) > 0 {
		t.Errorf("%s: on the way to refusing, %d requests were neither answered nor refused at once; the first: %s", e.dp, len(odd), odd[0])
	}
	e.eventually("the NodePort to refuse connections from outside", func() error { return e.checkRefused(e.outside.NS, nodePorts) })
	// Refused at once, every time: not a timeout, not an unreachable.
	for range 5 {
		if err := e.checkRefused(e.client.NS, vips); err != nil {
			t.Fatalf("no endpoints: %v", err)
		}
		if err := e.checkRefused(e.outside.NS, nodePorts); err != nil {
			t.Fatalf("no endpoints, from outside: %v", err)
		}
	}
	for _, name := range pods {
		if err := e.node.RemovePod(name); err != nil {
			t.Fatal(err)
		}
	}
}

// trafficEnv is one dataplane's world for TestTraffic: a control plane
// with Nodes node-a and node-b and the namespace shop, a lab node for
// node-a programmed by vipd on dp and driven by vipd-k8s, the lab's
// client pod, and a host outside the cluster.
type trafficEnv struct {
	t       *testing.T
	dp      string
	ctx     context.Context
	c       *cluster.Cluster
	node    *labnode.Node
	client  *netlab.Pod
	outside *netlab.ExternalHost
	// pods are the lab pods of the Pod objects, by name.
	pods map[string]*netlab.Pod
}

func newTrafficEnv(t *testing.T, dp string) *trafficEnv {
	t.Helper()
	c := cluster.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	createNodesAndNamespace(t, ctx, c)
	n := labnode.Start(t, c, labnode.Options{Bin: bin, Dataplane: dp, NodeName: thisNode, Clients: []string{"client"}})
	outside, err := n.Lab.AddExternalHost(ctx, "outside")
	if err != nil {
		t.Fatal(err)
	}
	return &trafficEnv{t: t, dp: dp, ctx: ctx, c: c, node: n, client: n.Pod("client"), outside: outside, pods: map[string]*netlab.Pod{}}
}

// createService creates Service shop/name of type typ selecting app=web,
// dual-stack with the given cluster IPs, port 80 to the pods' port
// "http"; a NodePort Service gets nodePort.
func (e *trafficEnv) createService(name string, typ corev1.ServiceType, clusterIPs []string, nodePort int32) {
	e.t.Helper()
	policy := corev1.IPFamilyPolicyRequireDualStack
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Type:           typ,
			Selector:       map[string]string{"app": "web"},
			ClusterIP:      clusterIPs[0],
			ClusterIPs:     clusterIPs,
			IPFamilies:     []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
			IPFamilyPolicy: &policy,
			Ports: []corev1.ServicePort{{
				Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromString("http"), NodePort: nodePort,
			}},
		},
	}
	if _, err := e.c.Admin.CoreV1().Services(ns).Create(e.ctx, svc, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create Service %s/%s: %v", ns, name, err)
	}
}

// addrs pairs each address with port.
func (e *trafficEnv) addrs(ips []string, port uint16) []netip.AddrPort {
	var out []netip.AddrPort
	for _, ip := range ips {
		out = append(out, netip.AddrPortFrom(netip.MustParseAddr(ip), port))
	}
	return out
}

// startPod starts pod name (labels app=web, version): a lab pod whose
// echo server answers as name on trafficPodPort, and a Pod object on
// node-a whose container port "http" is that port, Running and Ready with
// the lab pod's addresses as its IPs, as a kubelet would report it.
func (e *trafficEnv) startPod(name, version string) {
	e.t.Helper()
	p, err := e.node.AddPod(name, trafficPodPort)
	if err != nil {
		e.t.Fatal(err)
	}
	e.pods[name] = p
	pods := e.c.Admin.CoreV1().Pods(ns)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "web", "version": version}},
		Spec: corev1.PodSpec{
			NodeName: thisNode,
			Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app:1", Ports: []corev1.ContainerPort{
				{Name: "http", ContainerPort: trafficPodPort, Protocol: corev1.ProtocolTCP},
			}}},
		},
	}
	created, err := pods.Create(e.ctx, pod, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create pod %s: %v", name, err)
	}
	created.Status = corev1.PodStatus{
		Phase:  corev1.PodRunning,
		PodIP:  p.IPv4().String(),
		PodIPs: []corev1.PodIP{{IP: p.IPv4().String()}, {IP: p.IPv6().String()}},
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()},
		},
	}
	setReadyConditions(created, true)
	if _, err := pods.UpdateStatus(e.ctx, created, metav1.UpdateOptions{}); err != nil {
		e.t.Fatalf("set pod %s's status: %v", name, err)
	}
}

// setReadyConditions sets pod's Ready and ContainersReady conditions to
// ready.
func setReadyConditions(pod *corev1.Pod, ready bool) {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	now := metav1.Now()
	for _, typ := range []corev1.PodConditionType{corev1.PodReady, corev1.ContainersReady} {
		i := slices.IndexFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool { return c.Type == typ })
		if i < 0 {
			pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: typ})
			i = len(pod.Status.Conditions) - 1
		}
		pod.Status.Conditions[i].Status = status
		pod.Status.Conditions[i].LastTransitionTime = now
	}
}

// setReady updates pod name's readiness, as a kubelet does when a
// readiness probe changes its mind, and returns the time just before the
// update was sent.
func (e *trafficEnv) setReady(name string, ready bool) time.Time {
	e.t.Helper()
	pods := e.c.Admin.CoreV1().Pods(ns)
	pod, err := pods.Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	setReadyConditions(pod, ready)
	sent := time.Now()
	if _, err := pods.UpdateStatus(e.ctx, pod, metav1.UpdateOptions{}); err != nil {
		e.t.Fatalf("set pod %s ready=%v: %v", name, ready, err)
	}
	return sent
}

// terminate deletes pod name with a long grace period: with no kubelet to
// finish the deletion, it stays terminating (deletionTimestamp set).
func (e *trafficEnv) terminate(name string) {
	e.t.Helper()
	grace := int64(3600)
	if err := e.c.Admin.CoreV1().Pods(ns).Delete(e.ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		e.t.Fatalf("delete pod %s gracefully: %v", name, err)
	}
}

// remove deletes the Pod objects at once, as the kubelet does once their
// containers stopped.
func (e *trafficEnv) remove(names ...string) {
	e.t.Helper()
	for _, name := range names {
		if err := e.c.Admin.CoreV1().Pods(ns).Delete(e.ctx, name, deleteNow()); err != nil {
			e.t.Fatalf("delete pod %s: %v", name, err)
		}
	}
}

// podAddrs are lab pod name's IPv4 and IPv6 addresses.
func (e *trafficEnv) podAddrs(name string) []string {
	p := e.pods[name]
	return []string{p.IPv4().String(), p.IPv6().String()}
}

// request makes one TCP request (a new connection) from the client pod
// to addr and returns the backend that answered. The reply must come
// from addr, and the backend must have seen the client's own address:
// inside the cluster nothing masquerades.
func (e *trafficEnv) request(addr netip.AddrPort) (string, error) {
	ctx, cancel := context.WithTimeout(e.ctx, 3*time.Second)
	defer cancel()
	r, err := e.client.Request(ctx, "tcp", addr.String())
	if err != nil {
		return "", err
	}
	if r.Remote != addr {
		return r.Backend, fmt.Errorf("reply from %s came from %v, want %v", r.Backend, r.Remote, addr)
	}
	own := e.client.IPv4()
	if addr.Addr().Is6() {
		own = e.client.IPv6()
	}
	if r.Peer.Addr() != own {
		return r.Backend, fmt.Errorf("%s saw the client as %v, want its own address %v", r.Backend, r.Peer.Addr(), own)
	}
	return r.Backend, nil
}

// answers makes n requests to each of addrs and counts the answering
// backends per address; it stops at the first failed request.
func (e *trafficEnv) answers(addrs []netip.AddrPort, n int) (map[netip.AddrPort]map[string]int, error) {
	seen := map[netip.AddrPort]map[string]int{}
	for _, addr := range addrs {
		seen[addr] = map[string]int{}
		for range n {
			b, err := e.request(addr)
			if err != nil {
				return seen, fmt.Errorf("request to %v: %w", addr, err)
			}
			seen[addr][b]++
		}
	}
	return seen, nil
}

// checkBackends makes 24 requests to each of addrs and says whether
// exactly the backends want answered each address.
func (e *trafficEnv) checkBackends(addrs []netip.AddrPort, want ...string) error {
	seen, err := e.answers(addrs, 24)
	if err != nil {
		return err
	}
	for addr, got := range seen {
		if !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(slices.Values(want))) {
			return fmt.Errorf("%v answered by %v; want exactly %v", addr, got, want)
		}
	}
	return nil
}

// expectBackends fails the test unless exactly the backends want answer
// each of addrs (24 requests each).
func (e *trafficEnv) expectBackends(what string, addrs []netip.AddrPort, want ...string) {
	e.t.Helper()
	if err := e.checkBackends(addrs, want...); err != nil {
		e.t.Fatalf("%s: %s: %v", e.dp, what, err)
	}
}

// checkQuiet says whether trafficQuietProbes requests in a row to each of addrs
// all succeed without reaching pod.
func (e *trafficEnv) checkQuiet(addrs []netip.AddrPort, pod string) error {
	seen, err := e.answers(addrs, trafficQuietProbes)
	if err != nil {
		return err
	}
	for addr, got := range seen {
		if got[pod] > 0 {
			return fmt.Errorf("%v: %d of %d new connections reached %s (%v)", addr, got[pod], trafficQuietProbes, pod, got)
		}
	}
	return nil
}

// checkNodePort makes 24 requests from the outside host to each of addrs
// (node ports) and says whether exactly want answered, each seeing the
// client as one of the node's addresses (masqueraded, as
// externalTrafficPolicy Cluster does).
func (e *trafficEnv) checkNodePort(addrs []netip.AddrPort, want ...string) error {
	nodeAddrs := e.node.Node.UplinkAddrs()
	for _, addr := range addrs {
		got := map[string]int{}
		for range 24 {
			ctx, cancel := context.WithTimeout(e.ctx, 3*time.Second)
			r, err := e.outside.Request(ctx, "tcp", addr.String())
			cancel()
			if err != nil {
				return fmt.Errorf("request to node port %v from outside: %w", addr, err)
			}
			if r.Remote != addr {
				return fmt.Errorf("reply from %s came from %v, want %v", r.Backend, r.Remote, addr)
			}
			if !slices.Contains(nodeAddrs, r.Peer.Addr()) {
				return fmt.Errorf("%s saw the outside client as %v; want one of the node's addresses %v (masqueraded)", r.Backend, r.Peer.Addr(), nodeAddrs)
			}
			got[r.Backend]++
		}
		if !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(slices.Values(want))) {
			return fmt.Errorf("node port %v answered from outside by %v; want exactly %v", addr, got, want)
		}
	}
	return nil
}

// errTrafficAnswered is checkRefused's error for a connection that a
// backend answered.
var errTrafficAnswered = errors.New("answered")

// checkRefused says whether a new connection from src to each of addrs is
// refused (ECONNREFUSED: a TCP reset or ICMP port unreachable, as REJECT
// sends) within a second, rather than answered, unreachable or timing
// out.
func (e *trafficEnv) checkRefused(src *netlab.NS, addrs []netip.AddrPort) error {
	for _, addr := range addrs {
		ctx, cancel := context.WithTimeout(e.ctx, 3*time.Second)
		start := time.Now()
		r, err := src.Request(ctx, "tcp", addr.String())
		took := time.Since(start)
		cancel()
		switch {
		case err == nil:
			return fmt.Errorf("%v from %s: %w by %s; want refused", addr, src.Name(), errTrafficAnswered, r.Backend)
		case !errors.Is(err, syscall.ECONNREFUSED):
			return fmt.Errorf("%v from %s: %v after %v; want connection refused", addr, src.Name(), err, took)
		case took > time.Second:
			return fmt.Errorf("%v from %s: refused only after %v; want at once", addr, src.Name(), took)
		}
	}
	return nil
}

// dialTo opens a connection from the client pod to addr that lands on
// backend, for tests of what happens to open connections.
func (e *trafficEnv) dialTo(addr netip.AddrPort, backend string) *netlab.Conn {
	e.t.Helper()
	for range 64 {
		c, err := e.client.Dial(e.ctx, "tcp", addr.String())
		if err != nil {
			e.t.Fatal(err)
		}
		r, err := c.Request(e.ctx)
		if err != nil {
			c.Close()
			e.t.Fatal(err)
		}
		if r.Backend == backend {
			return c
		}
		c.Close()
	}
	e.t.Fatalf("%s: 64 connections to %v, none reached %s", e.dp, addr, backend)
	return nil
}

// expectOpen fails the test unless the open connection c is still
// answered by backend.
func (e *trafficEnv) expectOpen(c *netlab.Conn, backend, what string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 3*time.Second)
	defer cancel()
	r, err := c.Request(ctx)
	if err != nil {
		e.t.Fatalf("%s: %s: the open connection to %s: %v; want it to keep flowing", e.dp, what, backend, err)
	}
	if r.Backend != backend {
		e.t.Fatalf("%s: %s: the open connection to %s answered by %s", e.dp, what, backend, r.Backend)
	}
}

// measureNotReady makes pod not ready and returns how long it took from
// the status update until new connections to every one of addrs stopped
// reaching it: to the first of trafficQuietProbes requests in a row, per
// address, that pod did not answer. Every request must succeed (the pod
// keeps serving; only its new connections go).
func (e *trafficEnv) measureNotReady(pod string, addrs []netip.AddrPort) time.Duration {
	e.t.Helper()
	sent := e.setReady(pod, false)
	quietSince := map[netip.AddrPort]time.Time{}
	run := map[netip.AddrPort]int{}
	var reached time.Time
	for done := 0; done < len(addrs); {
		if time.Since(sent) > 30*time.Second {
			e.t.Fatalf("%s: %s still gets new connections 30 s after it was made not ready", e.dp, pod)
		}
		for _, addr := range addrs {
			if run[addr] >= trafficQuietProbes {
				continue
			}
			start := time.Now()
			b, err := e.request(addr)
			if err != nil {
				e.t.Fatalf("%s: %s made not ready: %v", e.dp, pod, err)
			}
			if b == pod {
				run[addr] = 0
				continue
			}
			if run[addr] == 0 {
				quietSince[addr] = start
			}
			if run[addr]++; run[addr] == trafficQuietProbes {
				done++
				if quietSince[addr].After(reached) {
					reached = quietSince[addr]
				}
			}
		}
	}
	return reached.Sub(sent)
}

// measureReady makes pod ready and returns how long it took from the
// status update until new connections to every one of addrs reached it:
// to the start of the first request, per address, that it answered.
func (e *trafficEnv) measureReady(pod string, addrs []netip.AddrPort) time.Duration {
	e.t.Helper()
	sent := e.setReady(pod, true)
	answered := map[netip.AddrPort]time.Time{}
	var reached time.Time
	for len(answered) < len(addrs) {
		if time.Since(sent) > 30*time.Second {
			e.t.Fatalf("%s: %s gets no new connections 30 s after it was made ready", e.dp, pod)
		}
		for _, addr := range addrs {
			if _, ok := answered[addr]; ok {
				continue
			}
			start := time.Now()
			b, err := e.request(addr)
			if err != nil {
				e.t.Fatalf("%s: %s made ready: %v", e.dp, pod, err)
			}
			if b == pod {
				answered[addr] = start
				if start.After(reached) {
					reached = start
				}
			}
		}
	}
	return reached.Sub(sent)
}

// eventually polls cond until it returns nil, failing the test with its
// last error after 30 s or if vipd, vipd-k8s or the control plane died.
func (e *trafficEnv) eventually(what string, cond func() error) {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if cerr := e.c.Check(); cerr != nil {
			e.t.Fatalf("%s: waiting for %s: %v", e.dp, what, cerr)
		}
		if e.node.Vipd.Pid() == 0 || !e.node.Adapter.Process.Running() {
			e.t.Fatalf("%s: waiting for %s: vipd or vipd-k8s is not running:\n%s", e.dp, what, e.node.Adapter.Process.Tail(20))
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: waited 30 s for %s: %v", e.dp, what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// vipdBackends returns shop/name's backends in vipd: state by address.
func (e *trafficEnv) vipdBackends(name string) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	svcs, err := e.node.API.ListServices(ctx, "kubernetes")
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(svcs, func(s *vipdv1.Service) bool { return s.GetName() == ns+"/"+name })
	if i < 0 {
		return nil, fmt.Errorf("vipd has no service %s/%s", ns, name)
	}
	out := map[string]string{}
	for _, b := range svcs[i].GetBackends() {
		out[b.GetIp()] = strings.TrimPrefix(b.GetState().String(), "BACKEND_STATE_")
	}
	return out, nil
}

// waitVIPDState waits until vipd lists each of ips as a backend of
// shop/name in state (READY, TERMINATING, ...). vipd programs the kernel
// before it lists a change.
func (e *trafficEnv) waitVIPDState(name string, ips []string, state string) {
	e.t.Helper()
	e.eventually(fmt.Sprintf("vipd to list %v as %s in %s/%s", ips, state, ns, name), func() error {
		got, err := e.vipdBackends(name)
		if err != nil {
			return err
		}
		for _, ip := range ips {
			if got[ip] != state {
				return fmt.Errorf("backends %v", got)
			}
		}
		return nil
	})
}

// checkVIPDBackends says whether vipd lists exactly the addresses of pods
// as shop/name's backends, all READY.
func (e *trafficEnv) checkVIPDBackends(name string, pods ...string) error {
	got, err := e.vipdBackends(name)
	if err != nil {
		return err
	}
	want := map[string]string{}
	for _, p := range pods {
		for _, ip := range e.podAddrs(p) {
			want[ip] = "READY"
		}
	}
	if !maps.Equal(got, want) {
		return fmt.Errorf("vipd's backends of %s/%s: %v; want %v", ns, name, got, want)
	}
	return nil
}

// logUnanswered logs the node's conntrack entries of TCP connections that
// never got an answer (SYN_SENT): where the dataplane sent the ones that
// failed. It needs the conntrack tool, and logs why it has none.
func (e *trafficEnv) logUnanswered() {
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	for _, family := range []string{"ipv4", "ipv6"} {
		out, err := e.node.Node.Exec(ctx, "conntrack", "-L", "-f", family, "-p", "tcp", "--state", "SYN_SENT")
		if err != nil {
			e.t.Logf("%s: conntrack entries of unanswered connections: %v", e.dp, err)
			return
		}
		e.t.Logf("%s: the node's conntrack entries of unanswered %s connections:\n%s", e.dp, family, out)
	}
}

// durationP50 is the median of ds (the lower one of an even count).
func durationP50(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}
