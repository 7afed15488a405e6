package e2e

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// TestNamedTargetPortAcrossPods: the pods behind a Service name the target
// port "http" on different numbers; the controller puts them in separate
// slices, and vipd gives each backend its own port.
func TestNamedTargetPortAcrossPods(t *testing.T) {
	e := newEnv(t)
	e.createService(service("api", 80, 81))
	a := e.createPods(1, podSpec{app: "api", version: "a", node: thisNode, ports: map[string]int32{"http": 8080, "p1": 8081}})
	b := e.createPods(1, podSpec{app: "api", version: "b", node: otherNode, ports: map[string]int32{"http": 9090, "p1": 9091}})
	// A pod without the second named port serves only the first.
	c := e.createPods(1, podSpec{app: "api", version: "c", node: otherNode, ports: map[string]int32{"http": 7070}})
	e.waitVIPD("per-pod target ports", wantBackends("api",
		e.podIP(a[0])+" READY http=8080,p1=8081 local",
		e.podIP(b[0])+" READY http=9090,p1=9091",
		e.podIP(c[0])+" READY http=7070",
	))
	svcs, err := e.node.Services(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, be := range svcs[ns+"/api"].GetBackends() {
		if !be.GetOnlyNamedPorts() {
			t.Errorf("backend %s: only_named_ports unset; want set (each slice lists the ports its endpoints serve)", be.GetIp())
		}
	}
	if n := len(e.slices("api")); n < 3 {
		t.Errorf("the controller made %d EndpointSlices for 3 port mappings; want 3", n)
	}
}

// TestDualStackService: a RequireDualStack Service gets a cluster IP of
// each family from the apiserver's ranges, and vipd serves both, with the
// pods' IPv4 and IPv6 addresses as backends.
func TestDualStackService(t *testing.T) {
	e := newEnv(t)
	svc := service("dual", 80)
	policy := corev1.IPFamilyPolicyRequireDualStack
	svc.Spec.IPFamilyPolicy = &policy
	created := e.createService(svc)
	if len(created.Spec.ClusterIPs) != 2 {
		t.Fatalf("cluster IPs %v; want one of each family", created.Spec.ClusterIPs)
	}
	pods := e.createPods(2, podSpec{app: "dual", version: "v1", node: thisNode, ports: map[string]int32{"http": 8080}, dualStack: true})
	var want []string
	for _, name := range pods {
		p, err := e.c.Admin.CoreV1().Pods(ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, ip := range p.Status.PodIPs {
			want = append(want, ip.IP+" READY http=8080 local")
		}
	}
	e.waitVIPD("both families' backends", wantBackends("dual", want...))
	svcs, err := e.node.Services(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := slices.Clone(svcs[ns+"/dual"].GetVips())
	wantVIPs := slices.Clone(created.Spec.ClusterIPs)
	slices.Sort(got)
	slices.Sort(wantVIPs)
	if !slices.Equal(got, wantVIPs) {
		t.Errorf("vipd's VIPs %v; want the cluster IPs %v", got, wantVIPs)
	}
	for _, ip := range got {
		a := netip.MustParseAddr(ip)
		if !netip.MustParsePrefix("198.19.0.0/16").Contains(a) && !netip.MustParsePrefix("fd00:198::/32").Contains(a) {
			t.Errorf("VIP %s outside the test ranges", ip)
		}
	}
}

// TestServiceTypeSwitch switches one Service between ClusterIP,
// ExternalName and headless (the apiserver allows headless only by way of
// ExternalName, as a cluster IP cannot be dropped otherwise): vipd serves
// it only while it has a cluster IP, on the IP it has at the time.
func TestServiceTypeSwitch(t *testing.T) {
	e := newEnv(t)
	svcs := e.c.Admin.CoreV1().Services(ns)
	created := e.createService(service("sw", 80))
	pods := e.createPods(1, podSpec{app: "sw", version: "v1", node: otherNode, ports: map[string]int32{"http": 8080}})
	wantIP := e.podIP(pods[0]) + " READY http=8080"
	hasVIP := func(ip string) func(map[string]*vipdv1.Service) error {
		return func(m map[string]*vipdv1.Service) error {
			if err := wantBackends("sw", wantIP)(m); err != nil {
				return err
			}
			if got := m[ns+"/sw"].GetVips(); !slices.Equal(got, []string{ip}) {
				return fmt.Errorf("VIPs %v; want [%s]", got, ip)
			}
			return nil
		}
	}
	absent := func(m map[string]*vipdv1.Service) error {
		if _, ok := m[ns+"/sw"]; ok {
			return fmt.Errorf("shop/sw is in vipd: %v", m[ns+"/sw"])
		}
		return nil
	}
	e.waitVIPD("the ClusterIP Service", hasVIP(created.Spec.ClusterIP))

	update := func(what string, change func(*corev1.Service)) *corev1.Service {
		t.Helper()
		s, err := svcs.Get(e.ctx, "sw", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		change(s)
		s, err = svcs.Update(e.ctx, s, metav1.UpdateOptions{})
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return s
	}
	toExternalName := func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeExternalName
		s.Spec.ExternalName = "example.invalid"
		s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Spec.IPFamilies, s.Spec.IPFamilyPolicy = "", nil, nil, nil
	}
	update("ClusterIP → ExternalName", toExternalName)
	e.waitVIPD("no ExternalName Service", absent)

	headless := update("ExternalName → headless", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeClusterIP
		s.Spec.ExternalName = ""
		s.Spec.ClusterIP = corev1.ClusterIPNone
	})
	if headless.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Fatalf("headless Service got cluster IP %q", headless.Spec.ClusterIP)
	}
	e.waitVIPD("no headless Service", absent)

	update("headless → ExternalName", toExternalName)
	again := update("ExternalName → ClusterIP", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeClusterIP
		s.Spec.ExternalName = ""
	})
	if again.Spec.ClusterIP == "" || again.Spec.ClusterIP == corev1.ClusterIPNone {
		t.Fatalf("ClusterIP Service got cluster IP %q", again.Spec.ClusterIP)
	}
	e.waitVIPD("the ClusterIP Service again, on its new IP", hasVIP(again.Spec.ClusterIP))
}

// TestServiceProxyName: with --service-proxy-name=vipd the adapter programs
// only the Services labelled for it, and follows the label as it changes.
func TestServiceProxyName(t *testing.T) {
	const label = "service.kubernetes.io/service-proxy-name"
	e := newEnv(t, "--service-proxy-name=vipd")
	mine := service("mine", 80)
	mine.Labels = map[string]string{label: "vipd"}
	e.createService(mine)
	other := service("other", 80)
	other.Labels = map[string]string{label: "kube-proxy"}
	e.createService(other)
	e.createService(service("plain", 80))
	onlyMine := func(m map[string]*vipdv1.Service) error {
		if got := keys(m); !slices.Equal(got, []string{ns + "/mine"}) {
			return fmt.Errorf("vipd has %v; want only shop/mine", got)
		}
		return nil
	}
	e.waitVIPD("only the Service labelled for vipd", onlyMine)

	// Relabel: plain joins, mine leaves.
	for name, value := range map[string]string{"plain": "vipd", "mine": "kube-proxy"} {
		s, err := e.c.Admin.CoreV1().Services(ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if s.Labels == nil {
			s.Labels = map[string]string{}
		}
		s.Labels[label] = value
		if _, err := e.c.Admin.CoreV1().Services(ns).Update(e.ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e.waitVIPD("the relabelled Services", func(m map[string]*vipdv1.Service) error {
		if got := keys(m); !slices.Equal(got, []string{ns + "/plain"}) {
			return fmt.Errorf("vipd has %v; want only shop/plain", got)
		}
		return nil
	})
}
