package store

import (
	"math/rand/v2"
	"testing"
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
	x := buildAddrIndex(uses)
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
