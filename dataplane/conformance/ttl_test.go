package conformance

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ttlPort is the port of the UDP servers that report the TTL (IPv4) or
// hop limit (IPv6) a datagram arrived with.
const ttlPort = 9001

// recvTTL makes c report the TTL or hop limit of what it receives.
func recvTTL(c *net.UDPConn, v6 bool) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		if v6 {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVHOPLIMIT, 1)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVTTL, 1)
		}
	})
	if err != nil {
		return err
	}
	return serr
}

// readTTL reads one datagram from c and the TTL or hop limit it came with.
func readTTL(c *net.UDPConn) ([]byte, netip.AddrPort, int, error) {
	b, oob := make([]byte, 512), make([]byte, 512)
	n, oobn, _, from, err := c.ReadMsgUDPAddrPort(b, oob)
	if err != nil {
		return nil, from, 0, err
	}
	msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return nil, from, 0, err
	}
	for _, m := range msgs {
		if (m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_TTL) ||
			(m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_HOPLIMIT) {
			if len(m.Data) >= 4 {
				return b[:n], from, int(int32(uint32(m.Data[0]) | uint32(m.Data[1])<<8 | uint32(m.Data[2])<<16 | uint32(m.Data[3])<<24)), nil
			}
			return b[:n], from, int(m.Data[0]), nil
		}
	}
	return b[:n], from, 0, fmt.Errorf("no TTL in the control messages")
}

// startTTLServer answers each datagram to h's ttlPort with "<name> <ttl>",
// the TTL or hop limit it arrived with.
func (e *env) startTTLServer(h host) {
	e.t.Helper()
	for _, f := range families {
		var c *net.UDPConn
		err := h.NS.Do(func() (err error) {
			c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(ap(h.addr(f), ttlPort)))
			if err != nil {
				return err
			}
			return recvTTL(c, f == ipv6)
		})
		if err != nil {
			e.fatalf("TTL server on %s: %v", h.name, err)
		}
		e.t.Cleanup(func() { c.Close() })
		go func() {
			for {
				_, from, ttl, err := readTTL(c)
				if err != nil {
					if strings.Contains(err.Error(), "closed") {
						return
					}
					continue
				}
				c.WriteToUDPAddrPort([]byte(h.name+" "+strconv.Itoa(ttl)), from)
			}
		}()
	}
}

// ttlExchange sends one datagram from h to dst and returns who answered,
// the TTL the backend saw and the TTL of the reply as h saw it.
func ttlExchange(h host, dst netip.AddrPort) (backend string, there, back int, err error) {
	var c *net.UDPConn
	err = h.NS.Do(func() (err error) {
		c, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(dst))
		if err != nil {
			return err
		}
		return recvTTL(c, dst.Addr().Is6())
	})
	if err != nil {
		return "", 0, 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(replyDeadline))
	if _, err := c.Write([]byte("ttl?")); err != nil {
		return "", 0, 0, err
	}
	b, _, back, err := readTTL(c)
	if err != nil {
		return "", 0, 0, err
	}
	name, t, ok := strings.Cut(string(b), " ")
	there, cerr := strconv.Atoi(t)
	if !ok || cerr != nil {
		return "", 0, 0, fmt.Errorf("bad reply %q", b)
	}
	return name, there, back, nil
}

// should decrement the TTL (IPv4) or hop limit (IPv6) at node1 as
// forwarding does, both ways, for masqueraded (CLUSTER) node-port flows
// to a local and a remote backend, as kube-proxy's forwarding does: out
// sends with 64; the router and node1 take one each to be1, the router,
// node1, the router again and node2 one each to be4; the replies pass
// as many hops back.
func nodePortTTL(e *env) {
	svc := e.externalService(ports(withNodePort(udpPort(70, ttlPort), nodePort)), e.be1, e.be4)
	if !e.upsertExternal(svc) {
		return
	}
	e.startTTLServer(e.be1)
	e.startTTLServer(e.be4)
	want := map[string]int{e.be1.name: 62, e.be4.name: 60}
	for _, f := range families {
		np := ap(e.node1.addr(f), nodePort)
		seen := map[string]bool{}
		for i := 0; len(seen) < len(want); i++ {
			if i == 60 {
				e.fatalf("UDP %v from out: 60 datagrams reached only %v, want be1 and be4", np, seen)
			}
			b, there, back, err := ttlExchange(e.out, np)
			if err != nil {
				e.fatalf("UDP %v from out: %v", np, err)
			}
			if there != want[b] || back != want[b] {
				e.fatalf("UDP %v from out, answered by %s: TTL %d there and %d back, want %d both ways (64 less a hop per router and node forwarding)",
					np, b, there, back, want[b])
			}
			seen[b] = true
		}
	}
}
