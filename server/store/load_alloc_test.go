package store_test

import (
	"testing"

	"github.com/vipd/vipd/server/store"
)

// TestLoadAllocBudget guards the allocations of a state file's Load per
// service of 10 backends, decoding, conversion and indexes included. The
// records' API form is scratch, decoded into messages that each decoding
// goroutine reuses (recordDecoder). Decoding every record into new
// messages (a million backend messages at 100,000 services) took 50
// allocations a service here, and made a restart's load of 100,000
// services allocate 464 MB for a state that keeps 142 MiB; today it takes
// 34, and 251 MB.
func TestLoadAllocBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("saves and loads 2,000 services")
	}
	const n, budget = 2000, 38
	path := t.TempDir()
	dir, err := store.OpenDir(path)
	if err != nil {
		t.Fatal(err)
	}
	tx := store.Empty().Begin()
	for _, s := range bigServices(n) {
		put(t, tx, s)
	}
	if err := dir.Save(tx.Commit()); err != nil {
		t.Fatal(err)
	}
	dir.Close()
	d, err := store.OpenDir(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	allocs := testing.AllocsPerRun(3, func() {
		s, err := d.Load()
		if err != nil || s.Len() != n {
			t.Fatalf("Load: %d services, %v", s.Len(), err)
		}
	})
	if per := allocs / n; per > budget {
		t.Errorf("Load allocates %.1f times a service of 10 backends, over the budget of %d", per, budget)
	} else {
		t.Logf("Load allocates %.1f times a service of 10 backends (budget %d)", per, budget)
	}
}
