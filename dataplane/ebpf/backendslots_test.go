package ebpf

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/vipd/vipd/dataplane"
)

// bpfMapMappings returns the size of each mapping of a BPF map in this
// process (/proc/self/maps names them anon_inode:bpf-map) by its start
// address, but those in before.
func bpfMapMappings(t *testing.T, before map[uintptr]int) map[uintptr]int {
	t.Helper()
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[uintptr]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasSuffix(line, "anon_inode:bpf-map") {
			continue
		}
		var lo, hi uintptr
		if _, err := fmt.Sscanf(line, "%x-%x", &lo, &hi); err != nil {
			t.Fatalf("parse %q: %v", line, err)
		}
		if n, ok := before[lo]; !ok || n != int(hi-lo) {
			out[lo] = int(hi - lo)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// wantMapped checks that b maps exactly size bytes of its map, and that
// the process has no other mapping of a BPF map but those in before: the
// whole map is never mapped, and the windows of whole-map reads are gone.
func wantMapped(t *testing.T, b *backendSlots, before map[uintptr]int, size int) {
	t.Helper()
	if got := b.mapped(); got != size {
		t.Fatalf("the backend map's mapping is %d bytes, want %d (of %d)", got, size, mapBytes(b.m))
	}
	want := map[uintptr]int{}
	if size > 0 {
		want[uintptr(unsafe.Pointer(unsafe.SliceData(b.mem)))] = size
	}
	if got := bpfMapMappings(t, before); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("BPF map mappings (start: bytes) %v, want %v: b's only", got, want)
	}
}

// TestBackendSlotsMapOnlyWhatIsUsed: the backend map is mapped up to the
// highest ID written, grown as higher IDs come (issue 18: a mapping of
// the whole map is resident whole); slots past the old mapping read and
// write as any other; reading the whole map leaves nothing mapped; close
// unmaps.
func TestBackendSlotsMapOnlyWhatIsUsed(t *testing.T) {
	const slots = 1 << 20 // 24 MiB, as a large default map
	m := newIDMaps(t, slots).VipdBackends
	whole := mapBytes(m)
	before := bpfMapMappings(t, nil)
	b := newBackendSlots(m)
	t.Cleanup(func() { b.close() })
	wantMapped(t, b, before, 0)

	be := func(i int) bpfBackend {
		ap := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 8080)
		return bpfBackend{Addr: prAddrOf(ap.Addr()), Port: prBE16(ap.Port()), Used: backendUsed}
	}
	lookup := func(id uint32) bpfBackend {
		t.Helper()
		var v bpfBackend
		if err := m.Lookup(id, &v); err != nil {
			t.Fatalf("lookup backend %d: %v", id, err)
		}
		return v
	}
	put := func(ids ...uint32) {
		t.Helper()
		vals := make([]bpfBackend, len(ids))
		for i, id := range ids {
			vals[i] = be(int(id))
		}
		if err := putBackends(b, ids, vals); err != nil {
			t.Fatalf("put backends %v: %v", ids, err)
		}
		for i, id := range ids {
			if got := lookup(id); got != vals[i] {
				t.Fatalf("backend %d reads back as %+v through the syscall, want %+v", id, got, vals[i])
			}
		}
	}

	put(1, 2, 3)
	wantMapped(t, b, before, backendGrowMin)

	// Past the mapping: it grows to hold the ID, by an eighth at least.
	top := uint32(backendGrowMin/backendSize + 10)
	put(top)
	wantMapped(t, b, before, pageRound(backendGrowMin+backendGrowMin/8))
	far := uint32(100_000)
	put(far)
	wantMapped(t, b, before, pageRound(int(far+1)*backendSize))
	if b.mapped() >= whole/4 {
		t.Fatalf("mapped %d of %d bytes for 100,000 slots of 1,048,576", b.mapped(), whole)
	}
	// The slots written before the growth kept their backends.
	for _, id := range []uint32{1, 2, 3, top} {
		if got, want := lookup(id), be(int(id)); got != want {
			t.Fatalf("backend %d is %+v after the mapping grew, want %+v", id, got, want)
		}
	}

	// A slot another vipd wrote past the mapping (a restart's) is zeroed
	// when freed: clearing grows the mapping too.
	stale := uint32(200_000)
	v := be(int(stale))
	if err := m.Put(stale, &v); err != nil {
		t.Fatal(err)
	}
	if err := clearBackends(b, []uint32{2, stale}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []uint32{2, stale} {
		if got := lookup(id); got != (bpfBackend{}) {
			t.Fatalf("freed backend %d is %+v, want zeroed", id, got)
		}
	}
	wantMapped(t, b, before, pageRound(int(stale+1)*backendSize))

	// A whole-map read sees every used slot, and leaves only b's mapping.
	var seen []uint32
	if err := forEachBackend(m, func(id uint32, got bpfBackend) {
		if got != be(int(id)) {
			t.Errorf("backend %d read as %+v", id, got)
		}
		seen = append(seen, id)
	}); err != nil {
		t.Fatal(err)
	}
	if want := []uint32{1, 3, top, far}; fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Fatalf("forEachBackend saw %v, want %v", seen, want)
	}
	wantMapped(t, b, before, pageRound(int(stale+1)*backendSize))

	// An ID past the map is refused; the mapping stays.
	if err := putBackends(b, []uint32{slots}, []bpfBackend{be(1)}); err == nil {
		t.Fatal("wrote an ID past the map")
	}
	if err := b.close(); err != nil {
		t.Fatal(err)
	}
	wantMapped(t, b, before, 0)
}

// TestProgRunBackendSlotsGrown: the programs read the slots written after
// the mapping grew (a backend whose ID is past the first mapping).
func TestProgRunBackendSlotsGrown(t *testing.T) {
	r := newPREnv(t)
	b := newBackendSlots(r.objs.VipdBackends)
	t.Cleanup(func() { b.close() })
	low := prBackend{id: 1, addr: prAP("198.18.1.6:8080")}
	high := prBackend{id: r.objs.VipdBackends.MaxEntries() - 1, addr: prAP("198.18.1.7:8080")}
	if int(high.id)*backendSize < backendGrowMin {
		t.Fatalf("test setup: backend %d is within the first mapping", high.id)
	}
	fe := prFrontend{vip: prVIP4For(prUDP), proto: prUDP, id: 1}
	for _, be := range []prBackend{low, high} {
		v := bpfBackend{Addr: prAddrOf(be.addr.Addr()), Port: prBE16(be.addr.Port()), Used: backendUsed}
		if err := putBackends(b, []uint32{be.id}, []bpfBackend{v}); err != nil {
			t.Fatal(err)
		}
		r.setMember(fe, be.id, prMemberEligible)
	}
	if b.mapped() != mapBytes(r.objs.VipdBackends) {
		t.Fatalf("mapped %d bytes, want all %d of this small map", b.mapped(), mapBytes(r.objs.VipdBackends))
	}
	r.setSlots(fe, high)
	in := prUDPFrame(prClient4, fe.vip, []byte("q"))
	ret, out := r.run(r.objs.VipdFromPod, in)
	prWantVerdict(t, ret, prTCOK)
	if got := prDecode(t, out).dstPort(); got != high.addr {
		t.Fatalf("the packet went to %s, want %s (backend %d, written after the mapping grew)", got, high.addr, high.id)
	}
}

// TestDataplaneMapsOnlyWhatItUses: a Dataplane maps the backend map up to
// the slots it wrote, a WatchFlows maps the flow event ring's data once,
// and Close leaves nothing mapped (issue 18: both maps were mapped whole,
// the ring's data twice, all resident).
func TestDataplaneMapsOnlyWhatItUses(t *testing.T) {
	sizes := dpSmallMaps
	sizes.Backends = 1 << 20
	e := newDPEnv(t, []string{"client", "be1"}, sizes)
	a := e.service("test/a", dpVIPA, dataplane.TCP, dpReady("be1"))
	before := bpfMapMappings(t, nil)
	dp := e.open(nil)
	e.apply(dpState(1, nil, a))
	slots := uintptr(unsafe.Pointer(unsafe.SliceData(dp.prog.slots.mem)))
	if got, want := bpfMapMappings(t, before), map[uintptr]int{slots: backendGrowMin}; !maps.Equal(got, want) {
		t.Fatalf("after an apply of one backend: BPF map mappings %v, want %v (the backend map's first %d bytes of %d)",
			got, want, backendGrowMin, mapBytes(dp.objs.VipdBackends))
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- dp.WatchFlows(ctx, func(dataplane.FlowEvent) {}, func(uint64) {}) }()
	page := os.Getpagesize()
	want := []int{page, backendGrowMin, page + int(dp.objs.VipdEvents.MaxEntries())}
	var got []int
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if got = slices.Sorted(maps.Values(bpfMapMappings(t, before))); slices.Equal(got, want) {
			break
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("WatchFlows: %v", err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("while WatchFlows runs: BPF map mappings of %v bytes, want %v: the ring's consumer page, the backend map's first slots, the ring's producer page and data once", got, want)
	}

	e.close()
	if got := bpfMapMappings(t, before); len(got) != 0 {
		t.Fatalf("after Close: BPF map mappings %v left", got)
	}
}
