package ebpf

// Backend IDs and the backend map. vipd_backends is a BPF array indexed by
// backend ID, written and read through mappings of its memory (no syscall
// per entry), of the part vipd uses only (backendslots.go).
//
// The rule that keeps flows safe while IDs are recycled:
//   - ID 0 is "none"; IDs stay below the map's max_entries.
//   - vipd hands out never-used IDs first (nextBackend), then freed ones in
//     the order they were freed, oldest first (freeIDs), so that an ID
//     rests as long as it can before it names another backend.
//   - A backend's slot is written before any frontend names its ID, and
//     zeroed (used 0: a free slot) once no frontend does; only then does
//     its ID join freeIDs.
//   - Conntrack, affinity and socket entries hold IDs that may have been
//     recycled since. The programs trust such an ID only for a backend
//     that is a member of the frontend now: a tracked flow keeps its
//     backend only while the slot at its backend_id still holds its
//     nat_addr:nat_port (backend_is in bpf/vipd.c), and the affinity and
//     socket paths read the address from the slot. Flow events carry the
//     backend's address and port, from the conntrack entry, so vipd names
//     a flow's backend by them, never by its ID.

import (
	"fmt"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// backendSize is the size of one vipd_backends slot: struct backend.
const backendSize = int(unsafe.Sizeof(bpfBackend{}))

// backendUsed is BACKEND_USED of bpf/maps.h: bpfBackend.Used of a slot a
// backend holds.
const backendUsed = 1

// idQueue is a FIFO of freed backend IDs: taken oldest-freed first.
type idQueue struct {
	ids  []uint32
	head int
}

// push appends id, the most recently freed.
func (q *idQueue) push(id uint32) {
	if q.head > 0 && q.head >= len(q.ids)/2 {
		// Reclaim the taken half instead of growing forever.
		n := copy(q.ids, q.ids[q.head:])
		q.ids, q.head = q.ids[:n], 0
	}
	q.ids = append(q.ids, id)
}

// pop takes the oldest freed ID; false when there is none.
func (q *idQueue) pop() (uint32, bool) {
	if q.head == len(q.ids) {
		return 0, false
	}
	id := q.ids[q.head]
	q.head++
	if q.head == len(q.ids) {
		q.ids, q.head = q.ids[:0], 0
	}
	return id, true
}

// len is the number of freed IDs waiting.
func (q *idQueue) len() int { return len(q.ids) - q.head }

// backendCapacity is how many backends the backend map holds: its slots
// but slot 0 ("none").
func backendCapacity(m *ebpf.Map) int { return max(int(m.MaxEntries())-1, 0) }

// newBackendID hands out a backend ID: a never-used one while there is one
// below the map's size, else the oldest freed one. With neither (the map is
// full, which checkCapacity rules out beforehand) it hands out one past the
// map, which the write then refuses with errMapFull.
func (p *programmer) newBackendID() uint32 {
	if p.nextBackend < p.backendLimit() {
		p.nextBackend++
		return p.nextBackend - 1
	}
	if id, ok := p.freeIDs.pop(); ok {
		return id
	}
	p.nextBackend++
	return p.nextBackend - 1
}

// freeBackendID queues id for reuse. The caller zeroes its slot before the
// next apply allocates: in the same apply, after the frontends let go.
func (p *programmer) freeBackendID(id uint32) {
	if id != 0 && id < p.backendLimit() {
		p.freeIDs.push(id)
	}
}

// backendLimit is the first ID past the backend map: its max_entries.
// Without a map (tests of the pure steps) there is no limit.
func (p *programmer) backendLimit() uint32 {
	if p.maps == nil || p.maps.VipdBackends == nil {
		return ^uint32(0)
	}
	return p.maps.VipdBackends.MaxEntries()
}

// usedOffset is the offset of bpfBackend.Used in a slot.
const usedOffset = int64(unsafe.Offsetof(bpfBackend{}.Used))

// putBackends writes vals[i] into the slot of ids[i], through b's
// mappings of the backend map (eachSlot). IDs past the map fail with
// errMapFull, naming the lowest; every slot within the map is written.
//
// A free slot gets its address and port first and its used byte last, so
// that a program that sees it used sees the rest too (on a CPU that keeps
// stores in order, as x86 does): a conntrack entry whose ID was recycled
// never compares equal to a half-written backend. A used slot (a rewrite)
// is written in one copy, as the map update syscall would.
func putBackends(b *backendSlots, ids []uint32, vals []bpfBackend) error {
	if len(ids) == 0 {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	past, err := b.eachSlot(ids, func(i int, slot []byte) {
		v := vals[i]
		used := v.Used
		free := slot[usedOffset] == 0
		if free {
			v.Used = 0
		}
		copy(slot, unsafe.Slice((*byte)(unsafe.Pointer(&v)), backendSize))
		if free && used != 0 {
			slot[usedOffset] = used
		}
	})
	if err != nil {
		return err
	}
	if len(past) > 0 {
		return fmt.Errorf("%w: backend ID %d: the backend map has %d slots", errMapFull, past[0], b.m.MaxEntries())
	}
	return nil
}

// clearBackends zeroes the slots of ids (frees them), through b's mappings
// of the backend map, the used byte first (see putBackends). IDs past the
// map have no slot to clear.
func clearBackends(b *backendSlots, ids []uint32) error {
	if len(ids) == 0 {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var zero [unsafe.Sizeof(bpfBackend{})]byte
	_, err := b.eachSlot(ids, func(_ int, slot []byte) {
		slot[usedOffset] = 0
		copy(slot, zero[:])
	})
	return err
}

// forEachBackend calls fn with every used slot of the backend map (ID and
// backend), in ID order. It reads the whole map through a window mapped
// read-only and moved along it (backendWindow), so that the pages it has
// read leave vipd's resident memory again; a map that cannot be mapped
// (opened read-only) is read with batch lookups.
func forEachBackend(m *ebpf.Map, fn func(uint32, bpfBackend)) error {
	n := m.MaxEntries()
	size := mapBytes(m)
	for lo := uint32(0); lo < n; lo += backendWindow {
		k := min(n-lo, backendWindow)
		off := int(lo) * backendSize
		win, err := unix.Mmap(m.FD(), int64(off), min(backendWindow*backendSize, size-off), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			if lo == 0 {
				// Not mappable here (opened read-only, say): batch lookups.
				return forEach(m, func(id uint32, b bpfBackend) {
					if b.Used != 0 {
						fn(id, b)
					}
				})
			}
			return fmt.Errorf("map backends %d-%d: %w", lo, lo+k-1, err)
		}
		for i, b := range unsafe.Slice((*bpfBackend)(unsafe.Pointer(unsafe.SliceData(win))), k) {
			if b.Used != 0 {
				fn(lo+uint32(i), b)
			}
		}
		if err := unix.Munmap(win); err != nil {
			return fmt.Errorf("unmap backends %d-%d: %w", lo, lo+k-1, err)
		}
	}
	return nil
}
