package pmap

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"
)

// check compares m with want entry by entry, and checks that every
// non-root node is in canonical shape (no subtree of a single entry).
func check[K comparable, V comparable](t *testing.T, what string, m Map[K, V], want map[K]V) {
	t.Helper()
	if m.Len() != len(want) {
		t.Fatalf("%s: Len %d, want %d", what, m.Len(), len(want))
	}
	for k, v := range want {
		if got, ok := m.Get(k); !ok || got != v {
			t.Fatalf("%s: Get(%v) = %v, %v; want %v", what, k, got, ok, v)
		}
	}
	seen := map[K]bool{}
	for k, v := range m.All() {
		if seen[k] {
			t.Fatalf("%s: All yields %v twice", what, k)
		}
		seen[k] = true
		if want[k] != v {
			t.Fatalf("%s: All yields %v=%v, want %v", what, k, v, want[k])
		}
	}
	if len(seen) != len(want) {
		t.Fatalf("%s: All yields %d entries, want %d", what, len(seen), len(want))
	}
}

// TestPersistence applies random changes and checks after each that the
// new map is right and that every older map still reads as it did.
func TestPersistence(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var m Map[string, int]
	want := map[string]int{}
	type version struct {
		m    Map[string, int]
		want map[string]int
	}
	var versions []version
	for step := range 3000 {
		k := fmt.Sprintf("svc-%d", r.IntN(800))
		if r.IntN(3) == 0 {
			m = m.Delete(k)
			delete(want, k)
		} else {
			m = m.Set(k, step)
			want[k] = step
		}
		if _, ok := m.Get("absent"); ok {
			t.Fatal("Get of an absent key succeeded")
		}
		if step%100 == 0 {
			versions = append(versions, version{m, maps.Clone(want)})
		}
	}
	check(t, "last", m, want)
	for i, v := range versions {
		check(t, fmt.Sprintf("version %d", i), v.m, v.want)
	}
	for k := range want {
		m = m.Delete(k)
	}
	if m.Len() != 0 || m.root != nil {
		t.Fatalf("after deleting everything: Len %d, root %v", m.Len(), m.root)
	}
}

// TestBuilder checks that a Builder never changes the map it started
// from, nor a map it returned, as it goes on.
func TestBuilder(t *testing.T) {
	var base Map[int, int]
	for i := range 500 {
		base = base.Set(i, i)
	}
	baseWant := map[int]int{}
	for i := range 500 {
		baseWant[i] = i
	}
	b := base.Builder()
	want := maps.Clone(baseWant)
	for i := 250; i < 2000; i++ {
		b.Set(i, -i)
		want[i] = -i
	}
	for i := 0; i < 100; i++ {
		b.Delete(i)
		delete(want, i)
	}
	mid := b.Map()
	midWant := maps.Clone(want)
	for i := 100; i < 1500; i++ {
		b.Delete(i)
		delete(want, i)
	}
	b.Set(5, 5)
	want[5] = 5
	check(t, "base", base, baseWant)
	check(t, "first Map", mid, midWant)
	check(t, "second Map", b.Map(), want)
}

type collide struct{ k int }

// TestCollisions forces every key into the same hash by testing the trie
// below maxShift directly.
func TestCollisions(t *testing.T) {
	var n *node[collide, int]
	const h = 0xdeadbeef
	for i := range 10 {
		n, _ = set(n, nil, maxShift+bitsPerLevel, h, collide{i}, i)
	}
	if len(n.slots) != 10 {
		t.Fatalf("collision node has %d slots, want 10", len(n.slots))
	}
	old := n
	n, removed := del(n, nil, maxShift+bitsPerLevel, h, collide{3})
	if !removed || len(n.slots) != 9 || len(old.slots) != 10 {
		t.Fatalf("delete from a collision node: removed %v, %d slots (old %d)", removed, len(n.slots), len(old.slots))
	}
	n, added := set(n, nil, maxShift+bitsPerLevel, h, collide{4}, 40)
	if added || len(n.slots) != 9 {
		t.Fatalf("replace in a collision node: added %v, %d slots", added, len(n.slots))
	}
	// Two keys whose hashes agree in every bit used above the collision level.
	p := pair(nil, 0, h, slot[collide, int]{key: collide{1}, val: 1}, h, slot[collide, int]{key: collide{2}, val: 2})
	depth := 0
	for x := p; len(x.slots) == 1 && x.slots[0].child != nil; x = x.slots[0].child {
		depth++
	}
	if depth != maxShift/bitsPerLevel+1 {
		t.Fatalf("pair of equal hashes nests %d levels, want %d", depth, maxShift/bitsPerLevel+1)
	}
}

func BenchmarkSetOne(b *testing.B) {
	for _, n := range []int{1_000, 100_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			bl := Map[string, *int]{}.Builder()
			for i := range n {
				bl.Set(fmt.Sprintf("bench/w%06d", i), new(int))
			}
			m := bl.Map()
			v := new(int)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				m = m.Set("bench/changing", v)
				if i%2 == 0 {
					m = m.Delete("bench/changing")
				}
			}
		})
	}
}

// TestBuilderLoadKeepsLittleSpareRoom: a map a Builder loads keeps almost
// no spare slots: most of its nodes hold a few entries, and room that
// append left in them would stay with the map (at 100,000 entries some
// 8 bytes an entry of vipd's heap for each of the store's indexes).
func TestBuilderLoadKeepsLittleSpareRoom(t *testing.T) {
	const n = 100_000
	b := Map[int, int]{}.Builder()
	for i := range n {
		b.Set(i, i)
	}
	m := b.Map()
	var slots, spare, smallSpare int
	var walk func(*node[int, int])
	walk = func(nd *node[int, int]) {
		slots += len(nd.slots)
		spare += cap(nd.slots) - len(nd.slots)
		if len(nd.slots) < exactGrowth {
			smallSpare += cap(nd.slots) - len(nd.slots)
		}
		for _, s := range nd.slots {
			if s.child != nil {
				walk(s.child)
			}
		}
	}
	walk(m.root)
	if smallSpare > 0 {
		t.Errorf("nodes of fewer than %d slots keep %d spare slots, want none", exactGrowth, smallSpare)
	}
	// Nodes of 8 slots or more may keep what append left.
	if per := float64(spare) / n; per > 0.1 {
		t.Errorf("%d entries in %d slots keep %d spare slots, %.2f an entry; the budget is 0.1", n, slots, spare, per)
	}
}
