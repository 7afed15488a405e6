package load

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/internal/nsdo"
	"github.com/vipd/vipd/internal/testkit/childproc"
)

// Backend is one backend server: echo on EchoPort (TCP and UDP; each line or
// datagram is answered with "<Name> <peer>\n", but the TCP line "end"
// with "<Name>\n", after which the server closes the connection) and a sink
// on SinkPort (TCP, everything read is discarded), on Addr inside the
// network namespace at NetNS.
type Backend struct {
	NetNS    string
	Name     string
	Addr     netip.Addr
	EchoPort uint16
	SinkPort uint16
}

// serversEnv carries the backends to a child process started by
// StartServers.
const serversEnv = "VIPD_BENCH_SERVERS"

// Servers is a child process serving backends, so that their sockets and
// goroutines do not share a Go runtime with the load generators.
type Servers struct {
	cmd  *exec.Cmd
	done <-chan error
}

// StartServers starts a child process (this same binary, which must call
// RunServersIfRequested first thing in main or TestMain) serving backends,
// and returns once they all listen. Close stops it; it also dies with this
// process.
func StartServers(backends []Backend) (*Servers, error) {
	spec, err := json.Marshal(backends)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = append(os.Environ(), serversEnv+"="+string(spec))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	exited, err := childproc.Start(cmd)
	if err != nil {
		return nil, fmt.Errorf("start backend servers: %w", err)
	}
	s := &Servers{cmd: cmd, done: exited}
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err == nil && line != "ready\n" {
			err = fmt.Errorf("backend servers: %s", strings.TrimSpace(line))
		}
		ready <- err
		io.Copy(io.Discard, stdout)
	}()
	select {
	case err := <-ready:
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("backend servers did not start: %w", err)
		}
	case <-time.After(30 * time.Second):
		s.Close()
		return nil, errors.New("backend servers did not start within 30 s")
	}
	return s, nil
}

// Close stops the servers and waits for the process to exit.
func (s *Servers) Close() error {
	s.cmd.Process.Kill()
	<-s.done
	return nil
}

// RunServersIfRequested turns this process into the backend servers when
// it was started by StartServers, and never returns then; otherwise it
// returns at once.
func RunServersIfRequested() {
	spec, ok := os.LookupEnv(serversEnv)
	if !ok {
		return
	}
	if err := serve(spec); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	os.Exit(0)
}

// serve listens on every backend's sockets, reports "ready" on stdout, and
// serves until it is killed.
func serve(spec string) error {
	var backends []Backend
	if err := json.Unmarshal([]byte(spec), &backends); err != nil {
		return fmt.Errorf("backend servers: %w", err)
	}
	var listeners []echoListener
	for _, b := range backends {
		var (
			echo int
			sl   *net.TCPListener
			uc   *net.UDPConn
		)
		// Sockets stay in the namespace they were made in.
		err := nsdo.Do(b.NetNS, func() error {
			var err error
			if echo, err = listenNonBlocking(netip.AddrPortFrom(b.Addr, b.EchoPort)); err != nil {
				return err
			}
			if uc, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(b.Addr, b.EchoPort))); err != nil {
				return err
			}
			sl, err = net.ListenTCP("tcp", net.TCPAddrFromAddrPort(netip.AddrPortFrom(b.Addr, b.SinkPort)))
			return err
		})
		if err != nil {
			return fmt.Errorf("backend %s: %w", b.Name, err)
		}
		listeners = append(listeners, echoListener{fd: echo, name: b.Name})
		go acceptLoop(sl, func(c net.Conn) { io.Copy(io.Discard, c) })
		go echoUDP(b.Name, uc)
	}
	errc := make(chan error, runtime.NumCPU())
	for range runtime.NumCPU() {
		go func() { errc <- serveEcho(listeners) }()
	}
	fmt.Println("ready")
	return <-errc
}

func acceptLoop(l *net.TCPListener, handle func(net.Conn)) {
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			runtime.Gosched()
			continue
		}
		go func() {
			defer c.Close()
			handle(c)
		}()
	}
}

// echoListener is one backend's listening TCP echo socket.
type echoListener struct {
	fd   int
	name string
}

// listenNonBlocking returns a non-blocking listening TCP socket on addr
// for serveEcho. TCP_DEFER_ACCEPT has the kernel complete the accept only
// once the request has arrived, so that serving a connection takes no
// epoll registration: accept, read, write, close.
func listenNonBlocking(addr netip.AddrPort) (int, error) {
	if !addr.Addr().Is4() {
		return -1, fmt.Errorf("listen %s: IPv4 only", addr)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("listen %s: %w", addr, err)
	}
	err = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if err == nil {
		err = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_DEFER_ACCEPT, 1)
	}
	if err == nil {
		err = unix.Bind(fd, &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().As4()})
	}
	if err == nil {
		err = unix.Listen(fd, 4096)
	}
	if err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("listen %s: %w", addr, err)
	}
	return fd, nil
}

// echoConn is a connection that serveEcho has not finished with on
// accept.
type echoConn struct {
	name  string
	peer  netip.AddrPort
	line  []byte // a request line read in part
	ended bool
}

// serveEcho serves the TCP echo protocol on every listener, on one thread
// with its own epoll instance (several run side by side; EPOLLEXCLUSIVE
// wakes one of them per new connection). Each request line gets a reply:
// endRequest gets "<name>\n" and the server closes the connection right
// after it; any other line gets "<name> <peer>\n" and the connection stays
// open until the peer closes it.
func serveEcho(listeners []echoListener) error {
	runtime.LockOSThread()
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return fmt.Errorf("epoll_create: %w", err)
	}
	// Listeners are told apart from connections by a negative id.
	for i, l := range listeners {
		ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLEXCLUSIVE, Fd: int32(-1 - i)}
		if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, l.fd, &ev); err != nil {
			return fmt.Errorf("epoll_ctl: %w", err)
		}
	}
	open := map[int]*echoConn{}
	events := make([]unix.EpollEvent, 64)
	var buf [512]byte
	for {
		n, err := unix.EpollWait(epfd, events, -1)
		if err != nil {
			if err == unix.EINTR {
				continue
			}
			return fmt.Errorf("epoll_wait: %w", err)
		}
		for _, ev := range events[:n] {
			if ev.Fd >= 0 {
				fd := int(ev.Fd)
				if c := open[fd]; c != nil && !serveConn(fd, c, buf[:]) {
					delete(open, fd)
					unix.Close(fd)
				}
				continue
			}
			l := listeners[-1-ev.Fd]
			for {
				fd, sa, err := unix.Accept4(l.fd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
				if err != nil {
					break // EAGAIN: another thread took it, or none is left
				}
				c := &echoConn{name: l.name}
				if in4, ok := sa.(*unix.SockaddrInet4); ok {
					c.peer = netip.AddrPortFrom(netip.AddrFrom4(in4.Addr), uint16(in4.Port))
				}
				if !serveConn(fd, c, buf[:]) {
					unix.Close(fd)
					continue
				}
				ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
				if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
					unix.Close(fd)
					continue
				}
				open[fd] = c
			}
		}
	}
}

// serveConn reads what fd has and answers each complete request line. It
// reports whether the connection stays open.
func serveConn(fd int, c *echoConn, buf []byte) bool {
	for {
		n, err := unix.Read(fd, buf)
		switch {
		case err == unix.EAGAIN:
			return true
		case err == unix.EINTR:
			continue
		case err != nil || n == 0:
			return false
		}
		data := buf[:n]
		for len(data) > 0 {
			i := bytes.IndexByte(data, '\n')
			if i < 0 {
				c.line = append(c.line, data...)
				break
			}
			line := data[:i+1]
			if len(c.line) > 0 {
				line = append(c.line, line...)
				c.line = nil
			}
			data = data[i+1:]
			if bytes.Equal(line, endRequest) {
				unix.Write(fd, []byte(c.name+"\n"))
				return false
			}
			if _, err := unix.Write(fd, []byte(c.name+" "+c.peer.String()+"\n")); err != nil {
				return false
			}
		}
	}
}
func echoUDP(name string, c *net.UDPConn) {
	buf := make([]byte, 2048)
	for {
		_, peer, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		c.WriteToUDPAddrPort([]byte(name+" "+peer.String()+"\n"), peer)
	}
}
