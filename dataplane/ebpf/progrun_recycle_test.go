package ebpf

import (
	"net/netip"
	"slices"
	"testing"
)

// TestProgRunRecycledBackendID: backend IDs are recycled (backendids.go).
// When a flow's backend leaves and its ID goes to another backend of the
// same frontend, the ID is a member again, but the flow's backend is not:
// a UDP flow, and a new SYN on the tuple of a tracked TCP flow, must not
// keep going to the old address.
func TestProgRunRecycledBackendID(t *testing.T) {
	t.Run("inline members", func(t *testing.T) { testRecycledBackendID(t, false) })
	t.Run("members in the member map", func(t *testing.T) { testRecycledBackendID(t, true) })
}

func testRecycledBackendID(t *testing.T, spill bool) {
	// recycle starts a flow with first, then moves the flow's backend out
	// of the frontend and gives its ID to a new backend, in the
	// dataplane's order: slots and membership first, then the slot is
	// zeroed (the ID freed), then the new backend's slot is written
	// before its membership and slots. It returns the old backend.
	recycle := func(t *testing.T, r *prEnv, fe prFrontend, first []byte) prBackend {
		t.Helper()
		r.addService(fe, prBackends4...)
		if spill {
			for id := uint32(100); id < 100+revNatInlineMembers+1-uint32(len(prBackends4)); id++ {
				r.setMember(fe, id, prMemberEligible)
			}
			if got := r.revNat(fe).Members; got != revNatMembersMap {
				t.Fatalf("reverse-NAT value says %#x members, want them in vipd_members", got)
			}
		}
		_, out := r.run(r.objs.VipdFromPod, first)
		oldID := prBackendOf(t, out, prBackends4)
		old := prBackends4[slices.IndexFunc(prBackends4, func(be prBackend) bool { return be.id == oldID })]
		others := slices.DeleteFunc(slices.Clone(prBackends4), func(be prBackend) bool { return be.id == oldID })

		r.setSlots(fe, others...)
		r.deleteMember(fe, oldID)
		slots := newBackendSlots(r.objs.VipdBackends)
		if err := clearBackends(slots, []uint32{oldID}); err != nil {
			t.Fatalf("free backend %d: %v", oldID, err)
		}
		reused := prBackend{id: oldID, addr: prAP("198.18.1.9:8080")}
		if old.addr.Port() != reused.addr.Port() || old.addr == reused.addr {
			t.Fatalf("test setup: the new backend %s must differ from %s in address only", reused.addr, old.addr)
		}
		r.addService(fe, append(others, reused)...)
		return old
	}
	// wantMoved checks that out went to a backend of the frontend now,
	// not to old, and that conntrack agrees.
	wantMoved := func(t *testing.T, r *prEnv, out []byte, old prBackend, proto uint8) {
		t.Helper()
		dst := prDecode(t, out).dstPort()
		if dst == old.addr {
			t.Fatalf("the flow stayed on %s, which left the service (its ID %d now names another backend)", old.addr, old.id)
		}
		fwd, ok := r.ct(prClient4, prVIP4For(proto), proto, prDirForward)
		if !ok {
			t.Fatal("no forward entry")
		}
		if got := fromWords(fwd.NatAddr.W); got != dst.Addr() || fromBE16(fwd.NatPort) != dst.Port() {
			t.Errorf("forward entry names %s:%d, the packet went to %s", got, fromBE16(fwd.NatPort), dst)
		}
		if _, ok := r.ct(old.addr, prClient4, proto, prDirReply); ok {
			t.Error("the old backend's reply entry survived")
		}
	}

	t.Run("udp flow moves", func(t *testing.T) {
		r := newPREnv(t)
		fe := prFrontend{vip: prVIP4For(prUDP), proto: prUDP, id: 1}
		in := prUDPFrame(prClient4, fe.vip, []byte("q"))
		old := recycle(t, r, fe, in)
		ret, out := r.run(r.objs.VipdFromPod, in)
		prWantVerdict(t, ret, prTCOK)
		wantMoved(t, r, out, old, prUDP)
	})
	t.Run("tcp SYN reusing a tuple moves", func(t *testing.T) {
		r := newPREnv(t)
		fe := prFrontend{vip: prVIP4For(prTCP), proto: prTCP, id: 1}
		syn := prTCPFrame(prClient4, fe.vip, 1000, 0, prSYN, nil)
		old := recycle(t, r, fe, syn)
		ret, out := r.run(r.objs.VipdFromPod, syn)
		prWantVerdict(t, ret, prTCOK)
		wantMoved(t, r, out, old, prTCP)
	})
	t.Run("tcp flow keeps its backend", func(t *testing.T) {
		// Established segments ask nothing about the backend: the flow
		// finishes on its old backend, as with a removed one.
		r := newPREnv(t)
		fe := prFrontend{vip: prVIP4For(prTCP), proto: prTCP, id: 1}
		old := recycle(t, r, fe, prTCPFrame(prClient4, fe.vip, 1000, 0, prSYN, nil))
		ret, out := r.run(r.objs.VipdFromPod, prTCPFrame(prClient4, fe.vip, 1001, 5001, prACK, nil))
		prWantVerdict(t, ret, prTCOK)
		if dst := prDecode(t, out).dstPort(); dst != old.addr {
			t.Errorf("established flow moved from %s to %s", old.addr, dst)
		}
	})
}

// prVIP4For is the IPv4 VIP:port of the frontend of proto in these tests.
func prVIP4For(proto uint8) netip.AddrPort {
	if proto == prUDP {
		return prWithPort(prVIP4, 53)
	}
	return prVIP4
}
