package kubeadapter_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/fake"
	"github.com/vipd/vipd/internal/kubeadapter"
	"github.com/vipd/vipd/internal/testkit/testserver"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

// externalSummary is the external part of a vipd service in one line.
func externalSummary(s *vipdv1.Service) string {
	var parts []string
	for _, p := range s.Ports {
		if p.NodePort != 0 {
			parts = append(parts, fmt.Sprintf("nodeport=%d/%s", p.NodePort, strings.TrimPrefix(p.Protocol.String(), "PROTOCOL_")))
		}
	}
	if len(s.ExternalIps) > 0 {
		parts = append(parts, "ext="+strings.Join(s.ExternalIps, ","))
	}
	if len(s.LoadBalancerIps) > 0 {
		parts = append(parts, "lb="+strings.Join(s.LoadBalancerIps, ","))
	}
	if len(s.LoadBalancerSourceRanges) > 0 {
		parts = append(parts, "ranges="+strings.Join(s.LoadBalancerSourceRanges, ","))
	}
	if s.ExternalTrafficPolicy == vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL {
		parts = append(parts, "etp=local")
	}
	if s.HealthCheckNodePort != 0 {
		parts = append(parts, fmt.Sprintf("hc=%d", s.HealthCheckNodePort))
	}
	return strings.Join(parts, " ")
}

// externalState is the external part of vipd's kubernetes services but the
// sentinels, by name ("" for a service without one).
func (e *env) externalState() map[string]string {
	e.t.Helper()
	svcs, err := e.vipd.ListServices(context.Background(), "kubernetes")
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]string{}
	for _, s := range svcs {
		if !strings.HasPrefix(s.Name, sentinelNS+"/") {
			out[s.Name] = externalSummary(s)
		}
	}
	return out
}

func (e *env) waitExternal(want map[string]string) {
	e.t.Helper()
	eventually(e.t, "vipd's external state", func() error { return diffState(want, e.externalState()) })
}

func nodePortService(ns, name, vip string, nodePort int32) *corev1.Service {
	s := service(ns, name, []string{vip}, svcPort("", corev1.ProtocolTCP, 80, 8080))
	s.Spec.Type = corev1.ServiceTypeNodePort
	s.Spec.Ports[0].NodePort = nodePort
	return s
}

func lbService(ns, name, vip string, nodePort int32, ingress ...string) *corev1.Service {
	s := nodePortService(ns, name, vip, nodePort)
	s.Spec.Type = corev1.ServiceTypeLoadBalancer
	for _, ip := range ingress {
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
	}
	return s
}

func (e *env) updateServiceStatus(s *corev1.Service) {
	e.t.Helper()
	if _, err := e.kube.CoreV1().Services(s.Namespace).UpdateStatus(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// TestExternalFields: every external field of a Service reaches vipd, in
// the first full sync and in the per-service passes after it, and a
// change of only one of them (the load-balancer ingress lives in the
// Service's status) is applied.
func TestExternalFields(t *testing.T) {
	local := lbService("shop", "local", "198.19.0.12", 30082, "198.19.1.2")
	local.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	local.Spec.HealthCheckNodePort = 32000
	local.Spec.LoadBalancerSourceRanges = []string{"198.18.0.0/16"}
	ext := service("shop", "ext", []string{"198.19.0.13"}, svcPort("", corev1.ProtocolUDP, 53, 53))
	ext.Spec.ExternalIPs = []string{"198.19.2.1"}
	noAlloc := lbService("shop", "noalloc", "198.19.0.14", 0, "198.19.1.4")
	noAlloc.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
	proxyMode := lbService("shop", "proxymode", "198.19.0.15", 30085)
	proxyMode.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{
		{IP: "198.19.1.5", IPMode: ptr.To(corev1.LoadBalancerIPModeProxy)},
		{Hostname: "lb.example.com"},
	}
	e := newEnv(t,
		nodePortService("shop", "np", "198.19.0.10", 30080),
		lbService("shop", "lb", "198.19.0.11", 30081, "198.19.1.1"),
		local, ext, noAlloc, proxyMode)
	a := e.start()
	want := map[string]string{
		"shop/np":        "nodeport=30080/TCP",
		"shop/lb":        "nodeport=30081/TCP lb=198.19.1.1",
		"shop/local":     "nodeport=30082/TCP lb=198.19.1.2 ranges=198.18.0.0/16 etp=local hc=32000",
		"shop/ext":       "ext=198.19.2.1",
		"shop/noalloc":   "lb=198.19.1.4",
		"shop/proxymode": "nodeport=30085/TCP",
	}
	e.waitExternal(want)

	// A Service created after the full sync goes through the per-service pass.
	e.createService(lbService("shop", "late", "198.19.0.16", 30086, "198.19.1.6"))
	want["shop/late"] = "nodeport=30086/TCP lb=198.19.1.6"
	e.waitExternal(want)

	// Status only: the load balancer assigns another ingress IP.
	lb := lbService("shop", "lb", "198.19.0.11", 30081, "198.19.1.1", "198.19.1.7")
	e.updateServiceStatus(lb)
	want["shop/lb"] = "nodeport=30081/TCP lb=198.19.1.1,198.19.1.7"
	e.waitExternal(want)

	// Each spec field alone.
	for _, c := range []struct {
		what   string
		mutate func(*corev1.Service)
		want   string
	}{
		{"externalTrafficPolicy", func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal },
			"nodeport=30081/TCP lb=198.19.1.1,198.19.1.7 etp=local"},
		{"healthCheckNodePort", func(s *corev1.Service) { s.Spec.HealthCheckNodePort = 32001 },
			"nodeport=30081/TCP lb=198.19.1.1,198.19.1.7 etp=local hc=32001"},
		{"loadBalancerSourceRanges", func(s *corev1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"198.18.1.0/24"} },
			"nodeport=30081/TCP lb=198.19.1.1,198.19.1.7 ranges=198.18.1.0/24 etp=local hc=32001"},
		{"nodePort", func(s *corev1.Service) { s.Spec.Ports[0].NodePort = 30091 },
			"nodeport=30091/TCP lb=198.19.1.1,198.19.1.7 ranges=198.18.1.0/24 etp=local hc=32001"},
		{"externalIPs", func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"198.19.2.9"} },
			"nodeport=30091/TCP ext=198.19.2.9 lb=198.19.1.1,198.19.1.7 ranges=198.18.1.0/24 etp=local hc=32001"},
		{"type ClusterIP drops the node port and the policy", func(s *corev1.Service) {
			s.Spec.Type, s.Spec.Ports[0].NodePort, s.Spec.HealthCheckNodePort = corev1.ServiceTypeClusterIP, 0, 0
			s.Status.LoadBalancer.Ingress = nil
		}, "ext=198.19.2.9 etp=local"},
	} {
		lb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.19.1.1"}, {IP: "198.19.1.7"}}
		c.mutate(lb)
		e.updateService(lb)
		want["shop/lb"] = c.want
		e.waitExternal(want)
	}
	if v, _ := metric(t, a.reg, "vipd_k8s_services_left_out", "reason", kubeadapter.ReasonInvalid); v != 0 {
		t.Errorf("left out as invalid: %v", v)
	}
}

// noExternal is a vipd whose dataplane does not serve external traffic: it
// refuses (FailedPrecondition) every write of a service with a node port,
// an external IP or a load-balancer IP while refusing is set, as vipd's
// server does with dataplane.Capabilities.External false.
type noExternal struct {
	*client.Client
	refusing atomic.Bool
	refused  atomic.Int64
}

func newNoExternal(c *client.Client) *noExternal {
	n := &noExternal{Client: c}
	n.refusing.Store(true)
	return n
}

func servesExternal(s *vipdv1.Service) bool {
	if len(s.ExternalIps) > 0 || len(s.LoadBalancerIps) > 0 {
		return true
	}
	return slices.ContainsFunc(s.Ports, func(p *vipdv1.Port) bool { return p.NodePort != 0 })
}

func (n *noExternal) check(svcs ...*vipdv1.Service) error {
	if !n.refusing.Load() {
		return nil
	}
	for _, s := range svcs {
		if servesExternal(s) {
			n.refused.Add(1)
			return status.Errorf(codes.FailedPrecondition, "service %s: external traffic (node ports, external IPs, load-balancer IPs) is not supported by this dataplane", s.Name)
		}
	}
	return nil
}

func (n *noExternal) UpsertService(ctx context.Context, svc *vipdv1.Service, gen uint64) (*vipdv1.Service, error) {
	if err := n.check(svc); err != nil {
		return nil, err
	}
	return n.Client.UpsertService(ctx, svc, gen)
}

func (n *noExternal) CreateService(ctx context.Context, svc *vipdv1.Service) (*vipdv1.Service, error) {
	if err := n.check(svc); err != nil {
		return nil, err
	}
	return n.Client.CreateService(ctx, svc)
}

func (n *noExternal) SyncServices(ctx context.Context, owner string, svcs []*vipdv1.Service) (*vipdv1.SyncServicesResponse, error) {
	if err := n.check(svcs...); err != nil {
		return nil, err
	}
	return n.Client.SyncServices(ctx, owner, svcs)
}

// TestExternalUnsupportedKeepsClusterIP: on a vipd whose dataplane cannot
// serve external traffic, NodePort and LoadBalancer Services keep their
// cluster IPs (programmed without the external part, counted as
// external-left-out "unsupported", not left out), in the full sync and
// after it, with one write per change once that is known; when vipd can
// serve it again, the next full sync programs the external parts.
func TestExternalUnsupportedKeepsClusterIP(t *testing.T) {
	var objs []runtime.Object
	objs = append(objs, simple("shop", "plain", "198.19.0.9", "198.18.1.9")...)
	objs = append(objs, nodePortService("shop", "np", "198.19.0.10", 30080),
		lbService("shop", "lb", "198.19.0.11", 30081, "198.19.1.1"))
	e := newEnv(t, objs...)
	var vipd *noExternal
	e.wrap = func(c *client.Client) kubeadapter.VIPD { vipd = newNoExternal(c); return vipd }
	a := e.start(kubeadapter.WithFullSyncPeriod(0))
	e.waitState(map[string]string{
		"shop/plain": simpleSummary("198.19.0.9", "198.18.1.9"),
		"shop/np":    "vips=198.19.0.10 ports=/TCP:80 backends=[]",
		"shop/lb":    "vips=198.19.0.11 ports=/TCP:80 backends=[]",
	})
	e.waitExternal(map[string]string{"shop/plain": "", "shop/np": "", "shop/lb": ""})
	waitMetric(t, a.reg, 2, "vipd_k8s_services_external_left_out", "reason", kubeadapter.ReasonUnsupported)
	waitMetric(t, a.reg, 0, "vipd_k8s_services_left_out", "reason", kubeadapter.ReasonUnsupported)
	waitMetric(t, a.reg, 1, "vipd_k8s_syncs_total", "kind", "full", "result", "ok")
	// One SyncServices refused (by noExternal, before it reaches vipd),
	// then one without the external parts.
	if n, refused := e.calls.get("SyncServices"), vipd.refused.Load(); n != 1 || refused != 1 {
		t.Errorf("%d SyncServices reached vipd, %d writes refused; want 1, 1 (the full sync sent again without the external parts)", n, refused)
	}

	// Known now: a change is one write of the ClusterIP part.
	refusedBefore := vipd.refused.Load()
	np := nodePortService("shop", "np", "198.19.0.10", 30080)
	np.Spec.Ports = append(np.Spec.Ports, svcPort("dns", corev1.ProtocolUDP, 53, 53))
	np.Spec.Ports[0].Name = "http"
	np.Spec.Ports[1].NodePort = 30053
	e.updateService(np)
	e.createService(lbService("shop", "new", "198.19.0.12", 30082, "198.19.1.2"))
	e.settle()
	e.waitState(map[string]string{
		"shop/plain": simpleSummary("198.19.0.9", "198.18.1.9"),
		"shop/np":    "vips=198.19.0.10 ports=http/TCP:80,dns/UDP:53 backends=[]",
		"shop/lb":    "vips=198.19.0.11 ports=/TCP:80 backends=[]",
		"shop/new":   "vips=198.19.0.12 ports=/TCP:80 backends=[]",
	})
	if n := vipd.refused.Load() - refusedBefore; n != 0 {
		t.Errorf("%d writes refused after the dataplane was known not to serve external traffic; want 0", n)
	}
	waitMetric(t, a.reg, 3, "vipd_k8s_services_external_left_out", "reason", kubeadapter.ReasonUnsupported)

	// vipd serves external traffic again (restarted with another
	// dataplane): the full sync that follows programs the external parts.
	vipd.refusing.Store(false)
	if err := e.srv.Close(); err != nil {
		t.Fatal(err)
	}
	e.setServer(testserver.Start(t))
	e.waitExternal(map[string]string{
		"shop/plain": "", "shop/np": "nodeport=30080/TCP nodeport=30053/UDP",
		"shop/lb": "nodeport=30081/TCP lb=198.19.1.1", "shop/new": "nodeport=30082/TCP lb=198.19.1.2",
	})
	waitMetric(t, a.reg, 0, "vipd_k8s_services_external_left_out", "reason", kubeadapter.ReasonUnsupported)

	// And after it, changes carry their external parts at once.
	e.updateServiceStatus(lbService("shop", "lb", "198.19.0.11", 30081, "198.19.1.8"))
	e.waitExternal(map[string]string{
		"shop/plain": "", "shop/np": "nodeport=30080/TCP nodeport=30053/UDP",
		"shop/lb": "nodeport=30081/TCP lb=198.19.1.8", "shop/new": "nodeport=30082/TCP lb=198.19.1.2",
	})
}

// TestExternalConflictKeepsClusterIP: a node port another owner holds
// leaves out the Service's external part, not its cluster IP: in the full
// sync (the adapter sees the claim) and in a per-service pass (vipd
// refuses the write with AlreadyExists).
func TestExternalConflictKeepsClusterIP(t *testing.T) {
	e := newEnv(t, nodePortService("shop", "np", "198.19.0.10", 30080))
	nomad := nomadService("nomad/web", "198.19.0.50")
	nomad.Ports[0].NodePort = 30080
	if _, err := e.vipd.UpsertService(context.Background(), nomad, 0); err != nil {
		t.Fatal(err)
	}
	a := e.start(kubeadapter.WithFullSyncPeriod(0))
	e.waitState(map[string]string{"shop/np": "vips=198.19.0.10 ports=/TCP:80 backends=[]"})
	e.waitExternal(map[string]string{"shop/np": ""})
	waitMetric(t, a.reg, 1, "vipd_k8s_services_external_left_out", "reason", kubeadapter.ReasonConflict)

	// Taken after the full sync: vipd refuses the write.
	nomad2 := nomadService("nomad/api", "198.19.0.51")
	nomad2.Ports[0].NodePort = 30081
	if _, err := e.vipd.UpsertService(context.Background(), nomad2, 0); err != nil {
		t.Fatal(err)
	}
	e.createService(nodePortService("shop", "np2", "198.19.0.11", 30081))
	e.createService(nodePortService("shop", "np3", "198.19.0.12", 30082))
	e.waitState(map[string]string{
		"shop/np":  "vips=198.19.0.10 ports=/TCP:80 backends=[]",
		"shop/np2": "vips=198.19.0.11 ports=/TCP:80 backends=[]",
		"shop/np3": "vips=198.19.0.12 ports=/TCP:80 backends=[]",
	})
	e.waitExternal(map[string]string{"shop/np": "", "shop/np2": "", "shop/np3": "nodeport=30082/TCP"})
	waitMetric(t, a.reg, 2, "vipd_k8s_services_external_left_out", "reason", kubeadapter.ReasonConflict)
	waitMetric(t, a.reg, 0, "vipd_k8s_services_left_out", "reason", kubeadapter.ReasonConflict)

	// The Service moves to a free node port: programmed whole.
	e.updateService(nodePortService("shop", "np2", "198.19.0.11", 30083))
	e.waitExternal(map[string]string{"shop/np": "", "shop/np2": "nodeport=30083/TCP", "shop/np3": "nodeport=30082/TCP"})
	waitMetric(t, a.reg, 1, "vipd_k8s_services_external_left_out", "reason", kubeadapter.ReasonConflict)
}

// TestExternalInvalidKeepsClusterIP: a service refused as invalid for a
// field of its external part alone (an external IP that is another
// service's backend) is programmed without that part, and the others
// whole: in the full sync (SyncServices names the field) and in a
// per-service pass. A fault outside the external part still leaves the
// service out whole.
func TestExternalInvalidKeepsClusterIP(t *testing.T) {
	bad := service("shop", "bad", []string{"198.19.0.10"}, svcPort("", corev1.ProtocolTCP, 80, 8080))
	bad.Spec.ExternalIPs = []string{"198.18.9.1"} // nomad/web's backend
	good := service("shop", "good", []string{"198.19.0.11"}, svcPort("", corev1.ProtocolTCP, 80, 8080))
	good.Spec.ExternalIPs = []string{"198.19.2.1"}
	e := newEnv(t, bad, good)
	if _, err := e.vipd.UpsertService(context.Background(), nomadService("nomad/web", "198.19.0.50"), 0); err != nil {
		t.Fatal(err)
	}
	a := e.start(kubeadapter.WithFullSyncPeriod(0))
	e.waitState(map[string]string{
		"shop/bad":  "vips=198.19.0.10 ports=/TCP:80 backends=[]",
		"shop/good": "vips=198.19.0.11 ports=/TCP:80 backends=[]",
	})
	e.waitExternal(map[string]string{"shop/bad": "", "shop/good": "ext=198.19.2.1"})
	waitMetric(t, a.reg, 1, "vipd_k8s_services_external_left_out", "reason", kubeadapter.ReasonInvalid)
	waitMetric(t, a.reg, 0, "vipd_k8s_services_left_out", "reason", kubeadapter.ReasonInvalid)
	if n := e.calls.get("SyncServices"); n != 2 {
		t.Errorf("%d SyncServices; want 2 (one refused naming the external IP, one without it)", n)
	}

	// Per service: the same fault in a new Service.
	bad2 := service("shop", "bad2", []string{"198.19.0.12"}, svcPort("", corev1.ProtocolTCP, 80, 8080))
	bad2.Spec.ExternalIPs = []string{"198.18.9.1"}
	e.createService(bad2)
	// A fault in the cluster IP part: the service is left out whole.
	worse := service("shop", "worse", []string{"198.18.9.1"}, svcPort("", corev1.ProtocolTCP, 80, 8080))
	worse.Spec.ExternalIPs = []string{"198.19.2.3"}
	e.createService(worse)
	e.settle()
	e.waitExternal(map[string]string{"shop/bad": "", "shop/good": "ext=198.19.2.1", "shop/bad2": ""})
	waitMetric(t, a.reg, 2, "vipd_k8s_services_external_left_out", "reason", kubeadapter.ReasonInvalid)
	waitMetric(t, a.reg, 1, "vipd_k8s_services_left_out", "reason", kubeadapter.ReasonInvalid)
}

// TestExternalUnsupportedByDataplane: the same on vipd itself, over a
// dataplane whose capabilities lack external traffic: vipd refuses the
// external part (FailedPrecondition), and every Service keeps its
// cluster IP, in the full sync and in a per-service pass.
func TestExternalUnsupportedByDataplane(t *testing.T) {
	dp := fake.New(fake.WithCapabilities(dataplane.Capabilities{
		LoadBalancing: []dataplane.LoadBalancing{dataplane.LoadBalancingRandom},
		Protocols:     []dataplane.Protocol{dataplane.TCP, dataplane.UDP},
	}))
	var objs []runtime.Object
	objs = append(objs, simple("shop", "plain", "198.19.0.9", "198.18.1.9")...)
	objs = append(objs, lbService("shop", "lb", "198.19.0.11", 30081, "198.19.1.1"))
	e := newEnv(t, objs...)
	e.setServer(testserver.Start(t, testserver.WithDataplane(dp)))
	a := e.start(kubeadapter.WithFullSyncPeriod(0))
	e.createService(nodePortService("shop", "np", "198.19.0.10", 30080))
	e.settle()
	e.waitState(map[string]string{
		"shop/plain": simpleSummary("198.19.0.9", "198.18.1.9"),
		"shop/np":    "vips=198.19.0.10 ports=/TCP:80 backends=[]",
		"shop/lb":    "vips=198.19.0.11 ports=/TCP:80 backends=[]",
	})
	e.waitExternal(map[string]string{"shop/plain": "", "shop/np": "", "shop/lb": ""})
	waitMetric(t, a.reg, 2, "vipd_k8s_services_external_left_out", "reason", kubeadapter.ReasonUnsupported)
	waitMetric(t, a.reg, 0, "vipd_k8s_services_left_out", "reason", kubeadapter.ReasonUnsupported)
}
