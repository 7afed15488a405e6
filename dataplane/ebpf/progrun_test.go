package ebpf

// Packet-path tests: each test loads a fresh, unpinned copy of the
// collection, fills the maps the way the dataplane would, and runs crafted
// frames through vipd_from_pod and vipd_to_pod with BPF_PROG_TEST_RUN.
// Frames are built, and checksums verified, by hand below, so that a
// wrong incremental checksum update cannot hide behind a library that
// recomputes it.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"net/netip"
	"slices"
	"structs"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/internal/testkit/require"
)

const (
	prTCOK       = 0
	prTCRedirect = 7

	prICMP   = 1
	prTCP    = 6
	prUDP    = 17
	prICMPv6 = 58

	prSYN = 0x02
	prRST = 0x04
	prPSH = 0x08
	prACK = 0x10

	prCTHairpin   = 1
	prCTSeenReply = 4

	prSvcAffinity = 1
	prSvcMaglev   = 2
	prSvcWeighted = 4

	prMemberEligible = 1

	// prTestChecksumComplete is BPF_F_TEST_SKB_CHECKSUM_COMPLETE
	// (Linux 6.17): the test run marks the skb CHECKSUM_COMPLETE and fails
	// with EBADMSG if the program leaves skb->csum inconsistent.
	prTestChecksumComplete = 1 << 2

	prEthLen = 14
)

var (
	// Frames go from the pod (prPodMAC) to the host side of its veth (prHostMAC).
	prPodMAC  = []byte{0x02, 0x00, 0x00, 0x00, 0x01, 0x02}
	prHostMAC = []byte{0x02, 0x00, 0x00, 0x00, 0xff, 0x01}
)

// ---- loading ----

// prEnv is one loaded copy of vipd's objects, with maps private to a test.
type prEnv struct {
	t    testing.TB
	spec *ebpf.CollectionSpec
	objs bpfObjects
}

// newPREnv loads the collection without pinning. It skips the test when
// the process may not use BPF, except under CI=true, where a missing
// privilege is a broken test setup and fails.
func newPREnv(t testing.TB) *prEnv {
	t.Helper()
	spec, err := loadBpf()
	if err != nil {
		t.Fatalf("load spec: %v", err)
	}
	// The maps are pinned by name in production; tests must not touch
	// (or be disturbed by) a running vipd's maps.
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	// Sizes are configuration (loadObjects sets them too) and change no
	// behaviour here; at full size, creating the maps takes over a second
	// per test.
	for name, size := range map[string]uint32{
		bpfMapVipdServices:   1 << 16,
		bpfMapVipdMembers:    1 << 16,
		bpfMapVipdBackends:   1 << 12,
		bpfMapVipdRevnat:     1 << 16, // holds the members of frontends of up to 16
		bpfMapVipdMaglev:     1 << 12,
		bpfMapVipdCt:         1 << 16,
		bpfMapVipdAffinity:   1 << 12,
		bpfMapVipdSockRevnat: 1 << 12,
	} {
		spec.Maps[name].MaxEntries = size
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		prSkipIfNoPermission(t, err)
		t.Fatalf("remove memlock limit: %v", err)
	}
	r := &prEnv{t: t, spec: spec}
	if err := spec.LoadAndAssign(&r.objs, nil); err != nil {
		prSkipIfNoPermission(t, err)
		t.Fatalf("load objects: %+v", err)
	}
	t.Cleanup(func() { r.objs.Close() })
	return r
}

// prSkipIfNoPermission skips t when err says that BPF is not permitted, or
// fails it under CI=true (require.KernelFeature). A verifier rejection can
// carry EACCES too: that is a bug, never a skip.
func prSkipIfNoPermission(t testing.TB, err error) {
	t.Helper()
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) || !errors.Is(err, unix.EPERM) {
		return
	}
	require.KernelFeature(t, "BPF (needs root or CAP_BPF+CAP_NET_ADMIN)", err)
}

// run runs prog once over frame and returns its verdict and output frame.
func (r *prEnv) run(prog *ebpf.Program, frame []byte) (uint32, []byte) {
	r.t.Helper()
	ret, out, err := prRun(prog, frame, 0)
	if err != nil {
		r.t.Fatalf("run %s: %v", prog, err)
	}
	return ret, out
}

func prRun(prog *ebpf.Program, frame []byte, flags uint32) (uint32, []byte, error) {
	opts := ebpf.RunOptions{Data: frame, DataOut: make([]byte, 2048), Flags: flags}
	ret, err := prog.Run(&opts)
	return ret, opts.DataOut, err
}

// ---- map encoding ----

// prAddr is union addr as bpf2go renders it.
type prAddr = struct {
	_ structs.HostLayout
	W [4]uint32
}

func prAddrOf(a netip.Addr) prAddr {
	b := a.As16() // IPv4 comes out IPv4-mapped, as the maps want it.
	var m prAddr
	for i := range m.W {
		m.W[i] = binary.NativeEndian.Uint32(b[4*i:])
	}
	return m
}

// prBE16 is a port as a __be16 field holds it.
func prBE16(p uint16) uint16 {
	return binary.NativeEndian.Uint16(binary.BigEndian.AppendUint16(nil, p))
}

type prFrontend struct {
	vip             netip.AddrPort
	proto           uint8
	scope           uint8  // scopeCluster or scopeExternal
	id              uint32 // rev_nat_id
	flags           uint32
	affinityTimeout uint32
	maglevSize      uint32
}

type prBackend struct {
	id     uint32
	addr   netip.AddrPort
	weight uint32
}

func (fe prFrontend) key(slot uint32) bpfSvcKey {
	return bpfSvcKey{Addr: prAddrOf(fe.vip.Addr()), Port: prBE16(fe.vip.Port()), Proto: fe.proto, Scope: fe.scope, Slot: slot}
}

// addService writes the backends, their eligible memberships, and the
// frontend's slots; with no backends the frontend rejects.
func (r *prEnv) addService(fe prFrontend, bes ...prBackend) {
	r.t.Helper()
	for _, be := range bes {
		v := bpfBackend{Addr: prAddrOf(be.addr.Addr()), Port: prBE16(be.addr.Port()), Used: backendUsed}
		if err := r.objs.VipdBackends.Put(be.id, &v); err != nil {
			r.t.Fatalf("put backend %d: %v", be.id, err)
		}
		r.setMember(fe, be.id, prMemberEligible)
	}
	r.setSlots(fe, bes...)
}

// setSlots points the frontend at bes (slots first, then the master, as
// the dataplane orders its updates), and removes slots past the new count.
// A dense frontend (unweighted, at most svcInlineSlots backends) has its
// slots in the master's value, as the dataplane writes it.
func (r *prEnv) setSlots(fe prFrontend, bes ...prBackend) {
	r.t.Helper()
	dense := fe.flags&prSvcWeighted == 0 && len(bes) <= svcInlineSlots
	var cum uint32
	var inline [svcInlineSlots]uint32
	for i, be := range bes {
		w := be.weight
		if w == 0 {
			w = 1
		}
		cum += w
		if dense {
			inline[i] = be.id
			continue
		}
		v := bpfSvcVal{BackendId: be.id, Weight: cum}
		k := fe.key(uint32(i + 1))
		if err := r.objs.VipdServices.Put(&k, &v); err != nil {
			r.t.Fatalf("put slot %d: %v", i+1, err)
		}
	}
	master := bpfSvcVal{
		Count:           uint32(len(bes)),
		RevNatId:        fe.id,
		Flags:           fe.flags,
		AffinityTimeout: fe.affinityTimeout,
		Weight:          cum,
		MaglevSize:      fe.maglevSize,
		Slots:           inline,
	}
	k := fe.key(0)
	if err := markFrontends(r.objs.VipdSvcAddrs, []bpfSvcKey{k}); err != nil {
		r.t.Fatalf("mark the frontend filter: %v", err)
	}
	if err := r.objs.VipdServices.Put(&k, &master); err != nil {
		r.t.Fatalf("put master: %v", err)
	}
	first := uint32(len(bes) + 1)
	if dense {
		first = 1
	}
	for slot := first; ; slot++ {
		k := fe.key(slot)
		if err := r.objs.VipdServices.Delete(&k); err != nil {
			break
		}
	}
}

// revNat returns the frontend's reverse-NAT value, or one with no member.
func (r *prEnv) revNat(fe prFrontend) bpfRevNat {
	r.t.Helper()
	var rn bpfRevNat
	if err := r.objs.VipdRevnat.Lookup(fe.id, &rn); err == nil {
		return rn
	} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
		r.t.Fatalf("lookup reverse NAT %d: %v", fe.id, err)
	}
	rn.Addr = prAddrOf(fe.vip.Addr())
	rn.Port, rn.Proto, rn.Scope = prBE16(fe.vip.Port()), fe.proto, fe.scope
	return rn
}

func (r *prEnv) putRevNat(fe prFrontend, rn bpfRevNat) {
	r.t.Helper()
	if err := r.objs.VipdRevnat.Put(fe.id, &rn); err != nil {
		r.t.Fatalf("put reverse NAT %d: %v", fe.id, err)
	}
}

// setMember makes backend id a member of the frontend with flags, as the
// dataplane keeps members: inline in its reverse-NAT value while at most
// revNatInlineMembers fit (one update), else in vipd_members (all of
// them moved there first, then the value marked).
func (r *prEnv) setMember(fe prFrontend, id, flags uint32) {
	r.t.Helper()
	rn := r.revNat(fe)
	if rn.Members != revNatMembersMap {
		n := int(rn.Members)
		j := slices.Index(rn.MemberIds[:n], id)
		if j < 0 && n < revNatInlineMembers {
			j = n
			rn.Members++
		}
		if j >= 0 {
			rn.MemberIds[j], rn.MemberFlags[j] = id, uint8(flags)
			r.putRevNat(fe, rn)
			return
		}
		for j := range n {
			k := bpfMemberKey{RevNatId: fe.id, BackendId: rn.MemberIds[j]}
			if err := r.objs.VipdMembers.Put(&k, uint32(rn.MemberFlags[j])); err != nil {
				r.t.Fatalf("put member %d: %v", rn.MemberIds[j], err)
			}
		}
		defer r.putRevNat(fe, bpfRevNat{Addr: rn.Addr, Port: rn.Port, Proto: rn.Proto, Scope: rn.Scope, Members: revNatMembersMap})
	}
	k := bpfMemberKey{RevNatId: fe.id, BackendId: id}
	if err := r.objs.VipdMembers.Put(&k, flags); err != nil {
		r.t.Fatalf("put member %d: %v", id, err)
	}
}

// memberEntries counts the entries of vipd_members.
func (r *prEnv) memberEntries() int {
	r.t.Helper()
	n := 0
	if err := forEach(r.objs.VipdMembers, func(bpfMemberKey, uint32) { n++ }); err != nil {
		r.t.Fatalf("read members: %v", err)
	}
	return n
}

func (r *prEnv) deleteMember(fe prFrontend, id uint32) {
	r.t.Helper()
	rn := r.revNat(fe)
	if rn.Members != revNatMembersMap {
		n := int(rn.Members)
		j := slices.Index(rn.MemberIds[:n], id)
		if j < 0 {
			r.t.Fatalf("delete member %d: not a member", id)
		}
		copy(rn.MemberIds[j:n], rn.MemberIds[j+1:n])
		copy(rn.MemberFlags[j:n], rn.MemberFlags[j+1:n])
		rn.MemberIds[n-1], rn.MemberFlags[n-1] = 0, 0
		rn.Members--
		r.putRevNat(fe, rn)
		return
	}
	k := bpfMemberKey{RevNatId: fe.id, BackendId: id}
	if err := r.objs.VipdMembers.Delete(&k); err != nil {
		r.t.Fatalf("delete member %d: %v", id, err)
	}
}

const (
	prDirForward = 0
	prDirReply   = 1
)

func prCTKey(src, dst netip.AddrPort, proto, dir uint8) bpfCtKey {
	return bpfCtKey{
		Src:   prAddrOf(src.Addr()),
		Dst:   prAddrOf(dst.Addr()),
		Sport: prBE16(src.Port()),
		Dport: prBE16(dst.Port()),
		Proto: proto,
		Dir:   dir,
	}
}

// ct returns the conntrack entry for (src, dst, proto, dir), and whether
// there is one.
func (r *prEnv) ct(src, dst netip.AddrPort, proto, dir uint8) (bpfCtEntry, bool) {
	r.t.Helper()
	k := prCTKey(src, dst, proto, dir)
	var e bpfCtEntry
	if err := r.objs.VipdCt.Lookup(&k, &e); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return e, false
		}
		r.t.Fatalf("lookup ct: %v", err)
	}
	return e, true
}

func (r *prEnv) ctCount() int {
	r.t.Helper()
	var (
		k bpfCtKey
		v bpfCtEntry
		n int
	)
	it := r.objs.VipdCt.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		r.t.Fatalf("iterate ct: %v", err)
	}
	return n
}

func (r *prEnv) clearCT() {
	r.t.Helper()
	var (
		k    bpfCtKey
		v    bpfCtEntry
		keys []bpfCtKey
	)
	it := r.objs.VipdCt.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, k)
	}
	if err := it.Err(); err != nil {
		r.t.Fatalf("iterate ct: %v", err)
	}
	for _, k := range keys {
		if err := r.objs.VipdCt.Delete(&k); err != nil {
			r.t.Fatalf("delete ct: %v", err)
		}
	}
}

// ---- frames ----

// prCsumAdd adds b to sum as big-endian 16-bit words (RFC 1071).
func prCsumAdd(sum uint32, b []byte) uint32 {
	for len(b) >= 2 {
		sum += uint32(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		sum += uint32(b[0]) << 8
	}
	return sum
}

func prCsumFold(sum uint32) uint16 {
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}

// prL4Sum is the unfolded sum over the pseudo-header (none for ICMPv4) and
// the L4 bytes.
func prL4Sum(src, dst netip.Addr, proto uint8, l4 []byte) uint32 {
	var sum uint32
	switch {
	case proto == prICMP:
	case src.Is4():
		s, d := src.As4(), dst.As4()
		sum = prCsumAdd(sum, s[:])
		sum = prCsumAdd(sum, d[:])
		sum += uint32(proto) + uint32(len(l4))
	default:
		s, d := src.As16(), dst.As16()
		sum = prCsumAdd(sum, s[:])
		sum = prCsumAdd(sum, d[:])
		sum = prCsumAdd(sum, binary.BigEndian.AppendUint32(nil, uint32(len(l4))))
		sum += uint32(proto)
	}
	return prCsumAdd(sum, l4)
}

func prL4CsumOffset(proto uint8) int {
	switch proto {
	case prTCP:
		return 16
	case prUDP:
		return 6
	case prICMP, prICMPv6:
		return 2
	}
	return -1
}

// prIPFrame builds an Ethernet frame from the pod to the host carrying an IP
// packet from src to dst; l4 is the L4 header and payload with a zero
// checksum field, which prIPFrame fills in, as it does the IPv4 header's.
func prIPFrame(src, dst netip.Addr, proto uint8, l4 []byte) []byte {
	f := slices.Concat(prHostMAC, prPodMAC)
	if src.Is4() {
		f = binary.BigEndian.AppendUint16(f, 0x0800)
		ip := make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(l4)))
		binary.BigEndian.PutUint16(ip[4:], 0x1c46) // id
		binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF
		ip[8] = 64
		ip[9] = proto
		s, d := src.As4(), dst.As4()
		copy(ip[12:], s[:])
		copy(ip[16:], d[:])
		binary.BigEndian.PutUint16(ip[10:], ^prCsumFold(prCsumAdd(0, ip)))
		f = append(f, ip...)
	} else {
		f = binary.BigEndian.AppendUint16(f, 0x86dd)
		ip := make([]byte, 40)
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], uint16(len(l4)))
		ip[6] = proto
		ip[7] = 64
		s, d := src.As16(), dst.As16()
		copy(ip[8:], s[:])
		copy(ip[24:], d[:])
		f = append(f, ip...)
	}
	l4 = slices.Clone(l4)
	if off := prL4CsumOffset(proto); off >= 0 {
		c := ^prCsumFold(prL4Sum(src, dst, proto, l4))
		if c == 0 && proto == prUDP {
			c = 0xffff // 0 would mean "no checksum"
		}
		binary.BigEndian.PutUint16(l4[off:], c)
	}
	return append(f, l4...)
}

func prTCPFrame(src, dst netip.AddrPort, seq, ack uint32, flags uint8, payload []byte) []byte {
	h := make([]byte, 20, 20+len(payload))
	binary.BigEndian.PutUint16(h[0:], src.Port())
	binary.BigEndian.PutUint16(h[2:], dst.Port())
	binary.BigEndian.PutUint32(h[4:], seq)
	binary.BigEndian.PutUint32(h[8:], ack)
	h[12] = 5 << 4
	h[13] = flags
	binary.BigEndian.PutUint16(h[14:], 64240)
	return prIPFrame(src.Addr(), dst.Addr(), prTCP, append(h, payload...))
}

func prUDPFrame(src, dst netip.AddrPort, payload []byte) []byte {
	h := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(h[0:], src.Port())
	binary.BigEndian.PutUint16(h[2:], dst.Port())
	binary.BigEndian.PutUint16(h[4:], uint16(8+len(payload)))
	return prIPFrame(src.Addr(), dst.Addr(), prUDP, append(h, payload...))
}

// prUDPFrameNoCsum is an IPv4 UDP frame that carries no checksum (zero).
func prUDPFrameNoCsum(src, dst netip.AddrPort, payload []byte) []byte {
	f := prUDPFrame(src, dst, payload)
	binary.BigEndian.PutUint16(f[prEthLen+20+6:], 0)
	return f
}

func prICMPEcho(src, dst netip.Addr) []byte {
	return prIPFrame(src, dst, prICMP, []byte{8, 0, 0, 0, 0x12, 0x34, 0, 1, 'p', 'i', 'n', 'g'})
}

func prARPRequest(sender, target netip.Addr) []byte {
	f := slices.Concat([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, prPodMAC, []byte{0x08, 0x06})
	f = append(f, 0, 1, 0x08, 0x00, 6, 4, 0, 1)
	s, d := sender.As4(), target.As4()
	f = slices.Concat(f, prPodMAC, s[:], make([]byte, 6), d[:])
	return f
}

// prNonFirstFragment turns an IPv4 frame into a fragment at offset 8 bytes.
func prNonFirstFragment(f []byte) []byte {
	f = slices.Clone(f)
	ip := f[prEthLen : prEthLen+20]
	binary.BigEndian.PutUint16(ip[6:], 1)
	binary.BigEndian.PutUint16(ip[10:], 0)
	binary.BigEndian.PutUint16(ip[10:], ^prCsumFold(prCsumAdd(0, ip)))
	return f
}

// prSwapMACs is f as bounced back out of the interface it came in by.
func prSwapMACs(f []byte) []byte {
	return slices.Concat(f[6:12], f[0:6], f[12:])
}

// prPacket is a decoded IP frame.
type prPacket struct {
	dstMAC, srcMAC []byte
	ipHdr          []byte
	src, dst       netip.Addr
	proto          uint8
	l4             []byte
}

// prDecode parses an Ethernet frame carrying IPv4 or IPv6, checking that the
// IP length fields match the frame.
func prDecode(t *testing.T, f []byte) prPacket {
	t.Helper()
	if len(f) < prEthLen {
		t.Fatalf("frame of %d bytes", len(f))
	}
	p := prPacket{dstMAC: f[0:6], srcMAC: f[6:12]}
	rest := f[prEthLen:]
	switch et := binary.BigEndian.Uint16(f[12:]); et {
	case 0x0800:
		if len(rest) < 20 || rest[0] != 0x45 {
			t.Fatalf("bad IPv4 header % x", rest)
		}
		if n := int(binary.BigEndian.Uint16(rest[2:])); n != len(rest) {
			t.Fatalf("IPv4 total length %d, frame carries %d", n, len(rest))
		}
		p.ipHdr = rest[:20]
		p.proto = rest[9]
		p.src = netip.AddrFrom4([4]byte(rest[12:16]))
		p.dst = netip.AddrFrom4([4]byte(rest[16:20]))
		p.l4 = rest[20:]
	case 0x86dd:
		if len(rest) < 40 || rest[0]>>4 != 6 {
			t.Fatalf("bad IPv6 header % x", rest)
		}
		if n := int(binary.BigEndian.Uint16(rest[4:])); n != len(rest)-40 {
			t.Fatalf("IPv6 payload length %d, frame carries %d", n, len(rest)-40)
		}
		p.ipHdr = rest[:40]
		p.proto = rest[6]
		p.src = netip.AddrFrom16([16]byte(rest[8:24]))
		p.dst = netip.AddrFrom16([16]byte(rest[24:40]))
		p.l4 = rest[40:]
	default:
		t.Fatalf("ethertype %#04x, want IPv4 or IPv6", et)
	}
	return p
}

func (p prPacket) srcPort() netip.AddrPort {
	return netip.AddrPortFrom(p.src, binary.BigEndian.Uint16(p.l4[0:]))
}

func (p prPacket) dstPort() netip.AddrPort {
	return netip.AddrPortFrom(p.dst, binary.BigEndian.Uint16(p.l4[2:]))
}

// prCheckChecksums verifies the IPv4 header checksum and the L4 checksum of
// p by summing over them in full (an IPv4 UDP checksum of 0 is "none").
func prCheckChecksums(t *testing.T, p prPacket) {
	t.Helper()
	if p.src.Is4() {
		if s := prCsumFold(prCsumAdd(0, p.ipHdr)); s != 0xffff {
			t.Errorf("IPv4 header checksum %#04x invalid (sum %#04x)", binary.BigEndian.Uint16(p.ipHdr[10:]), s)
		}
	}
	off := prL4CsumOffset(p.proto)
	if off < 0 || len(p.l4) < off+2 {
		t.Fatalf("no checksum to check for protocol %d (%d L4 bytes)", p.proto, len(p.l4))
	}
	c := binary.BigEndian.Uint16(p.l4[off:])
	if p.proto == prUDP && p.src.Is4() && c == 0 {
		return
	}
	if s := prCsumFold(prL4Sum(p.src, p.dst, p.proto, p.l4)); s != 0xffff {
		t.Errorf("protocol %d checksum %#04x invalid (sum %#04x)", p.proto, c, s)
	}
}

// prWantFrame fails t unless got is exactly want, showing both in hex.
func prWantFrame(t *testing.T, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		t.Errorf("output frame differs\n got: % x\nwant: % x", got, want)
	}
}

func prWantVerdict(t *testing.T, got, want uint32) {
	t.Helper()
	if got != want {
		t.Errorf("verdict %d, want %d", got, want)
	}
}

func prAP(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func prWithPort(a netip.AddrPort, port uint16) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr(), port)
}

// prBackendOf maps the destination of a DNATed frame to its backend ID.
func prBackendOf(t *testing.T, out []byte, bes []prBackend) uint32 {
	t.Helper()
	p := prDecode(t, out)
	prCheckChecksums(t, p)
	dst := p.dstPort()
	for _, be := range bes {
		if be.addr == dst {
			return be.id
		}
	}
	t.Fatalf("destination %s is no backend", dst)
	return 0
}

// ---- the cases ----

var (
	prClient4   = prAP("198.18.1.2:40000")
	prVIP4      = prAP("198.19.0.10:80")
	prBackends4 = []prBackend{
		{id: 1, addr: prAP("198.18.1.3:8080")},
		{id: 2, addr: prAP("198.18.1.4:8080")},
		{id: 3, addr: prAP("198.18.1.5:8080")},
	}
	prClient6  = prAP("[fd00:198:1::2]:40000")
	prVIP6     = prAP("[fd00:198:ff::10]:80")
	prBackend6 = prBackend{id: 11, addr: prAP("[fd00:198:1::3]:8080")}
)

func TestProgRunTCPDNATAndReverse(t *testing.T) {
	r := newPREnv(t)
	fe := prFrontend{vip: prVIP4, proto: prTCP, id: 1}
	be := prBackends4[0]
	r.addService(fe, be)

	syn := prTCPFrame(prClient4, prVIP4, 1000, 0, prSYN, nil)
	ret, out := r.run(r.objs.VipdFromPod, syn)
	prWantVerdict(t, ret, prTCOK)
	prCheckChecksums(t, prDecode(t, out))
	prWantFrame(t, out, prTCPFrame(prClient4, be.addr, 1000, 0, prSYN, nil))

	fwd, ok := r.ct(prClient4, prVIP4, prTCP, prDirForward)
	if !ok {
		t.Fatal("no forward conntrack entry client -> VIP")
	}
	if fwd.NatAddr != prAddrOf(be.addr.Addr()) || fwd.NatPort != prBE16(be.addr.Port()) {
		t.Errorf("forward entry NATs to %v:%d, want %s", fwd.NatAddr.W, fwd.NatPort, be.addr)
	}
	if fwd.BackendId != be.id || fwd.RevNatId != fe.id || fwd.Flags != 0 || fwd.Packets != 1 {
		t.Errorf("forward entry %+v: want backend %d, rev_nat %d, no flags, 1 packet", fwd, be.id, fe.id)
	}
	rev, ok := r.ct(be.addr, prClient4, prTCP, prDirReply)
	if !ok {
		t.Fatal("no reply conntrack entry backend -> client")
	}
	if rev.NatAddr != prAddrOf(prVIP4.Addr()) || rev.NatPort != prBE16(prVIP4.Port()) || rev.BackendId != be.id {
		t.Errorf("reply entry %+v: want VIP %s, backend %d", rev, prVIP4, be.id)
	}
	if n := r.ctCount(); n != 2 {
		t.Errorf("%d conntrack entries, want 2", n)
	}

	synAck := prTCPFrame(be.addr, prClient4, 5000, 1001, prSYN|prACK, nil)
	t.Run("reply passes the backend's ingress untranslated", func(t *testing.T) {
		// Only hairpin replies are translated on the way in.
		ret, out := r.run(r.objs.VipdFromPod, synAck)
		prWantVerdict(t, ret, prTCOK)
		prWantFrame(t, out, synAck)
	})
	t.Run("reverse NAT", func(t *testing.T) {
		ret, out := r.run(r.objs.VipdToPod, synAck)
		prWantVerdict(t, ret, prTCOK)
		prCheckChecksums(t, prDecode(t, out))
		prWantFrame(t, out, prTCPFrame(prVIP4, prClient4, 5000, 1001, prSYN|prACK, nil))
		if fwd, _ := r.ct(prClient4, prVIP4, prTCP, prDirForward); fwd.Flags&prCTSeenReply == 0 {
			t.Errorf("forward entry flags %#x: reply not recorded", fwd.Flags)
		}
	})
	t.Run("established data both ways", func(t *testing.T) {
		data := []byte("GET / HTTP/1.1\r\n\r\n")
		ret, out := r.run(r.objs.VipdFromPod, prTCPFrame(prClient4, prVIP4, 1001, 5001, prACK|prPSH, data))
		prWantVerdict(t, ret, prTCOK)
		prWantFrame(t, out, prTCPFrame(prClient4, be.addr, 1001, 5001, prACK|prPSH, data))
		ret, out = r.run(r.objs.VipdToPod, prTCPFrame(be.addr, prClient4, 5001, 1019, prACK|prPSH, data[:5]))
		prWantVerdict(t, ret, prTCOK)
		prWantFrame(t, out, prTCPFrame(prVIP4, prClient4, 5001, 1019, prACK|prPSH, data[:5]))
	})
	t.Run("untracked flow passes unchanged", func(t *testing.T) {
		for _, f := range [][]byte{
			prTCPFrame(prBackends4[1].addr, prClient4, 5000, 1001, prSYN|prACK, nil), // other pod
			prTCPFrame(prWithPort(be.addr, 8081), prClient4, 5000, 1001, prACK, nil), // other port
			prTCPFrame(be.addr, prWithPort(prClient4, 40001), 5000, 1001, prACK, nil),
			prUDPFrame(be.addr, prClient4, []byte("x")), // other protocol
		} {
			ret, out := r.run(r.objs.VipdToPod, f)
			prWantVerdict(t, ret, prTCOK)
			prWantFrame(t, out, f)
		}
	})
}

func TestProgRunStickiness(t *testing.T) {
	r := newPREnv(t)
	fe := prFrontend{vip: prVIP4, proto: prTCP, id: 1}
	r.addService(fe, prBackends4...)

	_, out := r.run(r.objs.VipdFromPod, prTCPFrame(prClient4, prVIP4, 1000, 0, prSYN, nil))
	first := prBackendOf(t, out, prBackends4)
	for i := range 20 {
		// A retransmitted SYN of a tracked flow keeps its backend.
		_, out := r.run(r.objs.VipdFromPod, prTCPFrame(prClient4, prVIP4, 1000, 0, prSYN, nil))
		if got := prBackendOf(t, out, prBackends4); got != first {
			t.Fatalf("SYN #%d went to backend %d, the flow's backend is %d", i+2, got, first)
		}
	}

	counts := map[uint32]int{}
	for i := range 300 {
		src := prWithPort(prClient4, uint16(41000+i))
		ret, out := r.run(r.objs.VipdFromPod, prTCPFrame(src, prVIP4, 1000, 0, prSYN, nil))
		prWantVerdict(t, ret, prTCOK)
		counts[prBackendOf(t, out, prBackends4)]++
	}
	for _, be := range prBackends4 {
		if counts[be.id] < 50 {
			t.Errorf("backend %d got %d of 300 flows, want >= 50 (all: %v)", be.id, counts[be.id], counts)
		}
	}
}

func TestProgRunWeighted(t *testing.T) {
	r := newPREnv(t)
	fe := prFrontend{vip: prVIP4, proto: prTCP, id: 1, flags: prSvcWeighted}
	bes := slices.Clone(prBackends4)
	for i := range bes {
		bes[i].weight = uint32(i + 1)
	}
	r.addService(fe, bes...)
	// The slots must carry cumulative ends 1, 3, 6 and the master 6.
	for slot, want := range []uint32{6, 1, 3, 6} {
		var v bpfSvcVal
		k := fe.key(uint32(slot))
		if err := r.objs.VipdServices.Lookup(&k, &v); err != nil || v.Weight != want {
			t.Fatalf("slot %d weight %d (%v), want %d", slot, v.Weight, err, want)
		}
	}

	const n = 3000
	counts := map[uint32]int{}
	for i := range n {
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, 2, byte(i / 250)}), uint16(10000+i))
		ret, out := r.run(r.objs.VipdFromPod, prTCPFrame(src, prVIP4, 1, 0, prSYN, nil))
		prWantVerdict(t, ret, prTCOK)
		counts[prBackendOf(t, out, bes)]++
	}
	for _, be := range bes {
		share, want := float64(counts[be.id])/n, float64(be.weight)/6
		if math.Abs(share-want) > 0.05 {
			t.Errorf("backend %d (weight %d) got %.1f%% of flows, want %.1f%% ± 5 (all: %v)",
				be.id, be.weight, 100*share, 100*want, counts)
		}
	}
}

func TestProgRunReject(t *testing.T) {
	r := newPREnv(t)
	for _, fe := range []prFrontend{
		{vip: prVIP4, proto: prTCP, id: 1},
		{vip: prWithPort(prVIP4, 53), proto: prUDP, id: 2},
		{vip: prVIP6, proto: prTCP, id: 3},
		{vip: prWithPort(prVIP6, 53), proto: prUDP, id: 4},
	} {
		r.addService(fe) // no backends: count 0
	}

	// checkBounce checks what every refusal shares: sent back to the
	// client, from the VIP, with valid checksums.
	checkBounce := func(t *testing.T, in, out []byte, vip, client netip.Addr, proto uint8) prPacket {
		t.Helper()
		p := prDecode(t, out)
		if !bytes.Equal(p.dstMAC, in[6:12]) || !bytes.Equal(p.srcMAC, in[0:6]) {
			t.Errorf("MACs %x -> %x, want swapped %x -> %x", p.srcMAC, p.dstMAC, in[0:6], in[6:12])
		}
		if p.src != vip || p.dst != client || p.proto != proto {
			t.Errorf("refusal %s -> %s proto %d, want %s -> %s proto %d", p.src, p.dst, p.proto, vip, client, proto)
		}
		prCheckChecksums(t, p)
		return p
	}
	checkRST := func(t *testing.T, p prPacket, from, to netip.AddrPort, seq, ack uint32, flags uint8) {
		t.Helper()
		if len(p.l4) != 20 {
			t.Fatalf("TCP segment of %d bytes, want a bare 20-byte header", len(p.l4))
		}
		if p.srcPort() != from || p.dstPort() != to {
			t.Errorf("RST %s -> %s, want %s -> %s", p.srcPort(), p.dstPort(), from, to)
		}
		gotSeq, gotAck := binary.BigEndian.Uint32(p.l4[4:]), binary.BigEndian.Uint32(p.l4[8:])
		if gotSeq != seq || gotAck != ack || p.l4[12] != 5<<4 || p.l4[13] != flags {
			t.Errorf("RST seq %d ack %d doff/flags %#x/%#x, want seq %d ack %d %#x/%#x",
				gotSeq, gotAck, p.l4[12], p.l4[13], seq, ack, 5<<4, flags)
		}
	}

	for _, tc := range []struct {
		name   string
		client netip.AddrPort
		vip    netip.AddrPort
	}{
		{"tcp4", prClient4, prVIP4},
		{"tcp6", prClient6, prVIP6},
	} {
		t.Run(tc.name+" SYN gets RST ACK", func(t *testing.T) {
			in := prTCPFrame(tc.client, tc.vip, 1000, 0, prSYN, nil)
			ret, out := r.run(r.objs.VipdFromPod, in)
			prWantVerdict(t, ret, prTCRedirect)
			p := checkBounce(t, in, out, tc.vip.Addr(), tc.client.Addr(), prTCP)
			checkRST(t, p, tc.vip, tc.client, 0, 1001, prRST|prACK)
		})
		t.Run(tc.name+" SYN with data gets RST ACK past the data", func(t *testing.T) {
			in := prTCPFrame(tc.client, tc.vip, 1000, 0, prSYN, []byte("fastopen"))
			ret, out := r.run(r.objs.VipdFromPod, in)
			prWantVerdict(t, ret, prTCRedirect)
			p := checkBounce(t, in, out, tc.vip.Addr(), tc.client.Addr(), prTCP)
			checkRST(t, p, tc.vip, tc.client, 0, 1009, prRST|prACK)
		})
		t.Run(tc.name+" untracked ACK gets RST", func(t *testing.T) {
			in := prTCPFrame(tc.client, tc.vip, 1000, 777, prACK|prPSH, []byte("data"))
			ret, out := r.run(r.objs.VipdFromPod, in)
			prWantVerdict(t, ret, prTCRedirect)
			p := checkBounce(t, in, out, tc.vip.Addr(), tc.client.Addr(), prTCP)
			checkRST(t, p, tc.vip, tc.client, 777, 0, prRST)
		})
		t.Run(tc.name+" RST is not answered", func(t *testing.T) {
			in := prTCPFrame(tc.client, tc.vip, 1000, 0, prRST, nil)
			ret, _ := r.run(r.objs.VipdFromPod, in)
			prWantVerdict(t, ret, 2) // TC_ACT_SHOT
		})
	}

	t.Run("untracked mid-stream segment gets RST despite backends", func(t *testing.T) {
		// Without conntrack the program cannot know the flow's backend,
		// and guessing one would only earn a RST from the wrong pod.
		fe := prFrontend{vip: prAP("198.19.0.11:80"), proto: prTCP, id: 5}
		r.addService(fe, prBackends4...)
		in := prTCPFrame(prClient4, fe.vip, 1000, 777, prACK, nil)
		ret, out := r.run(r.objs.VipdFromPod, in)
		prWantVerdict(t, ret, prTCRedirect)
		p := checkBounce(t, in, out, fe.vip.Addr(), prClient4.Addr(), prTCP)
		checkRST(t, p, fe.vip, prClient4, 777, 0, prRST)
	})

	payload := []byte("query-payload")
	t.Run("udp4 gets ICMP port unreachable", func(t *testing.T) {
		vip := prWithPort(prVIP4, 53)
		in := prUDPFrame(prClient4, vip, payload)
		ret, out := r.run(r.objs.VipdFromPod, in)
		prWantVerdict(t, ret, prTCRedirect)
		p := checkBounce(t, in, out, vip.Addr(), prClient4.Addr(), prICMP)
		if len(p.l4) != 8+28 {
			t.Fatalf("ICMP message of %d bytes, want 8 + 28", len(p.l4))
		}
		if p.l4[0] != 3 || p.l4[1] != 3 {
			t.Errorf("ICMP type %d code %d, want 3/3", p.l4[0], p.l4[1])
		}
		if !bytes.Equal(p.l4[4:8], []byte{0, 0, 0, 0}) {
			t.Errorf("ICMP unused field % x, want zero", p.l4[4:8])
		}
		if want := in[prEthLen : prEthLen+28]; !bytes.Equal(p.l4[8:], want) {
			t.Errorf("ICMP quotes % x, want the IP header and 8 bytes: % x", p.l4[8:], want)
		}
	})
	t.Run("udp6 gets ICMPv6 port unreachable", func(t *testing.T) {
		vip := prWithPort(prVIP6, 53)
		in := prUDPFrame(prClient6, vip, payload)
		ret, out := r.run(r.objs.VipdFromPod, in)
		prWantVerdict(t, ret, prTCRedirect)
		p := checkBounce(t, in, out, vip.Addr(), prClient6.Addr(), prICMPv6)
		if len(p.l4) != 8+48 {
			t.Fatalf("ICMPv6 message of %d bytes, want 8 + 48", len(p.l4))
		}
		if p.l4[0] != 1 || p.l4[1] != 4 {
			t.Errorf("ICMPv6 type %d code %d, want 1/4", p.l4[0], p.l4[1])
		}
		if want := in[prEthLen : prEthLen+48]; !bytes.Equal(p.l4[8:], want) {
			t.Errorf("ICMPv6 quotes % x, want the IPv6 header and 8 bytes: % x", p.l4[8:], want)
		}
	})
	if n := r.ctCount(); n != 0 {
		t.Errorf("refusals left %d conntrack entries", n)
	}
}

func TestProgRunUDP(t *testing.T) {
	r := newPREnv(t)
	vip := prWithPort(prVIP4, 53)
	be := prBackend{id: 1, addr: prAP("198.18.1.3:5353")}
	r.addService(prFrontend{vip: vip, proto: prUDP, id: 1}, be)
	query, answer := []byte("query"), []byte("answer!")

	t.Run("with checksum", func(t *testing.T) {
		ret, out := r.run(r.objs.VipdFromPod, prUDPFrame(prClient4, vip, query))
		prWantVerdict(t, ret, prTCOK)
		prCheckChecksums(t, prDecode(t, out))
		prWantFrame(t, out, prUDPFrame(prClient4, be.addr, query))

		ret, out = r.run(r.objs.VipdToPod, prUDPFrame(be.addr, prClient4, answer))
		prWantVerdict(t, ret, prTCOK)
		prCheckChecksums(t, prDecode(t, out))
		prWantFrame(t, out, prUDPFrame(vip, prClient4, answer))
	})
	t.Run("without checksum", func(t *testing.T) {
		client := prWithPort(prClient4, 40001)
		ret, out := r.run(r.objs.VipdFromPod, prUDPFrameNoCsum(client, vip, query))
		prWantVerdict(t, ret, prTCOK)
		prCheckChecksums(t, prDecode(t, out))
		prWantFrame(t, out, prUDPFrameNoCsum(client, be.addr, query))

		ret, out = r.run(r.objs.VipdToPod, prUDPFrameNoCsum(be.addr, client, answer))
		prWantVerdict(t, ret, prTCOK)
		prWantFrame(t, out, prUDPFrameNoCsum(vip, client, answer))
	})
	t.Run("ipv6", func(t *testing.T) {
		vip := prWithPort(prVIP6, 53)
		be := prBackend{id: 12, addr: prAP("[fd00:198:1::3]:5353")}
		r.addService(prFrontend{vip: vip, proto: prUDP, id: 2}, be)
		ret, out := r.run(r.objs.VipdFromPod, prUDPFrame(prClient6, vip, query))
		prWantVerdict(t, ret, prTCOK)
		prCheckChecksums(t, prDecode(t, out))
		prWantFrame(t, out, prUDPFrame(prClient6, be.addr, query))

		ret, out = r.run(r.objs.VipdToPod, prUDPFrame(be.addr, prClient6, answer))
		prWantVerdict(t, ret, prTCOK)
		prCheckChecksums(t, prDecode(t, out))
		prWantFrame(t, out, prUDPFrame(vip, prClient6, answer))
	})
}

func TestProgRunIPv6DNAT(t *testing.T) {
	r := newPREnv(t)
	r.addService(prFrontend{vip: prVIP6, proto: prTCP, id: 1}, prBackend6)

	ret, out := r.run(r.objs.VipdFromPod, prTCPFrame(prClient6, prVIP6, 1000, 0, prSYN, nil))
	prWantVerdict(t, ret, prTCOK)
	prCheckChecksums(t, prDecode(t, out))
	prWantFrame(t, out, prTCPFrame(prClient6, prBackend6.addr, 1000, 0, prSYN, nil))
	if fwd, ok := r.ct(prClient6, prVIP6, prTCP, prDirForward); !ok || fwd.NatAddr != prAddrOf(prBackend6.addr.Addr()) {
		t.Errorf("forward entry %+v (found %v), want NAT to %s", fwd, ok, prBackend6.addr)
	}
	if _, ok := r.ct(prBackend6.addr, prClient6, prTCP, prDirReply); !ok {
		t.Error("no reply conntrack entry backend -> client")
	}

	ret, out = r.run(r.objs.VipdToPod, prTCPFrame(prBackend6.addr, prClient6, 5000, 1001, prSYN|prACK, nil))
	prWantVerdict(t, ret, prTCOK)
	prCheckChecksums(t, prDecode(t, out))
	prWantFrame(t, out, prTCPFrame(prVIP6, prClient6, 5000, 1001, prSYN|prACK, nil))
}

func TestProgRunHairpin(t *testing.T) {
	r := newPREnv(t)
	be := prBackends4[0]
	r.addService(prFrontend{vip: prVIP4, proto: prTCP, id: 1}, be)
	client := prWithPort(be.addr, 40000) // the backend calls its own service

	ret, out := r.run(r.objs.VipdFromPod, prTCPFrame(client, prVIP4, 1000, 0, prSYN, nil))
	prWantVerdict(t, ret, prTCRedirect)
	prCheckChecksums(t, prDecode(t, out))
	// The source becomes the VIP, or the pod would answer itself directly.
	prWantFrame(t, out, prSwapMACs(prTCPFrame(prWithPort(prVIP4, client.Port()), be.addr, 1000, 0, prSYN, nil)))
	for _, k := range []struct {
		src, dst netip.AddrPort
		dir      uint8
	}{
		{client, prVIP4, prDirForward},
		{be.addr, prWithPort(prVIP4, client.Port()), prDirReply},
	} {
		e, ok := r.ct(k.src, k.dst, prTCP, k.dir)
		if !ok {
			t.Fatalf("no conntrack entry %s -> %s dir %d", k.src, k.dst, k.dir)
		}
		if e.Flags&prCTHairpin == 0 {
			t.Errorf("conntrack entry %s -> %s flags %#x, want hairpin", k.src, k.dst, e.Flags)
		}
	}

	synAck := prTCPFrame(be.addr, prWithPort(prVIP4, client.Port()), 5000, 1001, prSYN|prACK, nil)
	ret, out = r.run(r.objs.VipdFromPod, synAck)
	prWantVerdict(t, ret, prTCRedirect)
	prCheckChecksums(t, prDecode(t, out))
	prWantFrame(t, out, prSwapMACs(prTCPFrame(prVIP4, client, 5000, 1001, prSYN|prACK, nil)))

	// The client's ACK keeps going to itself through the VIP.
	ret, out = r.run(r.objs.VipdFromPod, prTCPFrame(client, prVIP4, 1001, 5001, prACK, nil))
	prWantVerdict(t, ret, prTCRedirect)
	prWantFrame(t, out, prSwapMACs(prTCPFrame(prWithPort(prVIP4, client.Port()), be.addr, 1001, 5001, prACK, nil)))
}

// TestProgRunBackendRemoved: a backend that leaves a frontend, or may take
// no new connections (drained, terminating), keeps its tracked TCP flows
// and gets no new one; UDP flows move when it leaves. Both ways a frontend
// keeps its members: inline in its reverse-NAT value (up to 16), and in
// vipd_members (17: three backends in slots, 14 more members).
func TestProgRunBackendRemoved(t *testing.T) {
	t.Run("inline members", func(t *testing.T) { testBackendRemoved(t, false) })
	t.Run("members in the member map", func(t *testing.T) { testBackendRemoved(t, true) })
}

func testBackendRemoved(t *testing.T, spill bool) {
	fe := prFrontend{vip: prVIP4, proto: prTCP, id: 1}
	others := func(gone uint32) []prBackend {
		return slices.DeleteFunc(slices.Clone(prBackends4), func(be prBackend) bool { return be.id == gone })
	}
	beByID := func(id uint32) prBackend {
		return prBackends4[slices.IndexFunc(prBackends4, func(be prBackend) bool { return be.id == id })]
	}
	add := func(r *prEnv, fe prFrontend) {
		t.Helper()
		r.addService(fe, prBackends4...)
		want, entries := uint32(len(prBackends4)), 0
		if spill {
			for id := uint32(100); id < 100+revNatInlineMembers+1-uint32(len(prBackends4)); id++ {
				r.setMember(fe, id, prMemberEligible)
			}
			want, entries = revNatMembersMap, revNatInlineMembers+1
		}
		if got, n := r.revNat(fe).Members, r.memberEntries(); got != want || n != entries {
			t.Fatalf("reverse-NAT value says %#x members, vipd_members holds %d; want %#x and %d", got, n, want, entries)
		}
	}

	t.Run("udp flow moves", func(t *testing.T) {
		r := newPREnv(t)
		fe := fe
		fe.vip, fe.proto = prWithPort(prVIP4, 53), prUDP
		add(r, fe)
		in := prUDPFrame(prClient4, fe.vip, []byte("q"))
		_, out := r.run(r.objs.VipdFromPod, in)
		old := prBackendOf(t, out, prBackends4)

		// The backend leaves, in the dataplane's order: slots first.
		r.setSlots(fe, others(old)...)
		r.deleteMember(fe, old)
		ret, out := r.run(r.objs.VipdFromPod, in)
		prWantVerdict(t, ret, prTCOK)
		if got := prBackendOf(t, out, prBackends4); got == old {
			t.Errorf("flow stayed on backend %d, which left the service", old)
		}
		if _, ok := r.ct(beByID(old).addr, prClient4, prUDP, prDirReply); ok {
			t.Error("the old backend's reply entry survived the move")
		}
		stale := prUDPFrame(beByID(old).addr, prClient4, []byte("late"))
		_, out = r.run(r.objs.VipdToPod, stale)
		prWantFrame(t, out, stale)
	})
	t.Run("udp flow keeps a terminating backend", func(t *testing.T) {
		r := newPREnv(t)
		fe := fe
		fe.vip, fe.proto = prWithPort(prVIP4, 53), prUDP
		add(r, fe)
		in := prUDPFrame(prClient4, fe.vip, []byte("q"))
		_, out := r.run(r.objs.VipdFromPod, in)
		old := prBackendOf(t, out, prBackends4)

		r.setSlots(fe, others(old)...)
		r.setMember(fe, old, 0)
		_, out = r.run(r.objs.VipdFromPod, in)
		if got := prBackendOf(t, out, prBackends4); got != old {
			t.Errorf("flow moved from terminating backend %d to %d", old, got)
		}
	})
	t.Run("tcp flow keeps its backend", func(t *testing.T) {
		r := newPREnv(t)
		add(r, fe)
		_, out := r.run(r.objs.VipdFromPod, prTCPFrame(prClient4, prVIP4, 1000, 0, prSYN, nil))
		old := prBackendOf(t, out, prBackends4)

		r.setSlots(fe, others(old)...)
		r.deleteMember(fe, old)
		ret, out := r.run(r.objs.VipdFromPod, prTCPFrame(prClient4, prVIP4, 1001, 5001, prACK, nil))
		prWantVerdict(t, ret, prTCOK)
		if got := prBackendOf(t, out, prBackends4); got != old {
			t.Errorf("established flow moved from backend %d to %d", old, got)
		}
	})
	t.Run("tcp SYN leaves an ineligible backend", func(t *testing.T) {
		r := newPREnv(t)
		add(r, fe)
		syn := prTCPFrame(prClient4, prVIP4, 1000, 0, prSYN, nil)
		_, out := r.run(r.objs.VipdFromPod, syn)
		old := prBackendOf(t, out, prBackends4)

		r.setSlots(fe, others(old)...)
		r.setMember(fe, old, 0)
		ret, out := r.run(r.objs.VipdFromPod, syn)
		prWantVerdict(t, ret, prTCOK)
		got := prBackendOf(t, out, prBackends4)
		if got == old {
			t.Fatalf("new SYN stayed on ineligible backend %d", old)
		}
		if fwd, _ := r.ct(prClient4, prVIP4, prTCP, prDirForward); fwd.BackendId != got {
			t.Errorf("forward entry names backend %d, the packet went to %d", fwd.BackendId, got)
		}
		if _, ok := r.ct(beByID(old).addr, prClient4, prTCP, prDirReply); ok {
			t.Error("the old backend's reply entry survived")
		}
		if _, ok := r.ct(beByID(got).addr, prClient4, prTCP, prDirReply); !ok {
			t.Error("no reply entry for the new backend")
		}
	})
}

func TestProgRunPassThrough(t *testing.T) {
	r := newPREnv(t)
	r.addService(prFrontend{vip: prVIP4, proto: prTCP, id: 1}, prBackends4...)
	r.addService(prFrontend{vip: prVIP6, proto: prTCP, id: 2}, prBackend6)

	for _, tc := range []struct {
		name  string
		frame []byte
	}{
		{"other port", prTCPFrame(prClient4, prWithPort(prVIP4, 81), 1000, 0, prSYN, nil)},
		{"other protocol", prUDPFrame(prClient4, prVIP4, []byte("x"))},
		{"other address", prTCPFrame(prClient4, prAP("198.19.0.11:80"), 1000, 0, prSYN, nil)},
		{"ipv6 other port", prTCPFrame(prClient6, prWithPort(prVIP6, 81), 1000, 0, prSYN, nil)},
		{"icmp echo", prICMPEcho(prClient4.Addr(), prVIP4.Addr())},
		{"arp", prARPRequest(prClient4.Addr(), prVIP4.Addr())},
		{"non-first fragment", prNonFirstFragment(prTCPFrame(prClient4, prVIP4, 1000, 0, prACK, []byte("fragment")))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, prog := range []*ebpf.Program{r.objs.VipdFromPod, r.objs.VipdToPod} {
				ret, out := r.run(prog, tc.frame)
				prWantVerdict(t, ret, prTCOK)
				prWantFrame(t, out, tc.frame)
			}
		})
	}
	if n := r.ctCount(); n != 0 {
		t.Errorf("pass-through left %d conntrack entries", n)
	}
}

func TestProgRunMaglev(t *testing.T) {
	r := newPREnv(t)
	const m = 31
	fe := prFrontend{vip: prVIP4, proto: prTCP, id: 7, flags: prSvcMaglev, maglevSize: m}
	r.addService(fe, prBackends4...)

	innerSpec := r.spec.Maps[bpfMapVipdMaglev].InnerMap.Copy()
	innerSpec.MaxEntries = m
	inner, err := ebpf.NewMap(innerSpec)
	if err != nil {
		t.Fatalf("create maglev table: %v", err)
	}
	defer inner.Close() // the outer map holds its own reference
	table := make([]uint32, m)
	for i := range table {
		// Uneven on purpose: a random pick would not match it.
		table[i] = prBackends4[(i*i)%len(prBackends4)].id
		if err := inner.Put(uint32(i), table[i]); err != nil {
			t.Fatalf("fill maglev table: %v", err)
		}
	}
	if err := r.objs.VipdMaglev.Put(fe.id, inner); err != nil {
		t.Fatalf("put maglev table: %v", err)
	}

	used := map[uint32]int{}
	for i := range 100 {
		src := prWithPort(prClient4, uint16(30000+i))
		syn := prTCPFrame(src, prVIP4, 1000, 0, prSYN, nil)
		want := table[flowHash(src, prVIP4, prTCP)%m]
		for try := range 3 {
			// Forget the flow so that each try is a fresh pick.
			r.clearCT()
			ret, out := r.run(r.objs.VipdFromPod, syn)
			prWantVerdict(t, ret, prTCOK)
			if got := prBackendOf(t, out, prBackends4); got != want {
				t.Fatalf("flow from %s try %d went to backend %d, table[hash %% %d] is %d", src, try, got, m, want)
			}
		}
		used[want]++
	}
	if len(used) < 2 {
		t.Errorf("100 flows used backends %v, want several", used)
	}
}

func TestProgRunAffinity(t *testing.T) {
	r := newPREnv(t)
	fe := prFrontend{vip: prVIP4, proto: prTCP, id: 1, flags: prSvcAffinity, affinityTimeout: 10}
	r.addService(fe, prBackends4...)

	for _, c := range []netip.Addr{prClient4.Addr(), netip.MustParseAddr("198.18.1.9")} {
		var first uint32
		for i := range 50 {
			src := netip.AddrPortFrom(c, uint16(42000+i))
			ret, out := r.run(r.objs.VipdFromPod, prTCPFrame(src, prVIP4, 1000, 0, prSYN, nil))
			prWantVerdict(t, ret, prTCOK)
			got := prBackendOf(t, out, prBackends4)
			if i == 0 {
				first = got
			} else if got != first {
				t.Fatalf("client %s port %d went to backend %d, its first connection to %d", c, src.Port(), got, first)
			}
		}
		k := bpfAffinityKey{RevNatId: fe.id, Client: prAddrOf(c)}
		var v bpfAffinityVal
		if err := r.objs.VipdAffinity.Lookup(&k, &v); err != nil || v.BackendId != first {
			t.Errorf("affinity entry for %s: %+v (%v), want backend %d", c, v, err, first)
		}
	}
}

// TestProgRunChecksumComplete runs the NAT paths over skbs marked
// CHECKSUM_COMPLETE, as packets received from a NIC are: the kernel fails
// the run with EBADMSG when the program leaves skb->csum stale.
func TestProgRunChecksumComplete(t *testing.T) {
	r := newPREnv(t)
	arp := prARPRequest(prClient4.Addr(), prVIP4.Addr())
	if _, _, err := prRun(r.objs.VipdFromPod, arp, prTestChecksumComplete); errors.Is(err, unix.EINVAL) {
		require.KernelFeature(t, "BPF_F_TEST_SKB_CHECKSUM_COMPLETE (Linux 6.17+)", err)
	}
	r.addService(prFrontend{vip: prVIP4, proto: prTCP, id: 1}, prBackends4[0])
	r.addService(prFrontend{vip: prWithPort(prVIP4, 53), proto: prUDP, id: 2}, prBackends4[0])
	r.addService(prFrontend{vip: prVIP6, proto: prTCP, id: 3}, prBackend6)
	r.addService(prFrontend{vip: prWithPort(prVIP6, 53), proto: prUDP, id: 4}, prBackend6)

	for _, tc := range []struct {
		name    string
		prog    *ebpf.Program
		in, out []byte
	}{
		{"tcp4 DNAT", r.objs.VipdFromPod,
			prTCPFrame(prClient4, prVIP4, 1, 0, prSYN, nil), prTCPFrame(prClient4, prBackends4[0].addr, 1, 0, prSYN, nil)},
		{"tcp4 reverse", r.objs.VipdToPod,
			prTCPFrame(prBackends4[0].addr, prClient4, 9, 2, prSYN|prACK, nil), prTCPFrame(prVIP4, prClient4, 9, 2, prSYN|prACK, nil)},
		{"udp4 DNAT", r.objs.VipdFromPod,
			prUDPFrame(prClient4, prWithPort(prVIP4, 53), []byte("q")), prUDPFrame(prClient4, prBackends4[0].addr, []byte("q"))},
		{"tcp6 DNAT", r.objs.VipdFromPod,
			prTCPFrame(prClient6, prVIP6, 1, 0, prSYN, nil), prTCPFrame(prClient6, prBackend6.addr, 1, 0, prSYN, nil)},
		{"tcp6 reverse", r.objs.VipdToPod,
			prTCPFrame(prBackend6.addr, prClient6, 9, 2, prSYN|prACK, nil), prTCPFrame(prVIP6, prClient6, 9, 2, prSYN|prACK, nil)},
		{"udp6 DNAT", r.objs.VipdFromPod,
			prUDPFrame(prClient6, prWithPort(prVIP6, 53), []byte("q")), prUDPFrame(prClient6, prBackend6.addr, []byte("q"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ret, out, err := prRun(tc.prog, tc.in, prTestChecksumComplete)
			if err != nil {
				// For IPv6, rewrite() must not let bpf_l4_csum_replace
				// fold the pseudo-header change into skb->csum: there is
				// no IPv6 header checksum to cancel it out (the kernel
				// wants BPF_F_IPV6 there, or the address store must carry
				// BPF_F_RECOMPUTE_CSUM to add it back).
				t.Fatalf("run: %v (EBADMSG: skb->csum left inconsistent with the packet)", err)
			}
			prWantVerdict(t, ret, prTCOK)
			prWantFrame(t, out, tc.out)
		})
	}
}
