package kubeadapter_test

import (
	"fmt"
	"testing"

	"github.com/vipd/vipd/internal/kubeadapter"
	"github.com/vipd/vipd/internal/kubeconvert"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// labelled returns objs (a Service and its slices, as simple makes them)
// with the service-proxy-name label set to value, or removed when value
// is nil: the EndpointSlice controller copies a Service's labels to its
// slices.
func labelled(value *string, objs ...runtime.Object) []runtime.Object {
	for _, o := range objs {
		var labels *map[string]string
		switch o := o.(type) {
		case *corev1.Service:
			labels = &o.Labels
		case *discoveryv1.EndpointSlice:
			labels = &o.Labels
		}
		if value == nil {
			delete(*labels, kubeconvert.ServiceProxyNameLabel)
			continue
		}
		if *labels == nil {
			*labels = map[string]string{}
		}
		(*labels)[kubeconvert.ServiceProxyNameLabel] = *value
	}
	return objs
}

func proxy(name string) *string { return &name }

// relabel updates the Service and slices objs as labelled says.
func (e *env) relabel(value *string, objs ...runtime.Object) {
	e.t.Helper()
	for _, o := range labelled(value, objs...) {
		switch o := o.(type) {
		case *corev1.Service:
			e.updateService(o)
		case *discoveryv1.EndpointSlice:
			e.updateSlice(o)
		}
	}
}

// TestServiceProxyName: with WithServiceProxyName("vipd") the adapter
// programs exactly the Services labelled service-proxy-name=vipd. A
// Service moves into vipd when it gains the label and out when it loses
// it or is handed to another proxy; unlabelled Services, kube-proxy's, and
// other proxies' Services are never programmed, whatever happens to them.
func TestServiceProxyName(t *testing.T) {
	webObjs := func() []runtime.Object { return simple("shop", "web", "198.19.0.10", "198.18.1.1") }
	apiObjs := func() []runtime.Object { return simple("shop", "api", "198.19.0.11", "198.18.1.2") }
	cilObjs := func() []runtime.Object { return simple("shop", "cil", "198.19.0.12", "198.18.1.3") }
	var objs []runtime.Object
	objs = append(objs, labelled(proxy("vipd"), webObjs()...)...)
	objs = append(objs, apiObjs()...)
	objs = append(objs, labelled(proxy("cilium"), cilObjs()...)...)
	web := simpleSummary("198.19.0.10", "198.18.1.1")
	api := simpleSummary("198.19.0.11", "198.18.1.2")
	cil := simpleSummary("198.19.0.12", "198.18.1.3")

	tests := []struct {
		name string
		do   func(e *env)
		want map[string]string
	}{
		{"only the labelled Service", nil, map[string]string{"shop/web": web}},
		{"the unlabelled Service's slice changes: untouched", func(e *env) {
			e.updateSlice(slice("shop", "api", "api-a", v4, ports(slicePort("", corev1.ProtocolTCP, 8080)), endpoint("198.18.1.9", ready, "")))
		}, map[string]string{"shop/web": web}},
		{"the unlabelled Service is labelled for vipd: it moves in", func(e *env) {
			e.relabel(proxy("vipd"), apiObjs()...)
		}, map[string]string{"shop/web": web, "shop/api": api}},
		{"web loses the label: it moves out, back to kube-proxy", func(e *env) {
			e.relabel(nil, webObjs()...)
		}, map[string]string{"shop/api": api}},
		{"api is handed to another proxy: it moves out", func(e *env) {
			e.relabel(proxy("cilium"), apiObjs()...)
		}, map[string]string{}},
		{"the other proxy's Service is labelled for vipd: it moves in", func(e *env) {
			e.relabel(proxy("vipd"), cilObjs()...)
		}, map[string]string{"shop/cil": cil}},
		{"an unlabelled Service is created: untouched", func(e *env) {
			for _, o := range simple("shop", "new", "198.19.0.13", "198.18.1.4") {
				switch o := o.(type) {
				case *corev1.Service:
					e.createService(o)
				case *discoveryv1.EndpointSlice:
					e.createSlice(o)
				}
			}
		}, map[string]string{"shop/cil": cil}},
		{"web is labelled for vipd again: it moves back in", func(e *env) {
			e.relabel(proxy("vipd"), webObjs()...)
		}, map[string]string{"shop/cil": cil, "shop/web": web}},
		{"a labelled Service whose slice lacks the label (hand-made, or not copied yet): its endpoints count", func(e *env) {
			for _, o := range simple("shop", "manual", "198.19.0.14", "198.18.1.5") {
				switch o := o.(type) {
				case *corev1.Service:
					e.createService(labelled(proxy("vipd"), o)[0].(*corev1.Service))
				case *discoveryv1.EndpointSlice:
					e.createSlice(o)
				}
			}
		}, map[string]string{"shop/cil": cil, "shop/web": web, "shop/manual": simpleSummary("198.19.0.14", "198.18.1.5")}},
		{"the labelled Service is deleted: it goes", func(e *env) {
			e.deleteService("shop", "manual")
		}, map[string]string{"shop/cil": cil, "shop/web": web}},
	}

	e := newEnv(t, objs...)
	e.sentinelLabels = map[string]string{kubeconvert.ServiceProxyNameLabel: "vipd"}
	a := e.start(kubeadapter.WithServiceProxyName("vipd"))
	for _, tt := range tests {
		if tt.do != nil {
			tt.do(e)
		}
		e.settle()
		if err := diffState(tt.want, e.state()); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
	}
	// Skipped Services are not "left out": nothing went wrong with them.
	for _, r := range []string{kubeadapter.ReasonOtherOwner, kubeadapter.ReasonConflict, kubeadapter.ReasonInvalid, kubeadapter.ReasonUnsupported} {
		waitMetric(t, a.reg, 0, "vipd_k8s_services_left_out", "reason", r)
	}

	// A new adapter over the same objects (a full sync) finds the same.
	a.stop()
	a = e.start(kubeadapter.WithServiceProxyName("vipd"))
	e.settle()
	final := map[string]string{"shop/cil": cil, "shop/web": web}
	if err := diffState(final, e.state()); err != nil {
		t.Fatalf("after a restart: %v", err)
	}

	// Finishing the move as the README says: with the adapter stopped, the
	// labels go; an adapter without the option then finds vipd's services
	// as they are, and no apply ever lacks them. (kube-proxy, retired by
	// then, would serve the unlabelled shop/new and shop/api here; this
	// adapter now does.)
	a.stop()
	mark := len(e.srv.Dataplane().Records())
	e.relabel(nil, webObjs()...)
	e.relabel(nil, cilObjs()...)
	e.relabel(nil, apiObjs()...)
	e.sentinelLabels = nil
	e.start()
	e.settle()
	final["shop/api"] = api
	final["shop/new"] = simpleSummary("198.19.0.13", "198.18.1.4")
	if err := diffState(final, e.state()); err != nil {
		t.Fatalf("after the labels went and the adapter restarted without the option: %v", err)
	}
	for i, r := range e.srv.Dataplane().Records()[mark:] {
		for _, name := range []string{"shop/web", "shop/cil"} {
			if _, ok := r.State.Services[name]; !ok {
				t.Errorf("apply %d after the switch lacks %s", i, name)
			}
		}
	}
}

// TestWithoutServiceProxyName: without the option the adapter programs
// what kube-proxy would, the Services without the label, whatever other
// Services are labelled for.
func TestWithoutServiceProxyName(t *testing.T) {
	var objs []runtime.Object
	objs = append(objs, labelled(proxy("vipd"), simple("shop", "web", "198.19.0.10", "198.18.1.1")...)...)
	objs = append(objs, simple("shop", "api", "198.19.0.11", "198.18.1.2")...)
	e := newEnv(t, objs...)
	e.start()
	e.settle()
	if err := diffState(map[string]string{"shop/api": simpleSummary("198.19.0.11", "198.18.1.2")}, e.state()); err != nil {
		t.Fatal(err)
	}
}

// TestServiceProxyNameInformerSelector: the Service informer asks the
// apiserver only for the Services labelled with the proxy name (kube-proxy
// asks for those without the label), so that a cluster's other Services
// cost the adapter nothing. The slices are then not filtered by the
// label: a Service's slices get it only after the Service, and hand-made
// ones may never have it.
func TestServiceProxyNameInformerSelector(t *testing.T) {
	for _, tt := range []struct {
		opts                    []kubeadapter.Option
		wantServices, wantSlice string
	}{
		{nil, "!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name",
			"!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name"},
		{[]kubeadapter.Option{kubeadapter.WithServiceProxyName("vipd")},
			"!service.kubernetes.io/headless,service.kubernetes.io/service-proxy-name=vipd", "!service.kubernetes.io/headless"},
	} {
		e := newEnv(t)
		a := e.start(tt.opts...)
		eventually(t, "the informers list", func() error {
			if err := listedWith(e.kube, "services", tt.wantServices); err != nil {
				return err
			}
			return listedWith(e.kube, "endpointslices", tt.wantSlice)
		})
		a.stop()
	}
}

// listedWith says whether kube was asked to list resource with selector.
func listedWith(kube *fake.Clientset, resource, selector string) error {
	var got []string
	for _, act := range kube.Actions() {
		l, ok := act.(k8stesting.ListAction)
		if !ok || act.GetResource().Resource != resource {
			continue
		}
		s := l.GetListRestrictions().Labels.String()
		if s == selector {
			return nil
		}
		got = append(got, s)
	}
	return fmt.Errorf("%s listed with selectors %q, want %q", resource, got, selector)
}
