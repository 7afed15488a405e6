package sockdiag

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

func TestRequestWireLayout(t *testing.T) {
	req := request{
		Family:   unix.AF_INET6,
		Protocol: unix.IPPROTO_UDP,
		States:   allStates,
		ID: sockID{
			SPort:  0x1234,
			DPort:  53,
			Src:    netip.MustParseAddr("2001:db8::1").As16(),
			Dst:    netip.MustParseAddr("2001:db8::2").As16(),
			If:     7,
			Cookie: 0x1122334455667788,
		},
	}
	b := make([]byte, sizeofReqV2)
	req.marshal(b)

	want := make([]byte, 0, sizeofReqV2)
	want = append(want, unix.AF_INET6, unix.IPPROTO_UDP, 0, 0)
	want = binary.NativeEndian.AppendUint32(want, allStates)
	want = append(want, 0x12, 0x34, 0x00, 53) // ports are big-endian
	want = append(want, req.ID.Src[:]...)
	want = append(want, req.ID.Dst[:]...)
	want = binary.NativeEndian.AppendUint32(want, 7)
	want = binary.NativeEndian.AppendUint32(want, 0x55667788) // cookie low word first
	want = binary.NativeEndian.AppendUint32(want, 0x11223344)
	if !bytes.Equal(b, want) {
		t.Fatalf("inet_diag_req_v2:\n got %x\nwant %x", b, want)
	}

	var back sockID
	back.unmarshal(b[8:])
	if back != req.ID {
		t.Errorf("sockid round trip: got %+v, want %+v", back, req.ID)
	}
}

func TestParseDiagMsgDst(t *testing.T) {
	tests := []struct {
		name   string
		family uint8
		dst    netip.Addr
		want   netip.AddrPort
	}{
		{"ipv4", unix.AF_INET, netip.MustParseAddr("10.0.0.1"), netip.MustParseAddrPort("10.0.0.1:53")},
		{"ipv6", unix.AF_INET6, netip.MustParseAddr("2001:db8::2"), netip.MustParseAddrPort("[2001:db8::2]:53")},
		{"ipv4-mapped on v6 socket", unix.AF_INET6, netip.MustParseAddr("::ffff:10.0.0.1"), netip.MustParseAddrPort("10.0.0.1:53")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := make([]byte, sizeofDiagMsg)
			msg[0] = tt.family
			id := sockID{SPort: 40000, DPort: 53, Cookie: 42}
			if tt.dst.Is4() {
				a := tt.dst.As4()
				copy(id.Dst[:], a[:])
			} else {
				id.Dst = tt.dst.As16()
			}
			id.marshal(msg[4:])
			s, err := parseDiagMsg(msg)
			if err != nil {
				t.Fatal(err)
			}
			if got := s.dst(); got != tt.want {
				t.Errorf("dst: got %s, want %s", got, tt.want)
			}
			if s.ID.Cookie != 42 {
				t.Errorf("cookie: got %d, want 42", s.ID.Cookie)
			}
		})
	}
	if _, err := parseDiagMsg(make([]byte, sizeofDiagMsg-1)); err == nil {
		t.Error("short inet_diag_msg: got no error")
	}
}

func TestTargetsNormalizes(t *testing.T) {
	got := targets([]netip.AddrPort{
		netip.MustParseAddrPort("[::ffff:10.0.0.1]:53"),
		netip.MustParseAddrPort("[fe80::1%eth0]:53"),
		{},
	})
	want := map[netip.AddrPort]bool{
		netip.MustParseAddrPort("10.0.0.1:53"):  true,
		netip.MustParseAddrPort("[fe80::1]:53"): true,
	}
	if len(got) != len(want) {
		t.Fatalf("targets: got %v, want %v", got, want)
	}
	for d := range want {
		if !got[d] {
			t.Errorf("targets: missing %s in %v", d, got)
		}
	}
}
