package ebpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
)

// ringWriter is a program that writes the 40 bytes of its packet after
// the Ethernet header into ring as one record, run with BPF_PROG_TEST_RUN.
func ringWriter(t *testing.T, ring *ebpf.Map) *ebpf.Program {
	t.Helper()
	const n = 40
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:    ebpf.SocketFilter,
		License: "GPL",
		Instructions: asm.Instructions{
			// bpf_skb_load_bytes(ctx, 0, fp-40, 40)
			asm.Mov.Imm(asm.R2, 0),
			asm.Mov.Reg(asm.R3, asm.RFP),
			asm.Add.Imm(asm.R3, -n),
			asm.Mov.Imm(asm.R4, n),
			asm.FnSkbLoadBytes.Call(),
			asm.JNE.Imm(asm.R0, 0, "out"),
			// bpf_ringbuf_output(ring, fp-40, 40, 0)
			asm.LoadMapPtr(asm.R1, ring.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -n),
			asm.Mov.Imm(asm.R3, n),
			asm.Mov.Imm(asm.R4, 0),
			asm.FnRingbufOutput.Call(),
			asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
			asm.Return(),
		},
	})
	if err != nil {
		prSkipIfNoPermission(t, err)
		t.Fatalf("load the ring writer: %v", err)
	}
	t.Cleanup(func() { prog.Close() })
	return prog
}

func newTestRing(t *testing.T, size uint32) *ebpf.Map {
	t.Helper()
	if err := rlimit.RemoveMemlock(); err != nil {
		prSkipIfNoPermission(t, err)
		t.Fatal(err)
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.RingBuf, MaxEntries: size})
	if err != nil {
		prSkipIfNoPermission(t, err)
		t.Fatalf("create ring: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestEventReaderRecords: eventReader reads every record a program writes,
// in order and intact, including those that wrap around the ring's end,
// over many laps; it maps the data pages once (issue 18: ringbuf.Reader
// maps them twice, all resident); Close unmaps.
func TestEventReaderRecords(t *testing.T) {
	page := os.Getpagesize()
	ring := newTestRing(t, uint32(page))
	prog := ringWriter(t, ring)
	before := bpfMapMappings(t, nil)
	rd, err := newEventReader(ring)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	if got, want := fmt.Sprint(slices.Sorted(maps.Values(bpfMapMappings(t, before)))), fmt.Sprint([]int{page, 2 * page}); got != want {
		t.Fatalf("the reader maps %s bytes of the ring, want %s: the consumer page, the producer page and the data once", got, want)
	}

	frame := func(seq int) []byte {
		f := make([]byte, 14+40)
		for i := 14; i < len(f); i += 4 {
			binary.LittleEndian.PutUint32(f[i:], uint32(seq*1000+i))
		}
		return f
	}
	// 48 bytes a record (header and data) in a ring of a page: records
	// wrap around its end at ever other offsets.
	perLap := page / 48 / 2
	var rec ringbuf.Record
	seq := 0
	for lap := range 20 {
		for i := range perLap {
			if _, _, err := prRun(prog, frame(seq+i), 0); err != nil {
				t.Fatalf("run the writer: %v", err)
			}
		}
		for i := range perLap {
			ok, err := rd.TryRead(&rec)
			if err != nil || !ok {
				t.Fatalf("lap %d: read record %d: %v, %v", lap, seq+i, ok, err)
			}
			if want := frame(seq + i)[14:]; !bytes.Equal(rec.RawSample, want) {
				t.Fatalf("lap %d: record %d is %x, want %x", lap, seq+i, rec.RawSample, want)
			}
		}
		seq += perLap
		// Empty now: nothing to read, and a Wait ends at its time.
		if ok, err := rd.TryRead(&rec); ok || err != nil {
			t.Fatalf("lap %d: read of an empty ring: %v, %v, want nothing", lap, ok, err)
		}
		began := time.Now()
		if err := rd.Wait(began.Add(10 * time.Millisecond)); err != nil {
			t.Fatalf("lap %d: wait on an empty ring: %v", lap, err)
		}
		if waited := time.Since(began); waited < 10*time.Millisecond {
			t.Fatalf("lap %d: a wait of 10ms on an empty ring ended after %v", lap, waited)
		}
	}

	if err := rd.Close(); err != nil {
		t.Fatal(err)
	}
	if got := bpfMapMappings(t, before); len(got) != 0 {
		t.Fatalf("mappings %v left after Close", got)
	}
	if _, err := rd.TryRead(&rec); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("read after Close: %v, want os.ErrClosed", err)
	}
	if err := rd.Wait(time.Time{}); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("wait after Close: %v, want os.ErrClosed", err)
	}
}

// TestEventReaderCloseInterrupts: a record written meanwhile ends a Wait
// with no end, and Close ends one, and a Pause, with os.ErrClosed. A Pause
// does not end for a record.
func TestEventReaderCloseInterrupts(t *testing.T) {
	ring := newTestRing(t, uint32(os.Getpagesize()))
	prog := ringWriter(t, ring)
	rd, err := newEventReader(ring)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()

	got := make(chan error, 1)
	go func() { got <- rd.Wait(time.Time{}) }()
	time.Sleep(50 * time.Millisecond)
	if _, _, err := prRun(prog, make([]byte, 64), 0); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("wait woken by a record: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a record did not wake Wait")
	}

	// The record is still unread: a Pause runs to its end regardless.
	began := time.Now()
	if err := rd.Pause(began.Add(30 * time.Millisecond)); err != nil {
		t.Fatalf("pause: %v", err)
	}
	if paused := time.Since(began); paused < 30*time.Millisecond {
		t.Fatalf("a pause of 30ms ended after %v", paused)
	}
	var rec ringbuf.Record
	if ok, err := rd.TryRead(&rec); !ok || err != nil {
		t.Fatalf("read the record: %v, %v", ok, err)
	}

	go func() { got <- rd.Wait(time.Time{}) }()
	go func() { got <- rd.Pause(time.Now().Add(time.Hour)) }()
	time.Sleep(50 * time.Millisecond)
	if err := rd.Close(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case err := <-got:
			if !errors.Is(err, os.ErrClosed) {
				t.Fatalf("wait interrupted by Close: %v, want os.ErrClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Close did not interrupt Wait and Pause")
		}
	}
}
