package fake

import (
	"context"
	"errors"
	"testing"

	"github.com/vipd/vipd/dataplane"
)

// TestDriftRepairedLikeRealDataplanes: drift set by SetDrift survives a
// partial Apply, but not one after a failed Apply, which is full in the
// real dataplanes (needFull), nor one with a nil Changed.
func TestDriftRepairedLikeRealDataplanes(t *testing.T) {
	ctx := context.Background()
	d := New()
	drift := []dataplane.Drift{{What: "hook", Detail: "gone"}}
	state := func(gen uint64, changed []string) *dataplane.State {
		return &dataplane.State{Generation: gen, Changed: changed}
	}
	detect := func() []dataplane.Drift {
		t.Helper()
		got, err := d.DetectDrift(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if err := d.Apply(ctx, state(1, nil)); err != nil {
		t.Fatal(err)
	}
	d.SetDrift(drift)
	if err := d.Apply(ctx, state(2, []string{"a"})); err != nil {
		t.Fatal(err)
	}
	if got := detect(); len(got) != 1 {
		t.Fatalf("after a partial Apply: drift %v, want %v", got, drift)
	}
	d.FailNext(errors.New("boom"))
	if err := d.Apply(ctx, state(3, []string{"a"})); err == nil {
		t.Fatal("Apply after FailNext succeeded")
	}
	if got := detect(); len(got) != 1 {
		t.Fatalf("after a failed Apply: drift %v, want %v", got, drift)
	}
	if err := d.Apply(ctx, state(3, []string{"a"})); err != nil {
		t.Fatal(err)
	}
	if rec := d.Records(); !rec[len(rec)-1].Full {
		t.Fatal("the Apply after a failed one is not recorded as full")
	}
	if got := detect(); len(got) != 0 {
		t.Fatalf("after an Apply following a failed one (a full one): drift %v, want none", got)
	}
	d.SetDrift(drift)
	if err := d.Apply(ctx, state(4, nil)); err != nil {
		t.Fatal(err)
	}
	if got := detect(); len(got) != 0 {
		t.Fatalf("after a full Apply: drift %v, want none", got)
	}
}
