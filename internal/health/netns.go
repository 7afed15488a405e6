package health

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"

	"github.com/vipd/vipd/internal/nsdo"
	"golang.org/x/sys/unix"
)

// nsSockets creates sockets inside a network namespace, from one thread
// that stays there while the prober runs: entering the namespace for every
// check would cost two setns calls and a locked thread each. A socket
// belongs to the namespace it was created in, so it is connected and used
// from any thread afterwards.
//
// Handing work to that thread costs a thread wake-up, so sockets are made
// in batches of socketBatch and kept until used.
type nsSockets struct {
	req  chan sockReq
	stop chan struct{}
	done chan error
	once sync.Once

	mu    sync.Mutex
	stash map[int][]int // by family: sockets made, not yet used
}

const socketBatch = 64

type sockReq struct {
	family int
	resp   chan sockResp
}

type sockResp struct {
	fds []int
	err error
}

func startNSSockets(path string) *nsSockets {
	s := &nsSockets{req: make(chan sockReq), stop: make(chan struct{}), done: make(chan error, 1), stash: map[int][]int{}}
	go func() {
		s.done <- nsdo.Do(path, func() error {
			for {
				select {
				case <-s.stop:
					return nil
				case r := <-s.req:
					var resp sockResp
					for range socketBatch {
						fd, err := unix.Socket(r.family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
						if err != nil {
							resp.err = err
							break
						}
						resp.fds = append(resp.fds, fd)
					}
					r.resp <- resp
				}
			}
		})
	}()
	return s
}

// close stops the thread and closes the sockets not used yet.
func (s *nsSockets) close() {
	s.once.Do(func() { close(s.stop) })
	s.mu.Lock()
	defer s.mu.Unlock()
	for f, fds := range s.stash {
		for _, fd := range fds {
			unix.Close(fd)
		}
		delete(s.stash, f)
	}
}

// socket returns a new TCP socket of family made in the namespace, which
// the caller owns.
func (s *nsSockets) socket(ctx context.Context, family int) (int, error) {
	s.mu.Lock()
	if fds := s.stash[family]; len(fds) > 0 {
		fd := fds[len(fds)-1]
		s.stash[family] = fds[:len(fds)-1]
		s.mu.Unlock()
		return fd, nil
	}
	s.mu.Unlock()
	r := sockReq{family: family, resp: make(chan sockResp, 1)}
	select {
	case s.req <- r:
	case err := <-s.done:
		s.done <- err
		if err == nil {
			err = errors.New("stopped")
		}
		return -1, fmt.Errorf("network namespace sockets: %w", err)
	case <-ctx.Done():
		return -1, ctx.Err()
	}
	resp := <-r.resp
	if len(resp.fds) == 0 {
		return -1, resp.err
	}
	s.mu.Lock()
	s.stash[family] = append(s.stash[family], resp.fds[1:]...)
	s.mu.Unlock()
	return resp.fds[0], nil
}

// dialTCP connects to addr from a socket that s creates, by ctx's deadline.
func (s *nsSockets) dialTCP(ctx context.Context, addr string) (net.Conn, error) {
	f, err := s.connect(ctx, addr)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return net.FileConn(f)
}

// connect returns a socket made by s, connected to addr by ctx's deadline.
func (s *nsSockets) connect(ctx context.Context, addr string) (*os.File, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, err
	}
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	family := unix.AF_INET6
	var sa unix.Sockaddr = &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	if ap.Addr().Is4() {
		family = unix.AF_INET
		sa = &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	}
	fd, err := s.socket(ctx, family)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "health-check")
	ok := false
	defer func() {
		if !ok {
			f.Close()
		}
	}()
	if err := unix.Connect(fd, sa); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", err)}
	}
	if dl, ok := ctx.Deadline(); ok {
		f.SetWriteDeadline(dl)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cerr error
	// Write calls the function until it returns true, waiting for the
	// socket to be writable in between: the connect has finished when
	// SO_ERROR says so or the peer has a name, as in package net.
	werr := rc.Write(func(fd uintptr) bool {
		v, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
		switch {
		case err != nil:
			cerr = err
			return true
		case v != 0:
			cerr = unix.Errno(v)
			return true
		}
		_, err = unix.Getpeername(int(fd))
		if err == nil {
			return true
		}
		if !errors.Is(err, unix.ENOTCONN) {
			cerr = err
			return true
		}
		return false
	})
	if werr != nil {
		if errors.Is(werr, os.ErrDeadlineExceeded) {
			return nil, context.DeadlineExceeded
		}
		return nil, werr
	}
	if cerr != nil {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", cerr)}
	}
	ok = true
	return f, nil
}
