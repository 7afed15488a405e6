package store

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/vipd/vipd/dataplane"
)

// TestAddrIndex checks addrIndex against a plain map through a build and
// random commits of sets, changes and removals, and that a commit leaves
// the index it started from as it was.
func TestAddrIndex(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	// Few distinct keys, so that commits hit present ones often; some
	// differ only in their high word.
	key := func() addrKey { return addrKey{uint64(rng.IntN(3)) << 60, uint64(rng.IntN(5000))} }
	want := map[addrKey]addrUse{}
	for range 3000 {
		want[key()] = addrUse{vips: rng.Int32N(3) + 1, backends: rng.Int32N(3)}
	}
	check := func(x addrIndex, want map[addrKey]addrUse) {
		t.Helper()
		if x.len() != len(want) {
			t.Fatalf("index has %d addresses; want %d", x.len(), len(want))
		}
		for k, u := range want {
			if got := x.get(k); got != u {
				t.Fatalf("%v: %+v; want %+v", k, got, u)
			}
		}
		for range 1000 {
			k := key()
			if got := x.get(k); got != want[k] {
				t.Fatalf("%v: %+v; want %+v", k, got, want[k])
			}
		}
	}
	var uses []addrEntry
	for k, u := range want {
		// One entry per use, as build makes them, in no order.
		for range u.vips {
			uses = append(uses, addrEntry{k, addrUse{vips: 1}})
		}
		for range u.backends {
			uses = append(uses, addrEntry{k, addrUse{backends: 1}})
		}
	}
	rng.Shuffle(len(uses), func(i, j int) { uses[i], uses[j] = uses[j], uses[i] })
	x := buildAddrIndex(slices.Values(uses))
	check(x, want)
	for range 200 {
		changes := map[addrKey]addrUse{}
		for range rng.IntN(50) {
			u := addrUse{}
			if rng.IntN(3) > 0 {
				u = addrUse{vips: rng.Int32N(2), backends: rng.Int32N(2) + 1}
			}
			changes[key()] = u
		}
		before := map[addrKey]addrUse{}
		for k, u := range want {
			before[k] = u
		}
		next := x.with(changes)
		for k, u := range changes {
			if u == (addrUse{}) {
				delete(want, k)
			} else {
				want[k] = u
			}
		}
		check(next, want)
		check(x, before)
		x = next
	}
}

// TestAddrIndexWithMany checks that withMany, which with takes for big
// change sets, gives the index withFew gives, through sets, changes and
// removals (of present and absent addresses) that touch most buckets, and
// leaves the index it started from as it was.
func TestAddrIndexWithMany(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	key := func() addrKey { return addrKey{uint64(rng.IntN(2)) << 60, uint64(rng.IntN(400_000))} }
	var uses []addrEntry
	for range 100_000 {
		uses = append(uses, addrEntry{key(), addrUse{vips: rng.Int32N(2), backends: 1}})
	}
	x := buildAddrIndex(slices.Values(uses))
	entries := func(x addrIndex) map[addrKey]addrUse {
		m := map[addrKey]addrUse{}
		for _, b := range x.buckets.All() {
			for i, e := range b {
				if i > 0 && compareEntry(b[i-1], e) >= 0 {
					t.Fatalf("bucket out of order at %v", e.k)
				}
				m[e.k] = e.u
			}
		}
		return m
	}
	for round := range 4 {
		changes := map[addrKey]addrUse{}
		for range manyChanges + rng.IntN(200_000) {
			u := addrUse{}
			if rng.IntN(4) > 0 {
				u = addrUse{vips: rng.Int32N(2), backends: rng.Int32N(3)}
			}
			changes[key()] = u
		}
		before := entries(x)
		many, few := x.withMany(changes), x.withFew(changes)
		if got, want := entries(many), entries(few); len(got) != len(want) {
			t.Fatalf("round %d: withMany has %d addresses, withFew %d", round, len(got), len(want))
		} else {
			for k, u := range want {
				if got[k] != u {
					t.Fatalf("round %d: %v: withMany %+v, withFew %+v", round, k, got[k], u)
				}
			}
		}
		if x.with(changes).len() != many.len() {
			t.Fatalf("round %d: with did not take withMany's result", round)
		}
		after := entries(x)
		if len(after) != len(before) {
			t.Fatalf("round %d: the base index changed", round)
		}
		x = many
	}
}

// TestAddrIndexWithManyAllocs bounds what withMany allocates for a change
// set of every address into an empty index, as the first sync of a big
// state makes: the changes' array, the buckets, and the persistent map's
// nodes: 91 bytes a change here, where withFew's map of appended slices
// takes 170 (and more for bigger sets, as its slices double).
func TestAddrIndexWithManyAllocs(t *testing.T) {
	const n = 200_000
	changes := make(map[addrKey]addrUse, n)
	for i := range n {
		changes[addrKey{0, uint64(i)}] = addrUse{backends: 1}
	}
	var x addrIndex
	var y addrIndex
	CheckBytesPer(t, "with", "change into an empty index", n, 120, func() { y = x.with(changes) })
	if y.len() != n {
		t.Fatalf("%d addresses, want %d", y.len(), n)
	}
}

// TestBuildAddrIndexAllocs bounds what buildAddrIndex allocates for the
// uses of a big state as a load builds it (usesOf: services of one VIP and
// ten backends, the backends shared by several services): the one array
// the uses are ordered in, the scratch of its largest group, the summed
// buckets and the persistent map's nodes: about 31 bytes a use here.
// Ordering the uses through a slice of them and a scratch copy of it, as
// build did before, took 48 bytes a use more, and 2^16 buckets' nodes 10.
func TestBuildAddrIndexAllocs(t *testing.T) {
	const services, perService = 50_000, 10
	entries := make([]*Entry, services)
	for i := range entries {
		dp := &dataplane.Service{VIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96 + byte(i>>16), byte(i >> 8), byte(i)})}}
		for b := range perService {
			a := (i*perService + b) % 32768
			dp.Backends = append(dp.Backends, dataplane.Backend{IP: netip.AddrFrom4([4]byte{10, 128, byte(a >> 8), byte(a)})})
		}
		entries[i] = &Entry{Dataplane: dp}
	}
	uses := services * (1 + perService)
	var x addrIndex
	CheckBytesPer(t, "buildAddrIndex", "use", uses, 40, func() { x = buildAddrIndex(usesOf(entries)) })
	if want := services + 32768; x.len() != want {
		t.Fatalf("%d addresses, want %d", x.len(), want)
	}
}
