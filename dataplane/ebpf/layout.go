package ebpf

import (
	"encoding/binary"
	"net/netip"
)

// layoutVersion is LAYOUT_VERSION of bpf/maps.h: the version of the pinned
// map layout. A pinned set of another version is not reused.
const layoutVersion = 1

// Flags shared with bpf/maps.h.
const (
	svcFlagAffinity = 1
	svcFlagMaglev   = 2
	svcFlagWeighted = 4

	memberFlagEligible = 1

	ctDirForward = 0
	ctDirReply   = 1
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
