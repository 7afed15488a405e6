package netlab

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/cgroup2"
	"github.com/vipd/vipd/internal/testkit/cgroup2test"
)

func TestClient(t *testing.T) {
	lab := New(t, Spec{Nodes: []NodeSpec{{Pods: []string{"a1", "a2"}}}})
	n1, a1 := lab.Node(1), lab.Node(1).Pod("a1")
	if _, err := a1.StartEcho("", echoPort); err != nil {
		t.Fatal(err)
	}
	group := cgroup2test.New(t)
	wantCgroup := "/" + filepath.Base(group)
	c, err := n1.StartClient(t.Context(), group)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	t.Run("InCgroup", func(t *testing.T) {
		if got, err := cgroup2.ProcCgroup(c.Pid()); err != nil || got != wantCgroup {
			t.Errorf("/proc/%d/cgroup: got %q, %v; want %s", c.Pid(), got, err, wantCgroup)
		}
		if c.cgroup != wantCgroup {
			t.Errorf("the client process saw itself in cgroup %s, want %s", c.cgroup, wantCgroup)
		}
		if pids, err := cgroup2.Procs(group); err != nil || !slices.Equal(pids, []int{c.Pid()}) {
			t.Errorf("processes in the cgroup: got %v, %v; want only the client, %d", pids, err, c.Pid())
		}
	})

	t.Run("Reply", func(t *testing.T) {
		for _, fam := range families {
			for _, proto := range []string{"tcp", "udp"} {
				dst := netip.AddrPortFrom(fam.addr(a1), echoPort)
				r, err := c.Request(t.Context(), proto, dst.String())
				if err != nil {
					t.Fatalf("%s %s: %v", fam.name, proto, err)
				}
				if r.Backend != "a1" || r.Peer.Addr() != fam.addr(n1) || r.Peer != r.Local || r.Remote != dst {
					t.Errorf("%s %s: got %+v, want backend a1, peer %s = local, remote %s", fam.name, proto, r, fam.addr(n1), dst)
				}
			}
		}
		dst := netip.AddrPortFrom(a1.IPv4(), echoPort).String()
		r, err := c.Request(t.Context(), "tcp", dst, WithLocalPort(42043))
		if err != nil || r.Local.Port() != 42043 || r.Peer != r.Local {
			t.Errorf("WithLocalPort: got %+v, %v", r, err)
		}
		r, err = c.Request(t.Context(), "udp", dst, WithLocalPortRange(41100, 41101))
		if err != nil || r.Local.Port() < 41100 || r.Local.Port() > 41101 {
			t.Errorf("WithLocalPortRange: got %+v, %v", r, err)
		}
		if _, err := c.Request(t.Context(), "tcp", "198.18.1.10"); err == nil {
			t.Error("address without a port accepted")
		}
	})

	t.Run("Refused", func(t *testing.T) {
		for _, fam := range families {
			for _, proto := range []string{"tcp", "udp"} {
				dst := netip.AddrPortFrom(fam.addr(a1), 9).String()
				start := time.Now()
				_, err := c.Request(t.Context(), proto, dst)
				if !errors.Is(err, syscall.ECONNREFUSED) || IsTimeout(err) {
					t.Errorf("%s %s -> %s: got %v, want ECONNREFUSED", fam.name, proto, dst, err)
				}
				if err != nil && !strings.Contains(err.Error(), wantCgroup) {
					t.Errorf("%s %s -> %s: error %q does not name the cgroup", fam.name, proto, dst, err)
				}
				if d := time.Since(start); d > time.Second {
					t.Errorf("%s %s -> %s: refusal took %v", fam.name, proto, dst, d)
				}
			}
		}
	})

	t.Run("TimedOut", func(t *testing.T) {
		// a1 silently drops what it sends to node1: no reply, no ICMP.
		blackhole := n1.IPv4().String() + "/32"
		if _, err := a1.Exec(t.Context(), "ip", "route", "add", "blackhole", blackhole); err != nil {
			t.Fatal(err)
		}
		defer a1.Exec(context.Background(), "ip", "route", "del", "blackhole", blackhole)
		for _, proto := range []string{"tcp", "udp"} {
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			start := time.Now()
			_, err := c.Request(ctx, proto, netip.AddrPortFrom(a1.IPv4(), echoPort).String())
			cancel()
			if !IsTimeout(err) || errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("%s: got %v, want a timeout", proto, err)
			}
			if d := time.Since(start); d > 300*time.Millisecond+clientGrace/2 {
				t.Errorf("%s: timed out after %v, want about 300ms", proto, d)
			}
		}
	})

	t.Run("Cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := c.Request(ctx, "tcp", netip.AddrPortFrom(a1.IPv4(), echoPort).String())
		if !errors.Is(err, context.Canceled) {
			t.Errorf("got %v, want context.Canceled", err)
		}
	})

	t.Run("Concurrent", func(t *testing.T) {
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Go(func() {
				proto := []string{"tcp", "udp"}[i%2]
				r, err := c.Request(t.Context(), proto, netip.AddrPortFrom(a1.IPv6(), echoPort).String())
				if err != nil || r.Backend != "a1" {
					t.Errorf("request %d: got %+v, %v", i, r, err)
				}
			})
		}
		wg.Wait()
	})

	t.Run("Sequential", func(t *testing.T) {
		dst := netip.AddrPortFrom(a1.IPv4(), echoPort).String()
		measure := func(n int, req func() (Reply, error)) time.Duration {
			start := time.Now()
			for i := range n {
				if r, err := req(); err != nil || r.Backend != "a1" {
					t.Fatalf("request %d: got %+v, %v", i, r, err)
				}
			}
			return time.Since(start) / time.Duration(n)
		}
		const n = 60
		inProcess := measure(n, func() (Reply, error) { return n1.Request(t.Context(), "tcp", dst) })
		inClient := measure(n, func() (Reply, error) { return c.Request(t.Context(), "tcp", dst) })
		oneShot := measure(10, func() (Reply, error) { return n1.RequestInCgroup(t.Context(), group, "tcp", dst) })
		t.Logf("sequential TCP requests: %v each in process, %v through a Client (%v more), %v with RequestInCgroup",
			inProcess, inClient, inClient-inProcess, oneShot)
		// Typically half a millisecond; the bound leaves room for a busy machine.
		if inClient-inProcess > 10*time.Millisecond {
			t.Errorf("a request through a Client takes %v longer than in process, want a few milliseconds at most", inClient-inProcess)
		}
	})

	t.Run("Close", func(t *testing.T) {
		c2, err := n1.StartClient(t.Context(), group)
		if err != nil {
			t.Fatal(err)
		}
		pid := c2.Pid()
		if err := c2.Close(); err != nil {
			t.Fatal(err)
		}
		if err := c2.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		if _, err := c2.Request(t.Context(), "tcp", netip.AddrPortFrom(a1.IPv4(), echoPort).String()); !errors.Is(err, ErrClosed) {
			t.Errorf("Request after Close: got %v, want ErrClosed", err)
		}
		if pids, _ := cgroup2.Procs(group); slices.Contains(pids, pid) {
			t.Errorf("closed client %d still in the cgroup: %v", pid, pids)
		}
	})

	t.Run("ClosedWithItsNamespace", func(t *testing.T) {
		c2, err := n1.Pod("a2").StartClient(t.Context(), group)
		if err != nil {
			t.Fatal(err)
		}
		if err := n1.RemovePod("a2"); err != nil {
			t.Fatal(err)
		}
		if _, err := c2.Request(t.Context(), "tcp", netip.AddrPortFrom(a1.IPv4(), echoPort).String()); !errors.Is(err, ErrClosed) {
			t.Errorf("Request after RemovePod: got %v, want ErrClosed", err)
		}
		if pids, _ := cgroup2.Procs(group); slices.Contains(pids, c2.Pid()) {
			t.Errorf("client %d of a removed pod still in the cgroup: %v", c2.Pid(), pids)
		}
	})

	t.Run("Died", func(t *testing.T) {
		c2, err := n1.StartClient(t.Context(), group)
		if err != nil {
			t.Fatal(err)
		}
		defer c2.Close()
		if err := syscall.Kill(c2.Pid(), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_, err = c2.Request(t.Context(), "tcp", netip.AddrPortFrom(a1.IPv4(), echoPort).String())
		if err == nil || !strings.Contains(err.Error(), "exited") || errors.Is(err, ErrClosed) {
			t.Errorf("Request through a killed client: got %v, want an error saying it exited", err)
		}
	})

	t.Run("RequestInCgroup", func(t *testing.T) {
		dst := netip.AddrPortFrom(a1.IPv6(), echoPort)
		r, err := n1.RequestInCgroup(t.Context(), group, "udp", dst.String())
		if err != nil || r.Backend != "a1" || r.Peer.Addr() != n1.IPv6() || r.Remote != dst {
			t.Errorf("got %+v, %v", r, err)
		}
		_, err = n1.RequestInCgroup(t.Context(), group, "tcp", netip.AddrPortFrom(a1.IPv4(), 9).String())
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("refused: got %v, want ECONNREFUSED", err)
		}
	})

	t.Run("BadStart", func(t *testing.T) {
		if _, err := n1.StartClient(t.Context(), t.TempDir()); err == nil || !strings.Contains(err.Error(), "not a cgroup v2 directory") {
			t.Errorf("plain directory as the cgroup: got %v", err)
		}
		defer func(f func() (string, error)) { clientExecutable = f }(clientExecutable)
		clientExecutable = func() (string, error) { return "/bin/true", nil }
		if _, err := n1.StartClient(t.Context(), group); err == nil || !strings.Contains(err.Error(), "RunClientIfRequested") {
			t.Errorf("binary that is no client: got %v, want an error that names RunClientIfRequested", err)
		}
	})

	if err := c.Close(); err != nil {
		t.Error(err)
	}
	if pids, err := cgroup2.Procs(group); err != nil || len(pids) > 0 {
		t.Errorf("processes left in the cgroup after every client was closed: %v, %v", pids, err)
	}
}
