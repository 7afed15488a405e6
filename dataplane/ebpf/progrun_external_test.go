package ebpf

// BPF_PROG_TEST_RUN tests of the external paths: vipd_from_ext's source
// ranges, Local drop and SNAT, and the reverse translation of SNATed
// replies. A test run's skb enters on the loopback device (ifindex 1),
// which stands for the external interface here. Where a program would send
// a packet on with bpf_fib_lookup and a redirect, the verdict depends on
// the routes of the namespace the test runs in: those tests check the
// rewritten frame and the conntrack entries, not the verdict.

import (
	"net/netip"
	"testing"

	"github.com/vipd/vipd/dataplane"
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
	x := extIfaceOf(&dataplane.Interface{Name: "lo", Index: 1, Addrs: []netip.Addr{prNodeAddr}, External: true})
	if err := r.objs.VipdExtIfaces.Put(uint32(1), &x); err != nil {
		t.Fatalf("put external interface: %v", err)
	}

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
	x := extIfaceOf(&dataplane.Interface{Name: "lo", Index: 1, Addrs: []netip.Addr{prNodeAddr}, External: true})
	if err := r.objs.VipdExtIfaces.Put(uint32(1), &x); err != nil {
		t.Fatalf("put external interface: %v", err)
	}
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
