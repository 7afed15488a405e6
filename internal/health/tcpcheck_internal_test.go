package health

import (
	"context"
	"net/netip"
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
