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
// One goroutine reads (TryRead, Wait, Pause); Close may be called from
// any, and interrupts a Wait or Pause.
type eventReader struct {
	fd   int    // the ring's, not owned
	wake int    // eventfd, readable once Close has begun
	cons []byte // the consumer page: cons_pos, read-write
	prod []byte // the producer page (prod_pos), then the data pages
	data []byte
	mask uintptr

	// mu is held by the reader's calls, and by Close to unmap: never
	// while the other uses the mapping.
	mu     sync.Mutex
	closed atomic.Bool

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

// TryRead reads the next record into rec.RawSample (reusing its array),
// without waiting: false when the ring holds none. It returns an error
// wrapping os.ErrClosed once Close has begun.
func (r *eventReader) TryRead(rec *ringbuf.Record) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.data == nil || r.closed.Load() {
		return false, fmt.Errorf("flow event ring: %w", os.ErrClosed)
	}
	return r.next(rec)
}

// Wait returns when the ring holds a record that TryRead has not read, or
// at until (the zero time: never), whichever is first; an error wrapping
// os.ErrClosed once Close has begun. The kernel makes the ring readable
// when a record is committed, and wakes a waiting Wait only when the BPF
// program asks for it: with adaptive notification (no flags), when the
// record is the first one unread.
func (r *eventReader) Wait(until time.Time) error {
	return r.wait(until, true)
}

// Pause returns at until, or with an error wrapping os.ErrClosed once Close
// has begun, whatever the ring holds meanwhile: it lets records gather.
func (r *eventReader) Pause(until time.Time) error {
	return r.wait(until, false)
}

// wait polls the close eventfd, and the ring if ring, until t. A wait is
// whole milliseconds, rounded up: it never ends before t.
func (r *eventReader) wait(t time.Time, ring bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	fds := []unix.PollFd{{Fd: int32(r.wake), Events: unix.POLLIN}, {Fd: int32(r.fd), Events: unix.POLLIN}}
	if !ring {
		fds = fds[:1]
	}
	for {
		if r.data == nil || r.closed.Load() {
			return fmt.Errorf("flow event ring: %w", os.ErrClosed)
		}
		timeout := -1
		if !t.IsZero() {
			left := time.Until(t)
			if left <= 0 {
				return nil
			}
			timeout = int((left + time.Millisecond - 1) / time.Millisecond)
		}
		n, err := unix.Poll(fds, timeout)
		switch {
		case errors.Is(err, unix.EINTR):
		case err != nil:
			return fmt.Errorf("flow event ring: poll: %w", err)
		case n > 0 && fds[0].Revents != 0:
			return fmt.Errorf("flow event ring: %w", os.ErrClosed)
		case n > 0 || timeout >= 0:
			return nil
		}
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

// Close interrupts a Wait or Pause and, once it has returned, unmaps
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
