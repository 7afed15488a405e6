package kubeadapter_test

import (
	"context"
	"testing"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/fake"
	"github.com/vipd/vipd/internal/kubeadapter"
	"github.com/vipd/vipd/internal/testkit/testserver"
	"github.com/vipd/vipd/server/validation"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// noSCTP is a fake dataplane that forwards TCP and UDP only.
func noSCTP() *fake.Dataplane {
	return fake.New(fake.WithCapabilities(dataplane.Capabilities{
		LoadBalancing: []dataplane.LoadBalancing{dataplane.LoadBalancingRandom},
		Protocols:     []dataplane.Protocol{dataplane.TCP, dataplane.UDP},
	}))
}

// TestFullSyncSetsCulpritsAside: when vipd refuses the full sync naming
// the services at fault (one it cannot forward, one over --max-services),
// the adapter leaves those out and syncs the rest in one more call each
// time, never falling back to one call per service.
func TestFullSyncSetsCulpritsAside(t *testing.T) {
	var objs []runtime.Object
	objs = append(objs, simple("shop", "a", "198.19.0.10", "198.18.1.1")...)
	objs = append(objs, simple("shop", "b", "198.19.0.11", "198.18.1.2")...)
	objs = append(objs, simple("shop", "c", "198.19.0.12", "198.18.1.3")...)
	objs = append(objs, service("shop", "sctp", []string{"198.19.0.13"}, svcPort("", corev1.ProtocolSCTP, 80, 80)))
	e := newEnv(t, objs...)
	e.setServer(testserver.Start(t, testserver.WithDataplane(noSCTP()), testserver.WithLimits(validation.Limits{MaxServices: 2})))
	a := e.start(kubeadapter.WithFullSyncPeriod(0))
	waitMetric(t, a.reg, 1, "vipd_k8s_syncs_total", "kind", "full", "result", "ok")
	// Refused naming shop/sctp, then shop/c (it does not fit after a and b),
	// then through.
	if n, u := e.calls.get("SyncServices"), e.calls.get("UpsertService"); n != 3 || u != 0 {
		t.Errorf("SyncServices calls %d, UpsertService calls %d; want 3 and 0", n, u)
	}
	e.waitState(map[string]string{
		"shop/a": simpleSummary("198.19.0.10", "198.18.1.1"),
		"shop/b": simpleSummary("198.19.0.11", "198.18.1.2"),
	})
	waitMetric(t, a.reg, 1, "vipd_k8s_services_left_out", "reason", kubeadapter.ReasonUnsupported)
	waitMetric(t, a.reg, 1, "vipd_k8s_services_left_out", "reason", kubeadapter.ReasonOverLimit)
}

// TestRefusedChangeKeepsTheOldVersion: a change to a programmed Service
// that vipd refuses (invalid, not forwarded by the dataplane, a VIP:port
// another owner holds) ends the same whichever path meets it: the
// per-service pass (an UpsertService refused) and the full sync (the
// Service refused within the SyncServices) both leave vipd with the
// version it had, and report the Service left out with the same reason.
func TestRefusedChangeKeepsTheOldVersion(t *testing.T) {
	v1 := simple("shop", "web", "198.19.0.10", "198.18.1.1")
	tests := []struct {
		name   string
		dp     func() *fake.Dataplane
		change *corev1.Service
		reason string
	}{
		{"invalid", nil, service("shop", "web", []string{"127.0.0.10"}, svcPort("", corev1.ProtocolTCP, 80, 8080)), kubeadapter.ReasonInvalid},
		{"unsupported", noSCTP, service("shop", "web", []string{"198.19.0.10"}, svcPort("", corev1.ProtocolSCTP, 80, 8080)), kubeadapter.ReasonUnsupported},
		{"another owner's VIP:port", nil, service("shop", "web", []string{"198.19.0.20"}, svcPort("", corev1.ProtocolTCP, 80, 8080)), kubeadapter.ReasonConflict},
		{"conflicts with another kubernetes Service", nil, service("shop", "web", []string{"198.19.0.11"}, svcPort("", corev1.ProtocolTCP, 80, 8080)), kubeadapter.ReasonConflict},
	}
	old := map[string]string{
		"shop/web": simpleSummary("198.19.0.10", "198.18.1.1"),
		"shop/api": simpleSummary("198.19.0.11", "198.18.1.2"),
	}
	for _, tt := range tests {
		// setup returns an env whose vipd has v1 of shop/web, shop/api and
		// another owner's service on 198.19.0.20.
		setup := func(t *testing.T) *env {
			e := newEnv(t, append(v1, simple("shop", "api", "198.19.0.11", "198.18.1.2")...)...)
			var opts []testserver.Option
			if tt.dp != nil {
				opts = append(opts, testserver.WithDataplane(tt.dp()))
			}
			e.setServer(testserver.Start(t, opts...))
			if _, err := e.vipd.UpsertService(context.Background(), nomadService("nomad/db", "198.19.0.20"), 0); err != nil {
				t.Fatal(err)
			}
			return e
		}
		t.Run(tt.name+"/per-service", func(t *testing.T) {
			e := setup(t)
			a := e.start(kubeadapter.WithFullSyncPeriod(0))
			e.settle()
			e.waitState(old)
			e.updateService(tt.change)
			e.settle()
			if err := diffState(old, e.state()); err != nil {
				t.Fatal(err)
			}
			waitMetric(t, a.reg, 1, "vipd_k8s_services_left_out", "reason", tt.reason)
		})
		t.Run(tt.name+"/full-sync", func(t *testing.T) {
			e := setup(t)
			first := e.start(kubeadapter.WithFullSyncPeriod(0))
			e.settle()
			e.waitState(old)
			first.stop()
			// The change is made while no adapter runs: the next one's
			// full sync meets it.
			e.updateService(tt.change)
			a := e.start(kubeadapter.WithFullSyncPeriod(0))
			waitMetric(t, a.reg, 1, "vipd_k8s_syncs_total", "kind", "full", "result", "ok")
			e.settle()
			if err := diffState(old, e.state()); err != nil {
				t.Fatal(err)
			}
			waitMetric(t, a.reg, 1, "vipd_k8s_services_left_out", "reason", tt.reason)
			// Made acceptable, the change goes in.
			e.updateService(service("shop", "web", []string{"198.19.0.30"}, svcPort("", corev1.ProtocolTCP, 80, 8080)))
			e.settle()
			want := map[string]string{"shop/web": simpleSummary("198.19.0.30", "198.18.1.1"), "shop/api": old["shop/api"]}
			if err := diffState(want, e.state()); err != nil {
				t.Fatal(err)
			}
			waitMetric(t, a.reg, 0, "vipd_k8s_services_left_out", "reason", tt.reason)
		})
	}
}

// TestFullSyncNodePortConflictKeepsClusterIP: two Services on one node
// port in the first full sync: vipd names the second's node port, and the
// adapter sends it again without its external part in one more call (no
// relisting, no call per service); it keeps its cluster IP.
func TestFullSyncNodePortConflictKeepsClusterIP(t *testing.T) {
	e := newEnv(t, nodePortService("shop", "a", "198.19.0.10", 30080), nodePortService("shop", "b", "198.19.0.11", 30080))
	a := e.start(kubeadapter.WithFullSyncPeriod(0))
	waitMetric(t, a.reg, 1, "vipd_k8s_syncs_total", "kind", "full", "result", "ok")
	if n, l, u := e.calls.get("SyncServices"), e.calls.get("ListServices"), e.calls.get("UpsertService"); n != 2 || l != 2 || u != 0 {
		t.Errorf("SyncServices %d, ListServices %d, UpsertService %d calls; want 2, 2 (before and after) and 0", n, l, u)
	}
	e.waitState(map[string]string{
		"shop/a": "vips=198.19.0.10 ports=/TCP:80 backends=[]",
		"shop/b": "vips=198.19.0.11 ports=/TCP:80 backends=[]",
	})
	e.waitExternal(map[string]string{"shop/a": "nodeport=30080/TCP", "shop/b": ""})
	waitMetric(t, a.reg, 1, "vipd_k8s_services_external_left_out", "reason", kubeadapter.ReasonConflict)
	waitMetric(t, a.reg, 0, "vipd_k8s_services_left_out", "reason", kubeadapter.ReasonConflict)
}
