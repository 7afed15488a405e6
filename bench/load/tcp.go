package load

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/internal/testkit/netlab"
)

// Closer says which side of a TCP connection closes it first.
type Closer int

const (
	// ServerCloses has the server close right after its reply, as
	// HTTP/1.0 and most short RPCs do; the client closes when it has read
	// the reply and the server's FIN. The server keeps the TIME_WAIT.
	ServerCloses Closer = iota
	// ClientCloses has the client close as soon as it has the reply; the
	// server closes when it reads the end of the stream. The client keeps
	// the TIME_WAIT (reused thanks to net.ipv4.tcp_tw_reuse).
	ClientCloses
)

func (c Closer) String() string {
	if c == ClientCloses {
		return "client closes first"
	}
	return "server closes first"
}

// Requests of the connection loop. The servers of this package answer
// endRequest with "<name>\n" and close; any other line (such as
// requestLine) with "<name> <peer>\n", keeping the connection open.
var endRequest = []byte("end\n")

// TCPConnections makes TCP connections from ns to dsts for d, workers of
// them in flight at any time: connect, send one request line, read the
// one-line reply, close, in the order closer says. The i-th connection
// started goes to dsts[i % len(dsts)], from a source port in ports. Each
// latency is one whole connection, socket() to close().
//
// The connections are non-blocking sockets driven by epoll, on one thread
// locked into ns per CPU (at most one per worker), so that the generator
// costs as few system calls and context switches per connection as a
// connection can: socket, setsockopt (the port range), connect, epoll_ctl,
// write, read, close, and a share of one epoll_wait. Connections still in
// flight at the end are reset and not counted.
func TCPConnections(ns *netlab.NS, dsts []netip.AddrPort, ports PortRange, workers int, d time.Duration, closer Closer) Result {
	threads := min(runtime.NumCPU(), workers)
	var (
		mu   sync.Mutex
		res  = Result{Backends: map[string]int{}}
		wg   sync.WaitGroup
		next atomic.Uint64 // connections started
	)
	pick := func() netip.AddrPort {
		return dsts[(next.Add(1)-1)%uint64(len(dsts))]
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(runtime.GOMAXPROCS(0), threads+1)))
	start := time.Now()
	stop := start.Add(d)
	for k := range threads {
		slots := workers / threads
		if k < workers%threads {
			slots++
		}
		wg.Go(func() {
			w := &worker{backends: map[string]int{}}
			if err := ns.Do(func() error { return connLoop(w, slots, pick, ports, stop, closer) }); err != nil {
				w.fail(err)
			}
			mu.Lock()
			defer mu.Unlock()
			res.add(w)
		})
	}
	wg.Wait()
	res.Elapsed = d
	return res
}

// conn is one connection in flight of a connLoop.
type conn struct {
	fd   int // -1 when the slot is free
	dst  netip.AddrPort
	t0   time.Time
	sent bool
	n    int      // reply bytes read into buf
	buf  [64]byte // the reply
	done bool     // the reply line is complete
	eof  bool     // the server's FIN was read after the reply
}

// connLoop keeps slots connections in flight on one epoll instance until
// stop, recording each into w.
func connLoop(w *worker, slots int, pick func() netip.AddrPort, ports PortRange, stop time.Time, closer Closer) error {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return fmt.Errorf("epoll_create: %w", err)
	}
	defer unix.Close(epfd)
	req := endRequest
	if closer == ClientCloses {
		req = requestLine
	}
	cs := make([]conn, slots)
	// open starts slot i's next connection; a connection that fails at
	// once is recorded and the slot stays free until the next round.
	open := func(i int) {
		c := &cs[i]
		*c = conn{fd: -1, dst: pick(), t0: time.Now()}
		fd, err := startConnect(c.dst, ports)
		if err != nil {
			w.fail(err)
			return
		}
		ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(i)}
		if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			unix.Close(fd)
			w.fail(fmt.Errorf("epoll_ctl: %w", err))
			return
		}
		c.fd = fd
	}
	finish := func(i int, err error) {
		c := &cs[i]
		unix.Close(c.fd)
		c.fd = -1
		if err != nil {
			w.fail(fmt.Errorf("connection to %s: %w", c.dst, err))
			return
		}
		w.lat = append(w.lat, time.Since(c.t0))
		w.ok++
		line := c.buf[:c.n-1]
		if j := bytes.IndexByte(line, ' '); j >= 0 {
			line = line[:j]
		}
		w.backends[string(line)]++
	}
	for i := range cs {
		open(i)
	}
	events := make([]unix.EpollEvent, slots)
	for {
		now := time.Now()
		if !now.Before(stop) {
			break
		}
		wait := min(stop.Sub(now), 100*time.Millisecond)
		n, err := unix.EpollWait(epfd, events, int(wait.Milliseconds())+1)
		if err != nil && err != unix.EINTR {
			return fmt.Errorf("epoll_wait: %w", err)
		}
		for _, ev := range events[:max(n, 0)] {
			i := int(ev.Fd)
			c := &cs[i]
			if c.fd < 0 {
				continue
			}
			if err := step(c, ev.Events, req, closer); err != nil {
				finish(i, err)
				open(i)
				continue
			}
			if c.done && (closer == ClientCloses || c.eof) {
				finish(i, nil)
				open(i)
			}
		}
		now = time.Now()
		for i := range cs {
			c := &cs[i]
			switch {
			case c.fd < 0:
				open(i)
			case now.Sub(c.t0) > ioTimeout:
				finish(i, fmt.Errorf("no reply within %v (request sent: %v, %d bytes read)", ioTimeout, c.sent, c.n))
				open(i)
			}
		}
	}
	// Reset what is still in flight: no TIME_WAIT, no FIN exchange
	// after the measurement.
	for i := range cs {
		if fd := cs[i].fd; fd >= 0 {
			unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
			unix.Close(fd)
		}
	}
	return nil
}

// startConnect opens a non-blocking TCP socket with a source port from
// ports and starts its connect to dst.
func startConnect(dst netip.AddrPort, ports PortRange) (int, error) {
	if !dst.Addr().Is4() {
		return -1, fmt.Errorf("dial %s: IPv4 only", dst)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_IP, unix.IP_LOCAL_PORT_RANGE, int(uint32(ports.Hi)<<16|uint32(ports.Lo))); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("socket options: %w", err)
	}
	err = unix.Connect(fd, &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()})
	if err != nil && err != unix.EINPROGRESS {
		unix.Close(fd)
		return -1, fmt.Errorf("connect %s: %w", dst, err)
	}
	return fd, nil
}

// errClosedEarly is a connection that the server closed before its reply.
var errClosedEarly = errors.New("closed before the reply")

// step advances c on the epoll events evs: it sends the request once the
// socket is writable and reads what arrived. c.done is set once the reply
// line is complete, and c.eof once the server's FIN was read after it.
func step(c *conn, evs uint32, req []byte, closer Closer) error {
	if evs&unix.EPOLLERR != 0 {
		soerr, err := unix.GetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err == nil && soerr != 0 {
			err = unix.Errno(soerr)
		}
		if err == nil {
			err = errors.New("socket error")
		}
		return err
	}
	if !c.sent && evs&unix.EPOLLOUT != 0 {
		if _, err := unix.Write(c.fd, req); err != nil {
			return fmt.Errorf("send request: %w", err)
		}
		c.sent = true
	}
	if evs&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP) == 0 {
		return nil
	}
	for {
		if c.done {
			// Only the end of the stream is left to read.
			var b [1]byte
			m, err := unix.Read(c.fd, b[:])
			switch {
			case err == unix.EAGAIN:
				return nil
			case err != nil:
				return fmt.Errorf("read: %w", err)
			case m == 0:
				c.eof = true
				return nil
			default:
				return errors.New("more than one reply line")
			}
		}
		m, err := unix.Read(c.fd, c.buf[c.n:])
		switch {
		case err == unix.EAGAIN:
			return nil
		case err != nil:
			return fmt.Errorf("read reply: %w", err)
		case m == 0:
			return errClosedEarly
		}
		c.n += m
		if bytes.IndexByte(c.buf[:c.n], '\n') == c.n-1 {
			c.done = true
			if closer == ClientCloses {
				return nil
			}
			// The FIN usually comes with or right after the reply;
			// with EPOLLRDHUP already seen, read it now.
			if evs&unix.EPOLLRDHUP == 0 {
				return nil
			}
		} else if c.n == len(c.buf) {
			return fmt.Errorf("read reply: no newline in %d bytes", c.n)
		}
	}
}
