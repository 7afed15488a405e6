package ebpf

// BPF_PROG_TEST_RUN tests of the SNAT port choice of external flows under
// policy Cluster (ct_create): the client's own port first, a closed flow
// of the same client tuple taken over at once, random ports after a
// collision, the skipped ports (ip_local_port_range) never handed out, and
// a packet that finds no port dropped with nothing tracked.

import (
	"net/netip"
	"testing"

	"github.com/vipd/vipd/dataplane"
)

// newSNATEnv is a test env with one external frontend under Cluster
// (prNodePort, backend prBackends4[0]), SNAT ports ports less skip, and
// the loopback device as the external interface with prNodeAddr.
func newSNATEnv(t *testing.T, ports, skip PortRange) *prEnv {
	t.Helper()
	r := newPREnv(t)
	cfg := configFor(0, ConntrackTimeouts{}, ports)
	cfg.SnatSkipMin, cfg.SnatSkipMax = skip.Min, skip.Max
	if err := writeConfig(&r.objs.bpfMaps, cfg); err != nil {
		t.Fatal(err)
	}
	r.addService(prFrontend{vip: prNodePort, proto: prTCP, id: 1, scope: scopeExternal, flags: svcFlagSNAT}, prBackends4[0])
	r.setExternalLoopback(prNodeAddr)
	return r
}

// setExternalLoopback makes the interface prog.Run packets enter on
// (loopback, index 1) an external one holding the node addresses addrs,
// which SNAT uses.
func (r *prEnv) setExternalLoopback(addrs ...netip.Addr) {
	r.t.Helper()
	x := extIfaceOf(&dataplane.Interface{Name: "lo", Index: 1, Addrs: addrs, External: true})
	if err := r.objs.VipdExtIfaces.Put(uint32(1), &x); err != nil {
		r.t.Fatalf("put external interface: %v", err)
	}
}

// snatSYN sends a SYN from client to the node port and returns the port
// it was SNATed to, or 0 when the program tracked no new flow of it (it
// dropped the packet). The verdict itself depends on the routes of the
// test's namespace (fib lookup): not checked.
func snatSYN(t *testing.T, r *prEnv, client netip.AddrPort, seq uint32) uint16 {
	t.Helper()
	before, existed := r.ct(client, prNodePort, prTCP, prDirForward)
	_, out := r.run(r.objs.VipdFromExt, prTCPFrame(client, prNodePort, seq, 0, prSYN, nil))
	fwd, ok := r.ct(client, prNodePort, prTCP, prDirForward)
	if !ok || (existed && fwd.FlowId == before.FlowId) {
		return 0
	}
	port := fromBE16(fwd.SnatPort)
	p := prDecode(t, out)
	if p.srcPort() != netip.AddrPortFrom(prNodeAddr, port) || p.dstPort() != prBackends4[0].addr {
		t.Fatalf("SYN of %s went out %s -> %s, want %s:%d -> %s", client, p.srcPort(), p.dstPort(), prNodeAddr, port, prBackends4[0].addr)
	}
	return port
}

// snatOwner is the client whose flow holds SNAT port port (from the reply
// entry), and whether one does.
func snatOwner(r *prEnv, port uint16) (netip.AddrPort, bool) {
	rev, ok := r.ct(prBackends4[0].addr, netip.AddrPortFrom(prNodeAddr, port), prTCP, prDirReply)
	if !ok {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(fromWords(rev.SnatAddr.W), fromBE16(rev.SnatPort)), true
}

// TestProgRunSNATClientPort: a client's own source port is its SNAT port
// when the range has it (and it is not skipped); a client port outside
// the range maps to the same SNAT port each time it comes back.
func TestProgRunSNATClientPort(t *testing.T) {
	r := newSNATEnv(t, PortRange{Min: 61000, Max: 61099}, PortRange{Min: 61040, Max: 61059})
	for _, cp := range []uint16{61000, 61037, 61071, 61099} {
		c := prWithPort(prOutside4, cp)
		if got := snatSYN(t, r, c, 1000); got != cp {
			t.Errorf("client %s SNATed to port %d, want its own", c, got)
		}
	}
	// A skipped port is never handed out, not even to its own client.
	c := prWithPort(prOutside4, 61045)
	if got := snatSYN(t, r, c, 1000); got == 0 || got == 61045 || (got >= 61040 && got <= 61059) || got < 61000 || got > 61099 {
		t.Errorf("client %s SNATed to port %d, want one of 61000-61039, 61060-61099", c, got)
	}
	// Out of the range: the port the client's address and port hash to,
	// the same when it comes back after its flow's entries went.
	c = prWithPort(prOutside4, 45000)
	first := snatSYN(t, r, c, 1000)
	if first == 0 {
		t.Fatalf("client %s dropped", c)
	}
	for _, k := range []bpfCtKey{prCTKey(c, prNodePort, prTCP, prDirForward),
		prCTKey(prBackends4[0].addr, netip.AddrPortFrom(prNodeAddr, first), prTCP, prDirReply)} {
		if err := r.objs.VipdCt.Delete(&k); err != nil {
			t.Fatalf("delete: %v", err)
		}
	}
	for i := range 3 {
		if got := snatSYN(t, r, c, 5000); got != first {
			t.Fatalf("client %s came back (%d) SNATed to port %d, first %d", c, i, got, first)
		}
		k := prCTKey(c, prNodePort, prTCP, prDirForward)
		var e bpfCtEntry
		if err := r.objs.VipdCt.Lookup(&k, &e); err != nil {
			t.Fatalf("lookup: %v", err)
		}
		e.Expires = 1 // over: the next SYN replaces the flow
		if err := r.objs.VipdCt.Put(&k, &e); err != nil {
			t.Fatalf("put: %v", err)
		}
	}
}

// TestProgRunSNATSameTuple: a reply entry left by a flow of the same
// client tuple to the same node port (its forward entry gone) does not
// block that client's port: the new flow takes it over at once, even in
// a range of one port, while another client still finds it taken.
func TestProgRunSNATSameTuple(t *testing.T) {
	r := newSNATEnv(t, PortRange{Min: 61000, Max: 61000}, PortRange{})
	c := prWithPort(prOutside4, 45000)
	if got := snatSYN(t, r, c, 1000); got != 61000 {
		t.Fatalf("first flow SNATed to port %d, want 61000", got)
	}
	old, _ := r.ct(prBackends4[0].addr, netip.AddrPortFrom(prNodeAddr, 61000), prTCP, prDirReply)
	fk := prCTKey(c, prNodePort, prTCP, prDirForward)
	if err := r.objs.VipdCt.Delete(&fk); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if got := snatSYN(t, r, prWithPort(prOutside4, 45001), 1000); got != 0 {
		t.Fatalf("another client got port %d held by %s's flow", got, c)
	}
	if got := snatSYN(t, r, c, 9000); got != 61000 {
		t.Fatalf("the same client tuple came back SNATed to port %d (0: dropped), want 61000", got)
	}
	rev, ok := r.ct(prBackends4[0].addr, netip.AddrPortFrom(prNodeAddr, 61000), prTCP, prDirReply)
	fwd, fok := r.ct(c, prNodePort, prTCP, prDirForward)
	if !ok || !fok || rev.FlowId == old.FlowId || rev.FlowId != fwd.FlowId {
		t.Fatalf("reply entry %+v (found %v), forward %+v (found %v): want both of one new flow", rev, ok, fwd, fok)
	}
}

// TestProgRunSNATCollision: when a client's port is held by another
// client's live flow, the new flow gets another port of the range and the
// holder keeps its own.
func TestProgRunSNATCollision(t *testing.T) {
	r := newSNATEnv(t, PortRange{Min: 61000, Max: 61009}, PortRange{})
	holder := prWithPort(prOutside4, 61005)
	if got := snatSYN(t, r, holder, 1000); got != 61005 {
		t.Fatalf("holder SNATed to port %d, want 61005", got)
	}
	other := netip.AddrPortFrom(netip.MustParseAddr("203.0.113.8"), 61005)
	got := snatSYN(t, r, other, 1000)
	if got == 0 || got == 61005 || got < 61000 || got > 61009 {
		t.Fatalf("colliding client SNATed to port %d, want another of 61000-61009", got)
	}
	if o, ok := snatOwner(r, 61005); !ok || o != holder {
		t.Errorf("port 61005 held by %s (found %v), want %s", o, ok, holder)
	}
	if o, ok := snatOwner(r, got); !ok || o != other {
		t.Errorf("port %d held by %s (found %v), want %s", got, o, ok, other)
	}
}

// TestProgRunSNATExhausted: with every port of the range (less the
// skipped ones) held by live flows, a new flow is dropped and nothing of
// it is tracked; the skipped ports stay unused.
func TestProgRunSNATExhausted(t *testing.T) {
	r := newSNATEnv(t, PortRange{Min: 61000, Max: 61003}, PortRange{Min: 61001, Max: 61002})
	got := map[uint16]bool{}
	for _, cp := range []uint16{45000, 45001} {
		p := snatSYN(t, r, prWithPort(prOutside4, cp), 1000)
		if p == 0 {
			t.Fatalf("client port %d dropped with a port free", cp)
		}
		got[p] = true
	}
	if !got[61000] || !got[61003] {
		t.Fatalf("two flows SNATed to ports %v, want 61000 and 61003", got)
	}
	n := r.ctCount()
	late := prWithPort(prOutside4, 45002)
	if p := snatSYN(t, r, late, 1000); p != 0 {
		t.Fatalf("third flow SNATed to port %d, want it dropped (no port left)", p)
	}
	if _, ok := r.ct(late, prNodePort, prTCP, prDirForward); ok || r.ctCount() != n {
		t.Fatalf("a flow without an SNAT port was tracked (%d entries, want %d)", r.ctCount(), n)
	}
}
