package ebpf

import (
	"fmt"
	"os"
	"sync"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The backend map's memory in vipd. The kernel inserts every page of a
// mapping of an mmapable array when it is mapped (remap_vmalloc_range), so
// a mapping of the whole map (28 MiB at the default 1.2 million slots)
// is resident in vipd however few slots hold backends. vipd maps only what
// it uses:
//   - writes go through backendSlots, a read-write mapping of the map's
//     first pages, those up to the highest ID written, grown as higher IDs
//     come (backend IDs are handed out never-used first, lowest first, so
//     the highest ID is about the number of backends);
//   - whole-map reads (restore, audit, verify) go through a small
//     read-only window moved along the map (forEachBackend), unmapped as
//     it moves on.

// backendWindow is how many slots forEachBackend maps at a time: 768 KiB,
// a whole number of pages of any size up to 256 KiB (32768 slots of 24
// bytes are 3 × 2^18 bytes).
const backendWindow = 32768

// backendGrowMin is the least a growing backendSlots maps: 64 KiB.
const backendGrowMin = 64 << 10

// backendSlots is a mapping, read-write and shared, of the first pages of
// the backend map: its slots 0..len(mem)/backendSize-1. It grows by
// mapping a longer prefix anew, after unmapping the old one (never both at
// once: the pages of both would count), by at least an eighth, so that a
// map filled slot by slot is mapped again only a few dozen times.
//
// The mapping is vipd's own: nothing but putBackends and clearBackends
// reads or writes it, under mu, and no slice of it outlives their call;
// close unmaps it.
type backendSlots struct {
	m *ebpf.Map

	mu  sync.Mutex
	mem []byte
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

// slots returns the mapping, grown if need be to hold the slots of ids
// (but those past the map's max_entries). The caller holds mu.
func (b *backendSlots) slots(ids []uint32) ([]byte, error) {
	limit := b.m.MaxEntries()
	top := -1
	for _, id := range ids {
		if id < limit {
			top = max(top, int(id))
		}
	}
	need := (top + 1) * backendSize
	if need <= len(b.mem) {
		return b.mem, nil
	}
	if uintptr(b.m.ValueSize()) != unsafe.Sizeof(bpfBackend{}) {
		return nil, fmt.Errorf("backend map: value size %d, want %d", b.m.ValueSize(), unsafe.Sizeof(bpfBackend{}))
	}
	size := min(pageRound(max(need, len(b.mem)+len(b.mem)/8, backendGrowMin)), mapBytes(b.m))
	if err := b.unmap(); err != nil {
		return nil, err
	}
	mem, err := unix.Mmap(b.m.FD(), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map the backend map (%d bytes): %w", size, err)
	}
	b.mem = mem
	return mem, nil
}

// mapped is how many bytes of the map b has mapped.
func (b *backendSlots) mapped() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.mem)
}

func (b *backendSlots) unmap() error {
	if b.mem == nil {
		return nil
	}
	err := unix.Munmap(b.mem)
	b.mem = nil
	if err != nil {
		return fmt.Errorf("unmap the backend map: %w", err)
	}
	return nil
}

// close unmaps the backend map. It does not close the map.
func (b *backendSlots) close() error {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.unmap()
}
