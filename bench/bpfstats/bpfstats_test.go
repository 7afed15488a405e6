package bpfstats_test

import (
	"os"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/vipd/vipd/bench/bpfstats"
)

// TestStats loads a program, finds it among this process's programs, and
// checks that its runs show in the statistics while they are on. (That they
// stop when they are off cannot be checked here: anyone on the machine may
// have them on.)
func TestStats(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root to load a BPF program")
		}
		t.Skip("needs root to load a BPF program")
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SocketFilter,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
		License:      "GPL",
	})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	ids, err := bpfstats.IDs(prog)
	if err != nil {
		t.Fatal(err)
	}
	held, err := bpfstats.HeldBy(os.Getpid())
	if err != nil || !slices.Contains(held, ids[0]) {
		t.Fatalf("programs held by this process: %v (%v), want %d among them", held, err, ids[0])
	}
	run := func(n int) bpfstats.Sample {
		t.Helper()
		s0, err := bpfstats.Read(ids)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := prog.Run(&ebpf.RunOptions{Data: make([]byte, 64), Repeat: uint32(n)}); err != nil {
			t.Fatal(err)
		}
		s1, err := bpfstats.Read(ids)
		if err != nil {
			t.Fatal(err)
		}
		return s1.Sub(s0)
	}
	stats, err := bpfstats.Enable()
	if err != nil {
		t.Fatal(err)
	}
	if d := run(1000); d.Runs != 1000 || d.Runtime <= 0 {
		t.Fatalf("with statistics on: %d runs, %v, want 1000 runs", d.Runs, d.Runtime)
	}
	if err := stats.Close(); err != nil {
		t.Fatal(err)
	}
}
