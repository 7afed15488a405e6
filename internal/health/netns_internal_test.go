package health

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestNSSocketsDial: the namespace dialer connects, reports a refused
// port as "connection refused", and gives up at the deadline. With an
// empty path it runs in the test's own namespace, so it needs no root.
func TestNSSocketsDial(t *testing.T) {
	s := startNSSockets("")
	defer s.close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c, err := s.dialTCP(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if c.RemoteAddr().String() != ln.Addr().String() {
		t.Errorf("connected to %v, want %v", c.RemoteAddr(), ln.Addr())
	}
	c.Close()
	ln6, err := net.Listen("tcp", "[::1]:0")
	if err == nil {
		defer ln6.Close()
		c, err := s.dialTCP(ctx, ln6.Addr().String())
		if err != nil {
			t.Fatalf("IPv6: %v", err)
		}
		c.Close()
	}
	if _, err := s.dialTCP(ctx, "127.0.0.1:1"); err == nil || describe(err).Error() != "connection refused" {
		t.Errorf("refused port: %v", err)
	}
	// TCP checks on the namespace's sockets: more than a batch of them.
	tc, err := newTCPChecker(s.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer tc.close()
	for range 2*socketBatch + 1 {
		if err := checkNow(tc, ln.Addr().String()); err != nil {
			t.Fatalf("TCP check: %v", err)
		}
	}
	if err := describe(checkNow(tc, "127.0.0.1:1")); err == nil || err.Error() != "connection refused" {
		t.Errorf("TCP check of a refused port: %v", err)
	}
}

// checkNow runs one TCP check of addr and waits for its result.
func checkNow(tc *tcpChecker, addr string) error {
	err, _ := runCheck(tc, netip.MustParseAddrPort(addr), time.Second)
	return err
}
