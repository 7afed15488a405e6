package e2e

import (
	"fmt"
	"testing"
	"time"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// triggerAnnotation is the EndpointSlice controller's annotation that
// vipd-k8s measures programming latency from.
const triggerAnnotation = "endpoints.kubernetes.io/last-change-trigger-time"

// TestDeploymentLifecycle creates, scales, rolls and deletes a
// Deployment-shaped pod set behind a Service with a named targetPort; the
// real EndpointSlice controller makes the slices and vipd converges after
// each step: backends on this node are node-local, a rolled-out pod is
// TERMINATING until the kubelet would have removed it, and the adapter's
// programming-latency metric counts passes timed from the controller's
// trigger-time annotation.
func TestDeploymentLifecycle(t *testing.T) {
	e := newEnv(t)
	e.createService(service("web", 80))
	ports := map[string]int32{"http": 8080}
	// The controller's trigger time is a pod's Ready transition (or
	// deletion) time, which the API keeps to the second: a step in the same
	// second as the previous one, or as the adapter's start, carries no new
	// trigger time. Real rollouts are slower than this test; space the
	// steps so each is measured.
	step := func() { time.Sleep(1100 * time.Millisecond) }
	step()

	v1 := append(e.createPods(2, podSpec{app: "web", version: "v1", node: thisNode, ports: ports}),
		e.createPods(1, podSpec{app: "web", version: "v1", node: otherNode, ports: ports})...)
	wantV1 := []string{
		e.podIP(v1[0]) + " READY http=8080 local",
		e.podIP(v1[1]) + " READY http=8080 local",
		e.podIP(v1[2]) + " READY http=8080",
	}
	e.waitVIPD("the three v1 pods", wantBackends("web", wantV1...))
	for _, s := range e.slices("web") {
		if s.Annotations[triggerAnnotation] == "" {
			t.Errorf("EndpointSlice %s has no %s annotation: %v", s.Name, triggerAnnotation, s.Annotations)
		}
	}

	step()
	// Scale up to five.
	more := e.createPods(2, podSpec{app: "web", version: "v1", node: otherNode, ports: ports})
	v1 = append(v1, more...)
	wantV1 = append(wantV1, e.podIP(more[0])+" READY http=8080", e.podIP(more[1])+" READY http=8080")
	e.waitVIPD("five v1 pods after scaling up", wantBackends("web", wantV1...))

	step()
	// Roll: v2 comes up on port 9090 (the named port moves), v1 terminates.
	v2 := e.createPods(2, podSpec{app: "web", version: "v2", node: thisNode, ports: map[string]int32{"http": 9090}})
	e.terminate(v1)
	rolling := []string{e.podIP(v2[0]) + " READY http=9090 local", e.podIP(v2[1]) + " READY http=9090 local"}
	for i, n := range v1 {
		local := ""
		if i < 2 {
			local = " local"
		}
		rolling = append(rolling, e.podIP(n)+" TERMINATING http=8080"+local)
	}
	e.waitVIPD("v2 ready and v1 terminating", wantBackends("web", rolling...))
	step()
	e.remove(v1)
	e.waitVIPD("only v2 after the roll", wantBackends("web", rolling[:2]...))

	step()
	// Scale to zero: the Service stays, without backends.
	e.remove(v2)
	e.waitVIPD("no backends after scaling to zero", wantBackends("web"))

	m, err := e.node.AdapterMetrics()
	if err != nil {
		t.Fatal(err)
	}
	// Three steps made pods Ready (create, scale up, roll); a pod that is
	// deleted leaves no trigger time of its own, so removals are not timed,
	// for vipd-k8s as for kube-proxy.
	n := m.Sum("vipd_k8s_network_programming_duration_seconds_count")
	if n > 0 {
		t.Logf("programming latency from the trigger-time annotation: %v passes, mean %.3f s (the annotation is kept to the second)",
			n, m.Sum("vipd_k8s_network_programming_duration_seconds_sum")/n)
	}
	if n < 3 {
		t.Errorf("vipd_k8s_network_programming_duration_seconds_count = %v after 3 steps that made pods Ready; want at least 3 (timed from %s)", n, triggerAnnotation)
	}

	// Delete the Service: vipd drops it.
	if err := e.c.Admin.CoreV1().Services(ns).Delete(e.ctx, "web", deleteNow()); err != nil {
		t.Fatal(err)
	}
	e.waitVIPD("shop/web gone", func(svcs map[string]*vipdv1.Service) error {
		if _, ok := svcs[ns+"/web"]; ok {
			return fmt.Errorf("shop/web still in vipd")
		}
		return nil
	})
}
