package ebpf

import (
	"encoding/binary"
	"net/netip"
)

// layoutVersion is LAYOUT_VERSION of bpf/maps.h: the version of the pinned
// map layout. A pinned set of another version is not reused.
const layoutVersion = 7

// Flags shared with bpf/maps.h.
const (
	svcFlagAffinity = 1
	svcFlagMaglev   = 2
	svcFlagWeighted = 4
	svcFlagDraining = 8
	// svcFlagSNAT: an external frontend under policy Cluster masquerades
	// the client to the node's address.
	svcFlagSNAT = 16
	// svcFlagDropEmpty: an external frontend under policy Local drops,
	// rather than rejects, when it has no backend.
	svcFlagDropEmpty = 32
	// svcFlagSrcRanges: only sources in vipd_src_ranges reach the frontend.
	svcFlagSrcRanges = 64
	// svcFlagNodeAllowed: with svcFlagSrcRanges, a range holds one of the
	// node's addresses, so that the node's unbound sockets pass.
	svcFlagNodeAllowed = 128

	// Frontend scopes (svc_key.scope): cluster frontends serve pods and
	// the node's processes, external ones packets entering on an external
	// interface.
	scopeCluster  = 0
	scopeExternal = 1

	memberFlagEligible = 1

	// revNatInlineMembers is REVNAT_INLINE_MEMBERS: a frontend with at
	// most this many members keeps them in its reverse-NAT value, and has
	// no vipd_members entries. A larger one's value says revNatMembersMap.
	revNatInlineMembers = 16
	revNatMembersMap    = 0xffffffff

	ctFlagHairpin = 1
	ctFlagSNAT    = 8

	ctDirForward = 0
	ctDirReply   = 1

	ctEvClosed = 1 // ct_entry.ev_flags: the flow's CLOSED event was sent

	flowEvNew    = 1
	flowEvClosed = 2

	flowCloseFIN            = 1
	flowCloseRST            = 2
	flowCloseTimeout        = 3
	flowCloseBackendRemoved = 4
	flowCloseReplaced       = 5
)

// snatTWGuard is SNAT_TW_GUARD of bpf/maps.h: how many seconds a
// vipd_snat_tw record keeps the backend's TIME_WAIT of its tuple from SYNs
// it would refuse.
const snatTWGuard = 65

// TCP header flags, as ct_entry.tcp_flags collects them (bpf/vipd.c).
const (
	tcpFlagFIN = 0x01
	tcpFlagSYN = 0x02
	tcpFlagRST = 0x04
	tcpFlagACK = 0x10
)

// addrWords is the union addr of the BPF maps: the 16 address bytes in
// network order, IPv4 mapped into IPv6.
type addrWords = [4]uint32

func toWords(a netip.Addr) addrWords {
	b := a.As16()
	var w addrWords
	for i := range w {
		w[i] = binary.NativeEndian.Uint32(b[4*i:])
	}
	return w
}

func fromWords(w addrWords) netip.Addr {
	var b [16]byte
	for i := range w {
		binary.NativeEndian.PutUint32(b[4*i:], w[i])
	}
	return netip.AddrFrom16(b).Unmap()
}

// be16 turns a port into the __be16 the maps hold, and back.
func be16(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}

func fromBE16(v uint16) uint16 { return be16(v) }

// IP protocol numbers.
const (
	ipprotoTCP  = 6
	ipprotoUDP  = 17
	ipprotoSCTP = 132
)

// replyKeyOf is bpf/vipd.c's reply_key: the key of the reply entry of the
// flow whose forward entry is (k, e).
func replyKeyOf(k *bpfCtKey, e *bpfCtEntry) bpfCtKey {
	var rk bpfCtKey
	rk.Src = e.NatAddr
	rk.Sport = e.NatPort
	rk.Dport = k.Sport
	switch {
	case e.Flags&ctFlagSNAT != 0:
		rk.Dst = e.SnatAddr
		rk.Dport = e.SnatPort
	case e.Flags&ctFlagHairpin != 0:
		rk.Dst = k.Dst
	default:
		rk.Dst = k.Src
	}
	rk.Proto = k.Proto
	rk.Dir = ctDirReply
	return rk
}

// forwardKeyOf is the forward key of the flow whose reply entry is e under
// key k: the inverse of replyKeyOf.
func forwardKeyOf(k *bpfCtKey, e *bpfCtEntry) bpfCtKey {
	var fk bpfCtKey
	fk.Sport = k.Dport
	switch {
	case e.Flags&ctFlagSNAT != 0:
		fk.Src = e.SnatAddr
		fk.Sport = e.SnatPort
	case e.Flags&ctFlagHairpin != 0:
		fk.Src = k.Src
	default:
		fk.Src = k.Dst
	}
	fk.Dst = e.NatAddr
	fk.Dport = e.NatPort
	fk.Proto = k.Proto
	fk.Dir = ctDirForward
	return fk
}

// flowHash is bpf/lb.h's flow_hash of a packet from src to dst: the hash
// that picks a new flow's Maglev table slot.
func flowHash(src, dst netip.AddrPort, proto uint8) uint32 {
	h := uint32(0x9e3779b9)
	for _, a := range []netip.Addr{src.Addr(), dst.Addr()} {
		for _, w := range toWords(a) {
			h = mix32(h ^ w)
		}
	}
	return mix32(h ^ (uint32(be16(src.Port()))<<16 | uint32(be16(dst.Port()))) ^ uint32(proto))
}
