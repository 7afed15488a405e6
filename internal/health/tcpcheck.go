package health

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// tcpChecker runs TCP checks on raw non-blocking sockets, without the Go
// runtime's poller, timers or a goroutine per check:
//
//   - the scheduler's goroutine takes a socket from a pool (new ones are
//     made in the namespace, in batches: nsSockets) and connects it;
//   - a second connect(2) says at once whether the handshake is already
//     over (0: connected; an error such as ECONNREFUSED: failed), which on
//     a fast link it often is by the time the first one returns;
//   - otherwise the socket goes to one waiter goroutine, which owns an
//     epoll instance and waits for all pending checks at once (EPOLLOUT,
//     one-shot, re-armed per check), reads the result with connect again,
//     and times them out;
//   - then the socket is disconnected (connect to AF_UNSPEC), which resets
//     an established connection (no FIN exchange, no TIME_WAIT socket,
//     which at thousands of checks a second to the same few addresses
//     would fill the ephemeral port range and make every connect search
//     it), frees its port, and leaves the socket ready for the next check:
//     no socket is made, registered with epoll or closed per check.
//
// Per check that is connect, connect and the disconnect, and when the
// handshake is not over at once an epoll_ctl and a share of an
// epoll_wait; the pool holds at most as many sockets as checks were in
// flight at once.
type tcpChecker struct {
	newSocket func(ctx context.Context, family int) (int, error)

	epfd, evfd int
	done       chan struct{}

	mu      sync.Mutex
	pool    map[int][]*tcpSocket // by family: idle, disconnected sockets
	pending map[int32]*pendingConn
	stop    bool
	// wakeAt is when the waiter's epoll_wait returns at the latest; zero
	// while it waits for events only. A check with an earlier deadline
	// wakes it through evfd.
	wakeAt time.Time
}

// tcpSocket is a socket of the pool.
type tcpSocket struct {
	fd, family int
	// registered: the socket is in the epoll set (armed or not).
	registered bool
}

// pendingConn is a check waiting for its connect to finish; done is
// called once, from the waiter's goroutine, with the check's result.
type pendingConn struct {
	s        *tcpSocket
	sa       unix.Sockaddr
	deadline time.Time
	done     func(error)
}

// errTimeout is the result of a check that did not finish by its timeout;
// describe shows it as "timeout".
var errTimeout = fmt.Errorf("connect: %w", context.DeadlineExceeded)

// newTCPChecker starts the waiter. newSocket returns a new non-blocking
// TCP socket of a family, owned by the caller.
func newTCPChecker(newSocket func(ctx context.Context, family int) (int, error)) (*tcpChecker, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	evfd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, evfd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(evfd)}); err != nil {
		unix.Close(epfd)
		unix.Close(evfd)
		return nil, fmt.Errorf("epoll_ctl: %w", err)
	}
	c := &tcpChecker{newSocket: newSocket, epfd: epfd, evfd: evfd, done: make(chan struct{}),
		pool: map[int][]*tcpSocket{}, pending: map[int32]*pendingConn{}}
	go c.wait()
	return c, nil
}

// close stops the waiter, fails the checks still pending with
// context.Canceled, and closes the sockets.
func (c *tcpChecker) close() {
	c.mu.Lock()
	c.stop = true
	c.mu.Unlock()
	c.signal()
	<-c.done
	c.mu.Lock()
	for f, socks := range c.pool {
		for _, s := range socks {
			unix.Close(s.fd)
		}
		delete(c.pool, f)
	}
	c.mu.Unlock()
	unix.Close(c.epfd)
	unix.Close(c.evfd)
}

// signal wakes the waiter.
func (c *tcpChecker) signal() {
	one := [8]byte{1}
	unix.Write(c.evfd, one[:])
}

// socket takes a socket of family from the pool, or makes one.
func (c *tcpChecker) socket(ctx context.Context, family int) (*tcpSocket, error) {
	c.mu.Lock()
	if socks := c.pool[family]; len(socks) > 0 {
		s := socks[len(socks)-1]
		c.pool[family] = socks[:len(socks)-1]
		c.mu.Unlock()
		return s, nil
	}
	c.mu.Unlock()
	fd, err := c.newSocket(ctx, family)
	if err != nil {
		return nil, err
	}
	return &tcpSocket{fd: fd, family: family}, nil
}

// check starts a check of addr. When it finishes at once it returns true
// and its result; otherwise done gets the result later (by timeout at the
// latest), from the waiter's goroutine, and check returns false.
func (c *tcpChecker) check(ctx context.Context, addr netip.AddrPort, timeout time.Duration, done func(error)) (bool, error) {
	family, sa := sockaddr(addr)
	s, err := c.socket(ctx, family)
	if err != nil {
		return true, err
	}
	err = unix.Connect(s.fd, sa)
	if err == unix.EINPROGRESS {
		// Has the handshake finished meanwhile? connect on a connecting
		// socket says so: 0 (or EISCONN), the error that ended it, or
		// EALREADY while it goes on.
		err = unix.Connect(s.fd, sa)
		if err == unix.EALREADY {
			c.await(&pendingConn{s: s, sa: sa, deadline: time.Now().Add(timeout), done: done})
			return false, nil
		}
	}
	return true, c.finish(s, err)
}

// await hands pc to the waiter, which calls its done; at once when the
// waiter has stopped.
func (c *tcpChecker) await(pc *pendingConn) {
	c.mu.Lock()
	if c.stop {
		c.mu.Unlock()
		unix.Close(pc.s.fd)
		pc.done(context.Canceled)
		return
	}
	// Armed under the lock: the waiter takes no event for pc before it
	// is pending, and none of an earlier arming after.
	if err := c.arm(pc.s); err != nil {
		c.mu.Unlock()
		unix.Close(pc.s.fd)
		pc.done(fmt.Errorf("epoll_ctl: %w", err))
		return
	}
	c.pending[int32(pc.s.fd)] = pc
	wake := c.wakeAt.IsZero() || pc.deadline.Before(c.wakeAt)
	if wake {
		c.wakeAt = pc.deadline
	}
	c.mu.Unlock()
	if wake {
		c.signal()
	}
}

// arm has the waiter's epoll report s once when it is writable: the
// connect finished, one way or the other.
func (c *tcpChecker) arm(s *tcpSocket) error {
	ev := unix.EpollEvent{Events: unix.EPOLLOUT | unix.EPOLLONESHOT, Fd: int32(s.fd)}
	if s.registered {
		return unix.EpollCtl(c.epfd, unix.EPOLL_CTL_MOD, s.fd, &ev)
	}
	if err := unix.EpollCtl(c.epfd, unix.EPOLL_CTL_ADD, s.fd, &ev); err != nil {
		return err
	}
	s.registered = true
	return nil
}

// wait is the waiter's loop.
func (c *tcpChecker) wait() {
	defer close(c.done)
	events := make([]unix.EpollEvent, 128)
	var ready []*pendingConn
	for {
		c.mu.Lock()
		if c.stop {
			pending := c.pending
			c.pending = map[int32]*pendingConn{}
			c.mu.Unlock()
			for _, pc := range pending {
				unix.Close(pc.s.fd)
				pc.done(context.Canceled)
			}
			return
		}
		timeout := -1
		c.wakeAt = time.Time{}
		if len(c.pending) > 0 {
			// The earliest deadline, rounded up to the millisecond: no
			// finer timer is needed for timeouts of whole milliseconds.
			now := time.Now()
			c.wakeAt = now.Add(time.Second)
			for _, pc := range c.pending {
				if pc.deadline.Before(c.wakeAt) {
					c.wakeAt = pc.deadline
				}
			}
			timeout = max(int((c.wakeAt.Sub(now)+time.Millisecond-1)/time.Millisecond), 0)
		}
		c.mu.Unlock()
		n, err := unix.EpollWait(c.epfd, events, timeout)
		if err != nil && err != unix.EINTR {
			// Cannot happen with a valid epoll fd and buffer; fail what
			// is pending rather than spin.
			c.mu.Lock()
			c.stop = true
			c.mu.Unlock()
			continue
		}
		ready = ready[:0]
		c.mu.Lock()
		for _, ev := range events[:max(n, 0)] {
			if int(ev.Fd) == c.evfd {
				var buf [8]byte
				unix.Read(c.evfd, buf[:])
				continue
			}
			// An event for a socket that no check waits for is left
			// over from a check that timed out: its one-shot is spent.
			if pc, ok := c.pending[ev.Fd]; ok {
				delete(c.pending, ev.Fd)
				ready = append(ready, pc)
			}
		}
		now := time.Now()
		var expired []*pendingConn
		for fd, pc := range c.pending {
			if !now.Before(pc.deadline) {
				delete(c.pending, fd)
				expired = append(expired, pc)
			}
		}
		c.mu.Unlock()
		for _, pc := range ready {
			err := unix.Connect(pc.s.fd, pc.sa)
			if err == unix.EALREADY {
				// Left over from an earlier check of this socket: wait on.
				c.await(pc)
				continue
			}
			pc.done(c.finish(pc.s, err))
		}
		for _, pc := range expired {
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
		c.mu.Lock()
		c.pool[s.family] = append(c.pool[s.family], s)
		c.mu.Unlock()
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
