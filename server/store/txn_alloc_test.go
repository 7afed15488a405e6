package store_test

import (
	"runtime"
	"slices"
	"testing"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
)

// TestTxnGrow checks that Grow keeps what a transaction staged before it
// (a sync deletes services before it puts the listed ones), and that the
// puts of a big change it made room for allocate less than they do
// growing the transaction's maps step by step.
func TestTxnGrow(t *testing.T) {
	const n = 20_000
	svcs := bigServices(n)
	dps := make([]*dataplane.Service, n)
	specs := make([]store.Spec, n)
	claims := 0
	for i, s := range svcs {
		dp, v := validation.ConvertService(s, "service")
		if len(v) > 0 {
			t.Fatal(v)
		}
		spec, err := store.NewSpec(s, dp)
		if err != nil {
			t.Fatal(err)
		}
		dps[i], specs[i] = dp, spec
		claims += store.ClaimCount(dp)
	}
	if claims != n {
		t.Fatalf("ClaimCount: %d claims in all, want %d (one VIP and port each)", claims, n)
	}
	base := snapshot(t, svcs[0])
	allocated := func(grow bool) uint64 {
		tx := base.Begin()
		if !tx.Delete(svcs[0].Name) {
			t.Fatal("Delete: the base's service is not there")
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		if grow {
			tx.Grow(n-1, claims-1)
		}
		for i := 1; i < n; i++ {
			c := *dps[i]
			if _, err := tx.PutSpec(specs[i], &c); err != nil {
				t.Fatal(err)
			}
		}
		runtime.ReadMemStats(&after)
		if _, ok := tx.Get(svcs[0].Name); ok {
			t.Fatal("a deleted service is back after Grow")
		}
		s := tx.Commit()
		if s.Len() != n-1 {
			t.Fatalf("%d services after the commit, want %d", s.Len(), n-1)
		}
		for i := 1; i < n; i += 997 {
			if h, ok := s.Holder(store.Claim{VIP: dps[i].VIPs[0], Protocol: dps[i].Ports[0].Protocol, Port: dps[i].Ports[0].Port}); !ok || h != dps[i].Name {
				t.Fatalf("claim of %s held by %q", dps[i].Name, h)
			}
		}
		return after.TotalAlloc - before.TotalAlloc
	}
	grown, growing := allocated(true), allocated(false)
	t.Logf("puts of %d services allocate %d bytes after Grow, %d without", n-1, grown, growing)
	if grown >= growing {
		t.Errorf("puts after Grow allocate %d bytes, no fewer than the %d without", grown, growing)
	}
}

// TestNamesAllocs bounds what Txn.Names allocates over a big base, as a
// SyncServices over 100,000 stored services of its owner calls it: the
// names' slice as it grows, about 80 bytes a service. A set of every name
// and a sorted copy of the base, as it once took, cost 190.
func TestNamesAllocs(t *testing.T) {
	const n = 20_000
	base := snapshot(t, bigServices(n)...)
	tx := base.Begin()
	var names []string
	store.CheckBytesPer(t, "Names", "stored service", n, 100, func() { names = tx.Names(validation.DefaultOwner) })
	if len(names) != n {
		t.Fatalf("Names: %d names, want %d", len(names), n)
	}
}

// TestAllSortsOnce checks that a snapshot sorts its services once for
// every All, its own and its DataplaneState's (a full apply walks them
// several times), and that the order is by name.
func TestAllSortsOnce(t *testing.T) {
	const n = 20_000
	snap := snapshot(t, bigServices(n)...)
	walk := func() (uint64, int) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		count, last := 0, ""
		for name, svc := range snap.DataplaneState(nil).Set.All() {
			if name <= last || svc.Name != name {
				t.Fatalf("DataplaneState's All yields %s (%s) after %s", name, svc.Name, last)
			}
			count, last = count+1, name
		}
		last = ""
		for name, e := range snap.All() {
			if name <= last || e.Name() != name {
				t.Fatalf("All yields %s (%s) after %s", name, e.Name(), last)
			}
			last = name
		}
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc, count
	}
	first, count := walk()
	if count != n {
		t.Fatalf("All yields %d services, want %d", count, n)
	}
	again, _ := walk()
	t.Logf("the first walks allocate %d bytes, the next %d", first, again)
	if again > first/10 {
		t.Errorf("walks of a snapshot walked before allocate %d bytes, over a tenth of the first's %d: the order is sorted again", again, first)
	}
}

// TestChangedAllocatesOnce checks that Changed lists the touched names,
// sorted, in one allocation of exactly their number (collected step by
// step from the map, the list of a sync of 100,000 services left several
// times its size as garbage).
func TestChangedAllocatesOnce(t *testing.T) {
	const n = 5_000
	svcs := bigServices(n)
	tx := snapshot(t).Begin()
	for _, s := range svcs {
		dp, v := validation.ConvertService(s, "service")
		if len(v) > 0 {
			t.Fatal(v)
		}
		if _, err := tx.Put(s, dp); err != nil {
			t.Fatal(err)
		}
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	changed := tx.Changed()
	runtime.ReadMemStats(&after)
	if allocs := after.Mallocs - before.Mallocs; allocs != 1 || len(changed) != n || cap(changed) != n || !slices.IsSorted(changed) {
		t.Fatalf("Changed: %d allocations, %d names (room for %d), sorted %v; want 1 allocation of exactly %d sorted names",
			allocs, len(changed), cap(changed), slices.IsSorted(changed), n)
	}
}
