package reconcile_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vipd/vipd/dataplane/fake"
	"github.com/vipd/vipd/server/reconcile"
)

// TestSetZone: a new zone re-selects the backends of the services with a
// traffic distribution or hints, in one partial apply that names only
// those (the selection may change under either zone), without a new
// generation; an equal zone applies nothing; later changes and Status
// carry the new zone; an empty zone means no zone.
func TestSetZone(t *testing.T) {
	const a1, b1 = "198.18.1.1", "198.18.2.1"
	hinted := topoService(0, withHints(be(a1, "a"), []string{"a"}, nil), withHints(be(b1, "b"), []string{"b"}, nil))
	hinted.Name, hinted.Vips = "hinted", []string{"198.19.0.3"}
	h := run(t, fake.New(), snapshotOf(t,
		putService(topoService(sameZone, be(a1, "a"), be(b1, "b"))),
		putService(hinted),
		put("plain", "198.19.0.2", "198.18.3.1")),
		reconcile.WithTopology(nodeA))
	want := func(step, svc string, ips ...string) {
		t.Helper()
		if diff := cmp.Diff(ips, readyBackends(t, h.dp, svc)); diff != "" {
			t.Errorf("%s: READY backends of %s (-want +got):\n%s", step, svc, diff)
		}
	}
	want("zone a", "web", a1)
	want("zone a", "hinted", a1)
	gen := h.rec.Snapshot().Revision()

	if err := h.rec.SetZone(ctx10(t), "b"); err != nil {
		t.Fatal(err)
	}
	want("zone b", "web", b1)
	want("zone b", "hinted", b1)
	want("zone b", "plain", "198.18.3.1")
	last := lastRecord(t, h.dp)
	changed := slices.Sorted(slices.Values(last.State.Changed))
	if !slices.Equal(changed, []string{"hinted", "web"}) {
		t.Errorf("zone apply changed=%v, want [hinted web]: only the services topology selects for", last.State.Changed)
	}
	if last.State.Generation != gen || h.rec.Snapshot().Revision() != gen {
		t.Error("a zone change used up a generation")
	}
	if got := h.rec.Status().Topology; got != (reconcile.Topology{NodeName: "node-1", Zone: "b"}) {
		t.Errorf("Status().Topology = %+v after SetZone(b)", got)
	}

	n := len(h.dp.Records())
	if err := h.rec.SetZone(ctx10(t), "b"); err != nil {
		t.Fatal(err)
	}
	if len(h.dp.Records()) != n {
		t.Error("an equal zone was applied again")
	}

	// A later change of the zoned service selects by the new zone.
	if err := h.do(t, putService(topoService(sameZone, be(a1, "a"), be(b1, "b"), be("198.18.2.2", "b")))); err != nil {
		t.Fatal(err)
	}
	want("change under zone b", "web", b1, "198.18.2.2")

	// No zone: no zone preference, and zone hints never match.
	if err := h.rec.SetZone(ctx10(t), ""); err != nil {
		t.Fatal(err)
	}
	want("no zone", "web", a1, b1, "198.18.2.2")
	want("no zone", "hinted", a1, b1)
	if got := h.rec.TopologyLeftOut("web"); got != nil {
		t.Errorf("TopologyLeftOut(web) = %v without a zone, want none", got)
	}
	checkSyncsMatchApplies(t, h)
}

// TestSetZoneAllOrNothing: a zone whose apply fails is an error and
// leaves the previous zone in force, in the dataplane, for later applies
// and in Status; submitting it again is the retry.
func TestSetZoneAllOrNothing(t *testing.T) {
	const a1, b1 = "198.18.1.1", "198.18.2.1"
	h := run(t, fake.New(), snapshotOf(t, putService(topoService(sameZone, be(a1, "a"), be(b1, "b"))),
		put("plain", "198.19.0.2", "198.18.3.1")), reconcile.WithTopology(nodeA))
	h.dp.FailNext(errors.New("injected"))
	if err := h.rec.SetZone(ctx10(t), "b"); err == nil {
		t.Fatal("SetZone succeeded over a failing apply")
	}
	if got := readyBackends(t, h.dp, "web"); !slices.Equal(got, []string{a1}) {
		t.Fatalf("READY backends %v after a refused SetZone, want [%s]", got, a1)
	}
	if got := h.rec.Status().Topology.Zone; got != "a" {
		t.Fatalf("Status zone %q after a refused SetZone, want a", got)
	}
	if err := h.do(t, put("plain", "198.19.0.2", "198.18.3.2")); err != nil {
		t.Fatal(err)
	}
	if got := readyBackends(t, h.dp, "web"); !slices.Equal(got, []string{a1}) {
		t.Fatalf("READY backends %v after a later change: the refused zone was kept", got)
	}
	if err := h.rec.SetZone(ctx10(t), "b"); err != nil {
		t.Fatal(err)
	}
	if got := readyBackends(t, h.dp, "web"); !slices.Equal(got, []string{b1}) {
		t.Fatalf("READY backends %v after the retry, want [%s]", got, b1)
	}
}

// TestSetZoneWhileHeld: a zone set while the reconciler holds reaches
// the dataplane with the releasing sync, not before.
func TestSetZoneWhileHeld(t *testing.T) {
	dp := fake.New()
	rec := runHeld(t, dp, &persister{}, reconcile.WithTopology(nodeA))
	if err := rec.SetZone(ctx10(t), "b"); err != nil {
		t.Fatalf("SetZone while held: %v", err)
	}
	if len(dp.Records()) != 0 {
		t.Fatal("SetZone reached the dataplane while held")
	}
	svc := topoService(sameZone, be("198.18.1.1", "a"), be("198.18.2.1", "b"))
	if _, err := rec.Release(ctx10(t), putService(svc)); err != nil {
		t.Fatal(err)
	}
	if got := readyBackends(t, dp, "web"); !slices.Equal(got, []string{"198.18.2.1"}) {
		t.Fatalf("releasing sync READY backends %v, want the zone-b one", got)
	}
}
