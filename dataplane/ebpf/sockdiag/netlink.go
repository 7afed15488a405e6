package sockdiag

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// Sizes of the sock_diag structures in <linux/inet_diag.h>. golang.org/x/sys
// has the constants but not these types.
const (
	sizeofSockID  = 48 // struct inet_diag_sockid
	sizeofReqV2   = 8 + sizeofSockID
	sizeofDiagMsg = 4 + sizeofSockID + 20 // struct inet_diag_msg

	// allStates is idiag_states for every socket state: a connected UDP
	// socket is TCP_ESTABLISHED, but the address filter decides.
	allStates = 0xffffffff

	// noCookie is INET_DIAG_NOCOOKIE in both words: a request with it
	// skips the kernel's cookie check, so it is never sent.
	noCookie = ^uint64(0)

	// recvBufSize holds the largest dump message batch the kernel sends
	// (it caps a dump skb at 32 KiB).
	recvBufSize = 64 << 10
)

// sockID is struct inet_diag_sockid with ports in host order. Src and Dst
// are kept as the kernel sent them (an IPv4 address in the first 4 bytes),
// so that a destroy request names the socket exactly as the dump did.
type sockID struct {
	SPort, DPort uint16
	Src, Dst     [16]byte
	If           uint32
	Cookie       uint64
}

// marshal writes id to b in wire order: ports and addresses big-endian,
// interface and cookie in host order, the cookie's low word first.
func (id *sockID) marshal(b []byte) {
	binary.BigEndian.PutUint16(b[0:], id.SPort)
	binary.BigEndian.PutUint16(b[2:], id.DPort)
	copy(b[4:20], id.Src[:])
	copy(b[20:36], id.Dst[:])
	binary.NativeEndian.PutUint32(b[36:], id.If)
	binary.NativeEndian.PutUint32(b[40:], uint32(id.Cookie))
	binary.NativeEndian.PutUint32(b[44:], uint32(id.Cookie>>32))
}

func (id *sockID) unmarshal(b []byte) {
	id.SPort = binary.BigEndian.Uint16(b[0:])
	id.DPort = binary.BigEndian.Uint16(b[2:])
	copy(id.Src[:], b[4:20])
	copy(id.Dst[:], b[20:36])
	id.If = binary.NativeEndian.Uint32(b[36:])
	id.Cookie = uint64(binary.NativeEndian.Uint32(b[40:])) | uint64(binary.NativeEndian.Uint32(b[44:]))<<32
}

// request is struct inet_diag_req_v2 (idiag_ext is always 0).
type request struct {
	Family, Protocol uint8
	States           uint32
	ID               sockID
}

func (r *request) marshal(b []byte) {
	b[0] = r.Family
	b[1] = r.Protocol
	b[2] = 0 // idiag_ext: no attributes wanted
	b[3] = 0
	binary.NativeEndian.PutUint32(b[4:], r.States)
	r.ID.marshal(b[8:])
}

// socket is what a dump reports about one socket.
type socket struct {
	Family uint8
	ID     sockID
}

func parseDiagMsg(b []byte) (socket, error) {
	if len(b) < sizeofDiagMsg {
		return socket{}, fmt.Errorf("inet_diag_msg of %d bytes, want %d", len(b), sizeofDiagMsg)
	}
	s := socket{Family: b[0]}
	s.ID.unmarshal(b[4:])
	return s, nil
}

// dst returns the socket's destination, with an IPv4-mapped IPv6 address
// unmapped, so that a v6 socket connected to ::ffff:a.b.c.d compares equal
// to the IPv4 destination a.b.c.d.
func (s *socket) dst() netip.AddrPort {
	var a netip.Addr
	switch s.Family {
	case unix.AF_INET:
		a = netip.AddrFrom4([4]byte(s.ID.Dst[:4]))
	case unix.AF_INET6:
		a = netip.AddrFrom16(s.ID.Dst).Unmap()
	}
	return netip.AddrPortFrom(a, s.ID.DPort)
}

// conn is a NETLINK_SOCK_DIAG socket that carries one request at a time.
type conn struct {
	fd  int
	seq uint32
	buf []byte
}

// dial opens a NETLINK_SOCK_DIAG socket in the calling thread's network
// namespace. The socket stays in that namespace for its whole life.
func dial() (*conn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return nil, fmt.Errorf("open sock_diag netlink socket: %w", err)
	}
	return &conn{fd: fd, buf: make([]byte, recvBufSize)}, nil
}

func (c *conn) close() error { return unix.Close(c.fd) }

// execute sends req as a message of type typ and reads the replies until the
// kernel ends them (NLMSG_DONE, or NLMSG_ERROR, which is also the ack). It
// calls fn with the payload of every other reply. A kernel error comes back
// as a unix.Errno.
func (c *conn) execute(typ, flags uint16, req *request, fn func([]byte) error) error {
	c.seq++
	msg := make([]byte, unix.SizeofNlMsghdr+sizeofReqV2)
	binary.NativeEndian.PutUint32(msg[0:], uint32(len(msg)))
	binary.NativeEndian.PutUint16(msg[4:], typ)
	binary.NativeEndian.PutUint16(msg[6:], flags|unix.NLM_F_REQUEST)
	binary.NativeEndian.PutUint32(msg[8:], c.seq)
	req.marshal(msg[unix.SizeofNlMsghdr:])
	if err := unix.Sendto(c.fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	for {
		n, _, rflags, from, err := unix.Recvmsg(c.fd, c.buf, nil, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("receive: %w", err)
		}
		if rflags&unix.MSG_TRUNC != 0 {
			return fmt.Errorf("receive: reply truncated to %d bytes", len(c.buf))
		}
		// Only the kernel (port 0) may answer; anything else is not ours.
		if sa, ok := from.(*unix.SockaddrNetlink); !ok || sa.Pid != 0 {
			continue
		}
		done, err := c.parse(c.buf[:n], fn)
		if done || err != nil {
			return err
		}
	}
}

// parse handles one datagram of netlink messages and reports whether it
// ended the reply to the current request.
func (c *conn) parse(b []byte, fn func([]byte) error) (bool, error) {
	for len(b) >= unix.SizeofNlMsghdr {
		l := int(binary.NativeEndian.Uint32(b[0:]))
		typ := binary.NativeEndian.Uint16(b[4:])
		seq := binary.NativeEndian.Uint32(b[8:])
		if l < unix.SizeofNlMsghdr || l > len(b) {
			return true, fmt.Errorf("receive: malformed netlink message (length %d of %d bytes)", l, len(b))
		}
		payload := b[unix.SizeofNlMsghdr:l]
		b = b[min(nlmsgAlign(l), len(b)):]
		if seq != c.seq {
			continue // a late reply to an earlier request
		}
		switch typ {
		case unix.NLMSG_DONE:
			// Since Linux 4.x a dump's NLMSG_DONE carries its error.
			if len(payload) >= 4 {
				if e := int32(binary.NativeEndian.Uint32(payload)); e < 0 {
					return true, unix.Errno(-e)
				}
			}
			return true, nil
		case unix.NLMSG_ERROR:
			if len(payload) < 4 {
				return true, fmt.Errorf("receive: short NLMSG_ERROR of %d bytes", len(payload))
			}
			if e := int32(binary.NativeEndian.Uint32(payload)); e < 0 {
				return true, unix.Errno(-e)
			}
			return true, nil
		default:
			if err := fn(payload); err != nil {
				return true, err
			}
		}
	}
	return false, nil
}

func nlmsgAlign(l int) int { return (l + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }
