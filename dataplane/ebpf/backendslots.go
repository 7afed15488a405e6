package ebpf

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"sync"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The backend map's memory in vipd. The kernel inserts every page of a
// mapping of an mmapable array when it is mapped (remap_vmalloc_range), so
// whatever part of the map vipd keeps mapped is resident in vipd, however
// few of its slots hold backends: the whole map is 28 MiB at the default
// 1.2 million slots, and the slots of a million backends 23 MiB. vipd keeps
// none of it mapped:
//   - writes (backendSlots) map, for each run of the IDs they write, only
//     the pages of that run's slots, at most backendWindow slots' worth,
//     and unmap them before they map the next run or return;
//   - whole-map reads (restore, audit, verify) go through a read-only
//     window of backendWindow slots moved along the map (forEachBackend),
//     unmapped as it moves on.

// backendWindow is the most slots one mapping of the backend map spans:
// 768 KiB, a whole number of pages of any size up to 256 KiB (32768 slots
// of 24 bytes are 3 × 2^18 bytes).
const backendWindow = 32768

// backendSlots writes the slots of the backend map through short-lived
// mappings of it (eachSlot): a write of a few backends maps a page or two,
// the first sync of a million backends maps 768 KiB at a time. Nothing of
// the map stays mapped between writes.
//
// mu serializes the writes; largest is the most bytes one mapping of a
// write has spanned (the tests check the bound).
type backendSlots struct {
	m *ebpf.Map

	mu      sync.Mutex
	largest int
}

func newBackendSlots(m *ebpf.Map) *backendSlots { return &backendSlots{m: m} }

// mapBytes is the size of a mapping of all of m: its slots (a BPF array's
// values are 8-byte aligned), page-rounded.
func mapBytes(m *ebpf.Map) int {
	return pageRound(int((m.ValueSize()+7)&^7) * int(m.MaxEntries()))
}

func pageRound(n int) int {
	page := os.Getpagesize()
	return (n + page - 1) / page * page
}

// eachSlot calls fn(i, slot) for each ids[i] below the map's max_entries,
// slot being the bytes of that ID's slot in a read-write shared mapping of
// the map. The IDs are taken in ascending order (the order of ids among
// equal ones), in runs whose slots span at most backendWindow slots' bytes:
// each run is written through a mapping of just the pages of its slots,
// removed before the next run's is made and before eachSlot returns. fn
// must not keep slot. It returns the IDs past the map, which it skips, in
// ascending order. The caller holds mu.
func (b *backendSlots) eachSlot(ids []uint32, fn func(i int, slot []byte)) (past []uint32, err error) {
	if uintptr(b.m.ValueSize()) != unsafe.Sizeof(bpfBackend{}) {
		return nil, fmt.Errorf("backend map: value size %d, want %d", b.m.ValueSize(), unsafe.Sizeof(bpfBackend{}))
	}
	order := ascendingOrder(ids)
	at := func(k int) int {
		if order == nil {
			return k
		}
		return int(order[k])
	}
	limit, page := b.m.MaxEntries(), os.Getpagesize()
	for k := 0; k < len(ids); {
		first := ids[at(k)]
		if first >= limit {
			// Ascending: the rest are past the map too.
			for ; k < len(ids); k++ {
				past = append(past, ids[at(k)])
			}
			break
		}
		lo := int(first) * backendSize / page * page
		end := k + 1
		for end < len(ids) {
			id := ids[at(end)]
			if id >= limit || (int(id)+1)*backendSize-lo > backendWindow*backendSize {
				break
			}
			end++
		}
		hi := pageRound((int(ids[at(end-1)]) + 1) * backendSize)
		mem, err := unix.Mmap(b.m.FD(), int64(lo), hi-lo, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return nil, fmt.Errorf("map backend slots %d..%d: %w", first, ids[at(end-1)], err)
		}
		b.largest = max(b.largest, len(mem))
		for ; k < end; k++ {
			i := at(k)
			off := int(ids[i])*backendSize - lo
			fn(i, mem[off:off+backendSize])
		}
		if err := unix.Munmap(mem); err != nil {
			return nil, fmt.Errorf("unmap backend slots: %w", err)
		}
	}
	return past, nil
}

// ascendingOrder returns the indexes of ids in ascending order of ID,
// stable, or nil when ids ascend already (the usual case: a sync's
// backends get IDs in the order they are written).
func ascendingOrder(ids []uint32) []int32 {
	if slices.IsSorted(ids) {
		return nil
	}
	order := make([]int32, len(ids))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortStableFunc(order, func(a, b int32) int { return cmp.Compare(ids[a], ids[b]) })
	return order
}
