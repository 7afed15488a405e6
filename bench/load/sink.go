package load

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"

	"github.com/vipd/vipd/internal/netlab"
)

// Sink is a TCP server that reads and discards everything sent to it: the
// far end of Bulk.
type Sink struct {
	l  *net.TCPListener
	wg sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]bool
}

// StartSink listens on addr inside ns. Close stops it.
func StartSink(ns *netlab.NS, addr netip.AddrPort) (*Sink, error) {
	s := &Sink{conns: map[net.Conn]bool{}}
	err := ns.Do(func() error {
		l, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(addr))
		s.l = l
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("start sink on %s in %s: %w", addr, ns, err)
	}
	s.wg.Go(s.accept)
	return s, nil
}

func (s *Sink) accept() {
	for {
		c, err := s.l.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns[c] = true
		s.mu.Unlock()
		s.wg.Go(func() {
			io.Copy(io.Discard, c)
			c.Close()
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		})
	}
}

// Close stops the listener and every connection, and waits for them.
func (s *Sink) Close() error {
	err := s.l.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
