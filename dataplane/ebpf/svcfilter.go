package ebpf

import (
	"github.com/cilium/ebpf"
)

// svcFilterBits is SVC_ADDRS_BITS of bpf/maps.h: the bits of vipd_svc_addrs.
const svcFilterBits = 1 << 19

// svcFilterReadAll is how many words a markFrontends call may touch before
// it reads the whole filter in batches instead of word by word.
const svcFilterReadAll = 256

// mix32 is bpf/lb.h's mix32 (the murmur3 finaliser).
func mix32(h uint32) uint32 {
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

// svcFilterBit is bpf/vipd.c's bit of vipd_svc_addrs for the frontend of k
// (its address, port and protocol; scope and slot do not count).
func svcFilterBit(k bpfSvcKey) uint32 {
	h := uint32(0x27d4eb2f)
	for _, w := range k.Addr.W {
		h ^= w
	}
	return mix32(h^(uint32(k.Port)<<16|uint32(k.Proto))) % svcFilterBits
}

// markFrontends sets the vipd_svc_addrs bits of the frontends of keys, so
// that the packet path looks them up in vipd_services. It must run before
// those entries are written; bits are never cleared (a stale bit costs a
// lookup, a missing one a dead frontend). Calls must not run concurrently
// (vipd's writes are serialised by the programmer).
func markFrontends(m *ebpf.Map, keys []bpfSvcKey) error {
	if len(keys) == 0 {
		return nil
	}
	if len(keys) > svcFilterReadAll {
		return markFrontendsDense(m, keys)
	}
	want := map[uint32]uint64{}
	for _, k := range keys {
		b := svcFilterBit(k)
		want[b/64] |= 1 << (b % 64)
	}
	var ks []uint32
	var vs []uint64
	for w, bits := range want {
		var v uint64
		if err := m.Lookup(w, &v); err != nil {
			return err
		}
		if v|bits != v {
			ks = append(ks, w)
			vs = append(vs, v|bits)
		}
	}
	return batchPut(m, ks, vs)
}

// markFrontendsDense is markFrontends for many keys: it reads the whole
// filter in batches, and keeps the words it wants and reads in two arrays
// of the filter's size (64 KiB each), where maps of its words would cost
// ten times that in all while they grow, on every chunk of a large apply.
func markFrontendsDense(m *ebpf.Map, keys []bpfSvcKey) error {
	want := make([]uint64, svcFilterBits/64)
	for _, k := range keys {
		b := svcFilterBit(k)
		want[b/64] |= 1 << (b % 64)
	}
	cur := make([]uint64, svcFilterBits/64)
	if err := forEach(m, func(k uint32, v uint64) {
		if int(k) < len(cur) {
			cur[k] = v
		}
	}); err != nil {
		return err
	}
	var ks []uint32
	var vs []uint64
	for w, bits := range want {
		if v := cur[w]; v|bits != v {
			ks = append(ks, uint32(w))
			vs = append(vs, v|bits)
		}
	}
	return batchPut(m, ks, vs)
}
