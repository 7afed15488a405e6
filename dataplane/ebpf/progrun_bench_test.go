package ebpf

// Per-packet costs of the tc programs, measured in the kernel with
// BPF_PROG_TEST_RUN: the fast paths of dataplane/ebpf/FASTPATH.md, with
// 10,000 other services programmed and the flow event ring drained. A
// frame the program does not rewrite runs prbRepeat times per call; one it
// rewrites (the next run would see the rewritten frame) runs once per
// call, the kernel timing that one run. Maps stay in the CPU's caches
// here, unlike under real traffic (BenchmarkConnCost): these numbers show
// the instructions and helper calls of each path. Run alone, e.g.
//
//	go test -p 1 -count=1 -run '^$' -bench ProgRunPath -benchtime 20000x ./dataplane/ebpf/

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
)

const prbRepeat = 1000

// prbEnv is a prEnv with 10,000 services besides prVIP4's, and a reader
// that drains the flow event ring.
func prbEnv(b *testing.B) *prEnv {
	r := newPREnv(b)
	r.addService(prFrontend{vip: prVIP4, proto: prTCP, id: 1}, prBackends4...)
	for i := range 10_000 {
		vip := netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 19, byte(1 + i/250), byte(1 + i%250)}), 80)
		r.addService(prFrontend{vip: vip, proto: prTCP, id: uint32(100 + i)}, prBackends4[i%len(prBackends4)])
	}
	rd, err := ringbuf.NewReader(r.objs.VipdEvents)
	if err != nil {
		b.Fatalf("ring reader: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var rec ringbuf.Record
		for {
			if err := rd.ReadInto(&rec); errors.Is(err, ringbuf.ErrClosed) {
				return
			}
		}
	}()
	b.Cleanup(func() { rd.Close(); <-done })
	return r
}

// prbRun reports the mean kernel time per run of prog over frames, one
// frame per b.Loop iteration, each run repeat times.
func prbRun(b *testing.B, prog *ebpf.Program, repeat int, frame func(i int) []byte) {
	b.Helper()
	var total time.Duration
	runs := 0
	for i := 0; b.Loop(); i++ {
		_, d, err := prog.Benchmark(frame(i), repeat, nil)
		if err != nil {
			b.Fatalf("run %s: %v", prog, err)
		}
		total += d * time.Duration(repeat)
		runs += repeat
	}
	b.ReportMetric(float64(total.Nanoseconds())/float64(runs), "bpf-ns/run")
}

// prbClient is the i-th client address and port: every one a new flow.
func prbClient(i int) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, byte(2 + i/60000%200), 2}), uint16(1024+i%60000))
}

func BenchmarkProgRunPath(b *testing.B) {
	other := prAP("198.18.1.9:9000") // a pod that is no backend of anything
	b.Run("from_pod/non-VIP", func(b *testing.B) {
		r := prbEnv(b)
		f := prTCPFrame(prClient4, other, 1, 1, prACK, []byte("data"))
		prbRun(b, r.objs.VipdFromPod, prbRepeat, func(int) []byte { return f })
	})
	b.Run("to_pod/non-VIP", func(b *testing.B) {
		r := prbEnv(b)
		f := prTCPFrame(other, prClient4, 1, 1, prACK, []byte("data"))
		prbRun(b, r.objs.VipdToPod, prbRepeat, func(int) []byte { return f })
	})
	b.Run("from_pod/VIP-SYN-new-flow", func(b *testing.B) {
		r := prbEnv(b)
		prbRun(b, r.objs.VipdFromPod, 1, func(i int) []byte {
			return prTCPFrame(prbClient(i), prVIP4, 1000, 0, prSYN, nil)
		})
	})
	// A client port reused: the SYN finds its tuple's flow closed (the
	// client's FIN seen) and replaces it. Each frame's setup (the old
	// flow's SYN and FIN) runs outside the timed run.
	b.Run("from_pod/VIP-SYN-reused-tuple", func(b *testing.B) {
		r := prbEnv(b)
		prbRun(b, r.objs.VipdFromPod, 1, func(i int) []byte {
			c := prbClient(i)
			r.run(r.objs.VipdFromPod, prTCPFrame(c, prVIP4, 1000, 0, prSYN, nil))
			r.run(r.objs.VipdFromPod, prTCPFrame(c, prVIP4, 1001, 5001, prFIN|prACK, nil))
			return prTCPFrame(c, prVIP4, 9000, 0, prSYN, nil)
		})
	})
	// A tracked flow: its SYN went through, its SYN-ACK came back.
	tracked := func(b *testing.B) (*prEnv, prBackend) {
		r := prbEnv(b)
		r.run(r.objs.VipdFromPod, prTCPFrame(prClient4, prVIP4, 1000, 0, prSYN, nil))
		fwd, ok := r.ct(prClient4, prVIP4, prTCP, prDirForward)
		if !ok {
			b.Fatal("SYN not tracked")
		}
		var got prBackend
		for _, x := range prBackends4 {
			if x.id == fwd.BackendId {
				got = x
			}
		}
		r.run(r.objs.VipdToPod, prTCPFrame(got.addr, prClient4, 5000, 1001, prSYN|prACK, nil))
		return r, got
	}
	b.Run("from_pod/VIP-tracked", func(b *testing.B) {
		r, _ := tracked(b)
		f := prTCPFrame(prClient4, prVIP4, 1001, 5001, prACK, []byte("data"))
		prbRun(b, r.objs.VipdFromPod, 1, func(int) []byte { return f })
	})
	b.Run("to_pod/VIP-request-at-backend", func(b *testing.B) {
		r, got := tracked(b)
		f := prTCPFrame(prClient4, got.addr, 1001, 5001, prACK, []byte("data"))
		prbRun(b, r.objs.VipdToPod, prbRepeat, func(int) []byte { return f })
	})
	b.Run("from_pod/VIP-reply-at-backend", func(b *testing.B) {
		r, got := tracked(b)
		f := prTCPFrame(got.addr, prClient4, 5001, 1005, prACK, []byte("ok\n"))
		prbRun(b, r.objs.VipdFromPod, prbRepeat, func(int) []byte { return f })
	})
	// A tracked UDP flow revalidates its backend's membership on every
	// datagram (member_flags): inline in the reverse-NAT value for a
	// frontend of up to 16 members, in vipd_members for a larger one.
	udpTracked := func(b *testing.B, extraMembers int) {
		r := prbEnv(b)
		fe := prFrontend{vip: prWithPort(prVIP4, 53), proto: prUDP, id: 2}
		r.addService(fe, prBackends4...)
		for i := range extraMembers {
			r.setMember(fe, uint32(200+i), 0)
		}
		f := prUDPFrame(prClient4, fe.vip, []byte("q"))
		r.run(r.objs.VipdFromPod, f)
		if _, ok := r.ct(prClient4, fe.vip, prUDP, prDirForward); !ok {
			b.Fatal("datagram not tracked")
		}
		prbRun(b, r.objs.VipdFromPod, 1, func(int) []byte { return f })
	}
	b.Run("from_pod/VIP-UDP-tracked", func(b *testing.B) { udpTracked(b, 0) })
	b.Run("from_pod/VIP-UDP-tracked-17-members", func(b *testing.B) { udpTracked(b, 17-len(prBackends4)) })
	b.Run("to_pod/VIP-reply-tracked", func(b *testing.B) {
		r, got := tracked(b)
		f := prTCPFrame(got.addr, prClient4, 5001, 1005, prACK, []byte("ok\n"))
		prbRun(b, r.objs.VipdToPod, 1, func(int) []byte { return f })
	})
}
