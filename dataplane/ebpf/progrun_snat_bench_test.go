package ebpf

// Per-packet costs of the SNAT paths of vipd_from_ext, measured in the
// kernel with BPF_PROG_TEST_RUN as BenchmarkProgRunPath does: a new SNAT
// flow's SYN (Linux's SYN options, so the TIME_WAIT guard walks them) and
// an established client segment of an SNAT flow. Run alone, e.g.
//
//	go test -p 1 -count=1 -run '^$' -bench ProgRunSNAT -benchtime 5000x ./dataplane/ebpf/

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"testing"
)

// prbSYN is a SYN from src to dst with Linux's SYN options (MSS, SACK
// permitted, timestamps, NOP, window scale).
func prbSYN(src, dst netip.AddrPort, seq, tsval uint32) []byte {
	opts := []byte{2, 4, 0x05, 0xb4, 4, 2, 8, 10, 0, 0, 0, 0, 0, 0, 0, 0, 1, 3, 3, 7}
	binary.BigEndian.PutUint32(opts[8:], tsval)
	h := make([]byte, 20)
	binary.BigEndian.PutUint16(h[0:], src.Port())
	binary.BigEndian.PutUint16(h[2:], dst.Port())
	binary.BigEndian.PutUint32(h[4:], seq)
	h[12] = byte((20+len(opts))/4) << 4
	h[13] = prSYN
	binary.BigEndian.PutUint16(h[14:], 64240)
	return prIPFrame(src.Addr(), dst.Addr(), prTCP, slices.Concat(h, opts))
}

func BenchmarkProgRunSNAT(b *testing.B) {
	env := func(b *testing.B) *prEnv {
		r := prbEnv(b)
		cfg := configFor(0, ConntrackTimeouts{}, PortRange{Min: 1024, Max: 65535})
		cfg.SnatSkipMin, cfg.SnatSkipMax = 32768, 60999
		if err := writeConfig(&r.objs.bpfMaps, cfg); err != nil {
			b.Fatal(err)
		}
		r.addService(prFrontend{vip: prNodePort, proto: prTCP, id: 2, scope: scopeExternal, flags: svcFlagSNAT}, prBackends4[0])
		r.setExternalLoopback(prNodeAddr)
		return r
	}
	b.Run("from_ext/SNAT-SYN-new-flow", func(b *testing.B) {
		r := env(b)
		prbRun(b, r.objs.VipdFromExt, 1, func(i int) []byte {
			return prbSYN(prbClient(i), prNodePort, 1000, uint32(5000+i))
		})
	})
	b.Run("from_ext/SNAT-tracked", func(b *testing.B) {
		r := env(b)
		r.run(r.objs.VipdFromExt, prbSYN(prOutside4, prNodePort, 1000, 5000))
		fwd, ok := r.ct(prOutside4, prNodePort, prTCP, prDirForward)
		if !ok {
			b.Fatal("SYN not tracked")
		}
		r.run(r.objs.VipdFromPod, prTCPFrame(prBackends4[0].addr, netip.AddrPortFrom(prNodeAddr, fromBE16(fwd.SnatPort)), 7000, 1001, prSYN|prACK, nil))
		f := prTCPFrame(prOutside4, prNodePort, 1001, 7001, prACK, []byte("data"))
		prbRun(b, r.objs.VipdFromExt, 1, func(int) []byte { return f })
	})
}
