package kubeconvert_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vipd/vipd/internal/kubeconvert"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/protobuf/testing/protocmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

const (
	ready       = vipdv1.BackendState_BACKEND_STATE_READY
	terminating = vipdv1.BackendState_BACKEND_STATE_TERMINATING
	notServing  = vipdv1.BackendState_BACKEND_STATE_NOT_SERVING
	tcp         = vipdv1.Protocol_PROTOCOL_TCP
	udp         = vipdv1.Protocol_PROTOCOL_UDP
)

// service is a ClusterIP Service web in namespace shop with the given
// cluster IPs and ports.
func service(ips []string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: ips[0], ClusterIPs: ips, Ports: ports,
		},
	}
}

func svcPort(name string, proto corev1.Protocol, port int32, target intstr.IntOrString) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: proto, Port: port, TargetPort: target}
}

func slicePort(name string, proto corev1.Protocol, port int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr.To(name), Protocol: ptr.To(proto), Port: ptr.To(port)}
}

// slice is an EndpointSlice of shop/web.
func slice(name string, family discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "shop", Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: "web"},
		},
		AddressType: family, Ports: ports, Endpoints: eps,
	}
}

type conditions struct{ ready, serving, terminating *bool }

func endpoint(ip string, c conditions, node string) discoveryv1.Endpoint {
	ep := discoveryv1.Endpoint{
		Addresses:  []string{ip},
		Conditions: discoveryv1.EndpointConditions{Ready: c.ready, Serving: c.serving, Terminating: c.terminating},
	}
	if node != "" {
		ep.NodeName = ptr.To(node)
	}
	return ep
}

var (
	isReady       = conditions{ready: ptr.To(true), serving: ptr.To(true), terminating: ptr.To(false)}
	unset         = conditions{}
	isTerminating = conditions{ready: ptr.To(false), serving: ptr.To(true), terminating: ptr.To(true)}
	drained       = conditions{ready: ptr.To(false), serving: ptr.To(false), terminating: ptr.To(true)}
	notReady      = conditions{ready: ptr.To(false), serving: ptr.To(false), terminating: ptr.To(false)}
)

func backend(ip string, state vipdv1.BackendState, ports map[string]uint32) *vipdv1.Backend {
	return &vipdv1.Backend{Ip: ip, State: state, Ports: ports, OnlyNamedPorts: true}
}

func TestConvert(t *testing.T) {
	http := svcPort("http", corev1.ProtocolTCP, 80, intstr.FromString("web"))
	dns := svcPort("dns", corev1.ProtocolUDP, 53, intstr.FromInt32(5353))
	v4 := []string{"198.19.0.10"}
	tests := []struct {
		name   string
		svc    *corev1.Service
		slices []*discoveryv1.EndpointSlice
		opts   kubeconvert.Options
		want   *vipdv1.Service
	}{{
		name: "named target port resolved per slice, numeric one as given",
		svc:  service(v4, http, dns),
		slices: []*discoveryv1.EndpointSlice{
			slice("web-a", discoveryv1.AddressTypeIPv4,
				[]discoveryv1.EndpointPort{slicePort("http", corev1.ProtocolTCP, 8080), slicePort("dns", corev1.ProtocolUDP, 5353)},
				endpoint("198.18.1.1", isReady, ""), endpoint("198.18.1.2", unset, "")),
			slice("web-b", discoveryv1.AddressTypeIPv4,
				[]discoveryv1.EndpointPort{slicePort("http", corev1.ProtocolTCP, 9090), slicePort("dns", corev1.ProtocolUDP, 5353)},
				endpoint("198.18.2.1", isReady, "")),
		},
		want: &vipdv1.Service{
			Name: "shop/web", Owner: "kubernetes", Vips: v4,
			Ports: []*vipdv1.Port{{Name: "http", Protocol: tcp, Port: 80}, {Name: "dns", Protocol: udp, Port: 53, TargetPort: 5353}},
			Backends: []*vipdv1.Backend{
				backend("198.18.1.1", ready, map[string]uint32{"http": 8080, "dns": 5353}),
				backend("198.18.1.2", ready, map[string]uint32{"http": 8080, "dns": 5353}),
				backend("198.18.2.1", ready, map[string]uint32{"http": 9090, "dns": 5353}),
			},
		},
	}, {
		name: "numeric target port that a backend's slice contradicts: no one target port",
		svc:  service(v4, svcPort("http", corev1.ProtocolTCP, 80, intstr.FromInt32(8080)), dns),
		slices: []*discoveryv1.EndpointSlice{
			slice("web-a", discoveryv1.AddressTypeIPv4,
				[]discoveryv1.EndpointPort{slicePort("http", corev1.ProtocolTCP, 8080), slicePort("dns", corev1.ProtocolUDP, 5353)},
				endpoint("198.18.1.1", isReady, "")),
			slice("web-b", discoveryv1.AddressTypeIPv4,
				[]discoveryv1.EndpointPort{slicePort("http", corev1.ProtocolTCP, 8081), slicePort("dns", corev1.ProtocolUDP, 5353)},
				endpoint("198.18.2.1", isReady, "")),
		},
		want: &vipdv1.Service{
			Name: "shop/web", Owner: "kubernetes", Vips: v4,
			Ports: []*vipdv1.Port{{Name: "http", Protocol: tcp, Port: 80}, {Name: "dns", Protocol: udp, Port: 53, TargetPort: 5353}},
			Backends: []*vipdv1.Backend{
				backend("198.18.1.1", ready, map[string]uint32{"http": 8080, "dns": 5353}),
				backend("198.18.2.1", ready, map[string]uint32{"http": 8081, "dns": 5353}),
			},
		},
	}, {
		name: "a slice without a port: its endpoints do not serve it",
		svc:  service(v4, http, dns),
		slices: []*discoveryv1.EndpointSlice{
			slice("web-a", discoveryv1.AddressTypeIPv4,
				[]discoveryv1.EndpointPort{slicePort("http", corev1.ProtocolTCP, 8080)},
				endpoint("198.18.1.1", isReady, "")),
			// A port of the right name but the wrong protocol is not the
			// service's port; a slice with none of its ports adds nothing.
			slice("web-b", discoveryv1.AddressTypeIPv4,
				[]discoveryv1.EndpointPort{slicePort("dns", corev1.ProtocolTCP, 53)},
				endpoint("198.18.2.1", isReady, "")),
		},
		want: &vipdv1.Service{
			Name: "shop/web", Owner: "kubernetes", Vips: v4,
			Ports:    []*vipdv1.Port{{Name: "http", Protocol: tcp, Port: 80}, {Name: "dns", Protocol: udp, Port: 53, TargetPort: 5353}},
			Backends: []*vipdv1.Backend{backend("198.18.1.1", ready, map[string]uint32{"http": 8080})},
		},
	}, {
		name: "dual-stack, with each family's slice; FQDN slices and other services' slices ignored",
		svc:  service([]string{"198.19.0.10", "fd00:198::10"}, svcPort("", "", 80, intstr.FromInt32(8080))),
		slices: []*discoveryv1.EndpointSlice{
			slice("web-v6", discoveryv1.AddressTypeIPv6,
				[]discoveryv1.EndpointPort{slicePort("", corev1.ProtocolTCP, 8080)},
				endpoint("fd00:198::1:1", isReady, "")),
			slice("web-v4", discoveryv1.AddressTypeIPv4,
				[]discoveryv1.EndpointPort{slicePort("", corev1.ProtocolTCP, 8080)},
				endpoint("198.18.1.1", isReady, "")),
			slice("web-fqdn", discoveryv1.AddressTypeFQDN,
				[]discoveryv1.EndpointPort{slicePort("", corev1.ProtocolTCP, 8080)},
				endpoint("web.example.com", isReady, "")),
			func() *discoveryv1.EndpointSlice {
				s := slice("other-x", discoveryv1.AddressTypeIPv4,
					[]discoveryv1.EndpointPort{slicePort("", corev1.ProtocolTCP, 8080)},
					endpoint("198.18.9.9", isReady, ""))
				s.Labels[discoveryv1.LabelServiceName] = "other"
				return s
			}(),
			func() *discoveryv1.EndpointSlice {
				s := slice("web-elsewhere", discoveryv1.AddressTypeIPv4,
					[]discoveryv1.EndpointPort{slicePort("", corev1.ProtocolTCP, 8080)},
					endpoint("198.18.9.8", isReady, ""))
				s.Namespace = "other-namespace"
				return s
			}(),
		},
		want: &vipdv1.Service{
			Name: "shop/web", Owner: "kubernetes", Vips: []string{"198.19.0.10", "fd00:198::10"},
			Ports: []*vipdv1.Port{{Protocol: tcp, Port: 80, TargetPort: 8080}},
			Backends: []*vipdv1.Backend{
				backend("198.18.1.1", ready, map[string]uint32{"": 8080}),
				backend("fd00:198::1:1", ready, map[string]uint32{"": 8080}),
			},
		},
	}, {
		name: "an address of a family without a cluster IP is left out",
		svc:  service(v4, svcPort("", corev1.ProtocolTCP, 80, intstr.FromInt32(8080))),
		slices: []*discoveryv1.EndpointSlice{
			slice("web-v6", discoveryv1.AddressTypeIPv6,
				[]discoveryv1.EndpointPort{slicePort("", corev1.ProtocolTCP, 8080)},
				endpoint("fd00:198::1:1", isReady, "")),
		},
		want: &vipdv1.Service{
			Name: "shop/web", Owner: "kubernetes", Vips: v4,
			Ports:    []*vipdv1.Port{{Protocol: tcp, Port: 80, TargetPort: 8080}},
			Backends: []*vipdv1.Backend{},
		},
	}, {
		name: "conditions: ready, serving and terminating, neither, not ready",
		svc:  service(v4, http),
		slices: []*discoveryv1.EndpointSlice{
			slice("web-a", discoveryv1.AddressTypeIPv4,
				[]discoveryv1.EndpointPort{slicePort("http", corev1.ProtocolTCP, 8080)},
				endpoint("198.18.1.1", isReady, ""), endpoint("198.18.1.2", isTerminating, ""),
				endpoint("198.18.1.3", drained, ""), endpoint("198.18.1.4", notReady, ""),
				// Only serving unset: kube-proxy reads it as serving.
				endpoint("198.18.1.5", conditions{ready: ptr.To(false), terminating: ptr.To(true)}, "")),
		},
		want: &vipdv1.Service{
			Name: "shop/web", Owner: "kubernetes", Vips: v4,
			Ports: []*vipdv1.Port{{Name: "http", Protocol: tcp, Port: 80}},
			Backends: []*vipdv1.Backend{
				backend("198.18.1.1", ready, map[string]uint32{"http": 8080}),
				backend("198.18.1.2", terminating, map[string]uint32{"http": 8080}),
				backend("198.18.1.3", notServing, map[string]uint32{"http": 8080}),
				backend("198.18.1.4", notServing, map[string]uint32{"http": 8080}),
				backend("198.18.1.5", terminating, map[string]uint32{"http": 8080}),
			},
		},
	}, {
		name: "an address in two slices appears once, with its best state and both slices' ports",
		svc:  service(v4, http, dns),
		slices: []*discoveryv1.EndpointSlice{
			slice("web-a", discoveryv1.AddressTypeIPv4,
				[]discoveryv1.EndpointPort{slicePort("http", corev1.ProtocolTCP, 8080)},
				endpoint("198.18.1.1", isTerminating, "node-b")),
			slice("web-b", discoveryv1.AddressTypeIPv4,
				[]discoveryv1.EndpointPort{slicePort("http", corev1.ProtocolTCP, 8081), slicePort("dns", corev1.ProtocolUDP, 5353)},
				endpoint("198.18.1.1", isReady, "node-a")),
		},
		opts: kubeconvert.Options{NodeName: "node-a"},
		want: &vipdv1.Service{
			Name: "shop/web", Owner: "kubernetes", Vips: v4,
			Ports: []*vipdv1.Port{{Name: "http", Protocol: tcp, Port: 80}, {Name: "dns", Protocol: udp, Port: 53, TargetPort: 5353}},
			Backends: []*vipdv1.Backend{{
				Ip: "198.18.1.1", State: ready, OnlyNamedPorts: true, NodeLocal: true,
				Ports: map[string]uint32{"http": 8081, "dns": 5353},
			}},
		},
	}, {
		name: "internalTrafficPolicy Local, node-local endpoints, zones, ClientIP affinity with its timeout",
		svc: func() *corev1.Service {
			s := service(v4, http)
			s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
			return s
		}(),
		slices: []*discoveryv1.EndpointSlice{
			slice("web-a", discoveryv1.AddressTypeIPv4,
				[]discoveryv1.EndpointPort{slicePort("http", corev1.ProtocolTCP, 8080)},
				func() discoveryv1.Endpoint {
					ep := endpoint("198.18.1.1", isReady, "node-a")
					ep.Zone = ptr.To("zone-1")
					return ep
				}(),
				endpoint("198.18.1.2", isReady, "node-b")),
		},
		opts: kubeconvert.Options{NodeName: "node-a"},
		want: &vipdv1.Service{
			Name: "shop/web", Owner: "kubernetes", Vips: v4,
			Ports: []*vipdv1.Port{{Name: "http", Protocol: tcp, Port: 80}},
			Backends: []*vipdv1.Backend{
				{Ip: "198.18.1.1", State: ready, OnlyNamedPorts: true, NodeLocal: true, Zone: "zone-1", Ports: map[string]uint32{"http": 8080}},
				backend("198.18.1.2", ready, map[string]uint32{"http": 8080}),
			},
			SessionAffinity:       &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP, TimeoutSeconds: 60},
			InternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL,
		},
	}, {
		name: "ClientIP affinity without a config gets Kubernetes' default timeout; NodePort keeps its cluster IP",
		svc: func() *corev1.Service {
			s := service(v4, http)
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			return s
		}(),
		want: &vipdv1.Service{
			Name: "shop/web", Owner: "kubernetes", Vips: v4,
			Ports:           []*vipdv1.Port{{Name: "http", Protocol: tcp, Port: 80}},
			Backends:        []*vipdv1.Backend{},
			SessionAffinity: &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP, TimeoutSeconds: 10800},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := kubeconvert.Convert(tt.svc, tt.slices, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("Convert (-want +got):\n%s", diff)
			}
			// The same objects in another order give the same service.
			reversed := slices.Clone(tt.slices)
			slices.Reverse(reversed)
			again, err := kubeconvert.Convert(tt.svc, reversed, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(got, again, protocmp.Transform()); diff != "" {
				t.Errorf("Convert with the slices reversed (-first +reversed):\n%s", diff)
			}
		})
	}
}

func TestSkipped(t *testing.T) {
	base := func(mutate func(*corev1.Service)) *corev1.Service {
		s := service([]string{"198.19.0.10"}, svcPort("http", corev1.ProtocolTCP, 80, intstr.FromInt32(8080)))
		mutate(s)
		return s
	}
	labelled := func(value string) *corev1.Service {
		return base(func(s *corev1.Service) { s.Labels = map[string]string{kubeconvert.ServiceProxyNameLabel: value} })
	}
	vipd := kubeconvert.Options{ServiceProxyName: "vipd"}
	tests := []struct {
		name string
		opts kubeconvert.Options
		svc  *corev1.Service
		want string // in the reason; "" means programmed
	}{
		{"ClusterIP", kubeconvert.Options{}, base(func(*corev1.Service) {}), ""},
		{"LoadBalancer keeps its cluster IP", kubeconvert.Options{}, base(func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeLoadBalancer }), ""},
		{"headless", kubeconvert.Options{}, base(func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"} }), "headless"},
		{"ExternalName", kubeconvert.Options{}, base(func(s *corev1.Service) {
			s.Spec.Type, s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Spec.ExternalName = corev1.ServiceTypeExternalName, "", nil, "db.example.com"
		}), "ExternalName"},
		{"service-proxy-name, even empty", kubeconvert.Options{}, labelled(""), "another proxy"},
		{"service-proxy-name of any value", kubeconvert.Options{}, labelled("vipd"), "another proxy"},
		{"no cluster IP yet", kubeconvert.Options{}, base(func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil }), "no cluster IP"},

		// As the proxy named vipd: only Services labelled with that name.
		{"proxy name: labelled with it", vipd, labelled("vipd"), ""},
		{"proxy name: unlabelled, kube-proxy's", vipd, base(func(*corev1.Service) {}), "lacks the label service.kubernetes.io/service-proxy-name=vipd"},
		{"proxy name: another proxy's", vipd, labelled("cilium"), `"cilium": that proxy serves it, not "vipd"`},
		{"proxy name: empty value", vipd, labelled(""), `"": that proxy serves it`},
		{"proxy name: a prefix of it", vipd, labelled("vip"), `"vip": that proxy`},
		{"proxy name: labelled but headless", vipd, func() *corev1.Service {
			s := labelled("vipd")
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"}
			return s
		}(), "headless"},
		{"proxy name: labelled but ExternalName", vipd, func() *corev1.Service {
			s := labelled("vipd")
			s.Spec.Type, s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Spec.ExternalName = corev1.ServiceTypeExternalName, "", nil, "db.example.com"
			return s
		}(), "ExternalName"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reason := tt.opts.Skipped(tt.svc)
			if tt.want == "" && reason != "" || !strings.Contains(reason, tt.want) {
				t.Fatalf("Skipped = %q; want it to contain %q", reason, tt.want)
			}
			if tt.opts == (kubeconvert.Options{}) {
				if got := kubeconvert.Skipped(tt.svc); got != reason {
					t.Fatalf("kubeconvert.Skipped = %q, Options{}.Skipped = %q; want the same", got, reason)
				}
			}
			got, err := kubeconvert.Convert(tt.svc, nil, tt.opts)
			if skipped := kubeconvert.IsSkipped(err); skipped != (tt.want != "") {
				t.Fatalf("Convert: %v; skipped %v, want %v", err, skipped, tt.want != "")
			}
			if tt.want != "" && !strings.Contains(err.Error(), reason) {
				t.Errorf("Convert: %v; want the reason %q in it", err, reason)
			}
			if tt.want == "" && (err != nil || got.GetName() != "shop/web") {
				t.Errorf("Convert = %v, %v; want shop/web", got, err)
			}
		})
	}
}

// TestConvertAllWithProxyName: as the proxy named vipd, ConvertAll
// converts exactly the Services labelled with that name, and lists the
// others as skipped, never as broken.
func TestConvertAllWithProxyName(t *testing.T) {
	port := svcPort("", corev1.ProtocolTCP, 80, intstr.FromInt32(8080))
	mk := func(name, vip string, labels map[string]string) *corev1.Service {
		s := service([]string{vip}, port)
		s.Name, s.Labels = name, labels
		return s
	}
	svcs := []*corev1.Service{
		mk("mine", "198.19.0.10", map[string]string{kubeconvert.ServiceProxyNameLabel: "vipd", "app": "web"}),
		mk("kube-proxys", "198.19.0.11", map[string]string{"app": "web"}),
		mk("cilium", "198.19.0.12", map[string]string{kubeconvert.ServiceProxyNameLabel: "cilium"}),
		mk("also-mine", "198.19.0.13", map[string]string{kubeconvert.ServiceProxyNameLabel: "vipd"}),
	}
	for _, tt := range []struct {
		opts       kubeconvert.Options
		want, left []string
	}{
		{kubeconvert.Options{ServiceProxyName: "vipd"}, []string{"shop/also-mine", "shop/mine"}, []string{"shop/cilium", "shop/kube-proxys"}},
		{kubeconvert.Options{ServiceProxyName: "cilium"}, []string{"shop/cilium"}, []string{"shop/also-mine", "shop/kube-proxys", "shop/mine"}},
		{kubeconvert.Options{}, []string{"shop/kube-proxys"}, []string{"shop/also-mine", "shop/cilium", "shop/mine"}},
	} {
		got, left := kubeconvert.ConvertAll(svcs, nil, tt.opts)
		var names, leftNames []string
		for _, s := range got {
			names = append(names, s.Name)
		}
		for _, l := range left {
			leftNames = append(leftNames, l.Service)
			if !kubeconvert.IsSkipped(l.Err) {
				t.Errorf("proxy name %q: %s left out as %v; want skipped", tt.opts.ServiceProxyName, l.Service, l.Err)
			}
		}
		if !slices.Equal(names, tt.want) || !slices.Equal(leftNames, tt.left) {
			t.Errorf("proxy name %q: converted %v, left %v; want %v, %v", tt.opts.ServiceProxyName, names, leftNames, tt.want, tt.left)
		}
	}
}

func TestConvertAll(t *testing.T) {
	port := svcPort("", corev1.ProtocolTCP, 80, intstr.FromInt32(8080))
	web := service([]string{"198.19.0.10"}, port)
	headless := service([]string{"None"}, port)
	headless.Name = "db"
	broken := service([]string{"198.19.0.300"}, port)
	broken.Name = "broken"
	web2 := service([]string{"198.19.0.11"}, port)
	web2.Namespace = "a"
	lingering := slice("gone-x", discoveryv1.AddressTypeIPv4,
		[]discoveryv1.EndpointPort{slicePort("", corev1.ProtocolTCP, 8080)}, endpoint("198.18.3.3", isReady, ""))
	lingering.Labels[discoveryv1.LabelServiceName] = "gone"
	webSlice := slice("web-x", discoveryv1.AddressTypeIPv4,
		[]discoveryv1.EndpointPort{slicePort("", corev1.ProtocolTCP, 8080)}, endpoint("198.18.1.1", isReady, ""))

	got, left := kubeconvert.ConvertAll([]*corev1.Service{web, headless, broken, web2}, []*discoveryv1.EndpointSlice{lingering, webSlice}, kubeconvert.Options{})
	var names []string
	for _, s := range got {
		names = append(names, s.Name)
	}
	if want := []string{"a/web", "shop/web"}; !slices.Equal(names, want) {
		t.Fatalf("converted %v; want %v (in name order; the lingering slice's service absent)", names, want)
	}
	if len(got[1].Backends) != 1 || len(got[0].Backends) != 0 {
		t.Errorf("backends: a/web %v, shop/web %v; want only shop/web's slice to count, for shop/web", got[0].Backends, got[1].Backends)
	}
	if len(left) != 2 || left[0].Service != "shop/broken" || left[1].Service != "shop/db" {
		t.Fatalf("left out %+v; want shop/broken, shop/db", left)
	}
	if kubeconvert.IsSkipped(left[0].Err) || !strings.Contains(left[0].Err.Error(), "198.19.0.300") {
		t.Errorf("broken service: %v; want a conversion error naming the bad IP", left[0].Err)
	}
	if !kubeconvert.IsSkipped(left[1].Err) || !errors.Is(left[1].Err, kubeconvert.ErrSkipped) {
		t.Errorf("headless service: %v; want ErrSkipped", left[1].Err)
	}
}

// TestConvertExternal: each external field of a Service, as kube-proxy
// reads it, and what is left out with the path of the field.
func TestConvertExternal(t *testing.T) {
	http := svcPort("http", corev1.ProtocolTCP, 80, intstr.FromInt32(8080))
	dns := svcPort("dns", corev1.ProtocolUDP, 53, intstr.FromInt32(5353))
	v4 := []string{"198.19.0.10"}
	dual := []string{"198.19.0.10", "fd00:198::10"}
	withNodePorts := func(s *corev1.Service, ports ...int32) *corev1.Service {
		for i, p := range ports {
			s.Spec.Ports[i].NodePort = p
		}
		return s
	}
	typed := func(typ corev1.ServiceType, s *corev1.Service) *corev1.Service {
		s.Spec.Type = typ
		return s
	}
	ingress := func(s *corev1.Service, ing ...corev1.LoadBalancerIngress) *corev1.Service {
		s.Status.LoadBalancer.Ingress = ing
		return s
	}
	vipMode, proxyMode := ptr.To(corev1.LoadBalancerIPModeVIP), ptr.To(corev1.LoadBalancerIPModeProxy)
	lb := func(ips []string, ports ...corev1.ServicePort) *corev1.Service {
		return typed(corev1.ServiceTypeLoadBalancer, service(ips, ports...))
	}
	tests := []struct {
		name    string
		svc     *corev1.Service
		want    *vipdv1.Service // Name, Owner and Backends filled in by the test
		omitted []string        // the fields left out
	}{{
		name: "NodePort: each port's node port, with its protocol",
		svc:  withNodePorts(typed(corev1.ServiceTypeNodePort, service(v4, http, dns)), 30080, 30053),
		want: &vipdv1.Service{
			Vips:  v4,
			Ports: []*vipdv1.Port{{Name: "http", Protocol: tcp, Port: 80, TargetPort: 8080, NodePort: 30080}, {Name: "dns", Protocol: udp, Port: 53, TargetPort: 5353, NodePort: 30053}},
		},
	}, {
		name: "LoadBalancer: node ports and the ingress IP",
		svc: ingress(withNodePorts(lb(v4, http), 30080),
			corev1.LoadBalancerIngress{IP: "198.19.1.1"}),
		want: &vipdv1.Service{
			Vips: v4, Ports: []*vipdv1.Port{{Name: "http", Protocol: tcp, Port: 80, TargetPort: 8080, NodePort: 30080}},
			LoadBalancerIps: []string{"198.19.1.1"},
		},
	}, {
		name: "LoadBalancer with allocateLoadBalancerNodePorts false: only the node ports set explicitly",
		svc: func() *corev1.Service {
			s := ingress(withNodePorts(lb(v4, http, dns), 0, 30053), corev1.LoadBalancerIngress{IP: "198.19.1.1"})
			s.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
			return s
		}(),
		want: &vipdv1.Service{
			Vips:            v4,
			Ports:           []*vipdv1.Port{{Name: "http", Protocol: tcp, Port: 80, TargetPort: 8080}, {Name: "dns", Protocol: udp, Port: 53, TargetPort: 5353, NodePort: 30053}},
			LoadBalancerIps: []string{"198.19.1.1"},
		},
	}, {
		name: "a node port on a ClusterIP Service (the apiserver refuses one) is left out",
		svc:  withNodePorts(service(v4, http), 30080),
		want: &vipdv1.Service{
			Vips: v4, Ports: []*vipdv1.Port{{Name: "http", Protocol: tcp, Port: 80, TargetPort: 8080}},
		},
		omitted: []string{"spec.ports[0].nodePort"},
	}, {
		name: "ingress: ipMode VIP and unset served, Proxy and hostnames left out, an empty entry ignored",
		svc: ingress(lb(v4, http),
			corev1.LoadBalancerIngress{IP: "198.19.1.1", IPMode: vipMode},
			corev1.LoadBalancerIngress{IP: "198.19.1.2", IPMode: proxyMode},
			corev1.LoadBalancerIngress{Hostname: "lb.example.com"},
			corev1.LoadBalancerIngress{},
			corev1.LoadBalancerIngress{IP: "198.19.1.3", Hostname: "lb3.example.com"}),
		want: &vipdv1.Service{
			Vips: v4, Ports: []*vipdv1.Port{{Name: "http", Protocol: tcp, Port: 80, TargetPort: 8080}},
			LoadBalancerIps: []string{"198.19.1.1", "198.19.1.3"},
		},
		omitted: []string{"status.loadBalancer.ingress[1]", "status.loadBalancer.ingress[2]"},
	}, {
		name: "externalIPs on a ClusterIP Service; leading zeros and blanks read as kube-proxy reads them; repeats and bad ones left out",
		svc: func() *corev1.Service {
			s := service(v4, http)
			s.Spec.ExternalIPs = []string{"198.19.2.1", " 198.019.2.2", "198.19.2.1", "not-an-ip", "", "198.19.0.10"}
			return s
		}(),
		want: &vipdv1.Service{
			Vips: v4, Ports: []*vipdv1.Port{{Name: "http", Protocol: tcp, Port: 80, TargetPort: 8080}},
			ExternalIps: []string{"198.19.2.1", "198.19.2.2"},
		},
		omitted: []string{"spec.externalIPs[2]", "spec.externalIPs[3]", "spec.externalIPs[5]"},
	}, {
		name: "single-stack IPv4: IPv6 external and ingress IPs left out; an IPv4-mapped one is IPv4",
		svc: func() *corev1.Service {
			s := ingress(lb(v4, http), corev1.LoadBalancerIngress{IP: "fd00:198::1:1"}, corev1.LoadBalancerIngress{IP: "198.19.1.1"})
			s.Spec.ExternalIPs = []string{"fd00:198::2:1", "::ffff:198.19.2.1"}
			return s
		}(),
		want: &vipdv1.Service{
			Vips: v4, Ports: []*vipdv1.Port{{Name: "http", Protocol: tcp, Port: 80, TargetPort: 8080}},
			ExternalIps: []string{"198.19.2.1"}, LoadBalancerIps: []string{"198.19.1.1"},
		},
		omitted: []string{"spec.externalIPs[0]", "status.loadBalancer.ingress[0].ip"},
	}, {
		name: "dual-stack: both families' external and ingress IPs; one both external and ingress is served once",
		svc: func() *corev1.Service {
			s := ingress(lb(dual, http), corev1.LoadBalancerIngress{IP: "fd00:198::1:1"}, corev1.LoadBalancerIngress{IP: "198.19.1.1"},
				corev1.LoadBalancerIngress{IP: "198.19.2.1"})
			s.Spec.ExternalIPs = []string{"198.19.2.1", "fd00:198::2:1"}
			return s
		}(),
		want: &vipdv1.Service{
			Vips: dual, Ports: []*vipdv1.Port{{Name: "http", Protocol: tcp, Port: 80, TargetPort: 8080}},
			ExternalIps: []string{"198.19.2.1", "fd00:198::2:1"}, LoadBalancerIps: []string{"fd00:198::1:1", "198.19.1.1"},
		},
		omitted: []string{"status.loadBalancer.ingress[2].ip"},
	}, {
		name: "externalTrafficPolicy Local and healthCheckNodePort on a LoadBalancer Service",
		svc: func() *corev1.Service {
			s := ingress(withNodePorts(lb(v4, http), 30080), corev1.LoadBalancerIngress{IP: "198.19.1.1"})
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 32000
			return s
		}(),
		want: &vipdv1.Service{
			Vips: v4, Ports: []*vipdv1.Port{{Name: "http", Protocol: tcp, Port: 80, TargetPort: 8080, NodePort: 30080}},
			LoadBalancerIps:       []string{"198.19.1.1"},
			ExternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL,
			HealthCheckNodePort:   32000,
		},
	}, {
		name: "externalTrafficPolicy Local on a NodePort Service: no health-check node port (kube-proxy's NeedsHealthCheck)",
		svc: func() *corev1.Service {
			s := withNodePorts(typed(corev1.ServiceTypeNodePort, service(v4, http)), 30080)
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 32000
			return s
		}(),
		want: &vipdv1.Service{
			Vips: v4, Ports: []*vipdv1.Port{{Name: "http", Protocol: tcp, Port: 80, TargetPort: 8080, NodePort: 30080}},
			ExternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL,
		},
	}, {
		name: "externalTrafficPolicy Local on a ClusterIP Service: only with external IPs",
		svc: func() *corev1.Service {
			s := service(v4, http)
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			return s
		}(),
		want: &vipdv1.Service{Vips: v4, Ports: []*vipdv1.Port{{Name: "http", Protocol: tcp, Port: 80, TargetPort: 8080}}},
	}, {
		name: "externalTrafficPolicy Local on a ClusterIP Service with external IPs",
		svc: func() *corev1.Service {
			s := service(v4, http)
			s.Spec.ExternalIPs = []string{"198.19.2.1"}
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			return s
		}(),
		want: &vipdv1.Service{
			Vips: v4, Ports: []*vipdv1.Port{{Name: "http", Protocol: tcp, Port: 80, TargetPort: 8080}},
			ExternalIps: []string{"198.19.2.1"}, ExternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL,
		},
	}, {
		name: "externalTrafficPolicy Cluster is the default",
		svc: func() *corev1.Service {
			s := withNodePorts(typed(corev1.ServiceTypeNodePort, service(v4, http)), 30080)
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
			return s
		}(),
		want: &vipdv1.Service{
			Vips: v4, Ports: []*vipdv1.Port{{Name: "http", Protocol: tcp, Port: 80, TargetPort: 8080, NodePort: 30080}},
		},
	}, {
		name: "loadBalancerSourceRanges: masked, blanks trimmed, repeats once, bad ones and other families left out",
		svc: func() *corev1.Service {
			s := ingress(lb(v4, http), corev1.LoadBalancerIngress{IP: "198.19.1.1"})
			s.Spec.LoadBalancerSourceRanges = []string{"198.18.0.0/16", " 198.18.7.9/24 ", "198.18.0.0/16", "nope", "fd00:198::/32"}
			return s
		}(),
		want: &vipdv1.Service{
			Vips: v4, Ports: []*vipdv1.Port{{Name: "http", Protocol: tcp, Port: 80, TargetPort: 8080}},
			LoadBalancerIps:          []string{"198.19.1.1"},
			LoadBalancerSourceRanges: []string{"198.18.0.0/16", "198.18.7.0/24"},
		},
		omitted: []string{"spec.loadBalancerSourceRanges[3]", "spec.loadBalancerSourceRanges[4]"},
	}, {
		name: "loadBalancerSourceRanges of one family on a dual-stack Service: the other family stays open, as in kube-proxy",
		svc: func() *corev1.Service {
			s := ingress(lb(dual, http), corev1.LoadBalancerIngress{IP: "198.19.1.1"}, corev1.LoadBalancerIngress{IP: "fd00:198::1:1"})
			s.Spec.LoadBalancerSourceRanges = []string{"198.18.0.0/16"}
			return s
		}(),
		want: &vipdv1.Service{
			Vips: dual, Ports: []*vipdv1.Port{{Name: "http", Protocol: tcp, Port: 80, TargetPort: 8080}},
			LoadBalancerIps:          []string{"198.19.1.1", "fd00:198::1:1"},
			LoadBalancerSourceRanges: []string{"198.18.0.0/16", "::/0"},
		},
	}, {
		name: "loadBalancerSourceRanges with no ingress IP yet are left out",
		svc: func() *corev1.Service {
			s := lb(v4, http)
			s.Spec.LoadBalancerSourceRanges = []string{"198.18.0.0/16"}
			return s
		}(),
		want:    &vipdv1.Service{Vips: v4, Ports: []*vipdv1.Port{{Name: "http", Protocol: tcp, Port: 80, TargetPort: 8080}}},
		omitted: []string{"spec.loadBalancerSourceRanges"},
	}, {
		name: "the load-balancer-source-ranges annotation is not read (kube-proxy does not), and said so",
		svc: func() *corev1.Service {
			s := ingress(lb(v4, http), corev1.LoadBalancerIngress{IP: "198.19.1.1"})
			s.Annotations = map[string]string{kubeconvert.LoadBalancerSourceRangesAnnotation: "198.18.0.0/16"}
			return s
		}(),
		want: &vipdv1.Service{
			Vips: v4, Ports: []*vipdv1.Port{{Name: "http", Protocol: tcp, Port: 80, TargetPort: 8080}},
			LoadBalancerIps: []string{"198.19.1.1"},
		},
		omitted: []string{"metadata.annotations[service.beta.kubernetes.io/load-balancer-source-ranges]"},
	}, {
		name: "the annotation beside spec.loadBalancerSourceRanges: the field counts, silently",
		svc: func() *corev1.Service {
			s := ingress(lb(v4, http), corev1.LoadBalancerIngress{IP: "198.19.1.1"})
			s.Annotations = map[string]string{kubeconvert.LoadBalancerSourceRangesAnnotation: "10.0.0.0/8"}
			s.Spec.LoadBalancerSourceRanges = []string{"198.18.0.0/16"}
			return s
		}(),
		want: &vipdv1.Service{
			Vips: v4, Ports: []*vipdv1.Port{{Name: "http", Protocol: tcp, Port: 80, TargetPort: 8080}},
			LoadBalancerIps: []string{"198.19.1.1"}, LoadBalancerSourceRanges: []string{"198.18.0.0/16"},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, omitted, err := kubeconvert.ConvertWithOmissions(tt.svc, nil, kubeconvert.Options{})
			if err != nil {
				t.Fatal(err)
			}
			tt.want.Name, tt.want.Owner, tt.want.Backends = "shop/web", kubeconvert.Owner, []*vipdv1.Backend{}
			if diff := cmp.Diff(tt.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("ConvertWithOmissions (-want +got):\n%s", diff)
			}
			var fields []string
			for _, o := range omitted {
				fields = append(fields, o.Field)
				if o.Reason == "" {
					t.Errorf("omission %s has no reason", o.Field)
				}
			}
			if !slices.Equal(fields, tt.omitted) {
				t.Errorf("omitted %q; want %q", omitted, tt.omitted)
			}
			plain, err := kubeconvert.Convert(tt.svc, nil, kubeconvert.Options{})
			if err != nil || !cmp.Equal(plain, got, protocmp.Transform()) {
				t.Errorf("Convert = %v, %v; want what ConvertWithOmissions gives", plain, err)
			}
		})
	}
}

// TestOmissionReasons: the reasons name what was left out and why, in
// words a user can act on.
func TestOmissionReasons(t *testing.T) {
	s := service([]string{"198.19.0.10"}, svcPort("http", corev1.ProtocolTCP, 80, intstr.FromInt32(8080)))
	s.Spec.Type = corev1.ServiceTypeLoadBalancer
	s.Spec.ExternalIPs = []string{"fd00:198::2:1"}
	s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{
		{IP: "198.19.1.2", IPMode: ptr.To(corev1.LoadBalancerIPModeProxy)},
		{Hostname: "lb.example.com"},
	}
	_, omitted, err := kubeconvert.ConvertWithOmissions(s, nil, kubeconvert.Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"spec.externalIPs[0]: fd00:198::2:1 is IPv6, and the Service has no IPv6 cluster IP",
		"status.loadBalancer.ingress[0]: ipMode Proxy",
		`status.loadBalancer.ingress[1]: hostname "lb.example.com", not an IP`,
	}
	if len(omitted) != len(want) {
		t.Fatalf("omitted %q; want %d", omitted, len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(omitted[i].String(), w) {
			t.Errorf("omission %d: %q; want it to start %q", i, omitted[i], w)
		}
	}
}

// TestConvertAllWithOmissions: the omissions are by service name, and a
// service that leaves nothing out has none.
func TestConvertAllWithOmissions(t *testing.T) {
	port := svcPort("", corev1.ProtocolTCP, 80, intstr.FromInt32(8080))
	a := service([]string{"198.19.0.10"}, port)
	a.Name = "a"
	a.Spec.ExternalIPs = []string{"fd00:198::2:1", "198.19.2.1"}
	b := service([]string{"198.19.0.11"}, port)
	b.Name = "b"
	out, omitted, left := kubeconvert.ConvertAllWithOmissions([]*corev1.Service{b, a}, nil, kubeconvert.Options{})
	if len(out) != 2 || len(left) != 0 || out[0].Name != "shop/a" || !slices.Equal(out[0].ExternalIps, []string{"198.19.2.1"}) {
		t.Fatalf("converted %v, left %v", out, left)
	}
	if len(omitted) != 1 || len(omitted["shop/a"]) != 1 || omitted["shop/a"][0].Field != "spec.externalIPs[0]" {
		t.Errorf("omitted %v; want shop/a's spec.externalIPs[0] only", omitted)
	}
}
