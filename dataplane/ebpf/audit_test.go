package ebpf

import (
	"net/netip"
	"testing"

	"github.com/vipd/vipd/dataplane"
)

// TestRestartAuditRepairs: the first full apply after a restart reads the
// maps once, leaves what is right, rewrites what is wrong and deletes what
// no service accounts for, as a crash in the middle of an apply could
// leave them.
func TestRestartAuditRepairs(t *testing.T) {
	e := newDPEnv(t, []string{"client", "be1", "be2", "be3"}, dpSmallMaps)
	a := e.service("test/a", dpVIPA, dataplane.TCP, dpReady("be1"), dpReady("be2"), dpReady("be3"))
	b := e.service("test/b", dpVIPB, dataplane.TCP, dpReady("be2"))
	dp := e.open(nil)
	e.apply(dpState(1, nil, a, b))
	want := dpSnapshot(t, &dp.objs.bpfMaps)

	m := &dp.objs.bpfMaps
	put := func(what string, mp interface{ Put(k, v any) error }, k, v any) {
		t.Helper()
		if err := mp.Put(k, v); err != nil {
			t.Fatalf("corrupt %s: %v", what, err)
		}
	}
	master := svcKeyOf(feKey{addr: dpVIPA, port: 80, proto: ipprotoTCP}, 0)
	var mv bpfSvcVal
	if err := m.VipdServices.Lookup(&master, &mv); err != nil {
		t.Fatalf("read A's master: %v", err)
	}
	// A is dense: its master holds its slots. Its slot 1 naming another
	// backend, and a slot entry (which it should not have) past the count.
	if mv.Count > svcInlineSlots || mv.Slots[0] == 0 {
		t.Fatalf("A's master %+v: want a dense frontend", mv)
	}
	sv := bpfSvcVal{BackendId: mv.Slots[0], Weight: 1}
	wrong := mv
	wrong.Slots[0] = 4242
	put("master", m.VipdServices, &master, &wrong)
	past := master
	past.Slot = 9
	put("slot", m.VipdServices, &past, &sv)
	// A member with wrong flags, and one of a backend A does not have.
	mk := bpfMemberKey{RevNatId: mv.RevNatId, BackendId: sv.BackendId}
	put("member", m.VipdMembers, &mk, uint32(0))
	put("member", m.VipdMembers, &bpfMemberKey{RevNatId: mv.RevNatId, BackendId: 999}, uint32(memberFlagEligible))
	// A backend no service uses, and a frontend no service has.
	var be bpfBackend
	be.Addr.W = toWords(netip.MustParseAddr("10.99.0.1"))
	be.Port = be16(8080)
	put("backend", m.VipdBackends, uint32(999), &be)
	absent := feKey{addr: netip.MustParseAddr("198.19.0.99"), port: 80, proto: ipprotoTCP}
	var rn bpfRevNat
	rn.Addr.W = toWords(absent.addr)
	rn.Port = be16(absent.port)
	rn.Proto = absent.proto
	put("reverse NAT", m.VipdRevnat, uint32(777), &rn)
	put("master", m.VipdServices, svcKeyOf(absent, 0), &bpfSvcVal{Count: 1, RevNatId: 777})
	put("slot", m.VipdServices, svcKeyOf(absent, 1), &bpfSvcVal{BackendId: 999, Weight: 1})
	put("member", m.VipdMembers, &bpfMemberKey{RevNatId: 777, BackendId: 999}, uint32(memberFlagEligible))

	e.close()
	dp = e.open(nil)
	e.apply(dpState(2, nil, a, b))
	dpWantSnap(t, "the maps after the audited full apply", dpSnapshot(t, &dp.objs.bpfMaps), want)
	if c, err := dp.prog.check(); err != nil || c.any() {
		t.Errorf("after the audited full apply, the maps differ from the state: %v (err %v)", c, err)
	}
	if _, ok := dp.prog.revNatIDs[absent]; ok {
		t.Errorf("the absent frontend %s keeps its reverse-NAT ID", absent)
	}
	e.expectBackends(dpVIPA, "be1", "be2", "be3")
	e.expectBackends(dpVIPB, "be2")
}

func TestBackendTable(t *testing.T) {
	tab := newBackendTable()
	keys := []beKey{
		{addr: netip.MustParseAddr("10.0.0.1"), port: 8080},
		{addr: netip.MustParseAddr("10.0.0.1"), port: 8081},
		{addr: netip.MustParseAddr("255.255.255.255"), port: 65535},
		{addr: netip.MustParseAddr("fd00::1"), port: 8080},
		{addr: netip.MustParseAddr("::1"), port: 1},
	}
	for i, k := range keys {
		tab.put(k.packed(), backendRef{id: uint32(i + 1), refs: int32(i)})
	}
	if tab.len() != len(keys) || tab.n4 != 3 {
		t.Fatalf("len %d (IPv4 %d), want %d (3)", tab.len(), tab.n4, len(keys))
	}
	seen := map[beKey]uint32{}
	for k, r := range tab.all() {
		seen[k.unpack()] = r.id
	}
	for i, k := range keys {
		if r, ok := tab.get(k.packed()); !ok || r.id != uint32(i+1) || r.refs != int32(i) {
			t.Errorf("get %s: %+v, %v", k, r, ok)
		}
		if seen[k] != uint32(i+1) {
			t.Errorf("all yields %s as ID %d, want %d", k, seen[k], i+1)
		}
	}
	for _, k := range keys {
		tab.del(k.packed())
	}
	if tab.len() != 0 {
		t.Errorf("len %d after deleting every key", tab.len())
	}
}

// TestRevNatIndex: the audit's reverse-NAT index finds what was set and
// nothing else, in its slice (IDs below the counter) and its map (IDs past
// it, or a counter far beyond the frontends).
func TestRevNatIndex(t *testing.T) {
	for _, tc := range []struct {
		name    string
		next    uint32
		n       int
		dense   bool
		ids     []uint32
		missing []uint32
	}{
		{"dense", 100, 3, true, []uint32{1, 50, 99, 150}, []uint32{0, 2, 98, 100, 151, 1 << 31}},
		{"sparse", maxRevNatSlice + 1, 3, false, []uint32{1, 5, maxRevNatSlice}, []uint32{0, 2, 6}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := newRevNatIndex(tc.next, tc.n)
			if got := x.dense != nil; got != tc.dense {
				t.Fatalf("slice used: %v, want %v", got, tc.dense)
			}
			for i, id := range tc.ids {
				x.set(id, i)
			}
			for i, id := range tc.ids {
				if j, ok := x.get(id); !ok || j != i {
					t.Errorf("get(%d) = %d, %v; want %d, true", id, j, ok, i)
				}
			}
			for _, id := range tc.missing {
				if j, ok := x.get(id); ok {
					t.Errorf("get(%d) = %d, true; want none", id, j)
				}
			}
		})
	}
}

// TestUsedKey: countUsed records the referenced backends, IPv4 and IPv6,
// and usedKey finds them (and no other) both when it keeps them by ID and
// when the ID counter is too far beyond them for that.
func TestUsedKey(t *testing.T) {
	for _, next := range []uint32{10, maxUsedSlice + 1} {
		p := &programmer{backendIDs: newBackendTable(), nextBackend: next}
		v4 := beKey{addr: netip.MustParseAddr("198.18.0.1"), port: 80}.packed()
		v6 := beKey{addr: netip.MustParseAddr("fd00:198::1"), port: 80}.packed()
		unref := beKey{addr: netip.MustParseAddr("198.18.0.2"), port: 80}.packed()
		p.backendIDs.put(v4, backendRef{id: 3, refs: 1})
		p.backendIDs.put(v6, backendRef{id: 5, refs: 2})
		p.backendIDs.put(unref, backendRef{id: 7, refs: 0})
		a := &auditor{p: p, au: &audit{}}
		a.countUsed()
		if a.au.used != 2 {
			t.Errorf("next %d: %d used, want 2", next, a.au.used)
		}
		want4, _ := v4Key(v4)
		for id, want := range map[uint32]uint64{3: want4, 5: usedV6} {
			if k, ok := a.usedKey(id); !ok || k != want {
				t.Errorf("next %d: usedKey(%d) = %#x, %v; want %#x, true", next, id, k, ok, want)
			}
		}
		for _, id := range []uint32{0, 1, 4, 7, 9, 10, 1 << 30} {
			if k, ok := a.usedKey(id); ok {
				t.Errorf("next %d: usedKey(%d) = %#x, true; want none", next, id, k)
			}
		}
	}
}
