package sockdiag

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/internal/nsdo"
	"github.com/vipd/vipd/internal/testkit/require"
)

// The tests run every socket in a private network namespace, so fixed
// ports cannot collide with anything.
const (
	echoPort  = 4242
	otherPort = 4243
)

// otherAddr is a second local address, added to lo in the test namespace.
var otherAddr = netip.MustParseAddr("192.0.2.1")

func TestDestroyUDP(t *testing.T) {
	ns, path := newNetNS(t)
	servers := map[netip.AddrPort]int{}
	for _, a := range []netip.AddrPort{
		netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), echoPort),
		netip.AddrPortFrom(netip.MustParseAddr("::1"), echoPort),
		netip.AddrPortFrom(otherAddr, echoPort),
		netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), otherPort),
	} {
		servers[a] = udpSocket(t, ns, familyOf(a), a, netip.AddrPort{})
	}
	dsts := []netip.AddrPort{
		netip.MustParseAddrPort("127.0.0.1:4242"),
		netip.MustParseAddrPort("[::1]:4242"),
	}
	clients := []struct {
		name    string
		family  int
		dst     netip.AddrPort
		inSet   bool // cookie passed to DestroyUDP
		destroy bool
		fd      int
	}{
		{name: "ipv4 to a destination in dsts", family: unix.AF_INET, dst: netip.MustParseAddrPort("127.0.0.1:4242"), inSet: true, destroy: true},
		{name: "ipv6 to a destination in dsts", family: unix.AF_INET6, dst: netip.MustParseAddrPort("[::1]:4242"), inSet: true, destroy: true},
		{name: "ipv4-mapped on a v6 socket to a destination in dsts", family: unix.AF_INET6, dst: netip.MustParseAddrPort("[::ffff:127.0.0.1]:4242"), inSet: true, destroy: true},
		{name: "ipv4 with a cookie not in the set", family: unix.AF_INET, dst: netip.MustParseAddrPort("127.0.0.1:4242")},
		{name: "ipv6 with a cookie not in the set", family: unix.AF_INET6, dst: netip.MustParseAddrPort("[::1]:4242")},
		{name: "ipv4 to another address on the same port", family: unix.AF_INET, dst: netip.AddrPortFrom(otherAddr, echoPort), inSet: true},
		{name: "ipv4 to another port", family: unix.AF_INET, dst: netip.MustParseAddrPort("127.0.0.1:4243"), inSet: true},
	}
	cookies := map[uint64]bool{}
	wantN := 0
	for i := range clients {
		c := &clients[i]
		c.fd = udpSocket(t, ns, c.family, netip.AddrPort{}, c.dst)
		if err := roundTrip(c.fd, servers[unmap(c.dst)]); err != nil {
			t.Fatalf("%s: before DestroyUDP: %v", c.name, err)
		}
		if c.inSet {
			cookies[cookieOf(t, c.fd)] = true
		}
		if c.destroy {
			wantN++
		}
	}

	n, err := DestroyUDP(path, dsts, cookies)
	if err != nil {
		t.Fatalf("DestroyUDP: %v", err)
	}
	if n != wantN {
		t.Errorf("DestroyUDP destroyed %d sockets, want %d", n, wantN)
	}
	for _, c := range clients {
		err := pendingError(c.fd)
		if c.destroy {
			if !errors.Is(err, unix.ECONNABORTED) {
				t.Errorf("%s: receive after destroy: got %v, want ECONNABORTED", c.name, err)
			}
			if _, err := unix.Write(c.fd, []byte("x")); err == nil {
				t.Errorf("%s: send after destroy succeeded, want the socket disconnected", c.name)
			}
			continue
		}
		if !errors.Is(err, unix.EAGAIN) {
			t.Errorf("%s: receive on a socket that must be untouched: got %v, want EAGAIN", c.name, err)
		}
		if err := roundTrip(c.fd, servers[unmap(c.dst)]); err != nil {
			t.Errorf("%s: socket that must be untouched: %v", c.name, err)
		}
	}

	// Destroyed sockets are disconnected, so a repeat finds nothing.
	if n, err := DestroyUDP(path, dsts, cookies); n != 0 || err != nil {
		t.Errorf("repeated DestroyUDP: got %d, %v; want 0, nil", n, err)
	}
}

// TestDestroyUDPIPv4Mapped checks that an IPv4 destination, in either form,
// matches both an IPv4 socket and a v6 socket connected to the IPv4-mapped
// address, with no IPv6 destination on the port to bring in v6 sockets.
func TestDestroyUDPIPv4Mapped(t *testing.T) {
	for _, form := range []string{"127.0.0.1:4242", "[::ffff:127.0.0.1]:4242"} {
		t.Run(form, func(t *testing.T) {
			ns, path := newNetNS(t)
			dst := netip.MustParseAddrPort("127.0.0.1:4242")
			udpSocket(t, ns, unix.AF_INET, dst, netip.AddrPort{})
			v4 := udpSocket(t, ns, unix.AF_INET, netip.AddrPort{}, dst)
			mapped := udpSocket(t, ns, unix.AF_INET6, netip.AddrPort{}, netip.MustParseAddrPort("[::ffff:127.0.0.1]:4242"))
			cookies := map[uint64]bool{cookieOf(t, v4): true, cookieOf(t, mapped): true}
			n, err := DestroyUDP(path, []netip.AddrPort{netip.MustParseAddrPort(form)}, cookies)
			if err != nil || n != 2 {
				t.Fatalf("DestroyUDP: got %d, %v; want 2, nil", n, err)
			}
			for name, fd := range map[string]int{"ipv4": v4, "ipv4-mapped": mapped} {
				if err := pendingError(fd); !errors.Is(err, unix.ECONNABORTED) {
					t.Errorf("%s socket: receive after destroy: got %v, want ECONNABORTED", name, err)
				}
			}
		})
	}
}

func TestDestroyUDPEmptyCookieSet(t *testing.T) {
	ns, path := newNetNS(t)
	dst := netip.MustParseAddrPort("127.0.0.1:4242")
	srv := udpSocket(t, ns, unix.AF_INET, dst, netip.AddrPort{})
	cl := udpSocket(t, ns, unix.AF_INET, netip.AddrPort{}, dst)
	cookie := cookieOf(t, cl)
	tests := []struct {
		name    string
		dsts    []netip.AddrPort
		cookies map[uint64]bool
	}{
		{"nil cookies", []netip.AddrPort{dst}, nil},
		{"empty cookies", []netip.AddrPort{dst}, map[uint64]bool{}},
		{"cookie mapped to false", []netip.AddrPort{dst}, map[uint64]bool{cookie: false}},
		{"no destinations", nil, map[uint64]bool{cookie: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := DestroyUDP(path, tt.dsts, tt.cookies)
			if n != 0 || err != nil {
				t.Errorf("DestroyUDP: got %d, %v; want 0, nil", n, err)
			}
			if err := roundTrip(cl, srv); err != nil {
				t.Errorf("client after DestroyUDP: %v", err)
			}
		})
	}
}

// TestDestroyUDPCurrentNetNS checks that "" means the namespace of the
// calling thread, not the process's.
func TestDestroyUDPCurrentNetNS(t *testing.T) {
	ns, _ := newNetNS(t)
	dst := netip.MustParseAddrPort("[::1]:4242")
	udpSocket(t, ns, unix.AF_INET6, dst, netip.AddrPort{})
	cl := udpSocket(t, ns, unix.AF_INET6, netip.AddrPort{}, dst)
	var n int
	err := nsdo.Do(fmt.Sprintf("/proc/self/fd/%d", int(ns)), func() error {
		var err error
		n, err = DestroyUDP("", []netip.AddrPort{dst}, map[uint64]bool{cookieOf(t, cl): true})
		return err
	})
	if err != nil || n != 1 {
		t.Fatalf("DestroyUDP in the current netns: got %d, %v; want 1, nil", n, err)
	}
	if err := pendingError(cl); !errors.Is(err, unix.ECONNABORTED) {
		t.Errorf("receive after destroy: got %v, want ECONNABORTED", err)
	}
}

// TestDestroyUDPManySockets makes the dump span several netlink messages.
func TestDestroyUDPManySockets(t *testing.T) {
	const count = 600
	ns, path := newNetNS(t)
	dst := netip.MustParseAddrPort("127.0.0.1:4242")
	udpSocket(t, ns, unix.AF_INET, dst, netip.AddrPort{})
	cookies := map[uint64]bool{}
	var fds []int
	for range count {
		fd := udpSocket(t, ns, unix.AF_INET, netip.AddrPort{}, dst)
		fds = append(fds, fd)
		cookies[cookieOf(t, fd)] = true
	}
	n, err := DestroyUDP(path, []netip.AddrPort{dst}, cookies)
	if err != nil || n != count {
		t.Fatalf("DestroyUDP: got %d, %v; want %d, nil", n, err, count)
	}
	for _, fd := range fds {
		if err := pendingError(fd); !errors.Is(err, unix.ECONNABORTED) {
			t.Fatalf("receive after destroy: got %v, want ECONNABORTED", err)
		}
	}
}

// TestDestroySkipsGoneSockets checks the kernel's answer when the socket a
// dump reported is gone, or its 4-tuple now has another cookie, by the time
// of the destroy request: ENOENT, which destroyAll skips.
func TestDestroySkipsGoneSockets(t *testing.T) {
	ns, path := newNetNS(t)
	dst := netip.MustParseAddrPort("127.0.0.1:4242")
	srv := udpSocket(t, ns, unix.AF_INET, dst, netip.AddrPort{})
	live := udpSocket(t, ns, unix.AF_INET, netip.AddrPort{}, dst)
	gone, err := openUDP(ns, unix.AF_INET, netip.AddrPort{}, dst)
	if err != nil {
		t.Fatal(err)
	}
	goneCookie := cookieOf(t, gone)
	liveCookie := cookieOf(t, live)

	c, err := dialIn(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	socks, err := c.findUDP(targets([]netip.AddrPort{dst}), map[uint64]bool{goneCookie: true, liveCookie: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(socks) != 2 {
		t.Fatalf("findUDP: got %d sockets, want 2", len(socks))
	}
	unix.Close(gone)
	for i := range socks {
		if socks[i].ID.Cookie == liveCookie {
			socks[i].ID.Cookie++ // as if the 4-tuple were reused by another socket
		}
	}
	n, err := c.destroyAll(socks)
	if n != 0 || err != nil {
		t.Errorf("destroyAll: got %d, %v; want 0, nil", n, err)
	}
	if err := pendingError(live); !errors.Is(err, unix.EAGAIN) {
		t.Errorf("receive on the socket with the other cookie: got %v, want EAGAIN", err)
	}
	if err := roundTrip(live, srv); err != nil {
		t.Errorf("socket with the other cookie: %v", err)
	}
}

// newNetNS makes a private network namespace with lo up, holding 127.0.0.1,
// ::1 and otherAddr, and returns it with a path that names it. Nothing
// outside the process refers to it, so it goes away when the test closes it.
func newNetNS(t *testing.T) (netns.NsHandle, string) {
	t.Helper()
	require.Root(t, "making a network namespace and destroying sockets")
	ns := netns.None()
	err := nsdo.OnLockedThread(func(netns.NsHandle) error {
		var err error
		ns, err = netns.New() // moves the locked thread into the new namespace
		return err
	})
	if err != nil {
		if ns.IsOpen() {
			ns.Close()
		}
		t.Fatalf("new netns: %v", err)
	}
	t.Cleanup(func() { ns.Close() })

	// Opened inside ns through nsdo, not by NewHandleAt(ns), which would
	// switch namespaces itself and unlock the thread even when switching
	// back fails.
	var h *netlink.Handle
	err = nsdo.In(ns, func() error {
		var err error
		h, err = netlink.NewHandleAt(netns.None())
		return err
	})
	if err != nil {
		t.Fatalf("netlink handle in test netns: %v", err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatalf("test netns: %v", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		t.Fatalf("test netns: set lo up: %v", err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: otherAddr.AsSlice(), Mask: net.CIDRMask(32, 32)}}
	if err := h.AddrAdd(lo, addr); err != nil {
		t.Fatalf("test netns: add %s to lo: %v", otherAddr, err)
	}
	return ns, fmt.Sprintf("/proc/self/fd/%d", int(ns))
}

// openUDP opens a UDP socket in ns, bound to bind and connected to dst when
// they are valid. A v6 socket is v6-only unless it uses an IPv4 address.
func openUDP(ns netns.NsHandle, family int, bind, dst netip.AddrPort) (int, error) {
	fd := -1
	err := nsdo.Do(fmt.Sprintf("/proc/self/fd/%d", int(ns)), func() error {
		var err error
		fd, err = unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		if family == unix.AF_INET6 {
			v6only := 1
			if unmap(bind).Addr().Is4() || unmap(dst).Addr().Is4() {
				v6only = 0
			}
			if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, v6only); err != nil {
				return fmt.Errorf("set IPV6_V6ONLY: %w", err)
			}
		}
		if bind.IsValid() {
			if err := unix.Bind(fd, sockaddr(family, bind)); err != nil {
				return fmt.Errorf("bind %s: %w", bind, err)
			}
		}
		if dst.IsValid() {
			if err := unix.Connect(fd, sockaddr(family, dst)); err != nil {
				return fmt.Errorf("connect %s: %w", dst, err)
			}
		}
		return nil
	})
	if err == nil {
		tv := unix.NsecToTimeval(int64(2 * time.Second))
		err = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	}
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return -1, fmt.Errorf("udp socket (family %d, bind %s, connect %s): %w", family, bind, dst, err)
	}
	return fd, nil
}

// udpSocket is openUDP, closing the socket when the test ends.
func udpSocket(t *testing.T, ns netns.NsHandle, family int, bind, dst netip.AddrPort) int {
	t.Helper()
	fd, err := openUDP(ns, family, bind, dst)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

func sockaddr(family int, a netip.AddrPort) unix.Sockaddr {
	if family == unix.AF_INET {
		return &unix.SockaddrInet4{Port: int(a.Port()), Addr: a.Addr().As4()}
	}
	return &unix.SockaddrInet6{Port: int(a.Port()), Addr: a.Addr().As16()}
}

func familyOf(a netip.AddrPort) int {
	if a.Addr().Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

func unmap(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}

func cookieOf(t *testing.T, fd int) uint64 {
	t.Helper()
	c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE)
	if err != nil {
		t.Fatalf("SO_COOKIE: %v", err)
	}
	return c
}

// pendingError returns what a non-blocking receive on fd returns: the
// socket's pending error, or EAGAIN when it has neither error nor data.
func pendingError(fd int) error {
	var b [64]byte
	_, _, err := unix.Recvfrom(fd, b[:], unix.MSG_DONTWAIT)
	return err
}

// roundTrip sends a datagram from the connected client to server and has
// server echo it back.
func roundTrip(client, server int) error {
	msg := []byte(fmt.Sprintf("ping from fd %d", client))
	if _, err := unix.Write(client, msg); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	buf := make([]byte, 256)
	n, from, err := unix.Recvfrom(server, buf, 0)
	if err != nil {
		return fmt.Errorf("server receive: %w", err)
	}
	if !bytes.Equal(buf[:n], msg) {
		return fmt.Errorf("server received %q, want %q", buf[:n], msg)
	}
	if err := unix.Sendto(server, buf[:n], 0, from); err != nil {
		return fmt.Errorf("server echo: %w", err)
	}
	n, err = unix.Read(client, buf)
	if err != nil {
		return fmt.Errorf("receive echo: %w", err)
	}
	if !bytes.Equal(buf[:n], msg) {
		return fmt.Errorf("echo %q, want %q", buf[:n], msg)
	}
	return nil
}
