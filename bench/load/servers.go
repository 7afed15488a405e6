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
// datagram is answered with "<Name> <peer>\n") and a sink on SinkPort (TCP,
// everything read is discarded), on Addr inside the network namespace at
// NetNS.
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
	// Every thread of this process blocks in a system call of its own:
	// with a P for each, a call returning needs no hand-off between
	// threads.
	runtime.GOMAXPROCS(len(backends)*echoThreads + runtime.NumCPU())
	for _, b := range backends {
		var (
			echo int
			sl   *net.TCPListener
			uc   *net.UDPConn
		)
		// Sockets stay in the namespace they were made in.
		err := nsdo.Do(b.NetNS, func() error {
			var err error
			if echo, err = listenBlocking(netip.AddrPortFrom(b.Addr, b.EchoPort)); err != nil {
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
		for range echoThreads {
			go echoTCP(b.Name, echo)
		}
		go acceptLoop(sl, func(c net.Conn) { io.Copy(io.Discard, c) })
		go echoUDP(b.Name, uc)
	}
	fmt.Println("ready")
	for {
		time.Sleep(time.Hour)
	}
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

// echoThreads is how many threads serve each backend's TCP echo port,
// each one connection at a time: at least as many as there are load
// workers, so that no connection waits for another to close.
const echoThreads = 16

// listenBlocking returns a listening TCP socket on addr in blocking mode:
// echoTCP serves it with plain blocking system calls, which cost less per
// connection than the Go runtime's poller (one epoll registration and
// goroutine per connection) and so leave more of the CPU to what is
// measured.
func listenBlocking(addr netip.AddrPort) (int, error) {
	if !addr.Addr().Is4() {
		return -1, fmt.Errorf("listen %s: IPv4 only", addr)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("listen %s: %w", addr, err)
	}
	err = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
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

// echoTCP accepts connections on the blocking listening socket lfd, one
// at a time, and answers each line a connection sends with "<name>
// <peer>\n" until the peer closes it.
func echoTCP(name string, lfd int) {
	runtime.LockOSThread()
	var buf [512]byte
	for {
		fd, sa, err := unix.Accept4(lfd, unix.SOCK_CLOEXEC)
		if err != nil {
			if err != unix.EINTR && err != unix.ECONNABORTED {
				time.Sleep(time.Millisecond)
			}
			continue
		}
		// No I/O timeouts: the load generators always close their
		// connections (the kernel does, if they die), and each system
		// call saved counts at these rates.
		var peer string
		if in4, ok := sa.(*unix.SockaddrInet4); ok {
			peer = netip.AddrPortFrom(netip.AddrFrom4(in4.Addr), uint16(in4.Port)).String()
		}
		reply := []byte(name + " " + peer + "\n")
		for {
			n, err := retry(func() (int, error) { return unix.Read(fd, buf[:]) })
			if err != nil || n == 0 {
				break
			}
			// One reply per newline; requests are one short line each.
			lines := bytes.Count(buf[:n], []byte{'\n'})
			if lines > 0 {
				if _, err := retry(func() (int, error) { return unix.Write(fd, bytes.Repeat(reply, lines)) }); err != nil {
					break
				}
			}
		}
		unix.Close(fd)
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
