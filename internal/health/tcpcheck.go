package health

import (
	"context"
	"fmt"
	"net/netip"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// tcpChecker runs TCP checks on raw non-blocking sockets, without the Go
// runtime's poller, timers or a goroutine per check. It belongs to one
// goroutine, the prober's scheduler loop, which starts checks (check) and
// collects their results (poll) on each of its wake-ups:
//
//   - a check takes a socket from a pool (new ones are made in the
//     namespace, in batches: nsSockets) and connects it;
//   - the socket is armed in an epoll set (EPOLLOUT, one-shot), and poll,
//     with one epoll_wait for every check in flight, takes each ready
//     one's result (writable and not hung up: connected; otherwise
//     connect again says how it ended), and times out the others;
//   - then the socket is disconnected (connect to AF_UNSPEC), which resets
//     an established connection (no FIN exchange, no TIME_WAIT socket,
//     which at thousands of checks a second to the same few addresses
//     would fill the ephemeral port range and make every connect search
//     it), frees its port, and leaves the socket ready for the next check:
//     no socket is made, registered with epoll or closed per check.
//
// Per check that is connect, an epoll_ctl, a share of an epoll_wait and
// the disconnect (and a second connect when the check fails); the pool
// holds at most as many sockets as checks were in flight at once.
type tcpChecker struct {
	newSocket func(ctx context.Context, family int) (int, error)
	epfd      int
	events    []unix.EpollEvent
	pool      map[int][]*tcpSocket // by family: idle, disconnected sockets
	pending   map[int32]*pendingConn
}

// tcpSocket is a socket of the pool.
type tcpSocket struct {
	fd, family int
	// registered: the socket is in the epoll set (armed or not).
	registered bool
}

// pendingConn is a check waiting for its connect to finish.
type pendingConn struct {
	s        *tcpSocket
	sa       unix.Sockaddr
	deadline time.Time
	done     func(error)
}

// errTimeout is the result of a check that did not finish by its timeout;
// describe shows it as "timeout".
var errTimeout = fmt.Errorf("connect: %w", context.DeadlineExceeded)

// newTCPChecker returns a checker whose new sockets come from newSocket,
// which returns a non-blocking TCP socket of a family, owned by the
// caller.
func newTCPChecker(newSocket func(ctx context.Context, family int) (int, error)) (*tcpChecker, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	return &tcpChecker{newSocket: newSocket, epfd: epfd, events: make([]unix.EpollEvent, 256),
		pool: map[int][]*tcpSocket{}, pending: map[int32]*pendingConn{}}, nil
}

// close fails the checks in flight with context.Canceled and closes the
// sockets.
func (c *tcpChecker) close() {
	for fd, pc := range c.pending {
		delete(c.pending, fd)
		unix.Close(pc.s.fd)
		pc.done(context.Canceled)
	}
	for f, socks := range c.pool {
		for _, s := range socks {
			unix.Close(s.fd)
		}
		delete(c.pool, f)
	}
	unix.Close(c.epfd)
}

// inFlight is the number of checks waiting for their connect.
func (c *tcpChecker) inFlight() int { return len(c.pending) }

// nextDeadline is the earliest deadline of the checks in flight; ok is
// false when there is none.
func (c *tcpChecker) nextDeadline() (at time.Time, ok bool) {
	for _, pc := range c.pending {
		if !ok || pc.deadline.Before(at) {
			at, ok = pc.deadline, true
		}
	}
	return at, ok
}

// socket takes a socket of family from the pool, or makes one.
func (c *tcpChecker) socket(ctx context.Context, family int) (*tcpSocket, error) {
	if socks := c.pool[family]; len(socks) > 0 {
		s := socks[len(socks)-1]
		c.pool[family] = socks[:len(socks)-1]
		return s, nil
	}
	fd, err := c.newSocket(ctx, family)
	if err != nil {
		return nil, err
	}
	return &tcpSocket{fd: fd, family: family}, nil
}

// check starts a check of addr. When it finishes at once it returns true
// and its result; otherwise a later poll calls done with the result (by
// the timeout at the latest), and check returns false.
func (c *tcpChecker) check(ctx context.Context, addr netip.AddrPort, timeout time.Duration, done func(error)) (bool, error) {
	family, sa := sockaddr(addr)
	s, err := c.socket(ctx, family)
	if err != nil {
		return true, err
	}
	err = unix.Connect(s.fd, sa)
	if err == unix.EINPROGRESS {
		// The handshake goes on; poll collects the result. (Asking at once
		// with a second connect pays on veth, where the handshake is often
		// over by now, and costs a syscall on a real network, where it
		// never is.)
		if err := c.await(&pendingConn{s: s, sa: sa, deadline: time.Now().Add(timeout), done: done}); err != nil {
			return true, err
		}
		return false, nil
	}
	return true, c.finish(s, err)
}

// await arms pc's socket and makes pc pending.
func (c *tcpChecker) await(pc *pendingConn) error {
	ev := unix.EpollEvent{Events: unix.EPOLLOUT | unix.EPOLLONESHOT, Fd: int32(pc.s.fd)}
	op := unix.EPOLL_CTL_ADD
	if pc.s.registered {
		op = unix.EPOLL_CTL_MOD
	}
	if err := unix.EpollCtl(c.epfd, op, pc.s.fd, &ev); err != nil {
		unix.Close(pc.s.fd)
		return fmt.Errorf("epoll_ctl: %w", err)
	}
	pc.s.registered = true
	c.pending[int32(pc.s.fd)] = pc
	return nil
}

// poll waits up to timeout (0: not at all, below 0: until one is ready)
// for checks in flight, and finishes those that are over or past their
// deadline, calling their done.
func (c *tcpChecker) poll(timeout time.Duration) {
	ms := -1
	if timeout >= 0 {
		ms = int((timeout + time.Millisecond - 1) / time.Millisecond)
	}
	n, err := unix.EpollWait(c.epfd, c.events, ms)
	if err != nil && err != unix.EINTR {
		n = 0
	}
	for _, ev := range c.events[:max(n, 0)] {
		pc, ok := c.pending[ev.Fd]
		if !ok {
			// Left over from a check that timed out: its one-shot is
			// spent.
			continue
		}
		delete(c.pending, ev.Fd)
		if ev.Events&unix.EPOLLOUT != 0 && ev.Events&unix.EPOLLHUP == 0 {
			// Writable and not hung up: connected. A connect that failed
			// closed the socket, which reports EPOLLHUP; EPOLLERR alone
			// is left over from the disconnect that ended the socket's
			// previous check (it sets ECONNRESET, which nothing reads).
			// No event is left over from an earlier check: a check that
			// times out takes its socket out of the epoll set.
			pc.done(c.finish(pc.s, nil))
			continue
		}
		// connect again says how the handshake ended.
		err := unix.Connect(pc.s.fd, pc.sa)
		if err == unix.EALREADY {
			// Left over from an earlier check of this socket: wait on.
			if err := c.await(pc); err != nil {
				pc.done(err)
			}
			continue
		}
		pc.done(c.finish(pc.s, err))
	}
	if len(c.pending) == 0 {
		return
	}
	now := time.Now()
	for fd, pc := range c.pending {
		if !now.Before(pc.deadline) {
			delete(c.pending, fd)
			// Its one-shot is still armed: out of the set, so that no
			// event of this check reaches the socket's next one.
			unix.EpollCtl(c.epfd, unix.EPOLL_CTL_DEL, pc.s.fd, nil)
			pc.s.registered = false
			c.finish(pc.s, nil)
			pc.done(errTimeout)
		}
	}
}

// finish disconnects s, with a reset when it is connected, and puts it
// back in the pool (or closes it, when that fails); it returns the
// result of a check whose connect returned err.
func (c *tcpChecker) finish(s *tcpSocket, err error) error {
	if err == unix.EISCONN {
		err = nil
	}
	if derr := disconnect(s.fd); derr != nil {
		unix.Close(s.fd)
	} else {
		c.pool[s.family] = append(c.pool[s.family], s)
	}
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	return nil
}

// disconnect is connect(2) to AF_UNSPEC: it aborts the connection of a
// TCP socket (a reset when it is established), releases its port, and
// makes it ready for another connect.
func disconnect(fd int) error {
	sa := unix.RawSockaddr{Family: unix.AF_UNSPEC}
	_, _, errno := unix.Syscall(unix.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&sa)), unsafe.Sizeof(sa))
	if errno != 0 {
		return errno
	}
	return nil
}

func sockaddr(ap netip.AddrPort) (int, unix.Sockaddr) {
	if a := ap.Addr().Unmap(); a.Is4() {
		return unix.AF_INET, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: a.As4()}
	}
	return unix.AF_INET6, &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
}

// ownSocket makes a socket in the process's own network namespace.
func ownSocket(_ context.Context, family int) (int, error) {
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	return fd, nil
}
