package store_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
)

// fullDiff is what ChangedSince must list at least: the names that a and
// b do not hold as the same entry, sorted.
func fullDiff(a, b *store.Snapshot) []string {
	var out []string
	for name, ea := range a.All() {
		if eb, ok := b.Get(name); !ok || eb != ea {
			out = append(out, name)
		}
	}
	for name := range b.All() {
		if _, ok := a.Get(name); !ok {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// TestChangedSince: a snapshot lists what changed since any of its recent
// ancestors, merging the commits in between, and nothing since itself or a
// copy of itself; it cannot tell for a snapshot it does not descend from.
func TestChangedSince(t *testing.T) {
	s0 := snapshot(t, svc("a", "10.96.0.1", 1, tcp(80)), svc("b", "10.96.0.2", 1, tcp(80)))
	tx := s0.Begin()
	put(t, tx, svc("c", "10.96.0.3", 1, tcp(80)))
	tx.Delete("a")
	s1 := tx.Commit()
	tx = s1.Begin()
	put(t, tx, svc("b", "10.96.0.2", 2, tcp(80)))
	put(t, tx, svc("d", "10.96.0.4", 1, tcp(80)))
	tx.Delete("d") // put, then deleted again: neither holds it
	s2 := tx.Commit()

	for _, tc := range []struct {
		name     string
		old, new *store.Snapshot
		want     []string
	}{
		{"parent", s0, s1, []string{"a", "c"}},
		{"two commits back", s0, s2, []string{"a", "b", "c", "d"}},
		{"last commit", s1, s2, []string{"b", "d"}},
		{"itself", s2, s2, nil},
		{"a copy with limits", s2.WithLimits(validation.Limits{MaxServices: 10}), s2, nil},
		{"from a copy with limits", s1, s2.WithLimits(validation.Limits{MaxServices: 10}), []string{"b", "d"}},
	} {
		got, ok := tc.new.ChangedSince(tc.old)
		if !ok || !slices.Equal(got, tc.want) {
			t.Errorf("%s: ChangedSince = %q, %v; want %q, true", tc.name, got, ok, tc.want)
		}
		for _, name := range fullDiff(tc.old, tc.new) {
			if !slices.Contains(got, name) {
				t.Errorf("%s: %s changed but is not listed", tc.name, name)
			}
		}
	}

	// A sibling committed on the same base, with the same revision.
	tx = s1.Begin()
	put(t, tx, svc("e", "10.96.0.5", 1, tcp(80)))
	put(t, tx, svc("f", "10.96.0.6", 1, tcp(80)))
	put(t, tx, svc("g", "10.96.0.7", 1, tcp(80)))
	sibling := tx.Commit()
	if sibling.Revision() != s2.Revision() {
		t.Fatalf("sibling at revision %d, s2 at %d", sibling.Revision(), s2.Revision())
	}
	built, err := store.Build(s2.Revision(), s2.List(""))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		old, new *store.Snapshot
	}{
		{"a sibling", s2, sibling},
		{"a descendant", s2, s1},
		{"an unrelated store", store.Empty(), s2},
		{"a snapshot loaded with the same services", s2, built},
		{"an ancestor of a loaded snapshot", built, s2},
	} {
		if got, ok := tc.new.ChangedSince(tc.old); ok {
			t.Errorf("%s: ChangedSince = %q, true; want false", tc.name, got)
		}
	}
	// A loaded snapshot tells its descendants what changed.
	tx = built.Begin()
	tx.Delete("b")
	if got, ok := tx.Commit().ChangedSince(built); !ok || !slices.Equal(got, []string{"b"}) {
		t.Errorf("after a load: ChangedSince = %q, %v; want [b], true", got, ok)
	}
}

// TestChangedSinceRandom: on a chain of random commits (puts, deletes,
// several in a transaction, some through a Sub), every snapshot tells what
// changed since each of its last 64 ancestors: all that a full comparison
// finds, sorted, without repeats, and nothing no commit in between touched.
// It cannot tell for older ancestors nor for descendants.
func TestChangedSinceRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const names = 40
	snaps := []*store.Snapshot{store.Empty()}
	var touched [][]string // by the commit that made snaps[i+1]
	for range 150 {
		tx := snaps[len(snaps)-1].Begin()
		for range 1 + r.IntN(4) {
			x := tx
			if r.IntN(3) == 0 {
				x = tx.Sub()
			}
			i := r.IntN(names)
			name := fmt.Sprintf("svc-%02d", i)
			if _, ok := x.Get(name); ok && r.IntN(3) == 0 {
				x.Delete(name)
			} else {
				put(t, x, svc(name, fmt.Sprintf("10.96.0.%d", i+1), 1+r.IntN(3), tcp(80)))
			}
			if x != tx {
				x.Merge()
			}
		}
		touched = append(touched, slices.Clone(tx.Changed()))
		snaps = append(snaps, tx.Commit())
	}
	for j := range snaps {
		for i := range snaps {
			got, ok := snaps[j].ChangedSince(snaps[i])
			switch {
			case i > j || j-i > 64:
				if ok {
					t.Fatalf("snapshot %d since %d: ChangedSince = %q, true; want false", j, i, got)
				}
				continue
			case !ok:
				t.Fatalf("snapshot %d since %d: ChangedSince cannot tell", j, i)
			}
			if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
				t.Fatalf("snapshot %d since %d: %q is not sorted without repeats", j, i, got)
			}
			var between []string
			for _, c := range touched[i:j] {
				between = append(between, c...)
			}
			for _, name := range got {
				if !slices.Contains(between, name) {
					t.Fatalf("snapshot %d since %d: %s listed, but no commit touched it", j, i, name)
				}
			}
			for _, name := range fullDiff(snaps[i], snaps[j]) {
				if !slices.Contains(got, name) {
					t.Fatalf("snapshot %d since %d: %s changed but is not listed", j, i, name)
				}
			}
		}
	}
}

// TestChangedSinceNamesBound: a snapshot forgets the commits past 4,096
// names since, but always tells what changed since its parent, however
// many names its own commit touched; the next commit forgets those.
func TestChangedSinceNamesBound(t *testing.T) {
	var all []string
	tx := store.Empty().Begin()
	for i := range 5000 {
		name := fmt.Sprintf("svc-%04d", i)
		all = append(all, name)
		put(t, tx, svc(name, fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), 1, tcp(80)))
	}
	base := tx.Commit()
	if got, ok := base.ChangedSince(store.Empty()); ok {
		t.Errorf("since the empty store: ChangedSince = %d names, true; want false (an unrelated Empty)", len(got))
	}
	snaps := []*store.Snapshot{base}
	for range 5 {
		tx := snaps[len(snaps)-1].Begin()
		for i, name := range all[:1000] {
			put(t, tx, svc(name, fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), 1, tcp(80)))
		}
		snaps = append(snaps, tx.Commit())
	}
	last := snaps[len(snaps)-1]
	for back := 1; back <= 4; back++ {
		if got, ok := last.ChangedSince(snaps[len(snaps)-1-back]); !ok || !slices.Equal(got, all[:1000]) {
			t.Errorf("%d commits of 1,000 names back: ChangedSince = %d names, %v; want 1000, true", back, len(got), ok)
		}
	}
	if _, ok := last.ChangedSince(snaps[0]); ok {
		t.Errorf("5 commits of 1,000 names back: ChangedSince can tell; want false")
	}

	// One commit of 5,000 names: its parent is still known.
	tx = last.Begin()
	for i, name := range all {
		put(t, tx, svc(name, fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), 1, tcp(80)))
	}
	big := tx.Commit()
	if got, ok := big.ChangedSince(last); !ok || !slices.Equal(got, all) {
		t.Errorf("since the parent of a commit of 5,000 names: ChangedSince = %d names, %v; want 5000, true", len(got), ok)
	}
	if _, ok := big.ChangedSince(snaps[len(snaps)-2]); ok {
		t.Errorf("past a commit of 5,000 names: ChangedSince can tell; want false")
	}

	// Once a commit follows, the big one's names are no longer kept.
	tx = big.Begin()
	tx.Delete(all[0])
	after := tx.Commit()
	if got, ok := after.ChangedSince(big); !ok || !slices.Equal(got, all[:1]) {
		t.Errorf("after the big commit: ChangedSince = %q, %v; want [%s], true", got, ok, all[0])
	}
	if n := store.KeptNames(after); n != 1 {
		t.Errorf("a commit of 1 name after one of 5,000 keeps %d names, want 1", n)
	}
}
