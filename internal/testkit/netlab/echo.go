package netlab

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Echo is an echo server: it answers requests on TCP and UDP, on a set of
// ports of a set of addresses in one namespace, with its backend name and
// the client's address as it sees it.
//
// Over TCP, it answers each line it receives with one line
//
//	<backend> <peer>\n
//
// where peer is the client's address and port (netip.AddrPort syntax,
// "198.18.1.10:40000" or "[fd00:198:1::a]:40000"). A connection can carry
// any number of requests. Over UDP it answers each datagram with the same
// line, sent from the address the datagram was sent to (each socket is bound
// to one address).
//
// The sockets are created inside the namespace and served by ordinary
// goroutines: one per listener and one per TCP connection.
type Echo struct {
	backend   string
	ports     []uint16
	log       hclog.Logger
	listeners []*net.TCPListener
	packets   []*net.UDPConn
	wg        sync.WaitGroup

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
}

// startEcho starts an echo server called backend on ports of addrs inside n;
// the Echo stops when n is closed, if not before.
func (n *NS) startEcho(backend string, addrs []netip.Addr, ports []uint16) (*Echo, error) {
	if backend == "" || strings.ContainsAny(backend, " \t\r\n") {
		return nil, fmt.Errorf("start echo %q: backend name must be non-empty and without spaces", backend)
	}
	if len(ports) == 0 || slices.Contains(ports, 0) {
		return nil, fmt.Errorf("start echo %s: need one or more non-zero ports, got %v", backend, ports)
	}
	e := &Echo{
		backend: backend,
		ports:   slices.Clone(ports),
		log:     n.log.With("backend", backend),
		conns:   make(map[net.Conn]struct{}),
	}
	err := n.Do(func() error {
		for _, a := range addrs {
			for _, p := range ports {
				ap := netip.AddrPortFrom(a, p)
				tl, err := net.ListenTCP(family("tcp", a), net.TCPAddrFromAddrPort(ap))
				if err != nil {
					return err
				}
				e.listeners = append(e.listeners, tl)
				uc, err := net.ListenUDP(family("udp", a), net.UDPAddrFromAddrPort(ap))
				if err != nil {
					return err
				}
				e.packets = append(e.packets, uc)
			}
		}
		return nil
	})
	if err == nil {
		err = n.addEcho(e)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("start echo %s in netns %s: %w", backend, n.name, err), e.Close())
	}
	for _, l := range e.listeners {
		e.wg.Add(1)
		go e.accept(l)
	}
	for _, c := range e.packets {
		e.wg.Add(1)
		go e.serveUDP(c)
	}
	e.log.Debug("started echo", "ports", ports, "addrs", addrs)
	return e, nil
}

// addEcho registers e to be closed with n.
func (n *NS) addEcho(e *Echo) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	n.echoes = append(n.echoes, e)
	return nil
}

// Backend returns the name the server answers with.
func (e *Echo) Backend() string { return e.backend }

// Ports returns the ports the server listens on.
func (e *Echo) Ports() []uint16 { return slices.Clone(e.ports) }

// Close closes the server's sockets, including open TCP connections, and
// waits for its goroutines to finish. Calling Close again does nothing.
func (e *Echo) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	conns := e.conns
	e.conns = nil
	e.mu.Unlock()

	var errs []error
	for _, l := range e.listeners {
		errs = append(errs, l.Close())
	}
	for _, c := range e.packets {
		errs = append(errs, c.Close())
	}
	for c := range conns {
		c.Close()
	}
	e.wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close echo %s: %w", e.backend, err)
	}
	return nil
}

func (e *Echo) accept(l *net.TCPListener) {
	defer e.wg.Done()
	for {
		c, err := l.AcceptTCP()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// Out of file descriptors, say: back off rather than spin.
			e.log.Warn("accept", "error", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		e.mu.Lock()
		if e.closed {
			e.mu.Unlock()
			c.Close()
			return
		}
		e.conns[c] = struct{}{}
		e.wg.Add(1)
		e.mu.Unlock()
		go e.serveTCP(c)
	}
}

func (e *Echo) serveTCP(c *net.TCPConn) {
	defer e.wg.Done()
	defer func() {
		c.Close()
		e.mu.Lock()
		delete(e.conns, c)
		e.mu.Unlock()
	}()
	reply := e.reply(addrPortOf(c.RemoteAddr()))
	r := bufio.NewReaderSize(c, 256)
	for {
		_, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			continue // a long line is still one request
		}
		if err != nil {
			return
		}
		if _, err := c.Write(reply); err != nil {
			return
		}
	}
}

func (e *Echo) serveUDP(c *net.UDPConn) {
	defer e.wg.Done()
	buf := make([]byte, 2048)
	for {
		_, peer, err := c.ReadFromUDPAddrPort(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			e.log.Debug("read udp", "error", err)
			time.Sleep(time.Millisecond)
			continue
		}
		peer = netip.AddrPortFrom(peer.Addr().Unmap(), peer.Port())
		if _, err := c.WriteToUDPAddrPort(e.reply(peer), peer); err != nil {
			e.log.Debug("write udp", "peer", peer, "error", err)
		}
	}
}

func (e *Echo) reply(peer netip.AddrPort) []byte {
	return []byte(e.backend + " " + peer.String() + "\n")
}
