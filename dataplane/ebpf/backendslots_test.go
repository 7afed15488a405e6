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

// wantNothingMapped checks that the process has no mapping of a BPF map
// but those in before: a write's mappings of the backend map are gone once
// it returns, and so are the windows of whole-map reads.
func wantNothingMapped(t *testing.T, before map[uintptr]int, after string) {
	t.Helper()
	if got := bpfMapMappings(t, before); len(got) != 0 {
		t.Fatalf("after %s: BPF map mappings (start: bytes) %v left", after, got)
	}
}

// TestBackendSlotsMapOnlyWhileWriting: a write maps only the pages of the
// slots it writes, at most backendWindow slots' worth at a time, and
// nothing of the backend map stays mapped after it (issue 18: a mapping
// is resident whole, 23 MiB for a million backends); IDs in any order,
// slots across page and window edges, read and write as through the map
// syscalls; reading the whole map leaves nothing mapped either.
func TestBackendSlotsMapOnlyWhileWriting(t *testing.T) {
	const slots = 1 << 20 // 24 MiB, as a large default map
	m := newIDMaps(t, slots).VipdBackends
	before := bpfMapMappings(t, nil)
	b := newBackendSlots(m)
	page := os.Getpagesize()

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
		b.largest = 0
		if err := putBackends(b, ids, vals); err != nil {
			t.Fatalf("put backends %v: %v", ids, err)
		}
		for i, id := range ids {
			if got := lookup(id); got != vals[i] {
				t.Fatalf("backend %d reads back as %+v through the syscall, want %+v", id, got, vals[i])
			}
		}
		wantNothingMapped(t, before, fmt.Sprintf("writing backends %v", ids[:min(len(ids), 8)]))
	}

	put(1, 2, 3)
	if b.largest != page {
		t.Fatalf("writing 3 slots of one page mapped %d bytes, want one page (%d)", b.largest, page)
	}
	// A slot across a page edge (170 × 24 = 4080), IDs out of order and
	// windows apart.
	straddle := uint32(page / backendSize)
	top, far := uint32(backendWindow+10), uint32(1_000_000)
	put(far, straddle, top)
	if b.largest > 2*page {
		t.Fatalf("writing 3 scattered slots mapped %d bytes at once, want each run's pages only", b.largest)
	}
	// A first sync's dense run of IDs: a window at a time.
	run := make([]uint32, 3*backendWindow)
	for i := range run {
		run[i] = uint32(300_000 + i)
	}
	put(run...)
	if b.largest != backendWindow*backendSize {
		t.Fatalf("writing %d consecutive slots mapped at most %d bytes at once, want the window, %d", len(run), b.largest, backendWindow*backendSize)
	}
	// Equal IDs: the last value wins, as with the syscall.
	if err := putBackends(b, []uint32{7, 7}, []bpfBackend{be(1), be(2)}); err != nil {
		t.Fatal(err)
	}
	if got := lookup(7); got != be(2) {
		t.Fatalf("backend 7 written twice in one call is %+v, want the second value %+v", got, be(2))
	}
	if err := clearBackends(b, []uint32{7}); err != nil {
		t.Fatal(err)
	}

	// A slot another vipd wrote (a restart's) is zeroed when freed.
	stale := uint32(200_000)
	v := be(int(stale))
	if err := m.Put(stale, &v); err != nil {
		t.Fatal(err)
	}
	if err := clearBackends(b, []uint32{stale, 2}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []uint32{2, stale} {
		if got := lookup(id); got != (bpfBackend{}) {
			t.Fatalf("freed backend %d is %+v, want zeroed", id, got)
		}
	}
	wantNothingMapped(t, before, "clearing backends")

	// A whole-map read sees every used slot, and leaves nothing mapped.
	want := append([]uint32{1, 3, straddle, top}, run...)
	want = append(want, far)
	var seen []uint32
	if err := forEachBackend(m, func(id uint32, got bpfBackend) {
		if got != be(int(id)) {
			t.Errorf("backend %d read as %+v", id, got)
		}
		seen = append(seen, id)
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(seen, want) {
		t.Fatalf("forEachBackend saw %d backends, want %d: %v…", len(seen), len(want), seen[:min(len(seen), 10)])
	}
	wantNothingMapped(t, before, "reading the whole map")

	// IDs past the map are refused; those within it are written.
	err := putBackends(b, []uint32{slots + 1, 9, slots}, []bpfBackend{be(1), be(9), be(1)})
	if !errors.Is(err, errMapFull) || !strings.Contains(err.Error(), fmt.Sprint(slots)) {
		t.Fatalf("writing IDs past the map: %v, want errMapFull naming ID %d", err, slots)
	}
	if got := lookup(9); got != be(9) {
		t.Fatalf("backend 9, within the map, is %+v after a write that also named IDs past it, want %+v", got, be(9))
	}
	wantNothingMapped(t, before, "a refused write")
}

// TestProgRunBackendSlotsWindowed: the programs read the slots written
// through a mapping at an offset into the map (a backend whose ID is past
// the map's first page).
func TestProgRunBackendSlotsWindowed(t *testing.T) {
	r := newPREnv(t)
	b := newBackendSlots(r.objs.VipdBackends)
	low := prBackend{id: 1, addr: prAP("198.18.1.6:8080")}
	high := prBackend{id: r.objs.VipdBackends.MaxEntries() - 1, addr: prAP("198.18.1.7:8080")}
	if int(high.id)*backendSize < os.Getpagesize() {
		t.Fatalf("test setup: backend %d is on the map's first page", high.id)
	}
	fe := prFrontend{vip: prVIP4For(prUDP), proto: prUDP, id: 1}
	for _, be := range []prBackend{low, high} {
		v := bpfBackend{Addr: prAddrOf(be.addr.Addr()), Port: prBE16(be.addr.Port()), Used: backendUsed}
		if err := putBackends(b, []uint32{be.id}, []bpfBackend{v}); err != nil {
			t.Fatal(err)
		}
		r.setMember(fe, be.id, prMemberEligible)
	}
	r.setSlots(fe, high)
	in := prUDPFrame(prClient4, fe.vip, []byte("q"))
	ret, out := r.run(r.objs.VipdFromPod, in)
	prWantVerdict(t, ret, prTCOK)
	if got := prDecode(t, out).dstPort(); got != high.addr {
		t.Fatalf("the packet went to %s, want %s (backend %d, written through a mapping at an offset)", got, high.addr, high.id)
	}
}

// TestDataplaneMapsOnlyWhatItUses: a Dataplane keeps nothing of the
// backend map mapped after an apply, a WatchFlows maps the flow event
// ring's data once, and Close leaves nothing mapped (issue 18: both maps
// were mapped whole, the ring's data twice, all resident).
func TestDataplaneMapsOnlyWhatItUses(t *testing.T) {
	sizes := dpSmallMaps
	sizes.Backends = 1 << 20
	e := newDPEnv(t, []string{"client", "be1"}, sizes)
	a := e.service("test/a", dpVIPA, dataplane.TCP, dpReady("be1"))
	before := bpfMapMappings(t, nil)
	dp := e.open(nil)
	e.apply(dpState(1, nil, a))
	wantNothingMapped(t, before, "an apply of one backend")
	if dp.prog.slots.largest != os.Getpagesize() {
		t.Fatalf("an apply of one backend mapped %d bytes of the backend map at once, want one page", dp.prog.slots.largest)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- dp.WatchFlows(ctx, func(dataplane.FlowEvent) {}, func(uint64) {}) }()
	page := os.Getpagesize()
	want := []int{page, page + int(dp.objs.VipdEvents.MaxEntries())}
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
		t.Fatalf("while WatchFlows runs: BPF map mappings of %v bytes, want %v: the ring's consumer page, the ring's producer page and data once", got, want)
	}

	e.close()
	if got := bpfMapMappings(t, before); len(got) != 0 {
		t.Fatalf("after Close: BPF map mappings %v left", got)
	}
}
