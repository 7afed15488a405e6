package ebpf

import (
	"math/rand/v2"
	"net/netip"
	"testing"
)

// TestBackendTableMatchesMap runs random puts (new keys, moves of a key to
// another ID, reference changes), deletions and deletions during all()
// against a plain map, IPv4 and IPv6 keys mixed, and checks that get, len
// and all agree with it after every step.
func TestBackendTableMatchesMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, reserve := range []int{0, 3000} {
		tab := newBackendTable()
		if reserve > 0 {
			tab.reserve(reserve, 10, reserve)
		}
		want := map[bePacked]backendRef{}
		key := func() bePacked {
			// Few distinct addresses, so that keys repeat and collide.
			if rng.IntN(8) == 0 {
				return beKey{addr: netip.AddrFrom16([16]byte{0xfd, 15: byte(rng.IntN(32))}), port: uint16(rng.IntN(4))}.packed()
			}
			return beKey{addr: netip.AddrFrom4([4]byte{10, 0, byte(rng.IntN(8)), byte(rng.IntN(256))}), port: uint16(8080 + rng.IntN(4))}.packed()
		}
		// ids hands out IDs no key in want holds.
		held := map[uint32]bool{}
		newID := func() uint32 {
			for {
				id := uint32(rng.IntN(20000))
				if !held[id] {
					return id
				}
			}
		}
		check := func(step int) {
			t.Helper()
			if tab.len() != len(want) {
				t.Fatalf("step %d: len %d, want %d", step, tab.len(), len(want))
			}
			n := 0
			for k, r := range tab.all() {
				n++
				if w, ok := want[k]; !ok || w != r {
					t.Fatalf("step %d: all yields %s %+v, want %+v (%v)", step, k, r, w, ok)
				}
			}
			if n != len(want) {
				t.Fatalf("step %d: all yields %d, want %d", step, n, len(want))
			}
		}
		for step := range 40000 {
			k := key()
			switch op := rng.IntN(10); {
			case op < 6:
				r, ok := want[k]
				if !ok || rng.IntN(4) == 0 {
					if ok {
						delete(held, r.id)
					}
					r.id = newID()
					held[r.id] = true
				}
				r.refs = int32(rng.IntN(5))
				tab.put(k, r)
				want[k] = r
			case op < 9:
				tab.del(k)
				delete(held, want[k].id)
				delete(want, k)
			default:
				for k2 := range tab.all() {
					if rng.IntN(3) == 0 {
						tab.del(k2)
						delete(held, want[k2].id)
						delete(want, k2)
					}
				}
			}
			r, ok := tab.get(k)
			if w, wok := want[k]; ok != wok || r != w {
				t.Fatalf("step %d: get %s: %+v %v, want %+v %v", step, k, r, ok, w, wok)
			}
			if step%1000 == 0 {
				check(step)
			}
		}
		check(-1)
		for k, r := range want {
			if got, ok := tab.get(k); !ok || got != r {
				t.Fatalf("get %s: %+v %v, want %+v", k, got, ok, r)
			}
		}
		tab.fit(1<<20, 1<<20)
		check(-2)
	}
}
