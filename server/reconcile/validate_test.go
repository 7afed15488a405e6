package reconcile_test

import (
	"errors"
	"testing"

	"github.com/vipd/vipd/dataplane/fake"
	"github.com/vipd/vipd/server/reconcile"
	"github.com/vipd/vipd/server/store"
)

// TestValidateChangesNothing: Validate and ValidateRelease run a mutation
// on the current desired state and return its result, but apply, save and
// publish nothing; under a hold Validate is refused as Do is, while
// ValidateRelease runs and leaves the hold in place.
func TestValidateChangesNothing(t *testing.T) {
	dp := fake.New()
	rec := runHeld(t, dp, &persister{})

	var held *reconcile.HeldError
	if _, err := rec.Validate(ctx10(t), put("a", "10.96.0.1", "10.0.0.1")); !errors.As(err, &held) {
		t.Fatalf("Validate while held: %v, want a HeldError", err)
	}
	v, err := rec.ValidateRelease(ctx10(t), put("a", "10.96.0.1", "10.0.0.1"))
	if e, ok := v.(*store.Entry); err != nil || !ok || e.Generation() != 1 {
		t.Fatalf("ValidateRelease while held: %v, %v; want the entry at generation 1", v, err)
	}
	if len(dp.Records()) != 0 || rec.Snapshot().Len() != 0 || isReady(rec) || rec.Status().HeldReason == "" {
		t.Fatal("ValidateRelease applied, published or released")
	}

	if _, err := rec.Release(ctx10(t), put("a", "10.96.0.1", "10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	records, snap := len(dp.Records()), rec.Snapshot()
	v, err = rec.Validate(ctx10(t), put("b", "10.96.0.2"))
	if e, ok := v.(*store.Entry); err != nil || !ok || e.Generation() != 2 {
		t.Fatalf("Validate: %v, %v; want the entry at generation 2", v, err)
	}
	if _, err := rec.Validate(ctx10(t), put("c", "10.96.0.1")); err == nil {
		t.Fatal("Validate of a conflicting change succeeded")
	}
	if len(dp.Records()) != records || rec.Snapshot() != snap {
		t.Fatal("Validate applied or published a change")
	}
	if e, err := rec.Do(ctx10(t), put("b", "10.96.0.2")); err != nil || e.(*store.Entry).Generation() != 2 {
		t.Fatalf("the change after a Validate: %v, %v; want generation 2", e, err)
	}
}
