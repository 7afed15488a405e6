package reconcile_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/fake"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/reconcile"
	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
)

func setHealth(t *testing.T, h *harness, changes ...reconcile.HealthChange) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return h.rec.SetHealth(ctx, changes)
}

func appliedStates(t *testing.T, dp *fake.Dataplane, name string) []dataplane.BackendState {
	t.Helper()
	applied, _ := dp.Applied()
	svc, ok := applied[name]
	if !ok {
		t.Fatalf("service %s not applied", name)
	}
	var out []dataplane.BackendState
	for _, b := range svc.Backends {
		out = append(out, b.State)
	}
	return out
}

// notServing upserts a service whose second backend the control plane
// marked NOT_SERVING.
func notServing(name, vip, a, b string) reconcile.Mutation {
	return func(tx *store.Txn) (any, error) {
		svc := &vipdv1.Service{Name: name, Vips: []string{vip}, Ports: []*vipdv1.Port{{Port: 80}}, Backends: []*vipdv1.Backend{
			{Ip: a}, {Ip: b, State: vipdv1.BackendState_BACKEND_STATE_NOT_SERVING}}}
		out, dp, v := validation.Service(svc, validation.Limits{}, "service")
		if v != nil {
			return nil, v
		}
		return tx.Put(out, dp)
	}
}

// TestSetHealthLowersOnly: a failing backend reaches the dataplane as
// NOT_SERVING through a partial apply naming its service, with no new
// generation; passing again restores the control plane's state; health
// never promotes a NOT_SERVING backend; and the overlay survives later API
// changes and full resyncs.
func TestSetHealthLowersOnly(t *testing.T) {
	h := run(t, fake.New(), snapshotOf(t, put("a", "10.96.0.1", "10.0.0.1", "10.0.0.2"), notServing("b", "10.96.0.2", "10.0.0.3", "10.0.0.4")))
	ready, down := dataplane.BackendReady, dataplane.BackendNotServing
	_, gen := h.dp.Applied()
	if err := setHealth(t, h, reconcile.HealthChange{Service: "a", Backend: netip.MustParseAddr("10.0.0.2"), Failing: true}); err != nil {
		t.Fatal(err)
	}
	if got := appliedStates(t, h.dp, "a"); !slices.Equal(got, []dataplane.BackendState{ready, down}) {
		t.Fatalf("states %v after a failing health check", got)
	}
	recs := h.dp.Records()
	if last := recs[len(recs)-1]; !slices.Equal(last.State.Changed, []string{"a"}) || last.State.Generation != gen {
		t.Errorf("health apply changed=%v generation %d, want [a] and %d", last.State.Changed, last.State.Generation, gen)
	}
	if h.rec.Snapshot().Revision() != gen {
		t.Errorf("a health change used up a generation")
	}
	// Other changes and full syncs keep it.
	if err := h.do(t, put("c", "10.96.0.3", "10.0.0.5")); err != nil {
		t.Fatal(err)
	}
	if got := appliedStates(t, h.dp, "a"); !slices.Equal(got, []dataplane.BackendState{ready, down}) {
		t.Fatalf("states %v after another change", got)
	}
	// A passing health check never promotes the control plane's NOT_SERVING.
	if err := setHealth(t, h, reconcile.HealthChange{Service: "b", Backend: netip.MustParseAddr("10.0.0.4"), Failing: true}); err != nil {
		t.Fatal(err)
	}
	if err := setHealth(t, h, reconcile.HealthChange{Service: "b", Backend: netip.MustParseAddr("10.0.0.4")}); err != nil {
		t.Fatal(err)
	}
	if got := appliedStates(t, h.dp, "b"); !slices.Equal(got, []dataplane.BackendState{ready, down}) {
		t.Fatalf("b states %v: health changed the control plane's NOT_SERVING", got)
	}
	if err := setHealth(t, h, reconcile.HealthChange{Service: "a", Backend: netip.MustParseAddr("10.0.0.2")}); err != nil {
		t.Fatal(err)
	}
	if got := appliedStates(t, h.dp, "a"); !slices.Equal(got, []dataplane.BackendState{ready, ready}) {
		t.Fatalf("states %v after passing again", got)
	}
}

// TestSetHealthAllOrNothing: a health change the dataplane refuses leaves
// nothing changed, and a later apply does not carry it.
func TestSetHealthAllOrNothing(t *testing.T) {
	h := run(t, fake.New(), snapshotOf(t, put("a", "10.96.0.1", "10.0.0.1", "10.0.0.2")))
	h.dp.FailNext(errors.New("boom"))
	if err := setHealth(t, h, reconcile.HealthChange{Service: "a", Backend: netip.MustParseAddr("10.0.0.2"), Failing: true}); err == nil {
		t.Fatal("SetHealth succeeded over a failing apply")
	}
	if err := h.do(t, put("c", "10.96.0.3", "10.0.0.5")); err != nil {
		t.Fatal(err)
	}
	ready := dataplane.BackendReady
	if got := appliedStates(t, h.dp, "a"); !slices.Equal(got, []dataplane.BackendState{ready, ready}) {
		t.Fatalf("states %v: the refused health change was applied later", got)
	}
}
