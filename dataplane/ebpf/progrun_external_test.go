package ebpf

// BPF_PROG_TEST_RUN tests of the external paths: vipd_from_ext's source
// ranges, Local drop and SNAT, and the reverse translation of SNATed
// replies. A test run's skb enters on the loopback device (ifindex 1),
// which stands for the external interface here. Where a program would send
// a packet on with bpf_fib_lookup and a redirect, the verdict depends on
// the routes of the namespace the test runs in: those tests check the
// rewritten frame and the conntrack entries, not the verdict.

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"testing"
)

const prTCShot = 2

var (
	prOutside4 = prAP("203.0.113.7:45000") // a client outside the node
	prNodePort = prAP("198.18.0.3:30080")  // a node port on the node's address
	prNodeAddr = netip.MustParseAddr("198.18.0.3")
)

// TestProgRunExternalSourceRanges: a frontend with source ranges drops
// packets from other sources, in vipd_from_ext and vipd_from_pod alike,
// and passes those within a range.
func TestProgRunExternalSourceRanges(t *testing.T) {
	r := newPREnv(t)
	be := prBackends4[0]
	ext := prFrontend{vip: prVIP4, proto: prTCP, id: 1, scope: scopeExternal, flags: svcFlagSrcRanges | svcFlagDropEmpty}
	cl := prFrontend{vip: prVIP4, proto: prTCP, id: 2, scope: scopeCluster, flags: svcFlagSrcRanges}
	r.addService(ext, be)
	r.addService(cl, be)
	fromOutside := prTCPFrame(prOutside4, prVIP4, 1000, 0, prSYN, nil)
	fromPod := prTCPFrame(prClient4, prVIP4, 1000, 0, prSYN, nil)

	ret, _ := r.run(r.objs.VipdFromExt, fromOutside)
	prWantVerdict(t, ret, prTCShot)
	ret, _ = r.run(r.objs.VipdFromPod, fromPod)
	prWantVerdict(t, ret, prTCShot)
	if n := r.ctCount(); n != 0 {
		t.Fatalf("%d conntrack entries after dropped packets, want none", n)
	}

	for _, k := range []bpfSrcRangeKey{
		srcRangeKeyOf(ext.id, netip.MustParsePrefix("203.0.113.0/24")),
		srcRangeKeyOf(cl.id, netip.MustParsePrefix("198.18.1.0/24")),
	} {
		if err := r.objs.VipdSrcRanges.Put(&k, uint8(1)); err != nil {
			t.Fatalf("put source range: %v", err)
		}
	}
	ret, out := r.run(r.objs.VipdFromExt, fromOutside)
	prWantVerdict(t, ret, prTCOK) // Local: DNAT only, the kernel forwards
	prWantFrame(t, out, prTCPFrame(prOutside4, be.addr, 1000, 0, prSYN, nil))
	ret, out = r.run(r.objs.VipdFromPod, fromPod)
	prWantVerdict(t, ret, prTCOK)
	prWantFrame(t, out, prTCPFrame(prClient4, be.addr, 1000, 0, prSYN, nil))
	// The range of one frontend does not open another.
	ret, _ = r.run(r.objs.VipdFromPod, prTCPFrame(prOutside4, prVIP4, 1000, 0, prSYN, nil))
	prWantVerdict(t, ret, prTCShot)
}

// TestProgRunExternalNoBackend: with no backend, an external frontend
// under Local drops; under Cluster it rejects as a VIP does.
func TestProgRunExternalNoBackend(t *testing.T) {
	r := newPREnv(t)
	local := prFrontend{vip: prNodePort, proto: prTCP, id: 1, scope: scopeExternal, flags: svcFlagDropEmpty}
	cluster := prFrontend{vip: prWithPort(prNodePort, 30081), proto: prTCP, id: 2, scope: scopeExternal, flags: svcFlagSNAT}
	r.addService(local)
	r.addService(cluster)
	ret, _ := r.run(r.objs.VipdFromExt, prTCPFrame(prOutside4, local.vip, 1000, 0, prSYN, nil))
	prWantVerdict(t, ret, prTCShot)
	ret, out := r.run(r.objs.VipdFromExt, prTCPFrame(prOutside4, cluster.vip, 1000, 0, prSYN, nil))
	prWantVerdict(t, ret, prTCRedirect)
	if p := prDecode(t, out); p.src != cluster.vip.Addr() || p.dst != prOutside4.Addr() || p.l4[13]&prRST == 0 {
		t.Errorf("refusal %s -> %s flags %#x, want a RST from %s to %s", p.src, p.dst, p.l4[13], cluster.vip.Addr(), prOutside4.Addr())
	}
	// A cluster-scope frontend is not served from outside, nor an external
	// one from pods.
	ret, out = r.run(r.objs.VipdFromPod, prTCPFrame(prClient4, local.vip, 1000, 0, prSYN, nil))
	prWantVerdict(t, ret, prTCOK)
	prWantFrame(t, out, prTCPFrame(prClient4, local.vip, 1000, 0, prSYN, nil))
}

// TestProgRunExternalSNAT: under Cluster, a new external flow is DNATed
// to its backend and SNATed to the external interface's address and a
// port of the SNAT range; the conntrack's reply entry, keyed by that
// address and port, takes the backend's replies back to the client from
// the node port, on the pod's veth and on the external interface alike.
func TestProgRunExternalSNAT(t *testing.T) {
	r := newPREnv(t)
	be := prBackends4[0]
	fe := prFrontend{vip: prNodePort, proto: prTCP, id: 1, scope: scopeExternal, flags: svcFlagSNAT}
	r.addService(fe, be)
	// Without an address on the interface the packet entered, nothing can
	// be SNATed: dropped, nothing tracked.
	ret, _ := r.run(r.objs.VipdFromExt, prTCPFrame(prOutside4, prNodePort, 1000, 0, prSYN, nil))
	prWantVerdict(t, ret, prTCShot)
	if n := r.ctCount(); n != 0 {
		t.Fatalf("%d conntrack entries without an SNAT address, want none", n)
	}
	r.setExternalLoopback(prNodeAddr)

	_, out := r.run(r.objs.VipdFromExt, prTCPFrame(prOutside4, prNodePort, 1000, 0, prSYN, nil))
	p := prDecode(t, out)
	prCheckChecksums(t, p)
	snat := p.srcPort()
	if p.src != prNodeAddr || snat.Port() < DefaultSNATPorts.Min || p.dstPort() != be.addr {
		t.Fatalf("SNATed SYN %s -> %s, want %s:%d-%d -> %s", snat, p.dstPort(), prNodeAddr, DefaultSNATPorts.Min, DefaultSNATPorts.Max, be.addr)
	}
	fwd, ok := r.ct(prOutside4, prNodePort, prTCP, prDirForward)
	if !ok || fwd.Flags&ctFlagSNAT == 0 || fromWords(fwd.SnatAddr.W) != prNodeAddr || fromBE16(fwd.SnatPort) != snat.Port() {
		t.Fatalf("forward entry %+v (found %v): want CT_F_SNAT to %s", fwd, ok, snat)
	}
	rev, ok := r.ct(be.addr, snat, prTCP, prDirReply)
	if !ok || fromWords(rev.SnatAddr.W) != prOutside4.Addr() || fromBE16(rev.SnatPort) != prOutside4.Port() ||
		fromWords(rev.NatAddr.W) != prNodePort.Addr() || fromBE16(rev.NatPort) != prNodePort.Port() {
		t.Fatalf("reply entry %+v (found %v): want the client %s and the node port %s", rev, ok, prOutside4, prNodePort)
	}
	// The Go side finds one entry from the other.
	k := prCTKey(prOutside4, prNodePort, prTCP, prDirForward)
	if rk := replyKeyOf(&k, &fwd); rk != prCTKey(be.addr, snat, prTCP, prDirReply) {
		t.Errorf("replyKeyOf the forward entry: %+v", rk)
	}
	rk := prCTKey(be.addr, snat, prTCP, prDirReply)
	if fk := forwardKeyOf(&rk, &rev); fk != k {
		t.Errorf("forwardKeyOf the reply entry: %+v, want %+v", fk, k)
	}

	synAck := prTCPFrame(be.addr, snat, 5000, 1001, prSYN|prACK, nil)
	want := prTCPFrame(prNodePort, prOutside4, 5000, 1001, prSYN|prACK, nil)
	for name, prog := range map[string]func() (uint32, []byte){
		"from a local backend (vipd_from_pod)":  func() (uint32, []byte) { return r.run(r.objs.VipdFromPod, synAck) },
		"from a remote backend (vipd_from_ext)": func() (uint32, []byte) { return r.run(r.objs.VipdFromExt, synAck) },
	} {
		_, out := prog()
		p := prDecode(t, out)
		prCheckChecksums(t, p)
		w := prDecode(t, want)
		if p.srcPort() != w.srcPort() || p.dstPort() != w.dstPort() {
			t.Errorf("reply %s: %s -> %s, want %s -> %s", name, p.srcPort(), p.dstPort(), w.srcPort(), w.dstPort())
		}
	}
	// Replies of SNATed flows are not for the egress programs.
	for _, prog := range []struct {
		name string
		run  func() (uint32, []byte)
	}{{"vipd_to_pod", func() (uint32, []byte) { return r.run(r.objs.VipdToPod, synAck) }},
		{"vipd_to_ext", func() (uint32, []byte) { return r.run(r.objs.VipdToExt, synAck) }}} {
		ret, out := prog.run()
		prWantVerdict(t, ret, prTCOK)
		prWantFrame(t, out, synAck)
	}

	// Another flow to the same backend gets another SNAT port.
	_, out = r.run(r.objs.VipdFromExt, prTCPFrame(prWithPort(prOutside4, 45001), prNodePort, 1000, 0, prSYN, nil))
	if p2 := prDecode(t, out); p2.srcPort() == snat {
		t.Errorf("two flows to one backend share the SNAT tuple %s", snat)
	}
}

// TestProgRunExternalSNATPorts: with one SNAT port, a second flow to the
// same backend finds no port while the first lives (dropped, nothing
// tracked); once the first flow expired, its port is reclaimed before the
// collector runs.
func TestProgRunExternalSNATPorts(t *testing.T) {
	r := newPREnv(t)
	if err := writeConfig(&r.objs.bpfMaps, configFor(0, ConntrackTimeouts{}, PortRange{Min: 61000, Max: 61000})); err != nil {
		t.Fatal(err)
	}
	be := prBackends4[0]
	fe := prFrontend{vip: prNodePort, proto: prTCP, id: 1, scope: scopeExternal, flags: svcFlagSNAT}
	r.addService(fe, be)
	r.setExternalLoopback(prNodeAddr)
	first, second := prOutside4, prWithPort(prOutside4, 45001)
	snat := netip.AddrPortFrom(prNodeAddr, 61000)
	_, out := r.run(r.objs.VipdFromExt, prTCPFrame(first, prNodePort, 1000, 0, prSYN, nil))
	if p := prDecode(t, out); p.srcPort() != snat {
		t.Fatalf("first flow SNATed to %s, want %s", p.srcPort(), snat)
	}
	ret, _ := r.run(r.objs.VipdFromExt, prTCPFrame(second, prNodePort, 1000, 0, prSYN, nil))
	prWantVerdict(t, ret, prTCShot)
	if _, ok := r.ct(second, prNodePort, prTCP, prDirForward); ok || r.ctCount() != 2 {
		t.Fatalf("a flow without an SNAT port was tracked (%d entries)", r.ctCount())
	}
	// The first flow expires (both entries), uncollected.
	for _, k := range []bpfCtKey{prCTKey(first, prNodePort, prTCP, prDirForward), prCTKey(be.addr, snat, prTCP, prDirReply)} {
		var e bpfCtEntry
		if err := r.objs.VipdCt.Lookup(&k, &e); err != nil {
			t.Fatalf("lookup: %v", err)
		}
		e.Expires = 1
		if err := r.objs.VipdCt.Put(&k, &e); err != nil {
			t.Fatalf("put: %v", err)
		}
	}
	_, out = r.run(r.objs.VipdFromExt, prTCPFrame(second, prNodePort, 1000, 0, prSYN, nil))
	if p := prDecode(t, out); p.srcPort() != snat {
		t.Fatalf("second flow SNATed to %s after the first expired, want %s", p.srcPort(), snat)
	}
	rev, ok := r.ct(be.addr, snat, prTCP, prDirReply)
	if !ok || fromWords(rev.SnatAddr.W) != second.Addr() || fromBE16(rev.SnatPort) != second.Port() {
		t.Fatalf("reply entry %+v (found %v): want the second client %s", rev, ok, second)
	}
	// The first client coming back replaces its own flow, not the second's.
	r.run(r.objs.VipdFromExt, prTCPFrame(first, prNodePort, 2000, 0, prSYN, nil))
	if rev, ok := r.ct(be.addr, snat, prTCP, prDirReply); !ok || fromBE16(rev.SnatPort) != second.Port() {
		t.Fatalf("the second flow's reply entry %+v (found %v) was taken by the first client's new SYN", rev, ok)
	}
}

// ---- ICMP errors of external flows, TTL ----

var (
	prNodeAddr6 = netip.MustParseAddr("fd00:198::3")
	prOutside6  = prAP("[fd00:198:99::7]:45000")
	prBackend6b = prBackend{id: 12, addr: prAP("[fd00:198:2::3]:8080")}
	// Routers between the node and a remote backend, and between the
	// node and the client.
	prRouterBE4, prRouterCL4 = netip.MustParseAddr("198.18.5.1"), netip.MustParseAddr("198.18.6.1")
	prRouterBE6, prRouterCL6 = netip.MustParseAddr("fd00:198:5::1"), netip.MustParseAddr("fd00:198:6::1")
)

// prICMPError is an ICMP fragmentation needed (IPv4) or ICMPv6 packet too
// big (next-hop MTU 1400) from src to dst, quoting the IP packet of frame.
func prICMPError(src, dst netip.Addr, frame []byte) []byte {
	q := frame[prEthLen:]
	if src.Is4() {
		return prIPFrame(src, dst, prICMP, append([]byte{3, 4, 0, 0, 0, 0, 0x05, 0x78}, q...))
	}
	return prIPFrame(src, dst, prICMPv6, append([]byte{2, 0, 0, 0, 0, 0, 0x05, 0x78}, q...))
}

// prErr is a decoded ICMP error: the error and the packet it quotes.
type prErr struct {
	outer, inner prPacket
	ttl          uint8
}

// prDecodeError decodes an ICMP error frame, checking the outer IPv4
// header checksum, the ICMP checksum and the quoted IPv4 header's (the
// quoted L4 checksum is left as it was: receivers do not check it).
func prDecodeError(t *testing.T, f []byte) prErr {
	t.Helper()
	o := prDecode(t, f)
	prCheckChecksums(t, o)
	if o.proto != prICMP && o.proto != prICMPv6 {
		t.Fatalf("protocol %d, want an ICMP error", o.proto)
	}
	q := o.l4[8:]
	ethType := []byte{0x08, 0x00}
	if o.proto == prICMPv6 {
		ethType = []byte{0x86, 0xdd}
	}
	in := prDecode(t, slices.Concat(make([]byte, 12), ethType, q))
	if in.src.Is4() {
		if s := prCsumFold(prCsumAdd(0, in.ipHdr)); s != 0xffff {
			t.Errorf("quoted IPv4 header checksum invalid (sum %#04x)", s)
		}
	}
	ttl := o.ipHdr[7] // IPv6 hop limit
	if o.src.Is4() {
		ttl = o.ipHdr[8]
	}
	return prErr{outer: o, inner: in, ttl: ttl}
}

// want fails t unless the error goes from src to dst quoting a packet
// from qsrc to qdst.
func (e prErr) want(t *testing.T, what string, src, dst netip.Addr, qsrc, qdst netip.AddrPort) {
	t.Helper()
	if e.outer.src != src || e.outer.dst != dst || e.inner.srcPort() != qsrc || e.inner.dstPort() != qdst {
		t.Errorf("%s: error %s -> %s quoting %s -> %s, want %s -> %s quoting %s -> %s", what,
			e.outer.src, e.outer.dst, e.inner.srcPort(), e.inner.dstPort(), src, dst, qsrc, qdst)
	}
}

// prICMPCase is one family's addresses for the ICMP error tests.
type prICMPCase struct {
	name                 string
	client, frontend     netip.AddrPort
	node, routerBE, rtCL netip.Addr
	backend              prBackend
}

var prICMPCases = []prICMPCase{
	{"IPv4", prOutside4, prNodePort, prNodeAddr, prRouterBE4, prRouterCL4, prBackends4[0]},
	{"IPv6", prOutside6, netip.AddrPortFrom(prNodeAddr6, prNodePort.Port()), prNodeAddr6, prRouterBE6, prRouterCL6, prBackend6b},
}

// TestProgRunICMPErrorSNAT: ICMP errors about a flow under policy Cluster
// (SNAT) are translated as netfilter translates a NATed connection's
// RELATED errors, in both directions and both families: a router's
// "fragmentation needed" / "packet too big" about a packet to the backend
// reaches the client quoting client -> node port, from the node port's
// address; one about a reply reaches the backend quoting backend ->
// node:SNAT port, from the node's address (the sources netfilter gives
// them), with every checksum right.
func TestProgRunICMPErrorSNAT(t *testing.T) {
	for _, c := range prICMPCases {
		t.Run(c.name, func(t *testing.T) {
			r := newPREnv(t)
			r.addService(prFrontend{vip: c.frontend, proto: prTCP, id: 1, scope: scopeExternal, flags: svcFlagSNAT}, c.backend)
			r.setExternalLoopback(prNodeAddr, prNodeAddr6)
			_, out := r.run(r.objs.VipdFromExt, prTCPFrame(c.client, c.frontend, 1000, 0, prSYN, nil))
			toBackend := prDecode(t, out)
			snat := toBackend.srcPort()
			if snat.Addr() != c.node || toBackend.dstPort() != c.backend.addr {
				t.Fatalf("SYN went out %s -> %s, want SNAT to %s", snat, toBackend.dstPort(), c.node)
			}

			// A router on the backend's side: to the client.
			_, out = r.run(r.objs.VipdFromExt, prICMPError(c.routerBE, c.node, out))
			e := prDecodeError(t, out)
			e.want(t, "router on the backend's side", c.frontend.Addr(), c.client.Addr(), c.client, c.frontend)
			if e.ttl != 63 {
				t.Errorf("error sent on with TTL %d, want 63", e.ttl)
			}
			// The backend itself (a local one: vipd_from_pod).
			_, out = r.run(r.objs.VipdFromPod, prICMPError(c.backend.addr.Addr(), c.node, prTCPFrame(snat, c.backend.addr, 1000, 0, prSYN, nil)))
			prDecodeError(t, out).want(t, "the backend's own error", c.frontend.Addr(), c.client.Addr(), c.client, c.frontend)

			// A router on the client's side, about a reply: to the backend.
			reply := prTCPFrame(c.frontend, c.client, 5000, 1001, prSYN|prACK, make([]byte, 32))
			_, out = r.run(r.objs.VipdFromExt, prICMPError(c.rtCL, c.node, reply))
			prDecodeError(t, out).want(t, "router on the client's side", c.node, c.backend.addr.Addr(), c.backend.addr, snat)

			// An error about no tracked flow passes untouched.
			other := prICMPError(c.routerBE, c.node, prTCPFrame(prWithPort(snat, snat.Port()+1), c.backend.addr, 1, 0, prSYN, nil))
			ret, out := r.run(r.objs.VipdFromExt, other)
			prWantVerdict(t, ret, prTCOK)
			prWantFrame(t, out, other)
		})
	}
}

// TestProgRunICMPErrorLocal: for a flow under policy Local (client address
// kept), an error on its way out to the client that quotes client ->
// backend (the node's own, or the backend's) shows the frontend instead
// (as quoted destination and as source), and an error about a reply sent
// to the frontend goes to the backend, its source kept;
// both are left to the stack to route, as the flow's packets are.
func TestProgRunICMPErrorLocal(t *testing.T) {
	for _, c := range prICMPCases {
		t.Run(c.name, func(t *testing.T) {
			r := newPREnv(t)
			r.addService(prFrontend{vip: c.frontend, proto: prUDP, id: 1, scope: scopeExternal, flags: svcFlagDropEmpty}, c.backend)
			ret, out := r.run(r.objs.VipdFromExt, prUDPFrame(c.client, c.frontend, make([]byte, 64)))
			prWantVerdict(t, ret, prTCOK)
			if p := prDecode(t, out); p.dstPort() != c.backend.addr {
				t.Fatalf("datagram DNATed to %s, want %s", p.dstPort(), c.backend.addr)
			}
			be := c.backend.addr.Addr()

			// The backend's port unreachable, or the node's fragmentation
			// needed, on the way out (vipd_to_ext).
			ret, out = r.run(r.objs.VipdToExt, prICMPError(be, c.client.Addr(), out))
			prWantVerdict(t, ret, prTCOK)
			e := prDecodeError(t, out)
			e.want(t, "the backend's error", c.frontend.Addr(), c.client.Addr(), c.client, c.frontend)
			if e.ttl != 64 {
				t.Errorf("TTL %d: the stack forwards this error, want it untouched (64)", e.ttl)
			}
			ret, out = r.run(r.objs.VipdToExt, prICMPError(c.node, c.client.Addr(), prUDPFrame(c.client, c.backend.addr, make([]byte, 64))))
			prWantVerdict(t, ret, prTCOK)
			prDecodeError(t, out).want(t, "the node's error", c.frontend.Addr(), c.client.Addr(), c.client, c.frontend)

			// A router on the client's side, about a reply: to the backend.
			ret, out = r.run(r.objs.VipdFromExt, prICMPError(c.rtCL, c.frontend.Addr(), prUDPFrame(c.frontend, c.client, make([]byte, 64))))
			prWantVerdict(t, ret, prTCOK)
			prDecodeError(t, out).want(t, "router on the client's side", c.rtCL, be, c.backend.addr, c.client)
		})
	}
}

// prWithTTL is frame with its TTL or hop limit set to ttl (IPv4 header
// checksum updated).
func prWithTTL(frame []byte, ttl uint8) []byte {
	f := slices.Clone(frame)
	ip := f[prEthLen:]
	if ip[0]>>4 == 6 {
		ip[7] = ttl
		return f
	}
	ip[8] = ttl
	binary.BigEndian.PutUint16(ip[10:], 0)
	binary.BigEndian.PutUint16(ip[10:], ^prCsumFold(prCsumAdd(0, ip[:20])))
	return f
}

// TestProgRunTTL: packets that the external paths send on past the
// routing forward path (SNAT flows, both ways) have their TTL or hop limit
// decremented as forwarding would (IPv4 header checksum right); a packet
// with TTL 1 is not sent on with TTL 0 but left to the stack.
func TestProgRunTTL(t *testing.T) {
	for _, c := range prICMPCases {
		t.Run(c.name, func(t *testing.T) {
			r := newPREnv(t)
			r.addService(prFrontend{vip: c.frontend, proto: prTCP, id: 1, scope: scopeExternal, flags: svcFlagSNAT}, c.backend)
			r.setExternalLoopback(prNodeAddr, prNodeAddr6)
			ttlOf := func(p prPacket) uint8 {
				if p.src.Is4() {
					return p.ipHdr[8]
				}
				return p.ipHdr[7]
			}
			_, out := r.run(r.objs.VipdFromExt, prWithTTL(prTCPFrame(c.client, c.frontend, 1000, 0, prSYN, nil), 50))
			p := prDecode(t, out)
			prCheckChecksums(t, p)
			if ttlOf(p) != 49 {
				t.Errorf("SYN to the backend with TTL %d, want 49", ttlOf(p))
			}
			snat := p.srcPort()
			_, out = r.run(r.objs.VipdFromExt, prWithTTL(prTCPFrame(c.backend.addr, snat, 5000, 1001, prSYN|prACK, nil), 64))
			p = prDecode(t, out)
			prCheckChecksums(t, p)
			if p.dstPort() != c.client || ttlOf(p) != 63 {
				t.Errorf("reply to %s with TTL %d, want to %s with 63", p.dstPort(), ttlOf(p), c.client)
			}
			// TTL 1: to the stack, not forwarded.
			last := prWithTTL(prTCPFrame(c.backend.addr, snat, 5001, 1001, prACK, nil), 1)
			ret, out := r.run(r.objs.VipdFromExt, last)
			prWantVerdict(t, ret, prTCOK)
			if p := prDecode(t, out); ttlOf(p) != 1 {
				t.Errorf("a packet with TTL 1 left with TTL %d", ttlOf(p))
			}
		})
	}
}
