package store_test

import (
	"errors"
	"fmt"
	"testing"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
)

// limitErr returns err as a *store.LimitError, failing the test otherwise.
func limitErr(t *testing.T, err error, resource string) *store.LimitError {
	t.Helper()
	var le *store.LimitError
	if !errors.As(err, &le) {
		t.Fatalf("got %v, want a *store.LimitError", err)
	}
	if le.Resource != resource {
		t.Fatalf("limit error on %q, want %q: %v", le.Resource, resource, le)
	}
	return le
}

// numbered is service i of a series: VIP 10.96.x.y, port 80, n backends.
func numbered(i, n int) *vipdv1.Service {
	return svc(fmt.Sprintf("s%d", i), fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), n, tcp(80))
}

func TestLimitsAtTheEdges(t *testing.T) {
	lim := validation.Limits{MaxServices: 3, MaxTotalBackends: 10}
	type step struct {
		name     string
		do       func(tx *store.Txn) error
		resource string // "" when the step must succeed
	}
	putErr := func(tx *store.Txn, in *vipdv1.Service) error {
		_, err := tx.Put(normalize(t, in))
		return err
	}
	tests := []struct {
		name  string
		start []*vipdv1.Service
		steps []step
	}{
		{"services up to the limit, then one more", nil, []step{
			{"s0", func(tx *store.Txn) error { return putErr(tx, numbered(0, 1)) }, ""},
			{"s1", func(tx *store.Txn) error { return putErr(tx, numbered(1, 1)) }, ""},
			{"s2: the limit itself", func(tx *store.Txn) error { return putErr(tx, numbered(2, 1)) }, ""},
			{"s3: limit + 1", func(tx *store.Txn) error { return putErr(tx, numbered(3, 1)) }, "services"},
			{"replacing s2 at the limit", func(tx *store.Txn) error { return putErr(tx, numbered(2, 2)) }, ""},
		}},
		{"backends up to the limit, then one more", nil, []step{
			{"6 backends", func(tx *store.Txn) error { return putErr(tx, numbered(0, 6)) }, ""},
			{"4 more: the limit itself", func(tx *store.Txn) error { return putErr(tx, numbered(1, 4)) }, ""},
			{"1 more: limit + 1", func(tx *store.Txn) error { return putErr(tx, numbered(2, 1)) }, "backends"},
			{"a service without backends", func(tx *store.Txn) error { return putErr(tx, numbered(2, 0)) }, ""},
			{"growing s1 by one", func(tx *store.Txn) error { return putErr(tx, numbered(1, 5)) }, "backends"},
			{"moving a backend from s0 to s1", func(tx *store.Txn) error {
				if err := putErr(tx, numbered(0, 5)); err != nil {
					return err
				}
				return putErr(tx, numbered(1, 5))
			}, ""},
		}},
		{"a sync deletes before it puts", []*vipdv1.Service{numbered(0, 5), numbered(1, 5), numbered(2, 0)}, []step{
			{"replace all three with three others", func(tx *store.Txn) error {
				for _, n := range []string{"s0", "s1", "s2"} {
					tx.Delete(n)
				}
				for i := 3; i < 6; i++ {
					if err := putErr(tx, numbered(i, 3)); err != nil {
						return err
					}
				}
				return nil
			}, ""},
		}},
		{"limits hold across Subs", []*vipdv1.Service{numbered(0, 1)}, []step{
			{"two Subs that fit alone but not together", func(tx *store.Txn) error {
				a := tx.Sub()
				if err := putErr(a, numbered(1, 4)); err != nil {
					return err
				}
				a.Merge()
				b := tx.Sub()
				return putErr(b, numbered(2, 6))
			}, "backends"},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			snap := snapshot(t, tc.start...).WithLimits(lim)
			for _, st := range tc.steps {
				before := snap
				tx := snap.Begin()
				err := st.do(tx)
				if st.resource == "" {
					if err != nil {
						t.Fatalf("%s: %v", st.name, err)
					}
					snap = tx.Commit()
					if snap.Len() > lim.MaxServices || snap.BackendCount() > lim.MaxTotalBackends {
						t.Fatalf("%s: committed %d services and %d backends, past the limits", st.name, snap.Len(), snap.BackendCount())
					}
					continue
				}
				le := limitErr(t, err, st.resource)
				want := lim.MaxServices
				if st.resource == "backends" {
					want = lim.MaxTotalBackends
				}
				if le.Limit != want || le.Count <= want || le.Service == "" || le.Flag == "" {
					t.Errorf("%s: limit error %+v", st.name, le)
				}
				// The caller drops the failed step; the snapshot it started
				// from is unchanged.
				if before.Len() != snap.Len() || before.Revision() != snap.Revision() || before.BackendCount() != snap.BackendCount() {
					t.Errorf("%s: a failed Put changed the base snapshot", st.name)
				}
			}
		})
	}
}

func TestLimitFailureStagesNothing(t *testing.T) {
	snap := snapshot(t, numbered(0, 2)).WithLimits(validation.Limits{MaxTotalBackends: 3})
	tx := snap.Begin()
	next := tx.NextGeneration()
	if _, err := tx.Put(normalize(t, numbered(1, 2))); err == nil {
		t.Fatal("Put past the backend limit succeeded")
	}
	if tx.Dirty() || tx.NextGeneration() != next {
		t.Errorf("the failed Put staged a change (dirty %v) or used a generation (next %d, want %d)", tx.Dirty(), tx.NextGeneration(), next)
	}
	if _, ok := tx.Get("s1"); ok {
		t.Error("the failed Put is visible")
	}
	// The claim of s1 was not taken either: another service may have it.
	other := numbered(1, 1)
	other.Name = "other"
	put(t, tx, other)
	if got := tx.Commit(); got.Len() != 2 || got.BackendCount() != 3 {
		t.Errorf("after the failed Put and a good one: %d services, %d backends; want 2 and 3", got.Len(), got.BackendCount())
	}
}

func TestLimitsCarryOver(t *testing.T) {
	lim := validation.Limits{MaxServices: 2, MaxTotalBackends: 100, MaxBackends: 7, MaxPorts: 3}
	snap := store.Empty().WithLimits(lim)
	if got := snap.Limits(); got.MaxServices != 2 || got.MaxTotalBackends != 100 || got.MaxBackends != 0 || got.MaxPorts != 0 {
		t.Errorf("Limits() = %+v; want only the totals", got)
	}
	for i := range 2 {
		tx := snap.Begin()
		put(t, tx, numbered(i, 1))
		snap = tx.Commit()
	}
	if snap.Limits().MaxServices != 2 {
		t.Fatalf("a committed snapshot lost its limits: %+v", snap.Limits())
	}
	_, err := snap.Begin().Put(normalize(t, numbered(2, 1)))
	limitErr(t, err, "services")
	// A snapshot without limits takes anything.
	unlimited := snap.WithLimits(validation.Limits{})
	tx := unlimited.Begin()
	for i := 2; i < 50; i++ {
		put(t, tx, numbered(i, 3))
	}
	if got := tx.Commit(); got.Len() != 50 {
		t.Errorf("%d services without limits, want 50", got.Len())
	}
}

func TestLoweredLimitDoesNotBlockShrinking(t *testing.T) {
	// A store restored over a lower limit than it was filled with keeps its
	// services, may change them without growing, and may shrink.
	snap := snapshot(t, numbered(0, 4), numbered(1, 4), numbered(2, 4)).WithLimits(validation.Limits{MaxServices: 2, MaxTotalBackends: 5})
	tx := snap.Begin()
	put(t, tx, numbered(0, 4)) // same size: allowed
	put(t, tx, numbered(1, 3)) // smaller: allowed
	if _, err := tx.Put(normalize(t, numbered(3, 0))); err == nil {
		t.Error("a new service over a lowered service limit was accepted")
	} else {
		limitErr(t, err, "services")
	}
	if _, err := tx.Put(normalize(t, numbered(2, 5))); err == nil {
		t.Error("growing a service over a lowered backend limit was accepted")
	} else {
		limitErr(t, err, "backends")
	}
	tx.Delete("s2")
	snap = tx.Commit()
	if snap.Len() != 2 || snap.BackendCount() != 7 {
		t.Errorf("%d services and %d backends, want 2 and 7", snap.Len(), snap.BackendCount())
	}
}

func TestLimitErrorMessage(t *testing.T) {
	snap := snapshot(t, numbered(0, 1)).WithLimits(validation.Limits{MaxServices: 1})
	_, err := snap.Begin().Put(normalize(t, numbered(1, 1)))
	const want = "service s1: storing it would make 2 services in all, above the limit of 1 (--max-services); nothing was changed"
	if err == nil || err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
}
