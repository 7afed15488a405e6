package health

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestTCPCheckerWaits: a check whose handshake does not finish inside
// connect goes to the waiter, which reports a timeout at the deadline (a
// listener whose accept queue is full drops the SYN), and close fails what
// is still pending with context.Canceled.
func TestTCPCheckerWaits(t *testing.T) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 7}}); err != nil {
		t.Fatal(err)
	}
	// Backlog 0: one connection fills the queue; nothing accepts.
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.7"), uint16(sa.(*unix.SockaddrInet4).Port))

	tc, err := newTCPChecker(ownSocket)
	if err != nil {
		t.Fatal(err)
	}
	check := func(timeout time.Duration) (error, bool) {
		res := make(chan error, 1)
		done, err := tc.check(context.Background(), addr, timeout, func(err error) { res <- err })
		if done {
			return err, true
		}
		return <-res, false
	}
	if err, _ := check(time.Second); err != nil {
		t.Fatalf("first check: %v", err)
	}
	var timedOut bool
	for range 3 {
		start := time.Now()
		err, done := check(150 * time.Millisecond)
		if err == nil {
			continue
		}
		if done || describe(err).Error() != "timeout" {
			t.Fatalf("check of a full queue: %v (at once: %v), want a timeout from the waiter", err, done)
		}
		if d := time.Since(start); d < 140*time.Millisecond || d > 2*time.Second {
			t.Errorf("timed out after %v, want about 150ms", d)
		}
		timedOut = true
		break
	}
	if !timedOut {
		t.Fatal("no check timed out against a full accept queue")
	}
	res := make(chan error, 1)
	done, _ := tc.check(context.Background(), addr, time.Hour, func(err error) { res <- err })
	tc.close()
	if done {
		t.Fatal("a check of a full queue finished at once")
	}
	if err := <-res; err != context.Canceled {
		t.Errorf("pending check after close: %v, want context.Canceled", err)
	}
}

// TestTCPCheckerReusesSockets: checks that pass and fail in turn all get
// their own result from the few sockets of the pool, and a passed check
// leaves the server a reset connection (no FIN: no TIME_WAIT).
func TestTCPCheckerReusesSockets(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.8:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	resets := make(chan error, 1000)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			_, err = conn.Read(make([]byte, 1))
			conn.Close()
			resets <- err
		}
	}()
	tc, err := newTCPChecker(ownSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer tc.close()
	up := netip.MustParseAddrPort(ln.Addr().String())
	down := netip.AddrPortFrom(up.Addr(), 1)
	check := func(addr netip.AddrPort) error {
		res := make(chan error, 1)
		done, err := tc.check(context.Background(), addr, time.Second, func(err error) { res <- err })
		if done {
			return err
		}
		return <-res
	}
	const n = 200
	for i := range n {
		if err := check(up); err != nil {
			t.Fatalf("check %d of a listener: %v", i, err)
		}
		if err := describe(check(down)); err == nil || err.Error() != "connection refused" {
			t.Fatalf("check %d of a closed port: %v", i, err)
		}
	}
	tc.mu.Lock()
	pooled := len(tc.pool[unix.AF_INET])
	tc.mu.Unlock()
	if pooled != 1 {
		t.Errorf("%d sockets pooled after %d checks one at a time, want 1", pooled, 2*n)
	}
	for i := range n {
		select {
		case err := <-resets:
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("connection %d ended with %v, want a reset", i, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("only %d connections reached the server", i)
		}
	}
}
