package iptablestest

import (
	"net/netip"
	"testing"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/iptables"
)

// Loaded returns a Tracer for family f that has applied payloads in order,
// failing tb on the first payload it refuses.
func Loaded(tb testing.TB, f iptables.Family, payloads ...[]byte) *Tracer {
	tb.Helper()
	tr := NewTracer(f)
	for _, p := range payloads {
		if err := tr.Restore(p); err != nil {
			tb.Fatalf("%s: %v\n%s", f, err, p)
		}
	}
	return tr
}

// NewPacket is a packet from src to dst:port over proto; it panics on an
// address that does not parse.
func NewPacket(src, dst string, proto dataplane.Protocol, port uint16) Packet {
	return Packet{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), Protocol: proto, DstPort: port}
}

// MustTrace traces p through tr, failing tb if the rules cannot be
// followed.
func MustTrace(tb testing.TB, tr *Tracer, p Packet) Outcome {
	tb.Helper()
	o, err := tr.Trace(p)
	if err != nil {
		tb.Fatalf("Trace: %v", err)
	}
	return o
}
