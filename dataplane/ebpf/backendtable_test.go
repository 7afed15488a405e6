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

// TestUsedInMatchesUsedOf: the referenced backends read in place from the
// backend table (usedIn, an audit's) say the same of every ID as their
// copy (usedOf, a drift check's), IPv4 and IPv6 backends mixed, with and
// without references, and IDs freed.
func TestUsedInMatchesUsedOf(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	tab := newBackendTable()
	keys := map[uint32]bePacked{}
	for id := uint32(1); id < 3000; id++ {
		if rng.IntN(5) == 0 {
			continue // a free ID
		}
		var k bePacked
		if rng.IntN(6) == 0 {
			k = beKey{addr: netip.AddrFrom16([16]byte{0xfd, 14: byte(id >> 8), 15: byte(id)}), port: 80}.packed()
		} else {
			k = beKey{addr: netip.AddrFrom4([4]byte{10, 1, byte(id >> 8), byte(id)}), port: 8080}.packed()
		}
		tab.put(k, backendRef{id: id, refs: int32(rng.IntN(3))})
		keys[id] = k
	}
	// Some freed after being held.
	for id, k := range keys {
		if rng.IntN(10) == 0 {
			tab.del(k)
			delete(keys, id)
		}
	}
	in, of := usedIn(&tab), usedOf(&tab, 3000)
	if in.n != of.n {
		t.Fatalf("usedIn counts %d referenced backends, usedOf %d", in.n, of.n)
	}
	used := 0
	for id := uint32(0); id < 3100; id++ {
		kIn, okIn := in.key(id)
		kOf, okOf := of.key(id)
		if okIn != okOf || (okIn && kIn != kOf) {
			t.Fatalf("backend %d: usedIn says %#x %v, usedOf %#x %v", id, kIn, okIn, kOf, okOf)
		}
		if okIn {
			used++
		}
	}
	if used != in.n || used == 0 || used == len(keys) {
		t.Fatalf("%d IDs referenced of %d held, counted %d: want some, not all", used, len(keys), in.n)
	}
}
