package ebpf

// Backend IDs and the backend map. vipd_backends is a BPF array indexed by
// backend ID, written and read through its mmap (no syscall per entry).
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

// backendMemory returns the mmap of the backend map.
func backendMemory(m *ebpf.Map) (*ebpf.Memory, error) {
	mem, err := m.Memory()
	if err != nil {
		return nil, fmt.Errorf("map the backend map: %w", err)
	}
	return mem, nil
}

// usedOffset is the offset of bpfBackend.Used in a slot.
const usedOffset = int64(unsafe.Offsetof(bpfBackend{}.Used))

// putBackends writes vals[i] into the slot of ids[i], through the map's
// mmap. An ID past the map fails with errMapFull; the slots before it are
// written.
//
// A free slot gets its address and port first and its used byte last, so
// that a program that sees it used sees the rest too (on a CPU that keeps
// stores in order, as x86 does): a conntrack entry whose ID was recycled
// never compares equal to a half-written backend. A used slot (a rewrite)
// is written in one copy, as the map update syscall would.
func putBackends(m *ebpf.Map, ids []uint32, vals []bpfBackend) error {
	if len(ids) == 0 {
		return nil
	}
	mem, err := backendMemory(m)
	if err != nil {
		return err
	}
	limit := m.MaxEntries()
	for i, id := range ids {
		if id >= limit {
			return fmt.Errorf("%w: backend ID %d: the backend map has %d slots", errMapFull, id, limit)
		}
		off := int64(id) * int64(backendSize)
		var cur [1]byte
		if _, err := mem.ReadAt(cur[:], off+usedOffset); err != nil {
			return fmt.Errorf("read backend %d: %w", id, err)
		}
		v := vals[i]
		used := v.Used
		if cur[0] == 0 {
			v.Used = 0
		}
		if _, err := mem.WriteAt(unsafe.Slice((*byte)(unsafe.Pointer(&v)), backendSize), off); err != nil {
			return fmt.Errorf("write backend %d: %w", id, err)
		}
		if cur[0] == 0 && used != 0 {
			if _, err := mem.WriteAt([]byte{used}, off+usedOffset); err != nil {
				return fmt.Errorf("write backend %d: %w", id, err)
			}
		}
	}
	return nil
}

// clearBackends zeroes the slots of ids (frees them), through the map's
// mmap, the used byte first (see putBackends). IDs past the map have no
// slot to clear.
func clearBackends(m *ebpf.Map, ids []uint32) error {
	if len(ids) == 0 {
		return nil
	}
	mem, err := backendMemory(m)
	if err != nil {
		return err
	}
	var zero [unsafe.Sizeof(bpfBackend{})]byte
	limit := m.MaxEntries()
	for _, id := range ids {
		if id >= limit {
			continue
		}
		off := int64(id) * int64(backendSize)
		if _, err := mem.WriteAt(zero[:1], off+usedOffset); err != nil {
			return fmt.Errorf("clear backend %d: %w", id, err)
		}
		if _, err := mem.WriteAt(zero[:], off); err != nil {
			return fmt.Errorf("clear backend %d: %w", id, err)
		}
	}
	return nil
}

// forEachBackend calls fn with every used slot of the backend map (ID and
// backend), in ID order, reading through the map's mmap; a map that cannot
// be mapped (opened read-only) is read with batch lookups.
func forEachBackend(m *ebpf.Map, fn func(uint32, bpfBackend)) error {
	mem, err := m.Memory()
	if err != nil {
		// Not mappable here (opened read-only, say): batch lookups.
		return forEach(m, func(id uint32, b bpfBackend) {
			if b.Used != 0 {
				fn(id, b)
			}
		})
	}
	const chunk = 4096
	buf := make([]bpfBackend, chunk)
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), chunk*backendSize)
	n := m.MaxEntries()
	for lo := uint32(0); lo < n; lo += chunk {
		k := min(n-lo, chunk)
		if _, err := mem.ReadAt(raw[:int(k)*backendSize], int64(lo)*int64(backendSize)); err != nil {
			return fmt.Errorf("read backends %d-%d: %w", lo, lo+k-1, err)
		}
		for i := range k {
			if buf[i].Used != 0 {
				fn(lo+i, buf[i])
			}
		}
	}
	return nil
}
