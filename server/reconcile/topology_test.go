package reconcile_test

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/fake"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/reconcile"
	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
)

const (
	sameZone = vipdv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_PREFER_SAME_ZONE
	sameNode = vipdv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_PREFER_SAME_NODE
)

// putService upserts svc as the API would admit it.
func putService(svc *vipdv1.Service) reconcile.Mutation {
	return func(tx *store.Txn) (any, error) {
		out, dp, v := validation.Service(svc, validation.Limits{}, "service")
		if v != nil {
			return nil, v
		}
		return tx.Put(out, dp)
	}
}

// topoService is service "web" with one backend per spec: ip, zone.
func topoService(dist vipdv1.TrafficDistribution, backends ...*vipdv1.Backend) *vipdv1.Service {
	return &vipdv1.Service{Name: "web", Vips: []string{"198.19.0.1"}, Ports: []*vipdv1.Port{{Port: 80}},
		TrafficDistribution: dist, Backends: backends}
}

func be(ip, zone string) *vipdv1.Backend { return &vipdv1.Backend{Ip: ip, Zone: zone} }

func withHints(b *vipdv1.Backend, zones, nodes []string) *vipdv1.Backend {
	b.ForZones, b.ForNodes = zones, nodes
	return b
}

func local(b *vipdv1.Backend) *vipdv1.Backend {
	b.NodeLocal = true
	return b
}

func state(b *vipdv1.Backend, s vipdv1.BackendState) *vipdv1.Backend {
	b.State = s
	return b
}

// readyBackends is the addresses of the applied service's READY backends:
// those that get new connections.
func readyBackends(t *testing.T, dp *fake.Dataplane, name string) []string {
	t.Helper()
	applied, _ := dp.Applied()
	svc, ok := applied[name]
	if !ok {
		t.Fatalf("service %s not applied", name)
	}
	var out []string
	for _, b := range svc.Backends {
		if b.State == dataplane.BackendReady {
			out = append(out, b.IP.String())
		}
	}
	return out
}

var nodeA = reconcile.Topology{NodeName: "node-1", Zone: "a"}

// TestTopologySelection: each rule of vipd.v1.Service.traffic_distribution
// hands the dataplane the backends it selects as the only READY ones.
func TestTopologySelection(t *testing.T) {
	const (
		a1, a2, b1, b2 = "198.18.1.1", "198.18.1.2", "198.18.2.1", "198.18.2.2"
	)
	tests := []struct {
		name string
		node reconcile.Topology
		svc  *vipdv1.Service
		want []string
	}{
		{"no distribution, no hints: all", nodeA,
			topoService(0, be(a1, "a"), be(b1, "b")), []string{a1, b1}},
		{"prefer same zone: the node's zone", nodeA,
			topoService(sameZone, be(a1, "a"), be(a2, "a"), be(b1, "b")), []string{a1, a2}},
		{"prefer same zone, no backend in the zone: all", reconcile.Topology{NodeName: "node-1", Zone: "c"},
			topoService(sameZone, be(a1, "a"), be(b1, "b")), []string{a1, b1}},
		{"prefer same zone, node without a zone: all", reconcile.Topology{NodeName: "node-1"},
			topoService(sameZone, be(a1, "a"), be(b1, "b")), []string{a1, b1}},
		{"prefer same zone, the zone's backend not ready: all", nodeA,
			topoService(sameZone, state(be(a1, "a"), vipdv1.BackendState_BACKEND_STATE_TERMINATING), be(b1, "b"), be(b2, "b")), []string{b1, b2}},
		{"prefer same node: node_local", nodeA,
			topoService(sameNode, be(a1, "a"), local(be(a2, "a")), be(b1, "b")), []string{a2}},
		{"prefer same node without node_local: same zone", nodeA,
			topoService(sameNode, be(a1, "a"), be(b1, "b")), []string{a1}},
		{"prefer same node without node_local or zone match: all", reconcile.Topology{Zone: "c"},
			topoService(sameNode, be(a1, "a"), be(b1, "b")), []string{a1, b1}},
		{"zone hints on every backend: those for the zone", nodeA,
			topoService(sameZone, withHints(be(a1, "a"), []string{"a"}, nil), withHints(be(b1, "b"), []string{"b"}, nil),
				withHints(be(b2, "b"), []string{"a", "b"}, nil)), []string{a1, b2}},
		{"zone hints apply without a distribution", nodeA,
			topoService(0, withHints(be(a1, "a"), []string{"a"}, nil), withHints(be(b1, "b"), []string{"b"}, nil)), []string{a1}},
		{"zone hints, one backend without: all", nodeA,
			topoService(sameZone, withHints(be(a1, "a"), []string{"a"}, nil), be(b1, "b")), []string{a1, b1}},
		{"zone hints, none for the zone: all", reconcile.Topology{NodeName: "node-1", Zone: "c"},
			topoService(sameZone, withHints(be(a1, "a"), []string{"a"}, nil), withHints(be(b1, "b"), []string{"b"}, nil)), []string{a1, b1}},
		{"zone hints, node without a zone: all", reconcile.Topology{NodeName: "node-1"},
			topoService(sameZone, withHints(be(a1, "a"), []string{"a"}, nil), withHints(be(b1, "b"), []string{"b"}, nil)), []string{a1, b1}},
		{"zone hints: a NOT_SERVING backend without hints does not count", nodeA,
			topoService(sameZone, withHints(be(a1, "a"), []string{"a"}, nil), withHints(be(b1, "b"), []string{"b"}, nil),
				state(be(b2, "b"), vipdv1.BackendState_BACKEND_STATE_NOT_SERVING)), []string{a1}},
		{"zone hints win over the zone field", nodeA,
			topoService(sameZone, withHints(be(a1, "a"), []string{"b"}, nil), withHints(be(b1, "b"), []string{"a"}, nil)), []string{b1}},
		{"node hints on every backend: the one for this node", nodeA,
			topoService(sameNode, withHints(be(a1, "a"), []string{"a"}, []string{"node-2"}), withHints(be(a2, "a"), []string{"a"}, []string{"node-1"}),
				withHints(be(b1, "b"), []string{"b"}, []string{"node-3"})), []string{a2}},
		{"node hints, none for this node: zone hints", nodeA,
			topoService(sameNode, withHints(be(a1, "a"), []string{"a"}, []string{"node-2"}), withHints(be(b1, "b"), []string{"b"}, []string{"node-3"})), []string{a1}},
		{"node hints, one backend without: zone hints", nodeA,
			topoService(sameNode, withHints(be(a1, "a"), []string{"a"}, []string{"node-2"}), withHints(be(a2, "a"), []string{"a"}, nil),
				withHints(be(b1, "b"), []string{"b"}, []string{"node-1"})), []string{a1, a2}},
		{"node hints, node without a name: all", reconcile.Topology{},
			topoService(sameNode, withHints(be(a1, "a"), nil, []string{"node-1"}), withHints(be(b1, "b"), nil, []string{"node-2"})), []string{a1, b1}},
		{"internal Local policy keeps node_local backends", nodeA, func() *vipdv1.Service {
			s := topoService(sameZone, be(a1, "a"), local(be(b1, "b")), be(b2, "b"))
			s.InternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
			return s
		}(), []string{a1, b1}},
		{"no topology option: hints and zones never match", reconcile.Topology{},
			topoService(sameZone, withHints(be(a1, "a"), []string{"a"}, nil), withHints(be(b1, "b"), []string{"b"}, nil)), []string{a1, b1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := run(t, fake.New(), snapshotOf(t, putService(tt.svc)), reconcile.WithTopology(tt.node))
			if diff := cmp.Diff(tt.want, readyBackends(t, h.dp, "web")); diff != "" {
				t.Errorf("READY backends (-want +got):\n%s", diff)
			}
		})
	}
}

// TestTopologyFollowsChanges: the selection follows API changes (partial
// applies), health checks (a zone whose last usable backend fails falls
// back to all) and full syncs, leaves other services alone, and a failed
// apply leaves the previous selection in force.
func TestTopologyFollowsChanges(t *testing.T) {
	const a1, b1, b2 = "198.18.1.1", "198.18.2.1", "198.18.2.2"
	zoned := topoService(sameZone, be(a1, "a"), be(b1, "b"), be(b2, "b"))
	h := run(t, fake.New(), snapshotOf(t, putService(zoned), put("other", "198.19.0.2", "198.18.3.1", "198.18.3.2")),
		reconcile.WithTopology(nodeA))
	want := func(step string, svc string, ips ...string) {
		t.Helper()
		if diff := cmp.Diff(ips, readyBackends(t, h.dp, svc)); diff != "" {
			t.Errorf("%s: READY backends of %s (-want +got):\n%s", step, svc, diff)
		}
	}
	want("initial", "web", a1)
	want("initial", "other", "198.18.3.1", "198.18.3.2")
	if got := h.rec.TopologyLeftOut("web"); !slices.Equal(got, []netip.Addr{netip.MustParseAddr(b1), netip.MustParseAddr(b2)}) {
		t.Errorf("TopologyLeftOut(web) = %v, want [%s %s]", got, b1, b2)
	}

	// Another service's change keeps web's selection.
	if err := h.do(t, put("other", "198.19.0.2", "198.18.3.1")); err != nil {
		t.Fatal(err)
	}
	want("other changed", "web", a1)

	// The last zone-a backend fails its health checks: all usable ones.
	if err := setHealth(t, h, reconcile.HealthChange{Service: "web", Backend: netip.MustParseAddr(a1), Failing: true}); err != nil {
		t.Fatal(err)
	}
	want("a1 failing", "web", b1, b2)
	if got := h.rec.TopologyLeftOut("web"); got != nil {
		t.Errorf("TopologyLeftOut(web) = %v with a1 failing, want none", got)
	}
	if err := setHealth(t, h, reconcile.HealthChange{Service: "web", Backend: netip.MustParseAddr(a1), Failing: false}); err != nil {
		t.Fatal(err)
	}
	want("a1 passing", "web", a1)

	// A failed apply of a change that would widen the selection keeps the
	// old one, and the next change starts from it.
	h.dp.FailNext(errors.New("injected"))
	if err := h.do(t, putService(topoService(0, be(a1, "a"), be(b1, "b"), be(b2, "b")))); err == nil {
		t.Fatal("apply did not fail")
	}
	want("failed apply", "web", a1)
	if err := h.do(t, put("other", "198.19.0.2", "198.18.3.2")); err != nil {
		t.Fatal(err)
	}
	want("after the failed apply", "web", a1)

	// The distribution removed: all.
	if err := h.do(t, putService(topoService(0, be(a1, "a"), be(b1, "b"), be(b2, "b")))); err != nil {
		t.Fatal(err)
	}
	want("no distribution", "web", a1, b1, b2)
	// Zone hints on every backend, then one removed: all.
	hinted := func(last []string) *vipdv1.Service {
		return topoService(0, withHints(be(a1, "a"), []string{"a"}, nil), withHints(be(b1, "b"), []string{"b"}, nil),
			withHints(be(b2, "b"), last, nil))
	}
	if err := h.do(t, putService(hinted([]string{"a"}))); err != nil {
		t.Fatal(err)
	}
	want("hints", "web", a1, b2)
	if err := h.do(t, putService(hinted(nil))); err != nil {
		t.Fatal(err)
	}
	want("one hint missing", "web", a1, b1, b2)
	// A deleted service leaves nothing behind.
	if err := h.do(t, func(tx *store.Txn) (any, error) { tx.Delete("web"); return nil, nil }); err != nil {
		t.Fatal(err)
	}
	if got := h.rec.TopologyLeftOut("web"); got != nil {
		t.Errorf("TopologyLeftOut(web) = %v after delete", got)
	}
}
