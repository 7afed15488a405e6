package store_test

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"testing"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/server/store"
)

// TestSnapshotsArePersistent commits a chain of changes on a store of many
// services and checks that every older snapshot still reads exactly as it
// did when it was committed: services, claims, counts, its dataplane state,
// and its delta as the journal sees it.
func TestSnapshotsArePersistent(t *testing.T) {
	const n = 300
	tx := store.Empty().Begin()
	for i := range n {
		put(t, tx, svc(fmt.Sprintf("svc-%03d", i), fmt.Sprintf("10.96.%d.%d", i/200, i%200+1), i%3+1, tcp(80)))
	}
	snaps := []*store.Snapshot{tx.Commit()}
	type view struct {
		names    []string
		holders  map[store.Claim]string
		backends int
		state    map[string]*dataplane.Service
	}
	claim := func(i int) store.Claim {
		return store.Claim{VIP: netipAddr(t, fmt.Sprintf("10.96.%d.%d", i/200, i%200+1)), Protocol: dataplane.TCP, Port: 80}
	}
	look := func(s *store.Snapshot) view {
		v := view{names: names(s.List("")), holders: map[store.Claim]string{}, backends: s.BackendCount(), state: s.DataplaneState(nil).Map()}
		for i := range n + 20 {
			if h, ok := s.Holder(claim(i)); ok {
				v.holders[claim(i)] = h
			}
		}
		return v
	}
	views := []view{look(snaps[0])}
	for step := range 20 {
		base := snaps[len(snaps)-1]
		tx := base.Begin()
		victim := fmt.Sprintf("svc-%03d", step*7)
		tx.Delete(victim)
		// The new service takes the deleted one's VIP: a claim moves.
		i := step * 7
		put(t, tx, svc(fmt.Sprintf("new-%02d", step), fmt.Sprintf("10.96.%d.%d", i/200, i%200+1), 2, tcp(80)))
		next := tx.Commit()
		if got, want := next.Len(), base.Len(); got != want {
			t.Fatalf("step %d: Len %d, want %d", step, got, want)
		}
		if h, _ := next.Holder(claim(i)); h != fmt.Sprintf("new-%02d", step) {
			t.Errorf("step %d: claim held by %q in the new snapshot", step, h)
		}
		if h, _ := base.Holder(claim(i)); h != victim {
			t.Errorf("step %d: claim held by %q in the base, want %s", step, h, victim)
		}
		snaps = append(snaps, next)
		views = append(views, look(next))
	}
	for k, s := range snaps {
		got := look(s)
		if !slices.Equal(got.names, views[k].names) || got.backends != views[k].backends ||
			len(got.holders) != len(views[k].holders) || len(got.state) != len(views[k].state) {
			t.Fatalf("snapshot %d changed after later commits", k)
		}
		for c, h := range views[k].holders {
			if got.holders[c] != h {
				t.Errorf("snapshot %d: claim %s held by %q, was %q", k, c, got.holders[c], h)
			}
		}
		for name, svc := range views[k].state {
			if got.state[name] != svc {
				t.Errorf("snapshot %d: dataplane service %s changed", k, name)
			}
		}
		if !slices.IsSorted(got.names) {
			t.Errorf("snapshot %d: List is not in name order", k)
		}
	}
	// A conflict is checked against the transaction's base, old or new.
	tx = snaps[0].Begin()
	if _, err := tx.Put(normalize(t, svc("x", "10.96.0.1", 1, tcp(80)))); err == nil {
		t.Error("Put on the first snapshot took svc-000's claim")
	}
	tx = snaps[len(snaps)-1].Begin()
	if _, err := tx.Put(normalize(t, svc("x", "10.96.0.1", 1, tcp(80)))); err == nil {
		t.Error("Put on the last snapshot took new-00's claim")
	}
}

// TestBigChangeWritesTheStateFile checks that a change too big for the
// journal's threshold is saved as a state file rather than as one huge
// journal record, and still loads back.
func TestBigChangeWritesTheStateFile(t *testing.T) {
	defer store.SetJournalCompactAt(4096)()
	d, s := started(t)
	tx := s.Begin()
	for i := range 100 {
		put(t, tx, svc(fmt.Sprintf("big-%03d", i), fmt.Sprintf("10.96.3.%d", i+1), 3, tcp(80)))
	}
	s = tx.Commit()
	save(t, d, s)
	if fi, err := os.Stat(journalPath(d)); err != nil || fi.Size() != 0 {
		t.Fatalf("journal after a big change: %v, size %d; want it empty (state file written)", err, fi.Size())
	}
	// A small change on top goes to the journal again.
	tx = s.Begin()
	put(t, tx, svc("small", "10.96.4.1", 1, tcp(80)))
	s = tx.Commit()
	save(t, d, s)
	if fi, err := os.Stat(journalPath(d)); err != nil || fi.Size() == 0 {
		t.Fatalf("journal after a small change: %v; want a record", err)
	}
	d = reopen(t, d)
	got, err := d.Load()
	if err != nil {
		t.Fatal(err)
	}
	sameSnapshot(t, s, got)
}

func netipAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// BenchmarkCommitOne measures one upsert (Begin, Put, Commit, DataplaneState)
// with n services present: it should not grow with n.
func BenchmarkCommitOne(b *testing.B) {
	for _, n := range []int{1_000, 100_000} {
		b.Run(fmt.Sprintf("present=%d", n), func(b *testing.B) {
			tx := store.Empty().Begin()
			for i := range n {
				put(b, tx, svc(fmt.Sprintf("bench/w%06d", i), fmt.Sprintf("10.%d.%d.%d", 100+i>>16, i>>8&255, i&255), 10, tcp(80)))
			}
			s := tx.Commit()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				tx := s.Begin()
				if _, err := tx.Put(normalize(b, svc("bench/changing", "10.99.0.1", i%5+1, tcp(443)))); err != nil {
					b.Fatal(err)
				}
				s = tx.Commit()
				if _, ok := s.DataplaneState(tx.Changed()).Get("bench/changing"); !ok {
					b.Fatal("missing")
				}
			}
		})
	}
}
