package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// waitZone waits until vipd reports zone from source.
func (e *env) waitZone(zone, source string) {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := e.node.API.Status(e.ctx)
		if err == nil && st.GetZone() == zone && st.GetZoneSource() == source {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("vipd's zone: want %q (%s), have %q (%s), error %v\n%s", zone, source, st.GetZone(), st.GetZoneSource(), err, e.node.Adapter.Tail(20))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// labelNode sets (or, with zone "", removes) node's zone label.
func (e *env) labelNode(node, zone string) {
	e.t.Helper()
	value := "null"
	if zone != "" {
		value = `"` + zone + `"`
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, corev1.LabelTopologyZone, value)
	if _, err := e.c.Admin.CoreV1().Nodes().Patch(e.ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		e.t.Fatalf("label node %s: %v", node, err)
	}
}

// eligible is the IPs Explain says a new connection from a pod of this
// node to vip:port may get.
func (e *env) eligible(vip string, port uint32) ([]string, error) {
	resp, err := e.node.API.Explain(e.ctx, &vipdv1.ExplainRequest{ClientIp: "198.18.250.1", Vip: vip, Port: port})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, b := range resp.GetBackends() {
		if b.GetEligible() {
			out = append(out, b.GetIp())
		}
	}
	slices.Sort(out)
	return out, nil
}

// waitEligible waits until Explain's eligible backends are want.
func (e *env) waitEligible(what, vip string, port uint32, want ...string) {
	e.t.Helper()
	slices.Sort(want)
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := e.eligible(vip, port)
		if err == nil && slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: eligible backends %v (error %v), want %v", what, got, err, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// preferCloseService creates Service shop/zoned with trafficDistribution
// PreferClose and one pod on each node (zone-a's and zone-b's), waits
// until vipd has both pods, and returns the cluster IP and the two pods'
// addresses.
func (e *env) preferCloseService() (vip, here, there string) {
	e.t.Helper()
	svc := service("zoned", 80)
	preferClose := corev1.ServiceTrafficDistributionPreferClose
	svc.Spec.TrafficDistribution = &preferClose
	created := e.createService(svc)
	a := e.createPods(1, podSpec{app: "zoned", version: "v1", node: thisNode, ports: map[string]int32{"http": 8080}})
	b := e.createPods(1, podSpec{app: "zoned", version: "v1", node: otherNode, ports: map[string]int32{"http": 8080}})
	here, there = e.podIP(a[0]), e.podIP(b[0])
	e.waitVIPD("both pods", wantBackends("zoned", here+" READY http=8080 local", there+" READY http=8080"))
	return created.Spec.ClusterIP, here, there
}

// TestZoneFromNodeLabel: vipd-k8s (--zone-from-node, the default) gives
// vipd the zone of its Node's topology.kubernetes.io/zone label, and
// follows it. A trafficDistribution: PreferClose Service, whose slices the
// real EndpointSlice controller fills with forZones hints from the pods'
// nodes, then sends this node's new connections to the backends of the
// label's zone: zone-a's pod, then zone-b's after a relabel, and every pod
// once the label is gone (no zone: hints never match).
func TestZoneFromNodeLabel(t *testing.T) {
	e := newEnv(t)
	e.waitZone("zone-a", "api")

	vip, a, b := e.preferCloseService()
	// The controller's hints, as vipd got them.
	e.waitVIPD("the controller's zone hints", func(svcs map[string]*vipdv1.Service) error {
		s := svcs[ns+"/zoned"]
		if s.GetTrafficDistribution() != vipdv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_PREFER_SAME_ZONE {
			return fmt.Errorf("traffic distribution %v", s.GetTrafficDistribution())
		}
		var hints []string
		for _, be := range s.GetBackends() {
			hints = append(hints, be.GetIp()+"→"+strings.Join(be.GetForZones(), ","))
		}
		slices.Sort(hints)
		want := []string{a + "→zone-a", b + "→zone-b"}
		slices.Sort(want)
		if !slices.Equal(hints, want) {
			return fmt.Errorf("hints %v, want %v", hints, want)
		}
		return nil
	})
	e.waitEligible("zone-a", vip, 80, a)

	start := time.Now()
	e.labelNode(thisNode, "zone-b")
	e.waitZone("zone-b", "api")
	e.waitEligible("relabelled to zone-b", vip, 80, b)
	t.Logf("relabel → vipd selects by the new zone: %v", time.Since(start).Round(time.Millisecond))

	e.labelNode(thisNode, "")
	e.waitZone("", "api")
	e.waitEligible("no zone label", vip, 80, a, b)

	// A restart of vipd without its state: the full sync that follows
	// sets the zone again before the services.
	e.labelNode(thisNode, "zone-a")
	e.waitZone("zone-a", "api")
	if err := e.node.RestartVIPD(e.ctx, true); err != nil {
		t.Fatal(err)
	}
	e.waitZone("zone-a", "api")
	e.waitEligible("after vipd restarted without state", vip, 80, a)
}

// TestZoneFromNodeOff: with --zone-from-node=false, vipd keeps the zone
// of its --zone flag (none here) whatever the label says, and the
// PreferClose Service keeps every pod.
func TestZoneFromNodeOff(t *testing.T) {
	e := newEnv(t, "--zone-from-node=false")
	vip, a, b := e.preferCloseService()
	e.waitEligible("no zone", vip, 80, a, b)
	st, err := e.node.API.Status(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.GetZone() != "" || st.GetZoneSource() != "" {
		t.Fatalf("vipd's zone %q (%s) with --zone-from-node=false and no --zone", st.GetZone(), st.GetZoneSource())
	}
}
