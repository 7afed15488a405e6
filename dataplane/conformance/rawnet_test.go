package conformance

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/vipd/vipd/internal/testkit/netlab"
	"golang.org/x/sys/unix"
)

// This file speaks ICMP and SCTP through raw sockets, which netlab's echo
// servers and clients do not cover: ping is not installed, and this kernel
// has no SCTP sockets (CONFIG_IP_SCTP is off) while its conntrack and NAT do
// handle SCTP. Every socket is created inside a lab namespace by NS.Do and
// used from ordinary goroutines afterwards.

// rawSocket opens a raw socket of protocol proto inside ns.
func rawSocket(ns *netlab.NS, domain, proto int) (int, error) {
	fd := -1
	err := ns.Do(func() error {
		var err error
		fd, err = unix.Socket(domain, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		return err
	})
	if err != nil {
		return -1, fmt.Errorf("raw socket (protocol %d) in netns %s: %w", proto, ns.Name(), err)
	}
	// Receives wake up regularly so that callers can check their deadline.
	tv := unix.NsecToTimeval((50 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("set SO_RCVTIMEO: %w", err)
	}
	return fd, nil
}

func sockaddr(a netip.Addr) unix.Sockaddr {
	if a.Is4() {
		return &unix.SockaddrInet4{Addr: a.As4()}
	}
	return &unix.SockaddrInet6{Addr: a.As16()}
}

func sockaddrAddrPort(sa unix.Sockaddr) netip.AddrPort {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), uint16(sa.Port))
	}
	return netip.AddrPort{}
}

// recvUntil reads datagrams from fd until deadline, calling f on each with
// its source; it stops early when f returns true.
func recvUntil(fd int, deadline time.Time, f func(b []byte, from netip.Addr) bool) error {
	buf := make([]byte, 65536)
	for time.Now().Before(deadline) {
		n, from, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if f(buf[:n], sockaddrAddrPort(from).Addr()) {
			return nil
		}
	}
	return nil
}

// ---- ICMP echo ----

// ping sends count ICMP echo requests from ns to dst, waiting up to wait
// for a reply to each, like `ping -c count -W wait`. It reports whether an
// echo reply came back from dst.
func ping(ns *netlab.NS, dst netip.Addr, count int, wait time.Duration) (bool, error) {
	domain, proto, reqType, replyType := unix.AF_INET, unix.IPPROTO_ICMP, byte(8), byte(0)
	if dst.Is6() {
		domain, proto, reqType, replyType = unix.AF_INET6, unix.IPPROTO_ICMPV6, 128, 129
	}
	fd, err := rawSocket(ns, domain, proto)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	id := uint16(rand.Uint32())
	for seq := range count {
		msg := make([]byte, 16)
		msg[0] = reqType
		binary.BigEndian.PutUint16(msg[4:], id)
		binary.BigEndian.PutUint16(msg[6:], uint16(seq))
		copy(msg[8:], "vipdconf")
		if dst.Is4() {
			// The kernel fills in the ICMPv6 checksum, but not ICMP's.
			binary.BigEndian.PutUint16(msg[2:], inetChecksum(msg))
		}
		if err := unix.Sendto(fd, msg, 0, sockaddr(dst)); err != nil {
			return false, fmt.Errorf("send ICMP echo to %v: %w", dst, err)
		}
		replied := false
		err := recvUntil(fd, time.Now().Add(wait), func(b []byte, from netip.Addr) bool {
			if dst.Is4() {
				// IPv4 raw sockets see the IP header.
				if len(b) < 20 || b[0]>>4 != 4 {
					return false
				}
				from = netip.AddrFrom4([4]byte(b[12:16]))
				b = b[int(b[0]&0xf)*4:]
			}
			replied = from == dst && len(b) >= 8 && b[0] == replyType && binary.BigEndian.Uint16(b[4:]) == id
			return replied
		})
		if err != nil {
			return false, fmt.Errorf("receive ICMP: %w", err)
		}
		if replied {
			return true, nil
		}
	}
	return false, nil
}

// inetChecksum is the Internet checksum (RFC 1071) of b.
func inetChecksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// ---- SCTP ----

const (
	sctpInit    = 1
	sctpInitAck = 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// sctpPacket builds an SCTP packet (common header and one chunk) carrying an
// INIT or INIT ACK chunk. The checksum is CRC32c over the packet with the
// checksum field zero, stored little-endian as the kernel does (RFC 9260,
// appendix A).
func sctpPacket(sport, dport uint16, vtag uint32, chunk uint8, initTag, tsn uint32) []byte {
	body := make([]byte, 20)
	body[0] = chunk
	binary.BigEndian.PutUint32(body[4:], initTag)
	binary.BigEndian.PutUint32(body[8:], 65535) // advertised receiver window
	binary.BigEndian.PutUint16(body[12:], 1)    // outbound streams
	binary.BigEndian.PutUint16(body[14:], 1)    // maximum inbound streams
	binary.BigEndian.PutUint32(body[16:], tsn)
	if chunk == sctpInitAck {
		// An INIT ACK must carry a State Cookie parameter.
		param := make([]byte, 12)
		binary.BigEndian.PutUint16(param[0:], 7)
		binary.BigEndian.PutUint16(param[2:], uint16(len(param)))
		copy(param[4:], "cookie!!")
		body = append(body, param...)
	}
	binary.BigEndian.PutUint16(body[2:], uint16(len(body)))
	pkt := make([]byte, 12, 12+len(body))
	binary.BigEndian.PutUint16(pkt[0:], sport)
	binary.BigEndian.PutUint16(pkt[2:], dport)
	binary.BigEndian.PutUint32(pkt[4:], vtag)
	pkt = append(pkt, body...)
	binary.LittleEndian.PutUint32(pkt[8:], crc32.Checksum(pkt, castagnoli))
	return pkt
}

// sctpSeen is an SCTP packet as a raw IPv4 socket received it.
type sctpSeen struct {
	src, dst   netip.AddrPort
	vtag       uint32
	chunk      uint8
	initTag    uint32
	checksumOK bool
}

func (s sctpSeen) String() string {
	name := fmt.Sprintf("chunk %d", s.chunk)
	switch s.chunk {
	case sctpInit:
		name = "INIT"
	case sctpInitAck:
		name = "INIT ACK"
	}
	return fmt.Sprintf("%s %v -> %v vtag %#x init tag %#x checksum ok %v", name, s.src, s.dst, s.vtag, s.initTag, s.checksumOK)
}

// parseSCTP4 parses an IPv4 packet carrying SCTP.
func parseSCTP4(b []byte) (sctpSeen, bool) {
	if len(b) < 20 || b[0]>>4 != 4 || b[9] != unix.IPPROTO_SCTP {
		return sctpSeen{}, false
	}
	src, dst := netip.AddrFrom4([4]byte(b[12:16])), netip.AddrFrom4([4]byte(b[16:20]))
	b = b[int(b[0]&0xf)*4:]
	if len(b) < 12+4+8 {
		return sctpSeen{}, false
	}
	s := sctpSeen{
		src:   netip.AddrPortFrom(src, binary.BigEndian.Uint16(b[0:])),
		dst:   netip.AddrPortFrom(dst, binary.BigEndian.Uint16(b[2:])),
		vtag:  binary.BigEndian.Uint32(b[4:]),
		chunk: b[12],
	}
	s.initTag = binary.BigEndian.Uint32(b[16:])
	sum := binary.LittleEndian.Uint32(b[8:])
	c := make([]byte, len(b))
	copy(c, b)
	clear(c[8:12])
	s.checksumOK = crc32.Checksum(c, castagnoli) == sum
	return s, true
}

// recvSCTP waits until deadline for an SCTP packet on the raw socket fd for
// which match is true. It also returns every other SCTP packet it saw.
func recvSCTP(fd int, deadline time.Time, match func(sctpSeen) bool) (got sctpSeen, ok bool, others []sctpSeen, err error) {
	err = recvUntil(fd, deadline, func(b []byte, _ netip.Addr) bool {
		s, isSCTP := parseSCTP4(b)
		if !isSCTP {
			return false
		}
		if match(s) {
			got, ok = s, true
			return true
		}
		others = append(others, s)
		return false
	})
	return got, ok, others, err
}

func fmtSeen(s []sctpSeen) string {
	if len(s) == 0 {
		return "nothing else"
	}
	var parts []string
	for _, p := range s {
		parts = append(parts, p.String())
	}
	return strings.Join(parts, "; ")
}

// sctpSocketsWork reports whether the kernel has SCTP sockets.
func sctpSocketsWork(ns *netlab.NS) bool {
	ok := false
	ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
		if err == nil {
			unix.Close(fd)
			ok = true
		}
		return nil
	})
	return ok
}

// sctpEcho is a one-to-one style SCTP echo server that answers each
// connection's first message like netlab's echo servers do: "<name> <peer>\n".
type sctpEcho struct {
	fd   int
	done chan struct{}
	wg   sync.WaitGroup
}

func startSCTPEcho(ns *netlab.NS, name string, addr netip.AddrPort) (*sctpEcho, error) {
	fd := -1
	err := ns.Do(func() error {
		var err error
		if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP); err != nil {
			return err
		}
		sa := sockaddr(addr.Addr()).(*unix.SockaddrInet4)
		sa.Port = int(addr.Port())
		if err := unix.Bind(fd, sa); err != nil {
			return err
		}
		return unix.Listen(fd, 64)
	})
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("SCTP echo on %v in netns %s: %w", addr, ns.Name(), err)
	}
	tv := unix.NsecToTimeval((50 * time.Millisecond).Nanoseconds())
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv) // accept wakes up to see done
	s := &sctpEcho{fd: fd, done: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			select {
			case <-s.done:
				return
			default:
			}
			c, peer, err := unix.Accept4(fd, unix.SOCK_CLOEXEC)
			if err != nil {
				continue
			}
			tv := unix.NsecToTimeval(time.Second.Nanoseconds())
			unix.SetsockoptTimeval(c, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
			buf := make([]byte, 512)
			if _, err := unix.Read(c, buf); err == nil {
				unix.Write(c, []byte(name+" "+sockaddrAddrPort(peer).String()+"\n"))
			}
			unix.Close(c)
		}
	}()
	return s, nil
}

func (s *sctpEcho) Close() {
	close(s.done)
	s.wg.Wait()
	unix.Close(s.fd)
}

// sctpRequest connects from ns to dst over SCTP, sends one line and returns
// the reply, as netlab's Request does for TCP.
func sctpRequest(ns *netlab.NS, dst netip.AddrPort, timeout time.Duration) (netlab.Reply, error) {
	fd := -1
	err := ns.Do(func() error {
		var err error
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
		return err
	})
	if err != nil {
		return netlab.Reply{}, err
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv) // bounds connect
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	sa := sockaddr(dst.Addr()).(*unix.SockaddrInet4)
	sa.Port = int(dst.Port())
	if err := unix.Connect(fd, sa); err != nil {
		return netlab.Reply{}, fmt.Errorf("SCTP connect to %v: %w", dst, err)
	}
	if _, err := unix.Write(fd, []byte("ping\n")); err != nil {
		return netlab.Reply{}, fmt.Errorf("SCTP send to %v: %w", dst, err)
	}
	buf := make([]byte, 512)
	n, err := unix.Read(fd, buf)
	if err != nil {
		return netlab.Reply{}, fmt.Errorf("SCTP receive from %v: %w", dst, err)
	}
	backend, peer, ok := strings.Cut(strings.TrimSpace(string(buf[:n])), " ")
	ap, perr := netip.ParseAddrPort(peer)
	if !ok || perr != nil {
		return netlab.Reply{}, fmt.Errorf("SCTP reply from %v: malformed %q", dst, buf[:n])
	}
	r := netlab.Reply{Backend: backend, Peer: ap}
	if rsa, err := unix.Getpeername(fd); err == nil {
		r.Remote = sockaddrAddrPort(rsa)
	}
	if lsa, err := unix.Getsockname(fd); err == nil {
		r.Local = sockaddrAddrPort(lsa)
	}
	return r, nil
}
