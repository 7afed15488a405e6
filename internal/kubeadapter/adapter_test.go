package kubeadapter_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

const (
	v4 = discoveryv1.AddressTypeIPv4
	v6 = discoveryv1.AddressTypeIPv6
)

func ports(ps ...discoveryv1.EndpointPort) []discoveryv1.EndpointPort { return ps }

// web is the Service shop/web: 198.19.0.10, port http 80 to the named
// target port "http".
func web() *corev1.Service {
	return service("shop", "web", []string{"198.19.0.10"}, svcPort("http", corev1.ProtocolTCP, 80, "http"))
}

func webSlice(name string, httpPort int32, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return slice("shop", "web", name, v4, ports(slicePort("http", corev1.ProtocolTCP, httpPort)), eps...)
}

type step struct {
	name string
	do   func(e *env) // nil for the initial state
	want map[string]string
}

// TestAdapter drives the adapter through the cases the issue lists: the
// objects exist before it starts (its first full sync), then each step
// changes them and vipd must end with exactly want.
func TestAdapter(t *testing.T) {
	const webVIP = "vips=198.19.0.10 ports=http/TCP:80 "
	tests := []struct {
		name  string
		objs  []runtime.Object
		steps []step
	}{{
		name: "multi-slice service",
		objs: []runtime.Object{web(),
			webSlice("web-a", 8080, endpoint("198.18.1.1", ready, ""), endpoint("198.18.1.2", ready, "")),
			webSlice("web-b", 8080, endpoint("198.18.2.1", ready, ""))},
		steps: []step{{
			name: "both slices' endpoints",
			want: map[string]string{"shop/web": webVIP + "backends=[198.18.1.1 READY http=8080; 198.18.1.2 READY http=8080; 198.18.2.1 READY http=8080]"},
		}, {
			name: "a third slice is added",
			do: func(e *env) {
				e.createSlice(webSlice("web-c", 8080, endpoint("198.18.3.1", ready, "")))
			},
			want: map[string]string{"shop/web": webVIP + "backends=[198.18.1.1 READY http=8080; 198.18.1.2 READY http=8080; 198.18.2.1 READY http=8080; 198.18.3.1 READY http=8080]"},
		}, {
			name: "one slice is deleted",
			do:   func(e *env) { e.deleteSlice("shop", "web-a") },
			want: map[string]string{"shop/web": webVIP + "backends=[198.18.2.1 READY http=8080; 198.18.3.1 READY http=8080]"},
		}},
	}, {
		name: "dual-stack",
		objs: []runtime.Object{
			service("shop", "dual", []string{"198.19.0.11", "fd00:198::11"}, svcPort("", corev1.ProtocolTCP, 80, 8080)),
			slice("shop", "dual", "dual-v4", v4, ports(slicePort("", corev1.ProtocolTCP, 8080)), endpoint("198.18.1.1", ready, "")),
			slice("shop", "dual", "dual-v6", v6, ports(slicePort("", corev1.ProtocolTCP, 8080)), endpoint("fd00:198::1:1", ready, "")),
		},
		steps: []step{{
			name: "both families",
			want: map[string]string{"shop/dual": "vips=198.19.0.11,fd00:198::11 ports=/TCP:80 backends=[198.18.1.1 READY =8080; fd00:198::1:1 READY =8080]"},
		}, {
			name: "the IPv6 slice gains an endpoint",
			do: func(e *env) {
				e.updateSlice(slice("shop", "dual", "dual-v6", v6, ports(slicePort("", corev1.ProtocolTCP, 8080)),
					endpoint("fd00:198::1:1", ready, ""), endpoint("fd00:198::1:2", ready, "")))
			},
			want: map[string]string{"shop/dual": "vips=198.19.0.11,fd00:198::11 ports=/TCP:80 backends=[198.18.1.1 READY =8080; fd00:198::1:1 READY =8080; fd00:198::1:2 READY =8080]"},
		}},
	}, {
		name: "named ports differing per slice",
		objs: []runtime.Object{web(),
			webSlice("web-a", 8080, endpoint("198.18.1.1", ready, "")),
			webSlice("web-b", 9090, endpoint("198.18.2.1", ready, ""))},
		steps: []step{{
			name: "each slice's number",
			want: map[string]string{"shop/web": webVIP + "backends=[198.18.1.1 READY http=8080; 198.18.2.1 READY http=9090]"},
		}, {
			name: "one slice's number changes (a rollout renumbers the container port)",
			do:   func(e *env) { e.updateSlice(webSlice("web-b", 9191, endpoint("198.18.2.1", ready, ""))) },
			want: map[string]string{"shop/web": webVIP + "backends=[198.18.1.1 READY http=8080; 198.18.2.1 READY http=9191]"},
		}},
	}, {
		name: "terminating and serving transitions",
		objs: []runtime.Object{web(), webSlice("web-a", 8080, endpoint("198.18.1.1", ready, ""), endpoint("198.18.1.2", ready, ""))},
		steps: []step{{
			name: "ready",
			want: map[string]string{"shop/web": webVIP + "backends=[198.18.1.1 READY http=8080; 198.18.1.2 READY http=8080]"},
		}, {
			name: "terminating but serving",
			do: func(e *env) {
				e.updateSlice(webSlice("web-a", 8080, endpoint("198.18.1.1", terminating, ""), endpoint("198.18.1.2", ready, "")))
			},
			want: map[string]string{"shop/web": webVIP + "backends=[198.18.1.1 TERMINATING http=8080; 198.18.1.2 READY http=8080]"},
		}, {
			name: "terminating and no longer serving",
			do: func(e *env) {
				e.updateSlice(webSlice("web-a", 8080, endpoint("198.18.1.1", drained, ""), endpoint("198.18.1.2", ready, "")))
			},
			want: map[string]string{"shop/web": webVIP + "backends=[198.18.1.1 NOT_SERVING http=8080; 198.18.1.2 READY http=8080]"},
		}, {
			name: "gone from the slice",
			do:   func(e *env) { e.updateSlice(webSlice("web-a", 8080, endpoint("198.18.1.2", ready, ""))) },
			want: map[string]string{"shop/web": webVIP + "backends=[198.18.1.2 READY http=8080]"},
		}},
	}, {
		name: "headless",
		objs: []runtime.Object{
			service("shop", "db", []string{corev1.ClusterIPNone}, svcPort("pg", corev1.ProtocolTCP, 5432, 5432)),
			func() runtime.Object {
				s := slice("shop", "db", "db-a", v4, ports(slicePort("pg", corev1.ProtocolTCP, 5432)), endpoint("198.18.1.1", ready, ""))
				s.Labels[corev1.IsHeadlessService] = ""
				return s
			}(),
			web(), webSlice("web-a", 8080, endpoint("198.18.1.1", ready, "")),
		},
		steps: []step{{
			name: "not programmed",
			want: map[string]string{"shop/web": webVIP + "backends=[198.18.1.1 READY http=8080]"},
		}, {
			name: "its slice changes: still not programmed",
			do: func(e *env) {
				s := slice("shop", "db", "db-a", v4, ports(slicePort("pg", corev1.ProtocolTCP, 5432)), endpoint("198.18.1.2", ready, ""))
				s.Labels[corev1.IsHeadlessService] = ""
				e.updateSlice(s)
			},
			want: map[string]string{"shop/web": webVIP + "backends=[198.18.1.1 READY http=8080]"},
		}},
	}, {
		name: "ExternalName and service-proxy-name skips",
		objs: []runtime.Object{
			&corev1.Service{
				ObjectMeta: metaNS("shop", "ext"),
				Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "db.example.com"},
			},
			func() runtime.Object {
				s := web()
				s.Labels = map[string]string{"service.kubernetes.io/service-proxy-name": "other-proxy"}
				return s
			}(),
			webSlice("web-a", 8080, endpoint("198.18.1.1", ready, "")),
		},
		steps: []step{{
			name: "neither is programmed",
			want: map[string]string{},
		}, {
			name: "the label is removed: programmed",
			do:   func(e *env) { e.updateService(web()) },
			want: map[string]string{"shop/web": webVIP + "backends=[198.18.1.1 READY http=8080]"},
		}, {
			name: "the label is added again: deleted",
			do: func(e *env) {
				s := web()
				s.Labels = map[string]string{"service.kubernetes.io/service-proxy-name": ""}
				e.updateService(s)
			},
			want: map[string]string{},
		}},
	}, {
		name: "internalTrafficPolicy Local",
		objs: []runtime.Object{
			func() runtime.Object {
				s := web()
				s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
				return s
			}(),
			webSlice("web-a", 8080, endpoint("198.18.1.1", ready, "node-a"), endpoint("198.18.1.2", ready, "node-b")),
		},
		steps: []step{{
			name: "this node's endpoints are node-local",
			want: map[string]string{"shop/web": webVIP + "backends=[198.18.1.1 READY http=8080 local; 198.18.1.2 READY http=8080] itp=local"},
		}, {
			name: "the policy is dropped",
			do:   func(e *env) { e.updateService(web()) },
			want: map[string]string{"shop/web": webVIP + "backends=[198.18.1.1 READY http=8080 local; 198.18.1.2 READY http=8080]"},
		}},
	}, {
		name: "session affinity",
		objs: []runtime.Object{
			func() runtime.Object {
				s := web()
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
				return s
			}(),
			webSlice("web-a", 8080, endpoint("198.18.1.1", ready, "")),
		},
		steps: []step{{
			name: "ClientIP with its timeout",
			want: map[string]string{"shop/web": webVIP + "backends=[198.18.1.1 READY http=8080] affinity=60"},
		}, {
			name: "ClientIP with Kubernetes' default timeout",
			do: func(e *env) {
				s := web()
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
				e.updateService(s)
			},
			want: map[string]string{"shop/web": webVIP + "backends=[198.18.1.1 READY http=8080] affinity=10800"},
		}, {
			name: "None",
			do:   func(e *env) { e.updateService(web()) },
			want: map[string]string{"shop/web": webVIP + "backends=[198.18.1.1 READY http=8080]"},
		}},
	}, {
		name: "a service deleted while its slices linger",
		objs: []runtime.Object{web(), webSlice("web-a", 8080, endpoint("198.18.1.1", ready, "")),
			service("shop", "api", []string{"198.19.0.12"}, svcPort("", corev1.ProtocolTCP, 80, 8080)),
			slice("shop", "api", "api-a", v4, ports(slicePort("", corev1.ProtocolTCP, 8080)), endpoint("198.18.4.1", ready, "")),
		},
		steps: []step{{
			name: "both programmed",
			want: map[string]string{
				"shop/web": webVIP + "backends=[198.18.1.1 READY http=8080]",
				"shop/api": "vips=198.19.0.12 ports=/TCP:80 backends=[198.18.4.1 READY =8080]",
			},
		}, {
			name: "the Service is deleted, its slice not",
			do:   func(e *env) { e.deleteService("shop", "web") },
			want: map[string]string{"shop/api": "vips=198.19.0.12 ports=/TCP:80 backends=[198.18.4.1 READY =8080]"},
		}, {
			name: "the lingering slice changes: still absent",
			do:   func(e *env) { e.updateSlice(webSlice("web-a", 8080, endpoint("198.18.1.9", ready, ""))) },
			want: map[string]string{"shop/api": "vips=198.19.0.12 ports=/TCP:80 backends=[198.18.4.1 READY =8080]"},
		}, {
			name: "the Service comes back with the slice's endpoints",
			do:   func(e *env) { e.createService(web()) },
			want: map[string]string{
				"shop/web": webVIP + "backends=[198.18.1.9 READY http=8080]",
				"shop/api": "vips=198.19.0.12 ports=/TCP:80 backends=[198.18.4.1 READY =8080]",
			},
		}},
	}, {
		name: "a slice moved to another Service updates both",
		objs: []runtime.Object{web(), webSlice("web-a", 8080, endpoint("198.18.1.1", ready, "")),
			service("shop", "web2", []string{"198.19.0.13"}, svcPort("http", corev1.ProtocolTCP, 80, "http"))},
		steps: []step{{
			name: "the slice serves web",
			want: map[string]string{
				"shop/web":  webVIP + "backends=[198.18.1.1 READY http=8080]",
				"shop/web2": "vips=198.19.0.13 ports=http/TCP:80 backends=[]",
			},
		}, {
			name: "relabelled to web2",
			do: func(e *env) {
				s := webSlice("web-a", 8080, endpoint("198.18.1.1", ready, ""))
				s.Labels[discoveryv1.LabelServiceName] = "web2"
				e.updateSlice(s)
			},
			want: map[string]string{
				"shop/web":  webVIP + "backends=[]",
				"shop/web2": "vips=198.19.0.13 ports=http/TCP:80 backends=[198.18.1.1 READY http=8080]",
			},
		}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, tt.objs...)
			e.start()
			for _, s := range tt.steps {
				if s.do != nil {
					s.do(e)
				}
				e.settle()
				if err := diffState(s.want, e.state()); err != nil {
					t.Fatalf("%s: %v", s.name, err)
				}
			}
		})
	}
}
