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

// runCheck runs one check on tc, polling as the scheduler loop does, and
// returns its result and whether it finished inside check.
func runCheck(tc *tcpChecker, addr netip.AddrPort, timeout time.Duration) (error, bool) {
	var result error
	finished := false
	done, err := tc.check(context.Background(), addr, timeout, func(err error) { result, finished = err, true })
	if done {
		return err, true
	}
	for !finished {
		tc.poll(pollEvery)
	}
	return result, false
}

// TestTCPCheckerWaits: a check whose handshake does not finish inside
// connect is collected by poll, which reports a timeout at the deadline (a
// listener whose accept queue is full drops the SYN), and close fails what
// is still in flight with context.Canceled.
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
	if err, _ := runCheck(tc, addr, time.Second); err != nil {
		t.Fatalf("first check: %v", err)
	}
	var timedOut bool
	for range 3 {
		start := time.Now()
		err, atOnce := runCheck(tc, addr, 150*time.Millisecond)
		if err == nil {
			continue
		}
		if atOnce || describe(err).Error() != "timeout" {
			t.Fatalf("check of a full queue: %v (at once: %v), want a timeout from poll", err, atOnce)
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
	var result error
	done, _ := tc.check(context.Background(), addr, time.Hour, func(err error) { result = err })
	if done {
		t.Fatal("a check of a full queue finished at once")
	}
	tc.close()
	if result != context.Canceled {
		t.Errorf("check in flight after close: %v, want context.Canceled", result)
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
	const n = 200
	for i := range n {
		if err, _ := runCheck(tc, up, time.Second); err != nil {
			t.Fatalf("check %d of a listener: %v", i, err)
		}
		if err, _ := runCheck(tc, down, time.Second); describe(err) == nil || describe(err).Error() != "connection refused" {
			t.Fatalf("check %d of a closed port: %v", i, err)
		}
	}
	if pooled := len(tc.pool[unix.AF_INET]); pooled != 1 {
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
