package ebpf

// BPF_PROG_TEST_RUN tests of the SNAT port choice of external flows under
// policy Cluster (ct_create): the client's own port first, a closed flow
// of the same client tuple taken over at once, random ports after a
// collision, the skipped ports (ip_local_port_range) never handed out, and
// a packet that finds no port dropped with nothing tracked; and the guard
// of the backends' TIME_WAIT (vipd_snat_tw): a port whose backend-side
// tuple is in TIME_WAIT at the backend goes only to a SYN that the
// TIME_WAIT takes.

import (
	"encoding/binary"
	"net/netip"
	"slices"
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

// prTCPFrameTS is prTCPFrame with options: Linux's SYN options (MSS,
// SACK permitted, timestamps, NOP, window scale) when flags has SYN, else
// NOP, NOP, timestamps; with tsval 0 no timestamp option at all (MSS and
// window scale only on a SYN, nothing else).
func prTCPFrameTS(src, dst netip.AddrPort, seq, ack uint32, flags uint8, tsval uint32, payload []byte) []byte {
	var opts []byte
	switch {
	case flags&prSYN != 0 && tsval != 0:
		opts = []byte{2, 4, 0x05, 0xb4, 4, 2, 8, 10, 0, 0, 0, 0, 0, 0, 0, 0, 1, 3, 3, 7}
		binary.BigEndian.PutUint32(opts[8:], tsval)
	case flags&prSYN != 0:
		opts = []byte{2, 4, 0x05, 0xb4, 1, 3, 3, 7}
	case tsval != 0:
		opts = []byte{1, 1, 8, 10, 0, 0, 0, 0, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(opts[4:], tsval)
	}
	h := make([]byte, 20, 20+len(opts)+len(payload))
	binary.BigEndian.PutUint16(h[0:], src.Port())
	binary.BigEndian.PutUint16(h[2:], dst.Port())
	binary.BigEndian.PutUint32(h[4:], seq)
	binary.BigEndian.PutUint32(h[8:], ack)
	h[12] = byte((20+len(opts))/4) << 4
	h[13] = flags
	binary.BigEndian.PutUint16(h[14:], 64240)
	return prIPFrame(src.Addr(), dst.Addr(), prTCP, slices.Concat(h, opts, payload))
}

// prFIN is the TCP FIN flag.
const prFIN = 0x01

// snatSYNTS is snatSYN with a SYN carrying TSval tsval (0: no timestamps).
func snatSYNTS(t *testing.T, r *prEnv, client netip.AddrPort, seq, tsval uint32) uint16 {
	t.Helper()
	before, existed := r.ct(client, prNodePort, prTCP, prDirForward)
	r.run(r.objs.VipdFromExt, prTCPFrameTS(client, prNodePort, seq, 0, prSYN, tsval, nil))
	fwd, ok := r.ct(client, prNodePort, prTCP, prDirForward)
	if !ok || (existed && fwd.FlowId == before.FlowId) {
		return 0
	}
	return fromBE16(fwd.SnatPort)
}

// snatConn is one SNAT TCP connection of client through SNAT port port,
// the client's first sequence number seq: the segments the tests send.
type snatConn struct {
	t      *testing.T
	r      *prEnv
	client netip.AddrPort
	port   uint16
	seq    uint32
}

// open sends the SYN (TSval tsval), the backend's SYN-ACK and the client's
// ACK; the SYN must get SNAT port want.
func (c *snatConn) open(tsval uint32, want uint16) {
	c.t.Helper()
	if c.port = snatSYNTS(c.t, c.r, c.client, c.seq, tsval); c.port != want {
		c.t.Fatalf("SYN of %s (seq %d, TSval %d) SNATed to port %d (0: dropped), want %d", c.client, c.seq, tsval, c.port, want)
	}
	c.fromBackend(prSYN|prACK, 0)
	c.fromClient(prACK, tsval+1, nil)
}

func (c *snatConn) fromBackend(flags uint8, tsval uint32) {
	c.r.run(c.r.objs.VipdFromPod, prTCPFrameTS(prBackends4[0].addr, netip.AddrPortFrom(prNodeAddr, c.port), 7000, c.seq+1, flags, tsval, nil))
}

// fromClient sends a segment of the client after its SYN (sequence numbers
// from seq+1 on).
func (c *snatConn) fromClient(flags uint8, tsval uint32, payload []byte) {
	c.r.run(c.r.objs.VipdFromExt, prTCPFrameTS(c.client, prNodePort, c.seq+1, 7001, flags, tsval, payload))
	c.seq += uint32(len(payload))
	if flags&prFIN != 0 {
		c.seq++
	}
}

// serverClosesFirst ends the connection as a backend that closes first:
// its FIN, then the client's FIN (TSval tsval): the backend keeps the
// TIME_WAIT.
func (c *snatConn) serverClosesFirst(tsval uint32) {
	c.fromBackend(prFIN|prACK, 0)
	c.fromClient(prFIN|prACK, tsval, nil)
	c.fromBackend(prACK, 0)
}

// forget deletes the connection's conntrack entries, as their lifetime
// (CT_TCP_CLOSE) ending and the collector do: its SNAT port is free.
func (c *snatConn) forget() {
	c.t.Helper()
	for _, k := range []bpfCtKey{prCTKey(c.client, prNodePort, prTCP, prDirForward),
		prCTKey(prBackends4[0].addr, netip.AddrPortFrom(prNodeAddr, c.port), prTCP, prDirReply)} {
		if err := c.r.objs.VipdCt.Delete(&k); err != nil {
			c.t.Fatalf("delete conntrack entry: %v", err)
		}
	}
}

// snatTW is the vipd_snat_tw record of SNAT port port, and whether there
// is one.
func snatTW(r *prEnv, port uint16) (bpfSnatTw, bool) {
	k := prCTKey(prBackends4[0].addr, netip.AddrPortFrom(prNodeAddr, port), prTCP, prDirReply)
	var v bpfSnatTw
	return v, r.objs.VipdSnatTw.Lookup(&k, &v) == nil
}

// snatStats reads vipd_snat_stats.
func snatStats(t *testing.T, r *prEnv) (exhausted, twSkips uint64) {
	t.Helper()
	d := &Dataplane{objs: &bpfObjects{bpfMaps: r.objs.bpfMaps}}
	exhausted, twSkips, err := d.SNATCounters()
	if err != nil {
		t.Fatal(err)
	}
	return exhausted, twSkips
}

// TestProgRunSNATTimeWait: a flow the backend closed first leaves the
// backend in TIME_WAIT on its tuple (node address:port -> backend), which
// refuses a SYN whose timestamp is older than the client's last one (PAWS)
// or, without timestamps, whose sequence number is not after the client's
// last one. SNAT does not hand that port to such a SYN of another client
// tuple (one port only: it is dropped, counted), and does to one that the
// TIME_WAIT takes, and to the same client tuple coming back.
func TestProgRunSNATTimeWait(t *testing.T) {
	a := prWithPort(prOutside4, 45000)
	b := prWithPort(prOutside4, 45001)
	t.Run("timestamps", func(t *testing.T) {
		r := newSNATEnv(t, PortRange{Min: 61000, Max: 61000}, PortRange{})
		c := &snatConn{t: t, r: r, client: a, seq: 1000}
		c.open(5000, 61000)
		c.fromClient(prACK|prPSH, 5001, []byte("GET\n"))
		c.serverClosesFirst(6000)
		tw, ok := snatTW(r, 61000)
		if !ok || tw.Tsval != 6000 || tw.NextSeq != 1006 || tw.Flags != 1 {
			t.Fatalf("TIME_WAIT record %+v (found %v), want TSval 6000, next seq 1006 (SYN, 4 bytes, FIN), timestamps", tw, ok)
		}
		c.forget()
		ex0, tw0 := snatStats(t, r)
		// Another client whose timestamps are older: the TIME_WAIT
		// would refuse it, whatever its sequence number.
		if got := snatSYNTS(t, r, b, 900000, 5999); got != 0 {
			t.Fatalf("SYN of %s with TSval 5999 < 6000 SNATed to port %d, want it dropped (the only port's TIME_WAIT refuses it)", b, got)
		}
		if ex, tws := snatStats(t, r); ex != ex0+1 || tws < tw0+1 {
			t.Errorf("counters exhausted %d -> %d, TIME_WAIT skips %d -> %d: want +1 and at least +1", ex0, ex, tw0, tws)
		}
		// Equal timestamps are taken only with a sequence number after.
		if got := snatSYNTS(t, r, b, 1006, 6000); got != 0 {
			t.Fatalf("SYN of %s with TSval 6000, seq 1006 SNATed to port %d, want it dropped", b, got)
		}
		// Newer: taken, and the record is of no flow any more.
		d := &snatConn{t: t, r: r, client: b, seq: 10}
		d.open(6001, 61000)
		if tw, ok := snatTW(r, 61000); ok {
			t.Errorf("TIME_WAIT record %+v left after a SYN took the tuple over", tw)
		}
	})
	t.Run("same-client-tuple", func(t *testing.T) {
		r := newSNATEnv(t, PortRange{Min: 61000, Max: 61000}, PortRange{})
		c := &snatConn{t: t, r: r, client: a, seq: 1000}
		c.open(5000, 61000)
		c.serverClosesFirst(6000)
		// Its entries still there (closing): another client finds the
		// port held, the client tuple itself comes back to it.
		if got := snatSYNTS(t, r, b, 1, 9000); got != 0 {
			t.Fatalf("SYN of %s SNATed to port %d held by a closing flow, want it dropped", b, got)
		}
		c2 := &snatConn{t: t, r: r, client: a, seq: 50000}
		c2.open(6100, 61000)
	})
	t.Run("sequence-numbers", func(t *testing.T) {
		r := newSNATEnv(t, PortRange{Min: 61000, Max: 61000}, PortRange{})
		c := &snatConn{t: t, r: r, client: a, seq: 1000}
		c.open(0, 61000)
		c.serverClosesFirst(0)
		if tw, ok := snatTW(r, 61000); !ok || tw.NextSeq != 1002 || tw.Flags != 0 {
			t.Fatalf("TIME_WAIT record %+v (found %v), want next seq 1002, no timestamps", tw, ok)
		}
		c.forget()
		// The client had no timestamps: a new SYN's do not count, its
		// sequence number must be after 1002.
		for _, syn := range []struct{ seq, tsval uint32 }{{1002, 0}, {1001, 0}, {1002, 99999}, {0x80001002, 99999}} {
			if got := snatSYNTS(t, r, b, syn.seq, syn.tsval); got != 0 {
				t.Fatalf("SYN of %s seq %d TSval %d SNATed to port %d, want it dropped (not after 1002)", b, syn.seq, syn.tsval, got)
			}
		}
		if got := snatSYNTS(t, r, b, 1003, 0); got != 61000 {
			t.Fatalf("SYN of %s seq 1003 SNATed to port %d, want 61000", b, got)
		}
	})
	t.Run("client-reset", func(t *testing.T) {
		r := newSNATEnv(t, PortRange{Min: 61000, Max: 61000}, PortRange{})
		c := &snatConn{t: t, r: r, client: a, seq: 1000}
		c.open(5000, 61000)
		c.serverClosesFirst(6000)
		if _, ok := snatTW(r, 61000); !ok {
			t.Fatal("no TIME_WAIT record after the backend closed first")
		}
		c.fromClient(prRST, 0, nil)
		if tw, ok := snatTW(r, 61000); ok {
			t.Fatalf("TIME_WAIT record %+v left after the client's RST", tw)
		}
		c.forget()
		if got := snatSYNTS(t, r, b, 1, 100); got != 61000 {
			t.Fatalf("SYN of %s SNATed to port %d after the client's RST, want 61000", b, got)
		}
	})
	t.Run("client-closes-first", func(t *testing.T) {
		r := newSNATEnv(t, PortRange{Min: 61000, Max: 61000}, PortRange{})
		c := &snatConn{t: t, r: r, client: a, seq: 1000}
		c.open(5000, 61000)
		c.fromClient(prFIN|prACK, 6000, nil)
		c.fromBackend(prFIN|prACK, 0)
		c.fromClient(prACK, 6001, nil)
		if tw, ok := snatTW(r, 61000); ok {
			t.Fatalf("TIME_WAIT record %+v for a flow the client closed first (the backend keeps none)", tw)
		}
		c.forget()
		if got := snatSYNTS(t, r, b, 1, 100); got != 61000 {
			t.Fatalf("SYN of %s SNATed to port %d, want 61000", b, got)
		}
	})
	t.Run("guard-ends", func(t *testing.T) {
		r := newSNATEnv(t, PortRange{Min: 61000, Max: 61000}, PortRange{})
		c := &snatConn{t: t, r: r, client: a, seq: 1000}
		c.open(5000, 61000)
		c.serverClosesFirst(6000)
		c.forget()
		k := prCTKey(prBackends4[0].addr, netip.AddrPortFrom(prNodeAddr, 61000), prTCP, prDirReply)
		tw, _ := snatTW(r, 61000)
		tw.Closed = uint32(ktimeNow()/1e9) - snatTWGuard
		if err := r.objs.VipdSnatTw.Put(&k, &tw); err != nil {
			t.Fatal(err)
		}
		if got := snatSYNTS(t, r, b, 1, 100); got != 61000 {
			t.Fatalf("SYN of %s SNATed to port %d after the TIME_WAIT guard ended, want 61000", b, got)
		}
	})
}

// TestProgRunSNATTimeWaitPicksAnother: with a pool of two ports, one held
// by a TIME_WAIT that would refuse the SYN, the SYN gets the other one,
// every time.
func TestProgRunSNATTimeWaitPicksAnother(t *testing.T) {
	r := newSNATEnv(t, PortRange{Min: 61000, Max: 61001}, PortRange{})
	c := &snatConn{t: t, r: r, client: prWithPort(prOutside4, 61000), seq: 1000}
	c.open(5000, 61000)
	c.serverClosesFirst(6000)
	c.forget()
	for i := range 20 {
		// Client port 61000: its own port is the first try.
		cl := netip.AddrPortFrom(netip.MustParseAddr("203.0.113.9"), 61000)
		d := &snatConn{t: t, r: r, client: cl, seq: uint32(i) * 1000}
		d.open(100, 61001)
		d.forget()
	}
}

// TestProgRunSNATTimeWaitEstablishedPaysNothing guards the fast path of
// FASTPATH.md: an established segment of an SNAT flow does not look at
// vipd_snat_tw (a record planted for its tuple stays as it was), only a
// segment of a closing flow does.
func TestProgRunSNATTimeWaitEstablishedPaysNothing(t *testing.T) {
	r := newSNATEnv(t, PortRange{Min: 61000, Max: 61000}, PortRange{})
	c := &snatConn{t: t, r: r, client: prWithPort(prOutside4, 45000), seq: 1000}
	c.open(5000, 61000)
	k := prCTKey(prBackends4[0].addr, netip.AddrPortFrom(prNodeAddr, 61000), prTCP, prDirReply)
	planted := bpfSnatTw{Tsval: 1, NextSeq: 1, Closed: 1, Flags: 1}
	if err := r.objs.VipdSnatTw.Put(&k, &planted); err != nil {
		t.Fatal(err)
	}
	c.fromClient(prACK|prPSH, 5002, []byte("GET\n"))
	if tw, _ := snatTW(r, 61000); tw != planted {
		t.Fatalf("an established segment changed the TIME_WAIT record to %+v (planted %+v)", tw, planted)
	}
	// Once the backend closed, the client's segments move it on.
	c.fromBackend(prFIN|prACK, 0)
	c.fromClient(prACK, 5003, nil)
	if tw, _ := snatTW(r, 61000); tw.Tsval != 5003 || tw.NextSeq != 1005 {
		t.Fatalf("TIME_WAIT record %+v after a segment of the closing flow, want TSval 5003, next seq 1005", tw)
	}
}
