package ebpf

// Guards of conntrack writes of FASTPATH.md that no packet shows: whether a
// program rewrote a vipd_ct entry in place or replaced it (an LRU hash
// update links a new element, a delete frees one) is seen from the
// element's address, which a small program of the test reads.

import (
	"encoding/binary"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// prCTAddrs reads the kernel addresses of vipd_ct elements.
type prCTAddrs struct {
	r    *prEnv
	keys *ebpf.Map // [0]: the key to look up
	out  *ebpf.Map // [0]: its element's address, 0 when there is none
	prog *ebpf.Program
}

// ctAddrs loads the reader of r's vipd_ct (a tc program: it needs
// CAP_PERFMON to store a pointer, as the programs' tests run with).
func (r *prEnv) ctAddrs() *prCTAddrs {
	t := r.t
	t.Helper()
	keys, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: uint32(binary.Size(bpfCtKey{})), MaxEntries: 1})
	if err != nil {
		t.Fatalf("key map: %v", err)
	}
	t.Cleanup(func() { keys.Close() })
	out, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		t.Fatalf("address map: %v", err)
	}
	t.Cleanup(func() { out.Close() })
	zeroKey := func() asm.Instructions {
		return asm.Instructions{
			asm.StoreImm(asm.RFP, -4, 0, asm.Word),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -4),
		}
	}
	var insns asm.Instructions
	insns = append(insns, zeroKey()...)
	insns = append(insns,
		asm.LoadMapPtr(asm.R1, keys.FD()),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.Mov.Reg(asm.R2, asm.R0),
		asm.LoadMapPtr(asm.R1, r.objs.VipdCt.FD()),
		asm.FnMapLookupElem.Call(),
		asm.Mov.Imm(asm.R7, 0),
		asm.JEq.Imm(asm.R0, 0, "store"),
		asm.Mov.Reg(asm.R7, asm.R0),
	)
	insns = append(insns, zeroKey()...)
	insns[len(insns)-3] = insns[len(insns)-3].WithSymbol("store")
	insns = append(insns,
		asm.LoadMapPtr(asm.R1, out.FD()),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.StoreMem(asm.R0, 0, asm.R7, asm.DWord),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
		asm.Return(),
	)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL", Instructions: insns})
	if err != nil {
		t.Fatalf("load the vipd_ct address reader: %v", err)
	}
	t.Cleanup(func() { prog.Close() })
	return &prCTAddrs{r: r, keys: keys, out: out, prog: prog}
}

// addr is the kernel address of k's element of vipd_ct, 0 when none.
func (c *prCTAddrs) addr(k bpfCtKey) uint64 {
	t := c.r.t
	t.Helper()
	if err := c.keys.Put(uint32(0), &k); err != nil {
		t.Fatalf("put key: %v", err)
	}
	c.r.run(c.prog, prTCPFrame(prClient4, prVIP4, 1, 0, prACK, nil))
	var a uint64
	if err := c.out.Lookup(uint32(0), &a); err != nil {
		t.Fatalf("read address: %v", err)
	}
	return a
}

// A SYN from a client port whose flow closed rewrites the old flow's
// entries in place (FASTPATH.md 9): the forward entry always, the reply
// entry when the new flow has the old backend (else it is deleted, and the
// new one inserted). The new flow is tracked and answered either way.
func TestProgRunFastPathReusedTupleInPlace(t *testing.T) {
	r := newPREnv(t)
	fe := prFrontend{vip: prVIP4, proto: prTCP, id: 1}
	be, other := prBackends4[0], prBackends4[1]
	r.addService(fe, be)
	addrs := r.ctAddrs()
	fk := prCTKey(prClient4, prVIP4, prTCP, prDirForward)

	reuse := func(from, to prBackend) {
		t.Helper()
		old, ok := r.ct(prClient4, prVIP4, prTCP, prDirForward)
		if !ok {
			t.Fatal("no forward entry before the reuse")
		}
		rk := prCTKey(to.addr, prClient4, prTCP, prDirReply)
		fwdAt, revAt := addrs.addr(fk), addrs.addr(prCTKey(from.addr, prClient4, prTCP, prDirReply))
		ret, out := r.run(r.objs.VipdFromPod, prTCPFrame(prClient4, prVIP4, 9000, 0, prSYN, nil))
		prWantVerdict(t, ret, prTCOK)
		prWantFrame(t, out, prTCPFrame(prClient4, to.addr, 9000, 0, prSYN, nil))
		if a := addrs.addr(fk); a != fwdAt {
			t.Errorf("SYN on a closed flow's tuple: its forward entry was replaced (element %#x, was %#x), not rewritten in place", a, fwdAt)
		}
		// (With another backend the new reply entry may well take the
		// element the old one freed: its address proves nothing there.)
		if a := addrs.addr(rk); from == to && a != revAt {
			t.Errorf("SYN on a closed flow's tuple to the same backend: its reply entry was replaced (element %#x, was %#x), not rewritten in place", a, revAt)
		}
		if from != to && addrs.addr(prCTKey(from.addr, prClient4, prTCP, prDirReply)) != 0 {
			t.Error("the replaced flow's reply entry is left")
		}
		fwd, ok := r.ct(prClient4, prVIP4, prTCP, prDirForward)
		if !ok || fwd.FlowId == old.FlowId || fwd.BackendId != to.id || fwd.Flags&2 != 0 || fwd.EvFlags != 0 || fwd.Packets != 1 {
			t.Errorf("forward entry after the reuse: %+v (old flow %d)", fwd, old.FlowId)
		}
		rev, ok := r.ct(to.addr, prClient4, prTCP, prDirReply)
		if !ok || rev.FlowId != fwd.FlowId || rev.Packets != 0 {
			t.Errorf("reply entry after the reuse: %+v, %v", rev, ok)
		}
		if n := r.ctCount(); n != 2 {
			t.Errorf("%d conntrack entries after the reuse, want 2", n)
		}
		ret, out = r.run(r.objs.VipdToPod, prTCPFrame(to.addr, prClient4, 7000, 9001, prSYN|prACK, nil))
		prWantVerdict(t, ret, prTCOK)
		prWantFrame(t, out, prTCPFrame(prVIP4, prClient4, 7000, 9001, prSYN|prACK, nil))
		// The client closes the new flow: its tuple is free to reuse.
		r.run(r.objs.VipdFromPod, prTCPFrame(prClient4, prVIP4, 9001, 7001, prFIN|prACK, nil))
	}

	r.run(r.objs.VipdFromPod, prTCPFrame(prClient4, prVIP4, 1000, 0, prSYN, nil))
	r.run(r.objs.VipdFromPod, prTCPFrame(prClient4, prVIP4, 1001, 5001, prFIN|prACK, nil))
	reuse(be, be)
	// Another backend: the reply entry's key changes.
	r.addService(fe, other)
	reuse(be, other)
}
