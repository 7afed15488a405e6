package e2e

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// Load-balancer and external IPs for these tests. The apiserver's IPv4
// Service range is all of 198.19.0.0/16 (see test/kube/cluster), so
// there is no room outside it; these are in its lowest 256 addresses,
// the static band that the apiserver's allocator hands out dynamically
// only once the rest of the range is full, so no cluster IP takes them.
const (
	lbIP1    = "198.19.0.201"
	lbIP2    = "198.19.0.202"
	lbProxy  = "198.19.0.203"
	lbIP4    = "198.19.0.204"
	extIP1   = "198.19.0.210"
	extIP2   = "198.19.0.211"
	srcRange = "198.18.0.0/16"
)

// describeExternal describes a vipd service's external part in one line: each
// port's node port by name, the external and load-balancer IPs, the
// source ranges, the external traffic policy and the health-check node
// port.
func describeExternal(s *vipdv1.Service) string {
	var nps []string
	for _, p := range s.GetPorts() {
		nps = append(nps, fmt.Sprintf("%s:%d", p.GetName(), p.GetNodePort()))
	}
	sort.Strings(nps)
	sorted := func(l []string) string {
		l = slices.Clone(l)
		sort.Strings(l)
		return strings.Join(l, ",")
	}
	return fmt.Sprintf("node_ports=%s external_ips=[%s] load_balancer_ips=[%s] load_balancer_source_ranges=[%s] external_traffic_policy=%s health_check_node_port=%d",
		strings.Join(nps, ","), sorted(s.GetExternalIps()), sorted(s.GetLoadBalancerIps()), sorted(s.GetLoadBalancerSourceRanges()),
		strings.TrimPrefix(s.GetExternalTrafficPolicy().String(), "TRAFFIC_POLICY_"), s.GetHealthCheckNodePort())
}

// externalWant is what vipd should have as the external part of a Service: the
// node ports the apiserver gave svc's ports, and the rest as given.
type externalWant struct {
	externalIPs, lbIPs, ranges []string
	local                      bool
	healthCheckNodePort        int32
}

func (w externalWant) of(svc *corev1.Service) string {
	// vipd stores an unset policy as CLUSTER.
	s := &vipdv1.Service{ExternalIps: w.externalIPs, LoadBalancerIps: w.lbIPs, LoadBalancerSourceRanges: w.ranges, HealthCheckNodePort: uint32(w.healthCheckNodePort),
		ExternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER}
	if w.local {
		s.ExternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	}
	for _, p := range svc.Spec.Ports {
		s.Ports = append(s.Ports, &vipdv1.Port{Name: p.Name, NodePort: uint32(p.NodePort)})
	}
	return describeExternal(s)
}

// wantExternal is a check that shop/name's external part is want (as
// external formats it) and that its VIPs are vips.
func wantExternal(name string, vips []string, want string) func(map[string]*vipdv1.Service) error {
	return func(svcs map[string]*vipdv1.Service) error {
		svc, ok := svcs[ns+"/"+name]
		if !ok {
			return fmt.Errorf("no service %s/%s (have %v)", ns, name, keys(svcs))
		}
		if got := describeExternal(svc); got != want {
			return fmt.Errorf("%s/%s external part:\n  %s\nwant:\n  %s", ns, name, got, want)
		}
		if got := svc.GetVips(); !slices.Equal(got, vips) {
			return fmt.Errorf("%s/%s VIPs %v; want %v", ns, name, got, vips)
		}
		return nil
	}
}

// updateService reads shop/name, changes it and writes it back.
func (e *env) updateService(name, what string, change func(*corev1.Service)) (*corev1.Service, error) {
	e.t.Helper()
	svcs := e.c.Admin.CoreV1().Services(ns)
	s, err := svcs.Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	change(s)
	s, err = svcs.Update(e.ctx, s, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return s, nil
}

// setIngress sets shop/name's status.loadBalancer.ingress, as a cloud
// controller would, through the status subresource.
func (e *env) setIngress(name string, ingress ...corev1.LoadBalancerIngress) *corev1.Service {
	e.t.Helper()
	svcs := e.c.Admin.CoreV1().Services(ns)
	s, err := svcs.Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	s.Status.LoadBalancer.Ingress = ingress
	s, err = svcs.UpdateStatus(e.ctx, s, metav1.UpdateOptions{})
	if err != nil {
		e.t.Fatalf("set %s/%s's load-balancer status: %v", ns, name, err)
	}
	return s
}

// leftOut reads the adapter's gauges of Services left out whole and of
// those programmed without their external part, by reason.
func (e *env) leftOut() (whole, externalPart map[string]float64) {
	e.t.Helper()
	m, err := e.node.AdapterMetrics()
	if err != nil {
		e.t.Fatal(err)
	}
	whole, externalPart = map[string]float64{}, map[string]float64{}
	for _, r := range []string{"other-owner", "conflict", "invalid", "unsupported", "over-limit"} {
		if v := m.Sum("vipd_k8s_services_left_out", `reason="`+r+`"`); v != 0 {
			whole[r] = v
		}
		if v := m.Sum("vipd_k8s_services_external_left_out", `reason="`+r+`"`); v != 0 {
			externalPart[r] = v
		}
	}
	return whole, externalPart
}

// TestNodePortService: the apiserver allocates a node port to each port
// of a NodePort Service, and vipd gets exactly those. Switching
// externalTrafficPolicy to Local gives vipd LOCAL; the apiserver gives a
// NodePort Service no healthCheckNodePort (only a LoadBalancer Service
// with policy Local has one, and it refuses one set by hand), so vipd has
// none.
func TestNodePortService(t *testing.T) {
	e := newEnv(t)
	svc := service("np", 80, 81)
	svc.Spec.Type = corev1.ServiceTypeNodePort
	created := e.createService(svc)
	for _, p := range created.Spec.Ports {
		if p.NodePort < 30000 || p.NodePort > 32767 {
			t.Fatalf("port %s: the apiserver allocated node port %d; want one in 30000-32767", p.Name, p.NodePort)
		}
	}
	if created.Spec.Ports[0].NodePort == created.Spec.Ports[1].NodePort {
		t.Fatalf("both ports got node port %d", created.Spec.Ports[0].NodePort)
	}
	vips := []string{created.Spec.ClusterIP}
	e.waitVIPD("the allocated node ports", wantExternal("np", vips, externalWant{}.of(created)))

	local, err := e.updateService("np", "externalTrafficPolicy Local", func(s *corev1.Service) {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	if err != nil {
		t.Fatal(err)
	}
	if local.Spec.HealthCheckNodePort != 0 {
		t.Fatalf("the apiserver gave a NodePort Service healthCheckNodePort %d; want none", local.Spec.HealthCheckNodePort)
	}
	e.waitVIPD("external_traffic_policy LOCAL", wantExternal("np", vips, externalWant{local: true}.of(local)))

	_, err = e.updateService("np", "healthCheckNodePort on a NodePort Service", func(s *corev1.Service) {
		s.Spec.HealthCheckNodePort = 31999
	})
	if !apierrors.IsInvalid(err) {
		t.Fatalf("setting healthCheckNodePort on a NodePort Service: %v; want the apiserver to refuse it as invalid", err)
	}
	// Back to ClusterIP: the apiserver drops the node ports, and vipd too.
	back, err := e.updateService("np", "NodePort → ClusterIP", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeClusterIP
		s.Spec.ExternalTrafficPolicy = ""
		for i := range s.Spec.Ports {
			s.Spec.Ports[i].NodePort = 0
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	e.waitVIPD("no node ports once ClusterIP", wantExternal("np", vips, externalWant{}.of(back)))
	if n := back.Spec.Ports[0].NodePort; n != 0 {
		t.Fatalf("a ClusterIP Service kept node port %d", n)
	}
}

// TestLoadBalancerService: a LoadBalancer Service with policy Local,
// source ranges and a load-balancer status written by hand (as a cloud
// controller writes it). vipd gets the allocated node ports and
// health-check node port, the ingress IPs with ipMode unset or VIP (not
// the one with ipMode Proxy, which kube-proxy leaves out too) and the
// ranges. The apiserver stores an unset ipMode as VIP (it defaults it
// for an ingress with an IP), so "unset" reaches vipd-k8s as VIP; a LoadBalancer Service with allocateLoadBalancerNodePorts:
// false gets no node ports.
func TestLoadBalancerService(t *testing.T) {
	e := newEnv(t)
	svc := service("lb", 80, 443)
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	svc.Spec.LoadBalancerSourceRanges = []string{srcRange}
	created := e.createService(svc)
	hc := created.Spec.HealthCheckNodePort
	if hc < 30000 || hc > 32767 {
		t.Fatalf("the apiserver allocated healthCheckNodePort %d; want one in 30000-32767", hc)
	}
	vips := []string{created.Spec.ClusterIP}
	// No ingress yet: node ports and the health-check port only; the
	// ranges have no load-balancer IP to restrict.
	e.waitVIPD("node ports before the load balancer", wantExternal("lb", vips, externalWant{local: true, healthCheckNodePort: hc}.of(created)))

	vip, proxy := corev1.LoadBalancerIPModeVIP, corev1.LoadBalancerIPModeProxy
	st := e.setIngress("lb",
		corev1.LoadBalancerIngress{IP: lbIP1},
		corev1.LoadBalancerIngress{IP: lbIP2, IPMode: &vip},
		corev1.LoadBalancerIngress{IP: lbProxy, IPMode: &proxy},
	)
	for _, ing := range st.Status.LoadBalancer.Ingress {
		mode := "unset"
		if ing.IPMode != nil {
			mode = string(*ing.IPMode)
		}
		t.Logf("the apiserver stored ingress %s with ipMode %s", ing.IP, mode)
	}
	e.waitVIPD("the load-balancer IPs", wantExternal("lb", vips, externalWant{
		lbIPs: []string{lbIP1, lbIP2}, ranges: []string{srcRange}, local: true, healthCheckNodePort: hc,
	}.of(created)))

	// Cluster policy: the apiserver frees the health-check node port.
	cluster, err := e.updateService("lb", "externalTrafficPolicy Cluster", func(s *corev1.Service) {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
		s.Spec.HealthCheckNodePort = 0
	})
	if err != nil {
		t.Fatal(err)
	}
	if cluster.Spec.HealthCheckNodePort != 0 {
		t.Fatalf("policy Cluster kept healthCheckNodePort %d", cluster.Spec.HealthCheckNodePort)
	}
	e.waitVIPD("policy Cluster", wantExternal("lb", vips, externalWant{lbIPs: []string{lbIP1, lbIP2}, ranges: []string{srcRange}}.of(cluster)))

	noNP := service("lb-nonp", 80)
	noNP.Spec.Type = corev1.ServiceTypeLoadBalancer
	f := false
	noNP.Spec.AllocateLoadBalancerNodePorts = &f
	created = e.createService(noNP)
	if n := created.Spec.Ports[0].NodePort; n != 0 {
		t.Fatalf("allocateLoadBalancerNodePorts false: the apiserver allocated node port %d", n)
	}
	e.setIngress("lb-nonp", corev1.LoadBalancerIngress{IP: lbIP4})
	e.waitVIPD("a load balancer without node ports", wantExternal("lb-nonp", []string{created.Spec.ClusterIP}, externalWant{lbIPs: []string{lbIP4}}.of(created)))
	if whole, ext := e.leftOut(); len(whole)+len(ext) != 0 {
		t.Errorf("services left out %v, programmed without their external part %v; want none", whole, ext)
	}
}

// TestExternalIPs: a ClusterIP Service's externalIPs (the apiserver takes
// them: its DenyServiceExternalIPs admission plugin is off by default)
// reach vipd as external_ips, with policy Local, which applies to a
// Service with external IPs.
func TestExternalIPs(t *testing.T) {
	e := newEnv(t)
	svc := service("ext", 80)
	svc.Spec.ExternalIPs = []string{extIP1, extIP2}
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	created := e.createService(svc)
	vips := []string{created.Spec.ClusterIP}
	e.waitVIPD("the external IPs", wantExternal("ext", vips, externalWant{externalIPs: []string{extIP1, extIP2}, local: true}.of(created)))

	one, err := e.updateService("ext", "one external IP removed", func(s *corev1.Service) {
		s.Spec.ExternalIPs = []string{extIP2}
	})
	if err != nil {
		t.Fatal(err)
	}
	e.waitVIPD("one external IP left", wantExternal("ext", vips, externalWant{externalIPs: []string{extIP2}, local: true}.of(one)))
}

// TestExternalIPOnAnotherClusterIP: the apiserver lets a Service name
// another Service's cluster IP as an external IP (on another port, even);
// vipd refuses that (an external IP cannot be a VIP it serves). The
// adapter programs the Service's cluster IP without its external part and
// counts it in vipd_k8s_services_external_left_out{reason="invalid"};
// the other Service is untouched. Once the external IP is one of its
// own, the whole Service is programmed and the count drops.
func TestExternalIPOnAnotherClusterIP(t *testing.T) {
	e := newEnv(t)
	owner := e.createService(service("owner", 80))
	thief := service("thief", 8080)
	thief.Spec.ExternalIPs = []string{owner.Spec.ClusterIP}
	created := e.createService(thief)
	e.waitVIPD("the cluster IP part alone", func(svcs map[string]*vipdv1.Service) error {
		if err := wantExternal("owner", []string{owner.Spec.ClusterIP}, externalWant{}.of(owner))(svcs); err != nil {
			return err
		}
		if err := wantExternal("thief", []string{created.Spec.ClusterIP}, externalWant{}.of(created))(svcs); err != nil {
			return err
		}
		if whole, ext := e.leftOut(); len(whole) != 0 || !onlyOne(ext, "invalid") {
			return fmt.Errorf("left out %v, programmed without the external part %v; want none and invalid=1", whole, ext)
		}
		return nil
	})

	fixed, err := e.updateService("thief", "an external IP of its own", func(s *corev1.Service) {
		s.Spec.ExternalIPs = []string{extIP1}
	})
	if err != nil {
		t.Fatal(err)
	}
	e.waitVIPD("the whole Service", func(svcs map[string]*vipdv1.Service) error {
		if err := wantExternal("thief", []string{created.Spec.ClusterIP}, externalWant{externalIPs: []string{extIP1}}.of(fixed))(svcs); err != nil {
			return err
		}
		if whole, ext := e.leftOut(); len(whole)+len(ext) != 0 {
			return fmt.Errorf("left out %v, programmed without the external part %v; want none", whole, ext)
		}
		return nil
	})
}

// onlyOne reports whether m is exactly {key: 1}.
func onlyOne(m map[string]float64, key string) bool { return len(m) == 1 && m[key] == 1 }
