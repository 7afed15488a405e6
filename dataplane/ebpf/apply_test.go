package ebpf

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"

	"github.com/vipd/vipd/dataplane"
)

// The steps of programmer.apply that decide, tested without maps: a
// programmer with no maps serves, since these steps touch none.

// stepFE builds a frontend of service on vip:port/proto whose members are
// backends ("ip:port"), each eligible and in a slot of weight 1.
func stepFE(service, vip string, port uint16, proto uint8, backends ...string) *frontend {
	fe := &frontend{key: feKey{addr: netip.MustParseAddr(vip), port: port, proto: proto}, service: service}
	for _, b := range backends {
		ap := netip.MustParseAddrPort(b)
		fe.members = append(fe.members, member{key: beKey{addr: ap.Addr(), port: ap.Port()}.packed(), flags: memberFlagEligible})
	}
	slices.SortFunc(fe.members, compareMembers)
	for i := range fe.members {
		fe.slots = append(fe.slots, slot{member: uint32(i), weight: 1, cum: uint32(i + 1)})
	}
	return fe
}

func stepBE(s string) bePacked {
	ap := netip.MustParseAddrPort(s)
	return beKey{addr: ap.Addr(), port: ap.Port()}.packed()
}

func newStepProgrammer() *programmer {
	return newProgrammer(hclog.NewNullLogger(), nil, nil, 0)
}

// stepApply runs the in-memory steps of an apply (no map is written) and
// returns its plan and the backend deletions commit queued.
func stepApply(p *programmer, changes ...change) (*applyPlan, writes) {
	pl := p.allocateIDs(changes)
	dead, _ := p.commit(pl)
	return pl, dead
}

// newBackends returns the backends an incremental apply of pl writes, by ID.
func newBackends(p *programmer, pl *applyPlan) map[uint32]bePacked {
	out := map[uint32]bePacked{}
	for id, k := range p.backendsToWrite(pl, nil, false) {
		out[id] = k
	}
	return out
}

func refOf(t *testing.T, p *programmer, be string) backendRef {
	t.Helper()
	ref, ok := p.backendIDs.get(stepBE(be))
	if !ok {
		t.Fatalf("backend %s is not in the table", be)
	}
	return ref
}

func TestAllocateIDs(t *testing.T) {
	a := stepFE("ns/a", "198.18.0.1", 80, ipprotoTCP, "10.0.0.1:8080", "10.0.0.2:8080")
	b := stepFE("ns/b", "198.18.0.2", 80, ipprotoTCP, "10.0.0.2:8080", "10.0.0.3:8080")

	t.Run("new frontends and backends get IDs in order; a shared backend one ID and two references", func(t *testing.T) {
		p := newStepProgrammer()
		pl := p.allocateIDs([]change{{key: a.key, fe: a}, {key: b.key, fe: b}})
		if got := []uint32{pl.next[0].revNat, pl.next[1].revNat}; !slices.Equal(got, []uint32{1, 2}) {
			t.Errorf("reverse-NAT IDs %v, want [1 2]", got)
		}
		if got := [][]uint32{pl.next[0].memberIDs(), pl.next[1].memberIDs()}; !cmp.Equal(got, [][]uint32{{1, 2}, {2, 3}}) {
			t.Errorf("member IDs %v, want [[1 2] [2 3]]", got)
		}
		if !slices.Equal(pl.next[0].slotIDs(), pl.next[0].memberIDs()) || !slices.Equal(pl.next[1].slotIDs(), pl.next[1].memberIDs()) {
			t.Errorf("slot IDs %v %v do not follow the members", pl.next[0].slotIDs(), pl.next[1].slotIDs())
		}
		if got, want := newBackends(p, pl), map[uint32]bePacked{1: stepBE("10.0.0.1:8080"), 2: stepBE("10.0.0.2:8080"), 3: stepBE("10.0.0.3:8080")}; !maps.Equal(got, want) {
			t.Errorf("new backends %v, want %v", got, want)
		}
		if ref := refOf(t, p, "10.0.0.2:8080"); ref != (backendRef{id: 2, refs: 2}) {
			t.Errorf("shared backend %+v, want ID 2 with 2 references", ref)
		}
		if p.nextBackend != 4 || p.nextRevNat != 3 {
			t.Errorf("next IDs: backend %d, reverse NAT %d; want 4 and 3", p.nextBackend, p.nextRevNat)
		}
		// The ID slab: a's 2 members and 2 slots, then b's.
		if pl.nids != 8 || !slices.Equal(pl.offs, []int32{0, 4}) {
			t.Errorf("ID slab of %d IDs at offsets %v, want 8 at [0 4]", pl.nids, pl.offs)
		}
	})

	t.Run("a frontend or backend that has an ID keeps it", func(t *testing.T) {
		p := newStepProgrammer()
		// As restore leaves them: a draining frontend's reverse-NAT ID,
		// a backend in the maps that no frontend references.
		p.revNatIDs[a.key] = 7
		p.draining[a.key] = 7
		p.nextRevNat = 9
		p.backendIDs.put(stepBE("10.0.0.2:8080"), backendRef{id: 5})
		p.nextBackend = 6
		pl := p.allocateIDs([]change{{key: a.key, fe: a}})
		if pl.next[0].revNat != 7 || p.nextRevNat != 9 {
			t.Errorf("reverse-NAT ID %d (next %d), want 7 kept (next 9)", pl.next[0].revNat, p.nextRevNat)
		}
		if !slices.Equal(pl.next[0].memberIDs(), []uint32{6, 5}) {
			t.Errorf("member IDs %v, want [6 5]: the restored backend keeps 5", pl.next[0].memberIDs())
		}
		if got := newBackends(p, pl); !maps.Equal(got, map[uint32]bePacked{6: stepBE("10.0.0.1:8080")}) {
			t.Errorf("new backends %v, want only 10.0.0.1:8080", got)
		}
	})

	t.Run("freed IDs are not given again", func(t *testing.T) {
		p := newStepProgrammer()
		stepApply(p, change{key: a.key, fe: a})
		_, dead := stepApply(p, change{key: a.key})
		if !slices.Equal(dead.backendDeletes, []uint32{1, 2}) {
			t.Fatalf("deleted backends %v, want [1 2]", dead.backendDeletes)
		}
		// As drained does once no flow uses a's reverse-NAT ID.
		delete(p.draining, a.key)
		delete(p.revNatIDs, a.key)
		c := stepFE("ns/c", "198.18.0.3", 80, ipprotoTCP, "10.0.0.1:8080")
		pl := p.allocateIDs([]change{{key: c.key, fe: c}})
		if pl.next[0].revNat != 2 || !slices.Equal(pl.next[0].memberIDs(), []uint32{3}) {
			t.Errorf("reverse-NAT ID %d, member IDs %v; want 2 and [3], never a freed one", pl.next[0].revNat, pl.next[0].memberIDs())
		}
	})

	t.Run("a full apply references its backends", func(t *testing.T) {
		p := newStepProgrammer()
		p.allocateIDs([]change{{key: a.key, fe: a}})
		if refOf(t, p, "10.0.0.1:8080").refs != 1 {
			t.Errorf("the backend is not referenced")
		}
	})

	t.Run("only programmed frontends leave", func(t *testing.T) {
		p := newStepProgrammer()
		stepApply(p, change{key: a.key, fe: a})
		pl := p.allocateIDs([]change{{key: a.key}, {key: b.key}})
		if len(pl.gone) != 1 || pl.gone[0].key != a.key {
			t.Errorf("gone %v, want only %s", pl.gone, a.key)
		}
		if pl.next[0] != nil || pl.next[1] != nil || pl.nids != 0 {
			t.Errorf("removals got a programmed state: %v, %d IDs", pl.next, pl.nids)
		}
	})

	t.Run("takeBack returns the references and keeps the IDs taken", func(t *testing.T) {
		p := newStepProgrammer()
		stepApply(p, change{key: a.key, fe: a})
		pl := p.allocateIDs([]change{{key: b.key, fe: b}})
		p.takeBack(pl)
		if ref := refOf(t, p, "10.0.0.2:8080"); ref != (backendRef{id: 2, refs: 1}) {
			t.Errorf("backend of a and the failed b: %+v, want ID 2 with a's reference alone", ref)
		}
		if ref := refOf(t, p, "10.0.0.3:8080"); ref != (backendRef{id: 3, refs: 0}) {
			t.Errorf("backend of the failed b alone: %+v, want it kept with ID 3 and no reference", ref)
		}
		if p.nextBackend != 4 || p.revNatIDs[b.key] != 2 {
			t.Errorf("next backend ID %d, b's reverse-NAT ID %d; want 4 and 2 kept", p.nextBackend, p.revNatIDs[b.key])
		}
	})
}

func TestChunkEnd(t *testing.T) {
	pr := func(members, slots int) *programmed {
		// Weighted: its slots are entries of their own (not dense).
		fe := &frontend{flags: svcFlagWeighted, slots: make([]slot, slots), members: make([]member, members)}
		return &programmed{fe: fe, ids: make([]uint32, members+slots)}
	}
	// Entries each: 1 + slots + member entries (none while the members
	// are inline in the reverse-NAT value, at most 16).
	if n := chunkEnd([]*programmed{pr(16, 0), pr(17, 0), pr(0, 0)}, 0, 18); n != 2 {
		t.Errorf("16 inline members count 1 entry, 17 count 18: chunkEnd(limit 18) = %d, want 2", n)
	}
	next := []*programmed{pr(2, 4), nil, pr(1, 1), pr(4, 8), nil, nil, pr(0, 0)}
	//                     5         0    2         9         0    0    1
	tests := []struct {
		name      string
		lo, limit int
		want      int
	}{
		{"a chunk closes once it holds the limit", 0, 7, 3},
		{"a removal adds nothing to a chunk", 0, 5, 1},
		{"a frontend larger than the limit is a chunk of its own", 3, 2, 4},
		{"a chunk takes one frontend at least", 2, 1, 3},
		{"removals after the limit belong to the next chunk", 3, 9, 4},
		{"trailing removals join the last chunk", 4, 100, 7},
		{"the last chunk ends at the end", 0, 1000, 7},
		{"no changes left", 7, 10, 7},
	}
	for _, tt := range tests {
		if got := chunkEnd(next, tt.lo, tt.limit); got != tt.want {
			t.Errorf("%s: chunkEnd(lo %d, limit %d) = %d, want %d", tt.name, tt.lo, tt.limit, got, tt.want)
		}
	}
	// Chunks cover every change once, in order.
	var covered int
	for lo := 0; lo < len(next); {
		hi := chunkEnd(next, lo, 3)
		if hi <= lo {
			t.Fatalf("chunk [%d, %d) is empty", lo, hi)
		}
		covered += hi - lo
		lo = hi
	}
	if covered != len(next) {
		t.Errorf("chunks cover %d changes, want %d", covered, len(next))
	}
}

func TestLeavingWrites(t *testing.T) {
	a := stepFE("ns/a", "198.18.0.1", 80, ipprotoTCP, "10.0.0.1:8080", "10.0.0.2:8080")
	a.flags |= svcFlagMaglev | svcFlagWeighted // weighted: slot entries of its own
	setup := func() (*programmer, []change) {
		p := newStepProgrammer()
		stepApply(p, change{key: a.key, fe: a})
		return p, p.allocateIDs([]change{{key: a.key}}).gone
	}
	wantDeletes := func(t *testing.T, w writes, slots []uint32) {
		t.Helper()
		var got []uint32
		for _, k := range w.svcDeletes {
			got = append(got, k.Slot)
		}
		if !slices.Equal(got, slots) {
			t.Errorf("deleted service slots %v, want %v", got, slots)
		}
		if len(w.memberDeletes) != 0 {
			t.Errorf("deleted members %v, want none (inline in the reverse-NAT value)", w.memberDeletes)
		}
		if !slices.Equal(w.maglevDeletes, []uint32{1}) {
			t.Errorf("deleted Maglev tables %v, want [1]", w.maglevDeletes)
		}
	}

	t.Run("the master drains", func(t *testing.T) {
		p, gone := setup()
		w := p.leavingWrites(gone)
		if want := []bpfSvcVal{{RevNatId: 1, Flags: svcFlagDraining}}; !slices.Equal(w.svcVals, want) || w.svcKeys[0].Slot != 0 {
			t.Errorf("master written %v at %v, want a draining master %v", w.svcVals, w.svcKeys, want)
		}
		if len(w.revNatDeletes) != 0 {
			t.Errorf("reverse-NAT entries %v deleted while the frontend drains", w.revNatDeletes)
		}
		if want := []bpfRevNat{revNatBase(a.key)}; !slices.Equal(w.revNatKeys, []uint32{1}) || !slices.Equal(w.revNatVals, want) {
			t.Errorf("reverse NAT written %v = %+v, want 1 = %+v (no member)", w.revNatKeys, w.revNatVals, want)
		}
		wantDeletes(t, w, []uint32{1, 2})
	})
	t.Run("a frontend with its members in the member map deletes them", func(t *testing.T) {
		big := stepFE("ns/a", "198.18.0.1", 80, ipprotoTCP, manyBackends(revNatInlineMembers+1)...)
		p := newStepProgrammer()
		stepApply(p, change{key: big.key, fe: big})
		w := p.leavingWrites(p.allocateIDs([]change{{key: big.key}}).gone)
		if len(w.memberDeletes) != revNatInlineMembers+1 || len(w.revNatVals) != 1 || w.revNatVals[0].Members != 0 {
			t.Errorf("deleted members %v, reverse NAT %+v; want all %d and a value with no member", w.memberDeletes, w.revNatVals, revNatInlineMembers+1)
		}
	})
	t.Run("without drain the master goes first", func(t *testing.T) {
		p, gone := setup()
		p.noDrain = true
		w := p.leavingWrites(gone)
		if len(w.svcKeys) != 0 {
			t.Errorf("service entries written: %v", w.svcKeys)
		}
		if !slices.Equal(w.revNatDeletes, []uint32{1}) {
			t.Errorf("deleted reverse-NAT entries %v, want [1]", w.revNatDeletes)
		}
		wantDeletes(t, w, []uint32{0, 1, 2})
	})
}

func TestBackendsToWrite(t *testing.T) {
	a := stepFE("ns/a", "198.18.0.1", 80, ipprotoTCP, "10.0.0.1:8080", "10.0.0.2:8080")
	b := stepFE("ns/b", "198.18.0.2", 80, ipprotoTCP, "10.0.0.2:8080", "10.0.0.3:8080")
	collect := func(seq func(func(uint32, bePacked) bool)) map[uint32]bePacked {
		out := map[uint32]bePacked{}
		for id, k := range seq {
			out[id] = k
		}
		return out
	}
	p := newStepProgrammer()
	p.backendIDs.put(stepBE("10.0.0.9:8080"), backendRef{id: 9}) // restored, unused
	p.nextBackend = 10
	stepApply(p, change{key: a.key, fe: a})

	pl := p.allocateIDs([]change{{key: b.key, fe: b}})
	if got, want := collect(p.backendsToWrite(pl, nil, false)), map[uint32]bePacked{12: stepBE("10.0.0.3:8080")}; !maps.Equal(got, want) {
		t.Errorf("incremental apply writes backends %v, want only the new one %v", got, want)
	}
	p.commit(pl)

	pl = p.allocateIDs([]change{{key: a.key, fe: a}, {key: b.key, fe: b}})
	all := map[uint32]bePacked{10: stepBE("10.0.0.1:8080"), 11: stepBE("10.0.0.2:8080"), 12: stepBE("10.0.0.3:8080")}
	if got := collect(p.backendsToWrite(pl, nil, true)); !maps.Equal(got, all) {
		t.Errorf("full apply of empty maps writes backends %v, want every one in use %v", got, all)
	}
	au := &audit{backendOK: newBitset(13)}
	au.backendOK.set(11)
	delete(all, 11)
	if got := collect(p.backendsToWrite(pl, au, true)); !maps.Equal(got, all) {
		t.Errorf("audited full apply writes backends %v, want those in use but the one found correct %v", got, all)
	}
}

func TestCommitFreesUnreferenced(t *testing.T) {
	a := stepFE("ns/a", "198.18.0.1", 53, ipprotoUDP, "10.0.0.1:53", "10.0.0.2:53")
	b := stepFE("ns/b", "198.18.0.2", 53, ipprotoUDP, "10.0.0.3:53")

	t.Run("a backend moving between frontends stays; one only a leaving frontend had goes", func(t *testing.T) {
		p := newStepProgrammer()
		stepApply(p, change{key: a.key, fe: a}, change{key: b.key, fe: b})
		// b takes a's backend 10.0.0.1 as a leaves.
		b2 := stepFE("ns/b", "198.18.0.2", 53, ipprotoUDP, "10.0.0.1:53", "10.0.0.3:53")
		pl, dead := stepApply(p, change{key: a.key}, change{key: b.key, fe: b2})
		if got := newBackends(p, pl); len(got) != 0 {
			t.Errorf("new backends %v: the moving backend got a new ID", got)
		}
		if !slices.Equal(dead.backendDeletes, []uint32{2}) {
			t.Errorf("deleted backends %v, want [2] (10.0.0.2, a's alone)", dead.backendDeletes)
		}
		if ref := refOf(t, p, "10.0.0.1:53"); ref != (backendRef{id: 1, refs: 1}) {
			t.Errorf("moving backend %+v, want ID 1 with b's reference", ref)
		}
		if _, ok := p.backendIDs.get(stepBE("10.0.0.2:53")); ok {
			t.Errorf("the unreferenced backend stays in the table")
		}
		if p.draining[a.key] != 1 || p.revNatIDs[a.key] != 1 || p.frontends[a.key] != nil {
			t.Errorf("leaving a: draining %v, reverse-NAT ID %d, programmed %v; want draining with ID 1 kept", p.draining, p.revNatIDs[a.key], p.frontends[a.key])
		}
		if _, ok := p.byService["ns/a"]; ok {
			t.Errorf("the gone service stays indexed: %v", p.byService)
		}
		if p.svcEntries != 1 || p.memberEntries != 0 {
			t.Errorf("entry counts: %d service, %d member; want b's 1 (dense: its master holds its slots) and 0 (inline)", p.svcEntries, p.memberEntries)
		}
	})

	t.Run("the UDP callbacks wait for the caller, and name the members that left", func(t *testing.T) {
		p := newStepProgrammer()
		var removed []string
		p.onMembersRemoved = func(fe feKey, revNat uint32, gone []beKey) {
			for _, k := range gone {
				removed = append(removed, fe.String()+" "+k.String())
			}
		}
		stepApply(p, change{key: a.key, fe: a})
		removed = nil
		a2 := stepFE("ns/a", "198.18.0.1", 53, ipprotoUDP, "10.0.0.2:53")
		_, udpGone := p.commit(p.allocateIDs([]change{{key: a.key, fe: a2}}))
		if len(removed) != 0 {
			t.Fatalf("commit called onMembersRemoved itself: %v", removed)
		}
		for _, f := range udpGone {
			f()
		}
		if want := []string{"198.18.0.1:53/UDP 10.0.0.1:53"}; !slices.Equal(removed, want) {
			t.Errorf("removed %v, want %v", removed, want)
		}
	})

	t.Run("without drain a leaving frontend gives up its reverse-NAT ID", func(t *testing.T) {
		p := newStepProgrammer()
		stepApply(p, change{key: a.key, fe: a})
		p.noDrain = true
		stepApply(p, change{key: a.key})
		if _, ok := p.revNatIDs[a.key]; ok || len(p.draining) != 0 {
			t.Errorf("reverse-NAT IDs %v, draining %v; want neither to hold a", p.revNatIDs, p.draining)
		}
	})

	t.Run("a frontend back before it drained is live again", func(t *testing.T) {
		p := newStepProgrammer()
		stepApply(p, change{key: a.key, fe: a})
		stepApply(p, change{key: a.key})
		pl, _ := stepApply(p, change{key: a.key, fe: a})
		if len(p.draining) != 0 || pl.next[0].revNat != 1 {
			t.Errorf("draining %v, reverse-NAT ID %d; want none draining and ID 1 again", p.draining, pl.next[0].revNat)
		}
	})
}

func TestQueueChangedFrontend(t *testing.T) {
	// Weighted: slots in entries of their own (TestQueueDenseFrontend
	// has the dense ones).
	old := stepFE("ns/a", "198.18.0.1", 80, ipprotoTCP, "10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080")
	old.flags |= svcFlagMaglev | svcFlagWeighted
	p := newStepProgrammer()
	stepApply(p, change{key: old.key, fe: old})
	// 10.0.0.2 leaves, 10.0.0.1 may take no new connections, Maglev goes.
	fe := stepFE("ns/a", "198.18.0.1", 80, ipprotoTCP, "10.0.0.1:8080", "10.0.0.3:8080")
	fe.flags |= svcFlagWeighted
	fe.members[0].flags = 0
	pl := p.allocateIDs([]change{{key: fe.key, fe: fe}})
	ch := chunk{changes: pl.changes, next: pl.next, offs: pl.offs}
	none := &audit{}

	var w writes
	p.queueMembers(&w, ch, false, none)
	// Inline members: one reverse-NAT value with the old and new members
	// (10.0.0.2 stays until step 6), 10.0.0.1's flags changed.
	union := revNatBase(fe.key)
	union.Members, union.MemberIds, union.MemberFlags = 3, [16]uint32{1, 2, 3}, [16]uint8{0, memberFlagEligible, memberFlagEligible}
	if len(w.memberKeys) != 0 || !slices.Equal(w.revNatKeys, []uint32{1}) || w.revNatVals[0] != union {
		t.Errorf("step 2 writes members %v and reverse NAT %v = %+v; want no member entry and 1 = %+v", w.memberKeys, w.revNatKeys, w.revNatVals, union)
	}
	w.reset()
	p.queueSlots(&w, ch, false, none)
	if len(w.svcKeys) != 1 || w.svcKeys[0].Slot != 2 || w.svcVals[0] != (bpfSvcVal{BackendId: 3, Weight: 2}) {
		t.Errorf("step 4 writes slots %v = %v; want slot 2 = backend 3, the only one that changed", w.svcKeys, w.svcVals)
	}
	w.reset()
	p.queueMasters(&w, ch, false, none)
	if len(w.svcVals) != 1 || w.svcVals[0].Count != 2 || w.svcVals[0].Flags&svcFlagMaglev != 0 {
		t.Errorf("step 5 writes masters %v; want one with count 2 and no Maglev", w.svcVals)
	}
	w.reset()
	p.queueStale(&w, ch)
	if len(w.svcDeletes) != 1 || w.svcDeletes[0].Slot != 3 {
		t.Errorf("step 6 deletes slots %v, want slot 3", w.svcDeletes)
	}
	final := revNatBase(fe.key)
	final.Members, final.MemberIds, final.MemberFlags = 2, [16]uint32{1, 3}, [16]uint8{0, memberFlagEligible}
	if len(w.memberDeletes) != 0 || !slices.Equal(w.revNatVals, []bpfRevNat{final}) {
		t.Errorf("step 6 deletes members %v, writes reverse NAT %+v; want none and %+v (10.0.0.2 gone)", w.memberDeletes, w.revNatVals, final)
	}
	if !slices.Equal(w.maglevDeletes, []uint32{1}) {
		t.Errorf("step 6 deletes Maglev tables %v, want [1]", w.maglevDeletes)
	}

	// A full apply writes every entry but those the audit found correct.
	au := &audit{revNatOK: newBitset(1), masterOK: newBitset(1), memberOK: newBitset(pl.nids), slotOK: newBitset(pl.nids)}
	au.revNatOK.set(0)
	au.memberOK.set(1)   // member 1 (10.0.0.3)
	au.slotOK.set(2 + 0) // slot 1
	w.reset()
	p.queueMembers(&w, ch, true, au)
	p.queueSlots(&w, ch, true, au)
	p.queueMasters(&w, ch, true, au)
	if !slices.Equal(w.revNatVals, []bpfRevNat{union}) || len(w.memberKeys) != 0 {
		t.Errorf("full apply writes reverse NAT %+v, members %v; want the union alone", w.revNatVals, w.memberKeys)
	}
	var slots []uint32
	for _, k := range w.svcKeys {
		slots = append(slots, k.Slot)
	}
	if !slices.Equal(slots, []uint32{2, 0}) {
		t.Errorf("full apply writes service slots %v, want [2 0] (slot 2, then the master)", slots)
	}
}

func TestSameMaglevTable(t *testing.T) {
	mk := func(maglevM uint32, backends ...string) *programmed {
		fe := stepFE("ns/a", "198.18.0.1", 80, ipprotoTCP, backends...)
		fe.flags |= svcFlagMaglev
		fe.maglevM = maglevM
		pr := &programmed{fe: fe, ids: make([]uint32, len(fe.members)+len(fe.slots))}
		for i := range fe.slots {
			pr.slotIDs()[i] = uint32(i + 1)
		}
		return pr
	}
	base := mk(251, "10.0.0.1:80", "10.0.0.2:80")
	if sameMaglevTable(nil, base) {
		t.Errorf("no old frontend: same table")
	}
	if !sameMaglevTable(mk(251, "10.0.0.1:80", "10.0.0.2:80"), base) {
		t.Errorf("the same frontend: a different table")
	}
	if sameMaglevTable(mk(509, "10.0.0.1:80", "10.0.0.2:80"), base) {
		t.Errorf("another table size: same table")
	}
	heavier := mk(251, "10.0.0.1:80", "10.0.0.2:80")
	heavier.fe.slots[1].weight = 5
	if sameMaglevTable(heavier, base) {
		t.Errorf("another weight: same table")
	}
	plain := mk(251, "10.0.0.1:80", "10.0.0.2:80")
	plain.fe.flags &^= svcFlagMaglev
	if sameMaglevTable(plain, base) {
		t.Errorf("the old frontend had no Maglev table: same table")
	}
}

// TestAuditEntries: the full apply's audit sorts each map entry it reads
// into correct, to rewrite, stale (of a desired frontend, deleted after the
// writes) and absent (of no frontend, deleted before them), and keeps what
// a draining frontend still needs.
func TestAuditEntries(t *testing.T) {
	a := stepFE("ns/a", "198.18.0.1", 80, ipprotoTCP, "10.0.0.1:8080", "10.0.0.2:8080")
	a.flags |= svcFlagWeighted // slot entries of its own (TestAuditDense has a dense one)
	gone := stepFE("ns/gone", "198.18.0.2", 80, ipprotoTCP, "10.0.0.3:8080")
	p := newStepProgrammer()
	stepApply(p, change{key: a.key, fe: a}, change{key: gone.key, fe: gone})
	stepApply(p, change{key: gone.key}) // gone drains, with reverse-NAT ID 2
	pl := p.allocateIDs([]change{{key: a.key, fe: a}})
	pr := pl.next[0]
	au := p.newAuditor(pl.changes, pl.next, pl.offs, pl.nids, pl.gone)
	absent := feKey{addr: netip.MustParseAddr("198.18.0.9"), port: 80, proto: ipprotoTCP}
	revNatOf := func(k feKey) bpfRevNat {
		var rn bpfRevNat
		rn.Addr.W, rn.Port, rn.Proto = toWords(k.addr), be16(k.port), k.proto
		return rn
	}

	au.revNatEntry(1, revNatVal(a.key, pr))                                 // correct, with its inline members
	au.revNatEntry(2, revNatOf(gone.key))                                   // draining: kept
	au.revNatEntry(9, revNatOf(absent))                                     // absent
	au.serviceEntry(svcKeyOf(a.key, 0), masterVal(pr))                      // correct
	au.serviceEntry(svcKeyOf(a.key, 1), bpfSvcVal{BackendId: 1, Weight: 1}) // correct
	au.serviceEntry(svcKeyOf(a.key, 2), bpfSvcVal{BackendId: 1, Weight: 2}) // wrong backend
	au.serviceEntry(svcKeyOf(a.key, 3), bpfSvcVal{BackendId: 2, Weight: 3}) // past the count: stale
	au.serviceEntry(svcKeyOf(absent, 1), bpfSvcVal{BackendId: 9})           // absent slot
	au.serviceEntry(svcKeyOf(absent, 0), bpfSvcVal{Count: 1, RevNatId: 9})  // absent master
	au.serviceEntry(svcKeyOf(gone.key, 0), bpfSvcVal{RevNatId: 2, Flags: svcFlagDraining})
	au.memberEntry(bpfMemberKey{RevNatId: 1, BackendId: 1}, memberFlagEligible) // a's members are inline: stale
	au.memberEntry(bpfMemberKey{RevNatId: 1, BackendId: 3}, memberFlagEligible) // not a member: stale
	au.memberEntry(bpfMemberKey{RevNatId: 9, BackendId: 9}, memberFlagEligible) // absent
	au.maglevEntry(1, 0)                                                        // a does not use Maglev: stale
	au.maglevEntry(9, 0)                                                        // absent
	au.countUsed()
	var be1, be2, be9 bpfBackend
	be1.Addr.W, be1.Port = toWords(netip.MustParseAddr("10.0.0.1")), be16(8080)
	be2.Addr.W, be2.Port = toWords(netip.MustParseAddr("10.0.0.9")), be16(8080)
	be9 = be1
	au.backendEntry(1, be1) // correct
	au.backendEntry(2, be2) // holds another address
	au.backendEntry(9, be9) // no frontend uses ID 9: stale
	au.au.absent.svcDeletes = append(au.au.absent.svcDeletes, au.absentSlots...)

	got := au.au
	if !got.revNatOK.has(0) || !got.masterOK.has(0) {
		t.Errorf("a's reverse-NAT entry and master not found correct")
	}
	// The ID slab: members 0-1 (inline: no entries), then slots 2-3.
	for i, want := range []bool{false, false, true, false} {
		ok := got.memberOK
		if i >= 2 {
			ok = got.slotOK
		}
		if ok.has(i) != want {
			t.Errorf("entry %d found correct: %v, want %v", i, ok.has(i), want)
		}
	}
	if !got.backendOK.has(1) || got.backendOK.has(2) {
		t.Errorf("backends found correct: 1 %v, 2 %v; want 1 alone", got.backendOK.has(1), got.backendOK.has(2))
	}
	wantOK := [numServiceMaps]int{mapServices: 2, mapRevNat: 1, mapBackends: 1}
	wantWrong := [numServiceMaps]int{mapServices: 1, mapBackends: 1}
	if got.ok != wantOK || got.wrong != wantWrong {
		t.Errorf("found correct %v and wrong %v, want %v and %v", got.ok, got.wrong, wantOK, wantWrong)
	}
	if want := []bpfSvcKey{svcKeyOf(absent, 0), svcKeyOf(absent, 1)}; !slices.Equal(got.absent.svcDeletes, want) {
		t.Errorf("absent service entries %v, want the master, then the slot: %v", got.absent.svcDeletes, want)
	}
	if !slices.Equal(got.absent.revNatDeletes, []uint32{9}) || !slices.Equal(got.absent.maglevDeletes, []uint32{9}) ||
		!slices.Equal(got.absent.memberDeletes, []bpfMemberKey{{RevNatId: 9, BackendId: 9}}) {
		t.Errorf("absent: reverse NAT %v, Maglev %v, members %v; want those of ID 9 alone",
			got.absent.revNatDeletes, got.absent.maglevDeletes, got.absent.memberDeletes)
	}
	if !slices.Equal(got.stale.svcDeletes, []bpfSvcKey{svcKeyOf(a.key, 3)}) ||
		!slices.Equal(got.stale.memberDeletes, []bpfMemberKey{{RevNatId: 1, BackendId: 1}, {RevNatId: 1, BackendId: 3}}) ||
		!slices.Equal(got.stale.maglevDeletes, []uint32{1}) || !slices.Equal(got.stale.backendDeletes, []uint32{9}) {
		t.Errorf("stale: services %v, members %v, Maglev %v, backends %v",
			got.stale.svcDeletes, got.stale.memberDeletes, got.stale.maglevDeletes, got.stale.backendDeletes)
	}
	if got.used != 2 {
		t.Errorf("%d backends used, want 2", got.used)
	}

	// The reverse-NAT value without its inline members (as the old
	// layout wrote it), or with one's flags wrong, is wrong: rewritten.
	bad := revNatVal(a.key, pr)
	bad.MemberFlags[1] = 0
	for _, rn := range []bpfRevNat{revNatOf(a.key), bad} {
		au := p.newAuditor(pl.changes, pl.next, pl.offs, pl.nids, pl.gone)
		au.revNatEntry(1, rn)
		if au.au.revNatOK.has(0) || au.au.wrong[mapRevNat] != 1 {
			t.Errorf("reverse-NAT value %+v found correct", rn)
		}
	}
}

// manyBackends returns n backends "10.0.x.y:8080", sorted as members are.
func manyBackends(n int) []string {
	var bs []string
	for i := range n {
		bs = append(bs, fmt.Sprintf("10.0.%d.%d:8080", i/200, i%200+1))
	}
	return bs
}

// TestChangesFor: an incremental Apply changes the frontends of the
// services it names that differ from what is programmed, and removes those
// they no longer have; a full one changes every frontend, and removes
// those of services that are gone.
func TestChangesFor(t *testing.T) {
	svc := func(name, vip string, gen uint64, backends ...string) *dataplane.Service {
		s := &dataplane.Service{
			Name: name, Owner: "test", Generation: gen,
			VIPs:          []netip.Addr{netip.MustParseAddr(vip)},
			Ports:         []dataplane.Port{{Name: "p", Protocol: dataplane.TCP, Port: 80, TargetPort: 8080}},
			TrafficPolicy: dataplane.TrafficPolicyCluster,
			LoadBalancing: dataplane.LoadBalancingRandom,
		}
		for _, b := range backends {
			s.Backends = append(s.Backends, dataplane.Backend{IP: netip.MustParseAddr(b), State: dataplane.BackendReady, Weight: 1})
		}
		return s
	}
	state := func(changed []string, svcs ...*dataplane.Service) *dataplane.State {
		s := &dataplane.State{Services: map[string]*dataplane.Service{}, Changed: changed}
		for _, v := range svcs {
			s.Services[v.Name] = v
		}
		return s
	}
	view := func(changes []change) []string {
		var out []string
		for _, c := range changes {
			what := "remove "
			if c.fe != nil {
				what = "write "
			}
			out = append(out, what+c.key.String())
		}
		slices.Sort(out)
		return out
	}
	d := &Dataplane{prog: newStepProgrammer(), cfg: Config{MaglevTableSize: 251}}
	a, b := svc("ns/a", "198.18.0.1", 1, "10.0.0.1"), svc("ns/b", "198.18.0.2", 1, "10.0.0.2")
	changes, err := d.changesFor(state(nil, a, b), true)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := view(changes), []string{"write 198.18.0.1:80/TCP", "write 198.18.0.2:80/TCP"}; !slices.Equal(got, want) {
		t.Errorf("first full apply: %v, want %v", got, want)
	}
	d.prog.commit(d.prog.allocateIDs(changes))

	// b gets another backend, c is new, a is unchanged but named.
	b2 := svc("ns/b", "198.18.0.2", 2, "10.0.0.2", "10.0.0.3")
	c := svc("ns/c", "198.18.0.3", 1, "10.0.0.4")
	changes, err = d.changesFor(state([]string{"ns/a", "ns/b", "ns/c"}, a, b2, c), false)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := view(changes), []string{"write 198.18.0.2:80/TCP", "write 198.18.0.3:80/TCP"}; !slices.Equal(got, want) {
		t.Errorf("incremental apply: %v, want %v", got, want)
	}
	d.prog.commit(d.prog.allocateIDs(changes))

	// a moves to another VIP; b is gone but not named: untouched.
	a2 := svc("ns/a", "198.18.0.9", 2, "10.0.0.1")
	changes, err = d.changesFor(state([]string{"ns/a"}, a2, c), false)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := view(changes), []string{"remove 198.18.0.1:80/TCP", "write 198.18.0.9:80/TCP"}; !slices.Equal(got, want) {
		t.Errorf("incremental apply of a moved VIP: %v, want %v", got, want)
	}

	// A full apply removes b too, and rewrites every frontend it keeps.
	changes, err = d.changesFor(state(nil, a2, c), true)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"remove 198.18.0.1:80/TCP", "remove 198.18.0.2:80/TCP", "write 198.18.0.3:80/TCP", "write 198.18.0.9:80/TCP"}
	if got := view(changes); !slices.Equal(got, want) {
		t.Errorf("full apply: %v, want %v", got, want)
	}

	// c's VIP moves to a new service e in one incremental apply that names
	// both (and e twice): e takes it over, nothing is removed.
	d.prog.commit(d.prog.allocateIDs(changes))
	c2 := svc("ns/c", "198.18.0.4", 2, "10.0.0.4")
	e := svc("ns/e", "198.18.0.3", 1, "10.0.0.6")
	changes, err = d.changesFor(state([]string{"ns/e", "ns/c", "ns/e"}, a2, c2, e), false)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := view(changes), []string{"write 198.18.0.3:80/TCP", "write 198.18.0.4:80/TCP"}; !slices.Equal(got, want) {
		t.Errorf("a VIP moving between services: %v, want %v", got, want)
	}

	// A service the dataplane cannot program changes nothing.
	bad := svc("ns/bad", "198.18.0.5", 1, "10.0.0.5")
	bad.Ports[0].Protocol = dataplane.Protocol(99)
	if _, err := d.changesFor(state([]string{"ns/bad"}, bad), false); !errors.Is(err, dataplane.ErrUnsupported) {
		t.Errorf("a service with an unsupported protocol: %v, want an error wrapping ErrUnsupported", err)
	}
}

// TestQueueDenseFrontend: a dense frontend (unweighted, at most
// svcInlineSlots slots) has its slots in its master's value and no slot
// entries; one that becomes dense has its slot entries deleted after its
// master is written, one that stops being dense gets them before.
func TestQueueDenseFrontend(t *testing.T) {
	backends := func(n int) []string {
		var bs []string
		for i := range n {
			bs = append(bs, fmt.Sprintf("10.0.%d.%d:8080", i/200, i%200+1))
		}
		return bs
	}
	queue := func(p *programmer, fe *frontend) (slots, masters, stale writes, pl *applyPlan) {
		pl = p.allocateIDs([]change{{key: fe.key, fe: fe}})
		ch := chunk{changes: pl.changes, next: pl.next, offs: pl.offs}
		p.queueSlots(&slots, ch, false, &audit{})
		p.queueMasters(&masters, ch, false, &audit{})
		p.queueStale(&stale, ch)
		p.commit(pl)
		return slots, masters, stale, pl
	}

	p := newStepProgrammer()
	dense := stepFE("ns/a", "198.18.0.1", 80, ipprotoTCP, backends(3)...)
	slots, masters, stale, pl := queue(p, dense)
	if len(slots.svcKeys) != 0 || len(stale.svcDeletes) != 0 {
		t.Errorf("dense frontend: slot entries %v written, %v deleted; want none", slots.svcKeys, stale.svcDeletes)
	}
	want := bpfSvcVal{Count: 3, RevNatId: 1}
	copy(want.Slots[:], pl.next[0].slotIDs())
	if len(masters.svcVals) != 1 || masters.svcVals[0] != want || want.Slots[2] == 0 {
		t.Errorf("dense frontend: masters %+v, want %+v with its 3 slots", masters.svcVals, want)
	}
	if p.svcEntries != 1 {
		t.Errorf("dense frontend counts %d service entries, want 1", p.svcEntries)
	}

	// More slots than a master holds: slot entries, written before the
	// master (step 4 before step 5), which holds no slot.
	big := stepFE("ns/a", "198.18.0.1", 80, ipprotoTCP, backends(svcInlineSlots+1)...)
	slots, masters, stale, _ = queue(p, big)
	if len(slots.svcKeys) != svcInlineSlots+1 || len(stale.svcDeletes) != 0 {
		t.Errorf("frontend grown past %d slots: %d slot entries written, %v deleted; want %d and none",
			svcInlineSlots, len(slots.svcKeys), stale.svcDeletes, svcInlineSlots+1)
	}
	if len(masters.svcVals) != 1 || masters.svcVals[0].Slots != ([svcInlineSlots]uint32{}) || masters.svcVals[0].Count != svcInlineSlots+1 {
		t.Errorf("frontend grown past %d slots: master %+v, want count %d and no inline slot", svcInlineSlots, masters.svcVals, svcInlineSlots+1)
	}
	if p.svcEntries != svcInlineSlots+2 {
		t.Errorf("%d service entries, want %d", p.svcEntries, svcInlineSlots+2)
	}

	// Back to dense: the master with its slots, then (step 6) every
	// slot entry deleted.
	slots, masters, stale, _ = queue(p, dense)
	if len(slots.svcKeys) != 0 || len(masters.svcVals) != 1 || masters.svcVals[0].Count != 3 || masters.svcVals[0].Slots[0] == 0 {
		t.Errorf("frontend dense again: slots %v, masters %+v; want no slot entry and a master with 3 inline slots", slots.svcKeys, masters.svcVals)
	}
	if len(stale.svcDeletes) != svcInlineSlots+1 || stale.svcDeletes[0].Slot != 1 {
		t.Errorf("frontend dense again: deletes %v, want slot entries 1..%d", stale.svcDeletes, svcInlineSlots+1)
	}
	if p.svcEntries != 1 {
		t.Errorf("%d service entries, want 1", p.svcEntries)
	}

	// A weighted frontend is never dense: cumulative weights need entries.
	w := stepFE("ns/w", "198.18.0.2", 80, ipprotoTCP, backends(2)...)
	w.flags |= svcFlagWeighted
	if w.dense() || w.slotEntries() != 2 {
		t.Errorf("weighted frontend: dense %v, %d slot entries; want not dense, 2", w.dense(), w.slotEntries())
	}
}

// TestAuditDense: a dense frontend's master is correct only with its slots
// inline, and any slot entry it has (left by an earlier layout of it) is
// stale.
func TestAuditDense(t *testing.T) {
	a := stepFE("ns/a", "198.18.0.1", 80, ipprotoTCP, "10.0.0.1:8080", "10.0.0.2:8080")
	p := newStepProgrammer()
	pl := p.allocateIDs([]change{{key: a.key, fe: a}})
	au := p.newAuditor(pl.changes, pl.next, pl.offs, pl.nids, pl.gone)
	master := masterVal(pl.next[0])
	if master.Slots[0] == 0 || master.Slots[1] == 0 || master.Slots[2] != 0 {
		t.Fatalf("dense master %+v: want its 2 slots inline", master)
	}
	au.serviceEntry(svcKeyOf(a.key, 0), master)
	au.serviceEntry(svcKeyOf(a.key, 1), bpfSvcVal{BackendId: master.Slots[0], Weight: 1})
	if !au.au.masterOK.has(0) || au.au.ok[mapServices] != 1 {
		t.Errorf("dense master not found correct")
	}
	if want := []bpfSvcKey{svcKeyOf(a.key, 1)}; !slices.Equal(au.au.stale.svcDeletes, want) {
		t.Errorf("stale service entries %v, want the slot entry %v", au.au.stale.svcDeletes, want)
	}

	// The same master without its inline slots (as the old layout wrote
	// it) is wrong: rewritten.
	au = p.newAuditor(pl.changes, pl.next, pl.offs, pl.nids, pl.gone)
	bare := master
	bare.Slots = [svcInlineSlots]uint32{}
	au.serviceEntry(svcKeyOf(a.key, 0), bare)
	if au.au.masterOK.has(0) || au.au.wrong[mapServices] != 1 {
		t.Errorf("master without its inline slots found correct")
	}
}

// TestEmptyApplyKeepsMapsClean: a full apply of no frontend writes no
// service entry, so clean maps stay clean and the next full apply reads
// nothing (the step programmer has no maps: reading would panic); an
// apply that programs or removes a frontend writes.
func TestEmptyApplyKeepsMapsClean(t *testing.T) {
	p := newStepProgrammer()
	p.clean = true
	empty := p.allocateIDs(nil)
	if empty.writesEntries() {
		t.Fatal("an apply of no frontend writes entries")
	}
	if au, err := p.auditFull(empty, true); au != nil || err != nil {
		t.Fatalf("auditFull on clean maps: %v, %v; want no audit", au, err)
	}
	a := stepFE("ns/a", "198.18.0.1", 80, ipprotoTCP, "10.0.0.1:8080")
	pl := p.allocateIDs([]change{{key: a.key, fe: a}})
	if !pl.writesEntries() {
		t.Error("an apply of a frontend writes no entries")
	}
	p.commit(pl)
	if gone := p.allocateIDs([]change{{key: a.key}}); !gone.writesEntries() {
		t.Error("an apply that removes a frontend writes no entries")
	}
}

// TestAuditBackendsBothFamilies: the audit checks an IPv4 backend by its
// packed key and an IPv6 one through the backend table; either is correct
// only under its own ID.
func TestAuditBackendsBothFamilies(t *testing.T) {
	a := stepFE("ns/a", "198.18.0.1", 80, ipprotoTCP, "10.0.0.1:8080", "[fd00:198::5]:8080")
	p := newStepProgrammer()
	pl := p.allocateIDs([]change{{key: a.key, fe: a}})
	au := p.newAuditor(pl.changes, pl.next, pl.offs, pl.nids, pl.gone)
	au.countUsed()
	v4, v6 := refOf(t, p, "10.0.0.1:8080").id, refOf(t, p, "[fd00:198::5]:8080").id
	var be4, be6 bpfBackend
	be4.Addr.W, be4.Port = toWords(netip.MustParseAddr("10.0.0.1")), be16(8080)
	be6.Addr.W, be6.Port = toWords(netip.MustParseAddr("fd00:198::5")), be16(8080)
	au.backendEntry(v4, be4) // correct
	au.backendEntry(v6, be6) // correct
	au.backendEntry(v4, be6) // the IPv6 backend under the IPv4 one's ID
	au.backendEntry(v6, be4) // and the other way round
	if au.au.ok[mapBackends] != 2 || au.au.wrong[mapBackends] != 2 {
		t.Errorf("backends found correct %d, wrong %d; want 2 and 2", au.au.ok[mapBackends], au.au.wrong[mapBackends])
	}
}

// TestQueueInlineMembers: a frontend of at most revNatInlineMembers
// members keeps them in its reverse-NAT value and writes no vipd_members
// entry; a larger one writes its members, then a value that points at
// them. Across a change, old and new members stay members together until
// step 6 (memberUnion): in the value while they fit, else in vipd_members,
// written before the value says so and deleted after the final value.
func TestQueueInlineMembers(t *testing.T) {
	type steps struct {
		members, stale writes // step 2, step 6
	}
	queue := func(p *programmer, fe *frontend) steps {
		var s steps
		pl := p.allocateIDs([]change{{key: fe.key, fe: fe}})
		ch := chunk{changes: pl.changes, next: pl.next, offs: pl.offs}
		p.queueMembers(&s.members, ch, false, &audit{})
		p.queueStale(&s.stale, ch)
		p.commit(pl)
		return s
	}
	fe := func(bs []string) *frontend { return stepFE("ns/a", "198.18.0.1", 80, ipprotoTCP, bs...) }
	all := manyBackends(40)
	p := newStepProgrammer()

	// New, 16 members: inline, no member entry.
	s := queue(p, fe(all[:16]))
	if len(s.members.memberKeys) != 0 || len(s.members.revNatVals) != 1 || s.members.revNatVals[0].Members != 16 ||
		s.members.revNatVals[0].MemberIds[15] == 0 || s.members.revNatVals[0].MemberFlags[15] != memberFlagEligible {
		t.Errorf("16 members: member entries %v, reverse NAT %+v; want none and 16 inline", s.members.memberKeys, s.members.revNatVals)
	}
	if p.memberEntries != 0 {
		t.Errorf("16 inline members count %d member entries, want 0", p.memberEntries)
	}

	// 16 -> 17: every member into vipd_members, then the value points there;
	// nothing to delete.
	s = queue(p, fe(all[:17]))
	if len(s.members.memberKeys) != 17 || len(s.members.revNatVals) != 1 || s.members.revNatVals[0].Members != revNatMembersMap {
		t.Errorf("16 -> 17 members: %d member entries, reverse NAT %+v; want 17 and the map mark", len(s.members.memberKeys), s.members.revNatVals)
	}
	if s.stale.len() != 0 {
		t.Errorf("16 -> 17 members: step 6 queues %d writes, want none", s.stale.len())
	}
	if p.memberEntries != 17 {
		t.Errorf("17 members count %d member entries, want 17", p.memberEntries)
	}

	// 17 -> 16: the union (17) stays in vipd_members through step 5; step 6
	// writes the inline value, then deletes all 17 entries.
	s = queue(p, fe(all[:16]))
	if len(s.members.memberKeys) != 0 || len(s.members.revNatVals) != 0 {
		t.Errorf("17 -> 16 members: step 2 writes members %v, reverse NAT %+v; want nothing (the union is all there)", s.members.memberKeys, s.members.revNatVals)
	}
	if len(s.stale.revNatVals) != 1 || s.stale.revNatVals[0].Members != 16 || len(s.stale.memberDeletes) != 17 {
		t.Errorf("17 -> 16 members: step 6 writes reverse NAT %+v, deletes %d members; want 16 inline and 17", s.stale.revNatVals, len(s.stale.memberDeletes))
	}

	// 16 -> 16 others, union 32: the union goes into vipd_members first,
	// step 6 writes the new 16 inline and deletes the 32 entries.
	s = queue(p, fe(all[16:32]))
	if len(s.members.memberKeys) != 32 || len(s.members.revNatVals) != 1 || s.members.revNatVals[0].Members != revNatMembersMap {
		t.Errorf("member swap: step 2 writes %d members, reverse NAT %+v; want 32 and the map mark", len(s.members.memberKeys), s.members.revNatVals)
	}
	if len(s.stale.revNatVals) != 1 || s.stale.revNatVals[0].Members != 16 || len(s.stale.memberDeletes) != 32 {
		t.Errorf("member swap: step 6 writes reverse NAT %+v, deletes %d members; want 16 inline and 32", s.stale.revNatVals, len(s.stale.memberDeletes))
	}
	if p.memberEntries != 0 {
		t.Errorf("16 inline members count %d member entries, want 0", p.memberEntries)
	}

	// One member drained (not eligible), one gone: step 2's value holds
	// all 16 with the new flags, step 6's the 15 left.
	next := fe(all[16:31])
	next.members[0].flags = 0
	s = queue(p, next)
	if len(s.members.revNatVals) != 1 || s.members.revNatVals[0].Members != 16 || s.members.revNatVals[0].MemberFlags[0] != 0 ||
		s.members.revNatVals[0].MemberFlags[15] != memberFlagEligible || len(s.members.memberKeys) != 0 {
		t.Errorf("drain and removal: step 2 writes reverse NAT %+v, members %v; want the 16 with the first drained", s.members.revNatVals, s.members.memberKeys)
	}
	if len(s.stale.revNatVals) != 1 || s.stale.revNatVals[0].Members != 15 || len(s.stale.memberDeletes) != 0 {
		t.Errorf("drain and removal: step 6 writes reverse NAT %+v, deletes %v; want 15 inline and nothing", s.stale.revNatVals, s.stale.memberDeletes)
	}

	// Nothing changes: nothing written.
	s = queue(p, fe(all[16:31]))
	s2 := queue(p, fe(all[16:31]))
	if s2.members.len() != 0 || s2.stale.len() != 0 {
		t.Errorf("unchanged frontend: step 2 %d writes, step 6 %d; want none", s2.members.len(), s2.stale.len())
	}
	_ = s
}

// TestServiceIndex: keysOf yields every frontend index added of a service
// and unindex did not remove, whichever of them goes first.
func TestServiceIndex(t *testing.T) {
	p := newStepProgrammer()
	k := func(port uint16) feKey {
		return feKey{addr: netip.MustParseAddr("198.18.0.1"), port: port, proto: ipprotoTCP}
	}
	keys := func(svc string) []uint16 {
		var out []uint16
		for key := range p.keysOf(svc) {
			out = append(out, key.port)
		}
		slices.Sort(out)
		return out
	}
	p.index("ns/a", k(1))
	p.index("ns/a", k(2))
	p.index("ns/a", k(3))
	p.index("ns/b", k(4))
	if got := keys("ns/a"); !slices.Equal(got, []uint16{1, 2, 3}) {
		t.Errorf("ns/a: %v, want [1 2 3]", got)
	}
	p.unindex("ns/a", k(1))
	p.unindex("ns/a", k(3))
	p.unindex("ns/b", k(9))
	if got := keys("ns/a"); !slices.Equal(got, []uint16{2}) {
		t.Errorf("ns/a after removing 1 and 3: %v, want [2]", got)
	}
	if got := keys("ns/b"); !slices.Equal(got, []uint16{4}) {
		t.Errorf("ns/b after removing a key it lacks: %v, want [4]", got)
	}
	p.unindex("ns/a", k(2))
	p.unindex("ns/b", k(4))
	if len(p.byService) != 0 || len(p.moreOf) != 0 || len(keys("ns/a")) != 0 {
		t.Errorf("index after removing every key: %v, %v", p.byService, p.moreOf)
	}
}
