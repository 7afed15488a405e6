package ebpf

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"github.com/hashicorp/go-hclog"

	"github.com/vipd/vipd/dataplane"
)

// newIDMaps creates, unpinned, the maps the programmer's IDs and capacity
// check use, with a backend map of backends slots (IDs 1..backends-1).
func newIDMaps(t *testing.T, backends uint32) *bpfMaps {
	t.Helper()
	spec, err := loadBpf()
	if err != nil {
		t.Fatalf("load spec: %v", err)
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		prSkipIfNoPermission(t, err)
		t.Fatalf("remove memlock limit: %v", err)
	}
	m := &bpfMaps{}
	for name, dst := range map[string]**ebpf.Map{
		bpfMapVipdServices: &m.VipdServices, bpfMapVipdMembers: &m.VipdMembers, bpfMapVipdRevnat: &m.VipdRevnat,
		bpfMapVipdMaglev: &m.VipdMaglev, bpfMapVipdBackends: &m.VipdBackends, bpfMapVipdIds: &m.VipdIds,
	} {
		ms := spec.Maps[name].Copy()
		ms.Pinning = ebpf.PinNone
		if name == bpfMapVipdBackends {
			ms.MaxEntries = backends
		} else if ms.Type != ebpf.Array {
			ms.MaxEntries = 1 << 10
		}
		mp, err := ebpf.NewMap(ms)
		if err != nil {
			prSkipIfNoPermission(t, err)
			t.Fatalf("create %s: %v", name, err)
		}
		t.Cleanup(func() { mp.Close() })
		*dst = mp
	}
	return m
}

// stepChange is the change of fe to hold backends (none: removed).
func stepChange(fe *frontend, backends ...string) change {
	if len(backends) == 0 {
		return change{key: fe.key}
	}
	return change{key: fe.key, fe: stepFE(fe.service, fe.key.addr.String(), fe.key.port, fe.key.proto, backends...)}
}

// TestBackendIDsRecycled: backend IDs stay below the backend map's size;
// never-used IDs go first, then freed ones oldest-freed first; a restart
// recovers which are held from the map; a full map fails the capacity
// check with ErrResourceExhausted as before, naming the flag.
func TestBackendIDsRecycled(t *testing.T) {
	const slots = 6 // IDs 1..5
	m := newIDMaps(t, slots)
	p := newProgrammer(hclog.NewNullLogger(), m, nil, 0)
	fe := stepFE("ns/a", "198.18.0.1", 80, ipprotoTCP)
	be := func(i int) string { return fmt.Sprintf("10.0.0.%d:8080", i) }
	ids := func(bes ...string) []uint32 {
		t.Helper()
		var out []uint32
		for _, b := range bes {
			out = append(out, refOf(t, p, b).id)
		}
		return out
	}
	// apply runs the in-memory steps and writes and frees the backend
	// slots as apply does (the slots before the frontends, the frees
	// after).
	apply := func(c change) {
		t.Helper()
		if err := p.checkCapacity([]change{c}); err != nil {
			t.Fatalf("capacity: %v", err)
		}
		pl := p.allocateIDs([]change{c})
		var w writes
		for id, k := range p.backendsToWrite(pl, nil, false) {
			w.backend(id, k)
		}
		if err := putBackends(p.slots, w.backendKeys, w.backendVals); err != nil {
			t.Fatalf("write backends: %v", err)
		}
		dead, _ := p.commit(pl)
		if err := clearBackends(p.slots, dead.backendDeletes); err != nil {
			t.Fatalf("free backends: %v", err)
		}
		if err := p.saveCounters(); err != nil {
			t.Fatal(err)
		}
	}
	slotsHeld := func() map[uint32]string {
		t.Helper()
		out := map[uint32]string{}
		if err := forEachBackend(m.VipdBackends, func(id uint32, b bpfBackend) {
			out[id] = fmt.Sprintf("%s:%d", fromWords(b.Addr.W), fromBE16(b.Port))
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}

	apply(stepChange(fe, be(1), be(2), be(3), be(4), be(5)))
	if got := ids(be(1), be(2), be(3), be(4), be(5)); !slices.Equal(got, []uint32{1, 2, 3, 4, 5}) {
		t.Fatalf("IDs %v, want 1..5", got)
	}
	// Freed in the order 2, 4, 1.
	apply(stepChange(fe, be(1), be(3), be(4), be(5)))
	apply(stepChange(fe, be(1), be(3), be(5)))
	apply(stepChange(fe, be(3), be(5)))
	if got, want := slotsHeld(), map[uint32]string{3: be(3), 5: be(5)}; !maps.Equal(got, want) {
		t.Fatalf("slots %v, want %v: freed slots are zeroed", got, want)
	}
	apply(stepChange(fe, be(3), be(5), be(6)))
	apply(stepChange(fe, be(3), be(5), be(6), be(7)))
	if got := ids(be(6), be(7)); !slices.Equal(got, []uint32{2, 4}) {
		t.Fatalf("new backends got IDs %v; want 2 and 4, the oldest freed first", got)
	}

	// A restart reads which IDs are held from the map: the one left free
	// (1) is next, and the slots keep their backends.
	p = newProgrammer(hclog.NewNullLogger(), m, nil, 0)
	if err := p.restore(); err != nil {
		t.Fatalf("restore: %v", err)
	}
	if p.nextBackend != slots || p.freeIDs.len() != 1 {
		t.Fatalf("restored: next ID %d, %d free; want %d and 1", p.nextBackend, p.freeIDs.len(), slots)
	}
	if got := ids(be(3), be(5), be(6), be(7)); !slices.Equal(got, []uint32{3, 5, 2, 4}) {
		t.Fatalf("restored IDs %v, want [3 5 2 4]", got)
	}
	apply(stepChange(fe, be(3), be(5), be(6), be(7), be(8)))
	if got := ids(be(3), be(5), be(6), be(7), be(8)); !slices.Equal(got, []uint32{3, 5, 2, 4, 1}) {
		t.Fatalf("after the restart, IDs %v; want [3 5 2 4 1]: restored ones kept, the free one reused", got)
	}

	// Full: a sixth backend does not fit, as it would not have in a map of
	// five entries before.
	err := p.checkCapacity([]change{stepChange(fe, be(3), be(5), be(6), be(7), be(8), be(9))})
	if !errors.Is(err, dataplane.ErrResourceExhausted) || !strings.Contains(err.Error(), "--bpf-backend-map-max") ||
		!strings.Contains(err.Error(), "would need 6 entries and holds 5") {
		t.Fatalf("capacity check of a sixth backend: %v; want ErrResourceExhausted naming --bpf-backend-map-max, 6 of 5", err)
	}
	// Past the check (it is what rules this out), an ID past the map is
	// refused as a full map.
	id := p.newBackendID()
	if id < slots {
		t.Fatalf("a full map handed out ID %d", id)
	}
	var w writes
	w.backend(id, stepBE(be(9)))
	if err := putBackends(p.slots, w.backendKeys, w.backendVals); !errors.Is(err, errMapFull) {
		t.Fatalf("writing backend ID %d past the map: %v; want errMapFull", id, err)
	}
}

func TestIDQueue(t *testing.T) {
	var q idQueue
	var got []uint32
	for round := range 3 {
		for i := range 5 {
			q.push(uint32(10*round + i))
		}
		for range 3 {
			id, _ := q.pop()
			got = append(got, id)
		}
	}
	for q.len() > 0 {
		id, _ := q.pop()
		got = append(got, id)
	}
	want := []uint32{0, 1, 2, 3, 4, 10, 11, 12, 13, 14, 20, 21, 22, 23, 24}
	if !slices.Equal(got, want) {
		t.Fatalf("popped %v, want %v (oldest pushed first)", got, want)
	}
	if _, ok := q.pop(); ok {
		t.Fatal("pop of an empty queue succeeded")
	}
}
