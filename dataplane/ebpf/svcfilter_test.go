package ebpf

import (
	"net/netip"
	"testing"
)

// TestMarkFrontendsDense checks that a large markFrontends (which reads
// the whole filter and keeps its words in arrays) sets the bit of every
// key it is given, keeps the bits already set, and sets no other.
func TestMarkFrontendsDense(t *testing.T) {
	r := newPREnv(t)
	m := r.objs.VipdSvcAddrs
	key := func(i int) bpfSvcKey {
		return svcKeyOf(feKey{addr: netip.AddrFrom4([4]byte{10, 9, byte(i >> 8), byte(i)}), port: 80, proto: ipprotoTCP}, 0)
	}
	want := make([]uint64, svcFilterBits/64)
	mark := func(lo, hi int) {
		var keys []bpfSvcKey
		for i := lo; i < hi; i++ {
			keys = append(keys, key(i))
			b := svcFilterBit(key(i))
			want[b/64] |= 1 << (b % 64)
		}
		if err := markFrontends(m, keys); err != nil {
			t.Fatalf("mark %d keys: %v", len(keys), err)
		}
	}
	mark(0, 10)                     // the small path: word by word
	mark(10, 10+4*svcFilterReadAll) // the dense path
	for w := range want {
		var v uint64
		if err := m.Lookup(uint32(w), &v); err != nil {
			t.Fatalf("lookup word %d: %v", w, err)
		}
		if v != want[w] {
			t.Fatalf("word %d is %#x, want %#x", w, v, want[w])
		}
	}
}
