package ebpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// eventReader reads the flow event ring (vipd_events) as ringbuf.Reader
// does, but maps the ring's data pages once, where ringbuf.Reader maps them
// twice, back to back, so that a record that wraps around the end of the
// ring reads as one slice. The kernel inserts every page of the mapping
// when it is mapped (remap_vmalloc_range): for the default 8 MiB ring,
// ringbuf.Reader keeps 16 MiB resident in vipd and eventReader 8 MiB. A
// record that wraps is copied in two parts instead.
//
// One goroutine reads (ReadInto, SetDeadline); Close may be called from
// any, and interrupts a waiting ReadInto.
type eventReader struct {
	fd   int    // the ring's, not owned
	wake int    // eventfd, readable once Close has begun
	cons []byte // the consumer page: cons_pos, read-write
	prod []byte // the producer page (prod_pos), then the data pages
	data []byte
	mask uintptr

	// mu is held by ReadInto, and by Close to unmap: never while the
	// other uses the mapping.
	mu       sync.Mutex
	closed   atomic.Bool
	deadline atomic.Int64 // unix nanoseconds; 0: none

	unmapOnce sync.Once
	unmapErr  error
}

// Ring buffer record header bits (BPF_RINGBUF_* of linux/bpf.h).
const (
	ringbufBusyBit    = 1 << 31
	ringbufDiscardBit = 1 << 30
	ringbufHeaderSize = 8
)

// newEventReader maps the ring buffer m. The caller keeps m open until
// Close has returned.
func newEventReader(m *ebpf.Map) (*eventReader, error) {
	size := int(m.MaxEntries())
	page := os.Getpagesize()
	if m.Type() != ebpf.RingBuf || size == 0 || size&(size-1) != 0 || size%page != 0 {
		return nil, fmt.Errorf("flow event ring: %s of %d bytes is no ring buffer", m.Type(), size)
	}
	r := &eventReader{fd: m.FD(), mask: uintptr(size - 1)}
	var err error
	if r.wake, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		return nil, fmt.Errorf("flow event ring: eventfd: %w", err)
	}
	if r.cons, err = unix.Mmap(r.fd, 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		unix.Close(r.wake)
		return nil, fmt.Errorf("flow event ring: map the consumer page: %w", err)
	}
	// The producer page and the data pages follow the consumer page; the
	// kernel maps the data pages a second time after them, which is left
	// out here.
	if r.prod, err = unix.Mmap(r.fd, int64(page), page+size, unix.PROT_READ, unix.MAP_SHARED); err != nil {
		unix.Munmap(r.cons)
		unix.Close(r.wake)
		return nil, fmt.Errorf("flow event ring: map the data pages: %w", err)
	}
	r.data = r.prod[page:]
	return r, nil
}

// SetDeadline makes ReadInto return os.ErrDeadlineExceeded once t has
// passed and the ring is empty; the zero time waits for ever.
func (r *eventReader) SetDeadline(t time.Time) {
	if t.IsZero() {
		r.deadline.Store(0)
		return
	}
	r.deadline.Store(t.UnixNano())
}

// ReadInto reads the next record into rec.RawSample (reusing its array),
// waiting for one until the deadline. It returns os.ErrDeadlineExceeded
// when a wait ended at the deadline with the ring empty (as ringbuf.Reader
// does, the wait is in whole milliseconds, rounded down), and an error
// wrapping os.ErrClosed once Close has begun.
func (r *eventReader) ReadInto(rec *ringbuf.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for timedOut := false; ; {
		if r.data == nil || r.closed.Load() {
			return fmt.Errorf("flow event ring: %w", os.ErrClosed)
		}
		ok, err := r.next(rec)
		if ok || err != nil {
			return err
		}
		if timedOut {
			return os.ErrDeadlineExceeded
		}
		timeout := -1
		if d := r.deadline.Load(); d != 0 {
			timeout = int(max(time.Until(time.Unix(0, d)).Milliseconds(), 0))
		}
		fds := []unix.PollFd{{Fd: int32(r.fd), Events: unix.POLLIN}, {Fd: int32(r.wake), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, timeout)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("flow event ring: poll: %w", err)
		}
		timedOut = err == nil && n == 0 && timeout >= 0
	}
}

// next reads the next committed record into rec, skipping discarded
// ones; false when there is none.
func (r *eventReader) next(rec *ringbuf.Record) (bool, error) {
	consPos := (*uintptr)(unsafe.Pointer(&r.cons[0]))
	prodPos := (*uintptr)(unsafe.Pointer(&r.prod[0]))
	cons := atomic.LoadUintptr(consPos)
	for {
		prod := atomic.LoadUintptr(prodPos)
		if prod == cons {
			return false, nil
		}
		if prod-cons < ringbufHeaderSize {
			return false, fmt.Errorf("flow event ring: read record header: %w", io.ErrUnexpectedEOF)
		}
		// Records start 8-byte aligned in a ring of whole pages: a header
		// never wraps. Its length is read atomically, after which the
		// record's data is visible (the kernel clears the busy bit with
		// an xchg once the data is written).
		l := atomic.LoadUint32((*uint32)(unsafe.Pointer(&r.data[cons&r.mask])))
		if l&ringbufBusyBit != 0 {
			// Reserved but not yet committed: a program is writing it.
			runtime.Gosched()
			continue
		}
		n := uintptr(l &^ (ringbufBusyBit | ringbufDiscardBit))
		end := cons + ringbufHeaderSize + (n+7)&^7
		if end-cons > prod-cons {
			return false, fmt.Errorf("flow event ring: read record data: %w", io.ErrUnexpectedEOF)
		}
		if l&ringbufDiscardBit == 0 {
			if uintptr(cap(rec.RawSample)) < n {
				rec.RawSample = make([]byte, n)
			}
			rec.RawSample = rec.RawSample[:n]
			start := (cons + ringbufHeaderSize) & r.mask
			k := copy(rec.RawSample, r.data[start:])
			copy(rec.RawSample[k:], r.data)
			rec.Remaining = int(prod - end)
		}
		cons = end
		atomic.StoreUintptr(consPos, cons)
		if l&ringbufDiscardBit == 0 {
			return true, nil
		}
	}
}

// Close interrupts a waiting ReadInto and, once it has returned, unmaps
// the ring. Every call returns only after the ring is unmapped, whichever
// call did it, and returns its error.
func (r *eventReader) Close() error {
	var werr error
	if !r.closed.Swap(true) {
		var one [8]byte
		binary.NativeEndian.PutUint64(one[:], 1)
		_, werr = unix.Write(r.wake, one[:])
	}
	r.unmapOnce.Do(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		err := errors.Join(unix.Munmap(r.prod), unix.Munmap(r.cons), unix.Close(r.wake))
		r.cons, r.prod, r.data = nil, nil, nil
		if err != nil {
			r.unmapErr = fmt.Errorf("close flow event ring: %w", err)
		}
	})
	if werr != nil {
		return errors.Join(fmt.Errorf("close flow event ring: wake the reader: %w", werr), r.unmapErr)
	}
	return r.unmapErr
}
