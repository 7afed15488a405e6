package kubeadapter_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/kubeadapter"
	"github.com/vipd/vipd/internal/testkit/testserver"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func node(name string, labels map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

func zoneLabel(zone string) map[string]string {
	return map[string]string{corev1.LabelTopologyZone: zone}
}

// waitZone waits until vipd's zone is zone, from source.
func (e *env) waitZone(zone, source string) {
	e.t.Helper()
	eventually(e.t, fmt.Sprintf("vipd's zone %q (%s)", zone, source), func() error {
		st, err := e.vipd.Status(context.Background())
		if err != nil {
			return err
		}
		if st.GetZone() != zone || st.GetZoneSource() != source {
			return fmt.Errorf("zone %q (%s)", st.GetZone(), st.GetZoneSource())
		}
		return nil
	})
}

func (e *env) updateNode(n *corev1.Node) {
	e.t.Helper()
	if _, err := e.kube.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// TestZoneFromNode: with WithZoneFromNode the adapter gives vipd the zone
// label of its own Node, and only its own: at start, at every change of
// the label, none when the label is removed, and again after vipd
// restarts without it. Another node's label changes nothing.
func TestZoneFromNode(t *testing.T) {
	objs, want := twoServices()
	objs = append(objs, node("node-a", zoneLabel("zone-a")), node("node-b", zoneLabel("zone-b")))
	e := newEnv(t, objs...)
	a := e.start(kubeadapter.WithZoneFromNode())
	e.waitState(want)
	e.waitZone("zone-a", "api")

	e.updateNode(node("node-a", zoneLabel("zone-c")))
	e.waitZone("zone-c", "api")
	e.updateNode(node("node-b", zoneLabel("zone-x")))
	e.updateNode(node("node-a", map[string]string{"other": "label"}))
	e.waitZone("", "api")
	e.updateNode(node("node-a", zoneLabel("zone-d")))
	e.waitZone("zone-d", "api")

	// vipd restarts without its state, and so without the zone: the full
	// sync that follows sets it again.
	if err := e.srv.Close(); err != nil {
		t.Fatal(err)
	}
	e.setServer(testserver.Start(t))
	e.instanceOf(e.srv)
	e.waitState(want)
	e.waitZone("zone-d", "api")
	if n, _ := metric(t, a.reg, "vipd_k8s_zone_updates_total", "result", "ok"); n < 5 {
		t.Errorf("vipd_k8s_zone_updates_total{result=ok} = %v, want at least 5", n)
	}
}

// TestZoneFromNodeOff: without WithZoneFromNode, vipd keeps the zone of
// its --zone flag whatever the node's label says.
func TestZoneFromNodeOff(t *testing.T) {
	objs, want := twoServices()
	objs = append(objs, node("node-a", zoneLabel("zone-a")))
	e := newEnv(t, objs...)
	e.setServer(testserver.Start(t, testserver.WithTopology("node-a", "flag-zone")))
	e.start()
	e.waitState(want)
	e.waitZone("flag-zone", "flag")
	if n := e.calls.get("SetNodeTopology"); n != 0 {
		t.Errorf("SetNodeTopology called %d times without WithZoneFromNode", n)
	}
}

// TestZoneFromNodeMissingNode: while the Node object is not found, vipd
// keeps its --zone; once it appears, its label wins.
func TestZoneFromNodeMissingNode(t *testing.T) {
	objs, want := twoServices()
	e := newEnv(t, objs...)
	e.setServer(testserver.Start(t, testserver.WithTopology("node-a", "flag-zone")))
	e.start(kubeadapter.WithZoneFromNode())
	e.waitState(want)
	e.waitZone("flag-zone", "flag")
	if _, err := e.kube.CoreV1().Nodes().Create(context.Background(), node("node-a", zoneLabel("zone-b")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitZone("zone-b", "api")
}

// refusesZone makes SetNodeTopology fail while refuse is set.
type refusesZone struct {
	*client.Client
	refuse chan struct{} // closed: accept
}

func (r *refusesZone) SetNodeTopology(ctx context.Context, zone string) (string, error) {
	select {
	case <-r.refuse:
		return r.Client.SetNodeTopology(ctx, zone)
	default:
		return "", status.Error(codes.PermissionDenied, "not allowed")
	}
}

// TestZoneFromNodeRefused: a refused zone does not hold up the services,
// is counted as an error, and is retried until vipd takes it.
func TestZoneFromNodeRefused(t *testing.T) {
	objs, want := twoServices()
	objs = append(objs, node("node-a", zoneLabel("zone-a")))
	e := newEnv(t, objs...)
	r := &refusesZone{refuse: make(chan struct{})}
	e.wrap = func(c *client.Client) kubeadapter.VIPD { r.Client = c; return r }
	a := e.start(kubeadapter.WithZoneFromNode())
	e.waitState(want)
	eventually(t, "a refused zone counted", func() error {
		if n, _ := metric(t, a.reg, "vipd_k8s_zone_updates_total", "result", "error"); n < 2 {
			return fmt.Errorf("vipd_k8s_zone_updates_total{result=error} = %v, want retries", n)
		}
		return nil
	})
	close(r.refuse)
	e.waitZone("zone-a", "api")
}

// TestZoneFromNodeNeedsNodeName: the zone comes from the node's own
// object, so the option needs its name.
func TestZoneFromNodeNeedsNodeName(t *testing.T) {
	e := newEnv(t)
	_, err := kubeadapter.New(testLogger(t), e.kube, e.vipd, nil, kubeadapter.WithZoneFromNode())
	if err == nil {
		t.Fatal("New without a node name accepted WithZoneFromNode")
	}
}
