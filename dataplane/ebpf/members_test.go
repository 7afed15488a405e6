package ebpf

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/vipd/vipd/dataplane"
)

// withTerminating adds n terminating backends on addresses no pod has to
// svc: members of its frontends (they may take no new connection), in no
// slot, so that traffic still reaches only the ready pods.
func withTerminating(svc *dataplane.Service, n int) *dataplane.Service {
	out := *svc
	out.Backends = append([]dataplane.Backend(nil), svc.Backends...)
	for i := range n {
		out.Backends = append(out.Backends, dataplane.Backend{
			IP: netip.MustParseAddr(fmt.Sprintf("198.18.250.%d", i+1)), State: dataplane.BackendTerminating, Weight: 1})
	}
	sortBackends(&out)
	return &out
}

// membersOfRevNat returns the reverse-NAT value of ID id and the number of
// vipd_members entries that name it.
func membersOfRevNat(t *testing.T, m *bpfMaps, id uint32) (bpfRevNat, int) {
	t.Helper()
	var rn bpfRevNat
	if err := m.VipdRevnat.Lookup(id, &rn); err != nil {
		t.Fatalf("read reverse NAT %d: %v", id, err)
	}
	n := 0
	err := forEach(m.VipdMembers, func(k bpfMemberKey, _ uint32) {
		if k.RevNatId == id {
			n++
		}
	})
	if err != nil {
		t.Fatalf("read members: %v", err)
	}
	return rn, n
}

// TestDataplaneInlineMembers: a frontend of up to 16 members keeps them in
// its reverse-NAT value and writes no vipd_members entry; at 17 they move
// to vipd_members (and the value says so), and back inline at 16, with
// the entries deleted. Traffic reaches the ready backends throughout, and
// VerifyPinned finds the maps in order, and a corrupted inline member.
func TestDataplaneInlineMembers(t *testing.T) {
	e := newDPEnv(t, []string{"client", "be1", "be2"}, dpSmallMaps)
	e.open(nil)
	base := e.service("test/tcp", dpVIPA, dataplane.TCP, dpReady("be1"), dpReady("be2"))
	key := feKey{addr: dpVIPA, port: 80, proto: ipprotoTCP}
	gen := uint64(0)
	step := func(name string, terminating int, wantInline uint32, wantEntries int) *dataplane.State {
		t.Helper()
		gen++
		svc := withTerminating(base, terminating)
		svc.Generation = gen
		var changed []string
		if gen > 1 {
			changed = []string{svc.Name} // incremental: the member union path
		}
		s := dpState(gen, changed, svc)
		e.apply(s)
		rn, n := membersOfRevNat(t, &e.dp.objs.bpfMaps, e.dp.prog.frontends[key].revNat)
		if rn.Members != wantInline || n != wantEntries {
			t.Fatalf("%s: reverse-NAT value says %#x members, vipd_members holds %d of them; want %#x and %d",
				name, rn.Members, n, wantInline, wantEntries)
		}
		if err := e.verifyPinned(s); err != nil {
			t.Fatalf("%s: VerifyPinned: %v", name, err)
		}
		e.expectBackends(dpVIPA, "be1", "be2")
		return s
	}
	step("16 members", 14, 16, 0)
	step("17 members", 15, revNatMembersMap, 17)
	step("back to 16 members", 14, 16, 0)
	s := step("2 members", 0, 2, 0)

	// An inline member's flags changed behind vipd's back are found.
	id := e.dp.prog.frontends[key].revNat
	rn, _ := membersOfRevNat(t, &e.dp.objs.bpfMaps, id)
	rn.MemberFlags[0] = 0
	if err := e.dp.objs.VipdRevnat.Put(id, &rn); err != nil {
		t.Fatal(err)
	}
	if err := e.verifyPinned(s); err == nil || !strings.Contains(err.Error(), "has flags 0x0, want 0x1") {
		t.Fatalf("VerifyPinned with an inline member drained by hand: %v, want it to say so", err)
	}
}

// TestDriftInlineMember: an inline member corrupted behind vipd's back (its
// backend ID or its flags) is drift in vipd_revnat, and a full apply
// repairs it.
func TestDriftInlineMember(t *testing.T) {
	e := newDriftEnv(t, TCAttachAuto)
	m := &e.dp.objs.bpfMaps
	want := dpSnapshot(t, m)
	for i, k := range []feKey{{addr: dpVIPA, port: 80, proto: ipprotoTCP}, {addr: dpVIPB, port: 80, proto: ipprotoUDP}} {
		id := e.dp.prog.frontends[k].revNat
		rn, n := membersOfRevNat(t, m, id)
		if rn.Members != 2 || n != 0 {
			t.Fatalf("frontend %s: %#x inline members and %d member entries, want 2 and none", k, rn.Members, n)
		}
		if i == 0 {
			rn.MemberFlags[1] = 0 // drained
		} else {
			rn.MemberIds[0] = 4242 // another backend
		}
		if err := m.VipdRevnat.Put(id, &rn); err != nil {
			t.Fatal(err)
		}
	}
	e.expectDrift(driftMapEntries, "vipd_revnat: 0 entries missing, 2 wrong, 0 no service accounts for")
	e.repairAndCheck("vipd_revnat=\"added=0 fixed=2 removed=0\"")
	dpWantSnap(t, "the maps after the repair", dpSnapshot(t, m), want)
}
