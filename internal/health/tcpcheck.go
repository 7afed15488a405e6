package health

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// tcpChecker runs TCP checks on raw non-blocking sockets, without the Go
// runtime's poller, timers or a goroutine per check:
//
//   - the scheduler's goroutine takes a socket (made in the namespace, in
//     batches: nsSockets), and connects it;
//   - a second connect(2) says at once whether the handshake is already
//     over (0: connected; an error such as ECONNREFUSED: failed), which on
//     a fast link it often is by the time the first one returns;
//   - otherwise the socket is handed to one waiter goroutine, which owns an
//     epoll instance and waits for all pending checks at once (EPOLLOUT,
//     one-shot), reading the result with SO_ERROR, and times them out;
//   - a connected socket is closed with a reset (SO_LINGER 0): no FIN
//     exchange and no TIME_WAIT socket, which at thousands of checks a
//     second to the same few addresses would fill the ephemeral port range
//     and make every connect search it.
//
// Per check that is connect, connect (or epoll_ctl and getsockopt),
// setsockopt and close, and no allocation but the pending entry.
type tcpChecker struct {
	newSocket func(ctx context.Context, family int) (int, error)

	epfd, evfd int
	done       chan struct{}

	mu      sync.Mutex
	pending map[int32]*pendingConn
	stop    bool
	// wakeAt is when the waiter's epoll_wait returns at the latest; zero
	// while it waits for events only. A check with an earlier deadline
	// wakes it through evfd.
	wakeAt time.Time
}

// pendingConn is a check waiting for its connect to finish; done is
// called once, from the waiter's goroutine, with the check's result.
type pendingConn struct {
	fd       int
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
	c := &tcpChecker{newSocket: newSocket, epfd: epfd, evfd: evfd, done: make(chan struct{}), pending: map[int32]*pendingConn{}}
	go c.wait()
	return c, nil
}

// close stops the waiter and fails the checks still pending with
// context.Canceled.
func (c *tcpChecker) close() {
	c.mu.Lock()
	c.stop = true
	c.mu.Unlock()
	c.signal()
	<-c.done
	unix.Close(c.epfd)
	unix.Close(c.evfd)
}

// signal wakes the waiter.
func (c *tcpChecker) signal() {
	one := [8]byte{1}
	unix.Write(c.evfd, one[:])
}

// check starts a check of addr. When it finishes at once it returns true
// and its result; otherwise done gets the result later (by timeout at the
// latest), from the waiter's goroutine, and check returns false.
func (c *tcpChecker) check(ctx context.Context, addr netip.AddrPort, timeout time.Duration, done func(error)) (bool, error) {
	family, sa := sockaddr(addr)
	fd, err := c.newSocket(ctx, family)
	if err != nil {
		return true, err
	}
	err = unix.Connect(fd, sa)
	if err == unix.EINPROGRESS {
		// Has the handshake finished meanwhile? connect on a connecting
		// socket says so: 0 (or EISCONN), the error that ended it, or
		// EALREADY while it goes on.
		err = unix.Connect(fd, sa)
		if err == unix.EALREADY {
			c.await(fd, timeout, done)
			return false, nil
		}
		if err == unix.EISCONN {
			err = nil
		}
	}
	return true, finish(fd, err)
}

// await hands fd to the waiter, which calls done; at once when the waiter
// has stopped.
func (c *tcpChecker) await(fd int, timeout time.Duration, done func(error)) {
	c.mu.Lock()
	if c.stop {
		c.mu.Unlock()
		unix.Close(fd)
		done(context.Canceled)
		return
	}
	deadline := time.Now().Add(timeout)
	c.pending[int32(fd)] = &pendingConn{fd: fd, deadline: deadline, done: done}
	wake := c.wakeAt.IsZero() || deadline.Before(c.wakeAt)
	if wake {
		c.wakeAt = deadline
	}
	c.mu.Unlock()
	if wake {
		c.signal()
	}
	if err := unix.EpollCtl(c.epfd, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLOUT | unix.EPOLLONESHOT, Fd: int32(fd)}); err != nil {
		c.mu.Lock()
		pc, ok := c.pending[int32(fd)]
		delete(c.pending, int32(fd))
		c.mu.Unlock()
		if ok {
			unix.Close(fd)
			pc.done(fmt.Errorf("epoll_ctl: %w", err))
		}
	}
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
				unix.Close(pc.fd)
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
			v, err := unix.GetsockoptInt(pc.fd, unix.SOL_SOCKET, unix.SO_ERROR)
			if err == nil && v != 0 {
				err = unix.Errno(v)
			}
			pc.done(finish(pc.fd, err))
		}
		for _, pc := range expired {
			unix.Close(pc.fd)
			pc.done(errTimeout)
		}
	}
}

// finish closes fd, with a reset when its connect succeeded, and returns
// the check's result.
func finish(fd int, err error) error {
	if err != nil {
		unix.Close(fd)
		return fmt.Errorf("connect: %w", err)
	}
	unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	unix.Close(fd)
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
