package netlab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// requestLine is what a client sends; the echo server ignores its content.
const requestLine = "ping\n"

// Reply is an echo server's answer to one request.
type Reply struct {
	// Backend is the name the answering echo server was started with.
	Backend string
	// Peer is the client's address as the server saw it: the client's own
	// address unless something translated it on the way.
	Peer netip.AddrPort
	// Remote is the address the client talked to: the TCP connection's
	// remote address, or the source of the UDP reply datagram.
	Remote netip.AddrPort
	// Local is the client socket's address.
	Local netip.AddrPort
}

// DialOption configures the client socket of Dial and Request.
type DialOption func(*dialConfig)

type dialConfig struct {
	localPort      uint16
	portLo, portHi uint16
}

// WithLocalPort binds the client socket to port, with SO_REUSEADDR so that
// the port can be bound while an earlier connection from it is in TIME_WAIT.
// (Connecting to the same server from the same port fails with
// EADDRNOTAVAIL until that TIME_WAIT ends.)
func WithLocalPort(port uint16) DialOption {
	return func(c *dialConfig) { c.localPort = port }
}

// WithLocalPortRange makes the kernel pick the client socket's port from
// lo..hi, inclusive (IP_LOCAL_PORT_RANGE, Linux 6.3 or later), rather than
// from the namespace's net.ipv4.ip_local_port_range.
func WithLocalPortRange(lo, hi uint16) DialOption {
	return func(c *dialConfig) { c.portLo, c.portHi = lo, hi }
}

// control sets the socket options of c on a new client socket.
func (c *dialConfig) control(network, _ string, rc syscall.RawConn) error {
	var err error
	cerr := rc.Control(func(fd uintptr) {
		s := int(fd)
		if c.localPort != 0 {
			err = unix.SetsockoptInt(s, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
		}
		if err == nil && c.portHi != 0 {
			err = unix.SetsockoptInt(s, unix.SOL_IP, unix.IP_LOCAL_PORT_RANGE, int(uint32(c.portHi)<<16|uint32(c.portLo)))
		}
		// Report ICMP errors (port, host or net unreachable) to reads on
		// UDP sockets, connected or not, so that a rejected UDP request
		// fails with ECONNREFUSED and friends rather than timing out.
		if err == nil && network == "udp4" {
			err = unix.SetsockoptInt(s, unix.SOL_IP, unix.IP_RECVERR, 1)
		}
		if err == nil && network == "udp6" {
			err = unix.SetsockoptInt(s, unix.SOL_IPV6, unix.IPV6_RECVERR, 1)
		}
	})
	if cerr != nil {
		return cerr
	}
	if err != nil {
		return fmt.Errorf("set socket options: %w", err)
	}
	return nil
}

// parseDial checks a Dial or Request's arguments and returns the
// family-specific network ("tcp4", "udp6", ...), the destination and the
// options.
func parseDial(network, addr string, opts []DialOption) (string, netip.AddrPort, *dialConfig, error) {
	dst, err := netip.ParseAddrPort(addr)
	if err != nil {
		return "", dst, nil, fmt.Errorf("dial %s %s: want a literal address and port: %w", network, addr, err)
	}
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	proto := strings.TrimRight(network, "46")
	if proto != "tcp" && proto != "udp" {
		return "", dst, nil, fmt.Errorf("dial %s %s: unsupported network", network, addr)
	}
	fnet := family(proto, dst.Addr())
	if network != proto && network != fnet {
		return "", dst, nil, fmt.Errorf("dial %s %s: address family does not match the network", network, addr)
	}
	cfg := &dialConfig{}
	for _, o := range opts {
		o(cfg)
	}
	if cfg.localPort != 0 && cfg.portHi != 0 {
		return "", dst, nil, fmt.Errorf("dial %s %s: WithLocalPort and WithLocalPortRange exclude each other", network, addr)
	}
	if cfg.portHi != 0 && (cfg.portLo == 0 || cfg.portLo > cfg.portHi) {
		return "", dst, nil, fmt.Errorf("dial %s %s: invalid local port range %d-%d", network, addr, cfg.portLo, cfg.portHi)
	}
	return fnet, dst, cfg, nil
}

// family returns proto ("tcp" or "udp") restricted to a's address family.
func family(proto string, a netip.Addr) string {
	if a.Is4() {
		return proto + "4"
	}
	return proto + "6"
}

// Dial connects from inside the namespace to addr, a literal "ip:port", over
// network ("tcp" or "udp", optionally with 4 or 6). A UDP Conn is connected:
// it only accepts datagrams from addr.
//
// Without a deadline in ctx, Dial gives up after DefaultTimeout. Errors keep
// their cause: errors.Is(err, syscall.ECONNREFUSED) tells a refusal, and
// IsTimeout(err) a timeout.
//
// A TCP connect fails at once on a RST, and usually on an ICMP error. But
// when an ICMPv6 error comes back before the connect system call has
// released the socket (netstat's TcpExtLockDroppedIcmps; it happens within
// one host), the kernel keeps it as a soft error and fails the connect only
// when the retransmitted SYN draws a second one, about a second later.
func (n *NS) Dial(ctx context.Context, network, addr string, opts ...DialOption) (*Conn, error) {
	fnet, dst, cfg, err := parseDial(network, addr, opts)
	if err != nil {
		return nil, err
	}
	ctx, cancel := withDefaultTimeout(ctx, DefaultTimeout)
	defer cancel()
	d := net.Dialer{Control: cfg.control}
	if cfg.localPort != 0 {
		local := netip.AddrPortFrom(unspecified(dst.Addr()), cfg.localPort)
		if strings.HasPrefix(fnet, "tcp") {
			d.LocalAddr = net.TCPAddrFromAddrPort(local)
		} else {
			d.LocalAddr = net.UDPAddrFromAddrPort(local)
		}
	}
	var c net.Conn
	err = n.Do(func() error {
		var err error
		c, err = d.DialContext(ctx, fnet, dst.String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial %s %s from netns %s: %w", fnet, dst, n.name, err)
	}
	return newConn(c), nil
}

// Request sends one request from inside the namespace to the echo server at
// addr (see Dial) and returns its reply.
//
// Over TCP it dials, sends a line, reads one and closes the connection.
// Over UDP it sends a datagram from an unconnected socket and takes the first
// datagram that comes back from any address, so Reply.Remote shows where the
// reply really came from; ICMP errors still fail the request (with
// ECONNREFUSED for a port unreachable, say).
//
// Without a deadline in ctx, Request gives up after DefaultTimeout.
func (n *NS) Request(ctx context.Context, network, addr string, opts ...DialOption) (Reply, error) {
	fnet, dst, cfg, err := parseDial(network, addr, opts)
	if err != nil {
		return Reply{}, err
	}
	ctx, cancel := withDefaultTimeout(ctx, DefaultTimeout)
	defer cancel()
	if strings.HasPrefix(fnet, "tcp") {
		c, err := n.Dial(ctx, fnet, dst.String(), opts...)
		if err != nil {
			return Reply{}, err
		}
		defer c.Close()
		return c.Request(ctx)
	}
	r, err := n.requestUDP(ctx, fnet, dst, cfg)
	if err != nil {
		return Reply{}, fmt.Errorf("request %s %s from netns %s: %w", fnet, dst, n.name, err)
	}
	return r, nil
}

func (n *NS) requestUDP(ctx context.Context, fnet string, dst netip.AddrPort, cfg *dialConfig) (Reply, error) {
	var pc net.PacketConn
	err := n.Do(func() error {
		// Bind to the address the kernel would send from, so that
		// Reply.Local is a real address, not a wildcard.
		probe, err := net.DialUDP(fnet, nil, net.UDPAddrFromAddrPort(dst))
		if err != nil {
			return err
		}
		src := addrPortOf(probe.LocalAddr()).Addr()
		probe.Close()
		lc := net.ListenConfig{Control: cfg.control}
		pc, err = lc.ListenPacket(ctx, fnet, netip.AddrPortFrom(src, cfg.localPort).String())
		return err
	})
	if err != nil {
		return Reply{}, err
	}
	defer pc.Close()
	uc := pc.(*net.UDPConn)
	defer deadlineFrom(ctx, uc)()
	if _, err := uc.WriteToUDPAddrPort([]byte(requestLine), dst); err != nil {
		return Reply{}, err
	}
	buf := make([]byte, 512)
	m, from, err := uc.ReadFromUDPAddrPort(buf)
	if err != nil {
		return Reply{}, err
	}
	backend, peer, err := parseReply(string(buf[:m]))
	if err != nil {
		return Reply{}, err
	}
	return Reply{
		Backend: backend,
		Peer:    peer,
		Remote:  netip.AddrPortFrom(from.Addr().Unmap(), from.Port()),
		Local:   addrPortOf(uc.LocalAddr()),
	}, nil
}

// Conn is a connection to an echo server, made by Dial. Use Request for
// request-reply exchanges; do not mix it with direct reads.
type Conn struct {
	net.Conn
	r *bufio.Reader // nil for UDP, which reads whole datagrams
}

func newConn(c net.Conn) *Conn {
	cc := &Conn{Conn: c}
	if _, ok := c.(*net.TCPConn); ok {
		cc.r = bufio.NewReaderSize(c, 512)
	}
	return cc
}

// Request sends one request line on the connection and reads the reply.
// Without a deadline in ctx it gives up after DefaultTimeout; a failed
// Request may leave a reply in flight, so close the Conn after an error.
func (c *Conn) Request(ctx context.Context) (Reply, error) {
	ctx, cancel := withDefaultTimeout(ctx, DefaultTimeout)
	defer cancel()
	defer deadlineFrom(ctx, c.Conn)()
	r, err := c.exchange()
	if err != nil {
		return Reply{}, fmt.Errorf("request %s %s: %w", c.RemoteAddr().Network(), c.RemoteAddr(), err)
	}
	return r, nil
}

func (c *Conn) exchange() (Reply, error) {
	if _, err := io.WriteString(c.Conn, requestLine); err != nil {
		return Reply{}, err
	}
	var line string
	if c.r != nil {
		b, err := c.r.ReadSlice('\n')
		if err != nil {
			return Reply{}, err
		}
		line = string(b)
	} else {
		buf := make([]byte, 512)
		m, err := c.Conn.Read(buf)
		if err != nil {
			return Reply{}, err
		}
		line = string(buf[:m])
	}
	backend, peer, err := parseReply(line)
	if err != nil {
		return Reply{}, err
	}
	return Reply{Backend: backend, Peer: peer, Remote: addrPortOf(c.RemoteAddr()), Local: addrPortOf(c.LocalAddr())}, nil
}

// deadlineFrom applies ctx's deadline to c, and makes ctx's cancellation
// interrupt c's pending I/O. The returned function undoes both.
func deadlineFrom(ctx context.Context, c interface{ SetDeadline(time.Time) error }) (undo func()) {
	dl, _ := ctx.Deadline()
	c.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	return func() {
		stop()
		c.SetDeadline(time.Time{})
	}
}

func parseReply(line string) (string, netip.AddrPort, error) {
	backend, peer, ok := strings.Cut(strings.TrimSuffix(line, "\n"), " ")
	if !ok || backend == "" {
		return "", netip.AddrPort{}, fmt.Errorf("malformed reply %q", line)
	}
	ap, err := netip.ParseAddrPort(peer)
	if err != nil {
		return "", netip.AddrPort{}, fmt.Errorf("malformed reply %q: %w", line, err)
	}
	return backend, ap, nil
}

// IsTimeout reports whether err means that a deadline passed before the peer
// answered, as opposed to a refusal or an ICMP error.
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout())
}

// addrPortOf returns the address of a TCP or UDP socket, with IPv4-mapped
// IPv6 addresses unmapped.
func addrPortOf(a net.Addr) netip.AddrPort {
	var ap netip.AddrPort
	switch a := a.(type) {
	case *net.TCPAddr:
		ap = a.AddrPort()
	case *net.UDPAddr:
		ap = a.AddrPort()
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

func unspecified(a netip.Addr) netip.Addr {
	if a.Is4() {
		return netip.IPv4Unspecified()
	}
	return netip.IPv6Unspecified()
}
