package sockdiag

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vipd/vipd/internal/nsdo"
	"golang.org/x/sys/unix"
)

// DestroyUDP destroys the UDP sockets (IPv4 and IPv6, including IPv4-mapped
// on v6 sockets) in the network namespace at netnsPath ("" = the caller's
// current one) that are connected to one of dsts and whose cookie is in
// cookies. It returns how many it destroyed. Sockets not matching are never
// touched. A socket that vanished meanwhile (ENOENT) is not an error.
//
// A destination matches in either form: 10.0.0.1:53 and [::ffff:10.0.0.1]:53
// are the same, and zones are ignored. Only cookies mapped to true count.
// With no cookies or no valid destinations DestroyUDP returns 0 at once,
// without opening netnsPath.
//
// A destroyed socket is disconnected, and its next receive (or SO_ERROR)
// reports ECONNABORTED. DestroyUDP keeps going after a socket it fails to
// destroy; it returns how many it did destroy together with the joined
// errors. "" means the namespace of the calling OS thread, so a caller that
// moved its goroutine into a namespace must keep it locked to its thread.
func DestroyUDP(netnsPath string, dsts []netip.AddrPort, cookies map[uint64]bool) (int, error) {
	want := targets(dsts)
	if len(want) == 0 || !anyTrue(cookies) {
		return 0, nil
	}
	c, err := dialIn(netnsPath)
	if err != nil {
		return 0, fmt.Errorf("destroy udp sockets: %w", err)
	}
	defer c.close()
	// Order matters: collect every match first, destroy after the dumps end.
	// The netlink socket carries one request at a time, and destroying
	// unhashes sockets from the table a running dump is walking.
	socks, err := c.findUDP(want, cookies)
	if err != nil {
		return 0, fmt.Errorf("destroy udp sockets: %w", err)
	}
	return c.destroyAll(socks)
}

// targets returns dsts unmapped and without zones, as socket.dst reports
// them. Invalid entries are dropped.
func targets(dsts []netip.AddrPort) map[netip.AddrPort]bool {
	want := make(map[netip.AddrPort]bool, len(dsts))
	for _, d := range dsts {
		if !d.Addr().IsValid() {
			continue
		}
		want[netip.AddrPortFrom(d.Addr().Unmap().WithZone(""), d.Port())] = true
	}
	return want
}

func anyTrue(m map[uint64]bool) bool {
	for _, v := range m {
		if v {
			return true
		}
	}
	return false
}

// findUDP dumps the UDP sockets connected to a port of want and returns the
// ones whose destination is in want and whose cookie is in cookies, each
// once.
func (c *conn) findUDP(want map[netip.AddrPort]bool, cookies map[uint64]bool) ([]socket, error) {
	// The kernel filters a UDP dump by destination port (not address), so
	// dump each family once per port. A v6 socket can be connected to an
	// IPv4-mapped address, so an IPv4 destination needs both dumps.
	type query struct {
		family uint8
		port   uint16
	}
	queries := make(map[query]bool)
	for d := range want {
		queries[query{unix.AF_INET6, d.Port()}] = true
		if d.Addr().Is4() {
			queries[query{unix.AF_INET, d.Port()}] = true
		}
	}
	var found []socket
	seen := make(map[uint64]bool)
	for q := range queries {
		req := request{
			Family:   q.family,
			Protocol: unix.IPPROTO_UDP,
			States:   allStates,
			ID:       sockID{DPort: q.port},
		}
		err := c.execute(unix.SOCK_DIAG_BY_FAMILY, unix.NLM_F_DUMP, &req, func(b []byte) error {
			s, err := parseDiagMsg(b)
			if err != nil {
				return err
			}
			if s.Family == q.family && s.ID.Cookie != noCookie && cookies[s.ID.Cookie] &&
				!seen[s.ID.Cookie] && want[s.dst()] {
				seen[s.ID.Cookie] = true
				found = append(found, s)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("dump udp sockets (family %d, port %d): %w", q.family, q.port, err)
		}
	}
	return found, nil
}

// destroyAll destroys socks and returns how many it destroyed. A socket
// that is gone, or whose 4-tuple now belongs to a socket with another
// cookie, is skipped: the kernel answers ENOENT for both.
func (c *conn) destroyAll(socks []socket) (int, error) {
	n := 0
	var errs []error
	for _, s := range socks {
		req := request{Family: s.Family, Protocol: unix.IPPROTO_UDP, States: allStates, ID: s.ID}
		err := c.execute(unix.SOCK_DESTROY, unix.NLM_F_ACK, &req, func([]byte) error { return nil })
		switch {
		case err == nil:
			n++
		case errors.Is(err, unix.ENOENT):
		default:
			errs = append(errs, fmt.Errorf("destroy udp socket %s (cookie %d): %w", s.dst(), s.ID.Cookie, err))
		}
	}
	return n, errors.Join(errs...)
}

// dialIn opens a NETLINK_SOCK_DIAG socket in the network namespace at path,
// or in the calling thread's one for "". A socket belongs to the namespace
// it was created in, so only creating it needs the namespace.
func dialIn(path string) (*conn, error) {
	var c *conn
	err := nsdo.Do(path, func() error {
		var err error
		c, err = dial()
		return err
	})
	if err != nil {
		if c != nil {
			c.close()
		}
		return nil, fmt.Errorf("netns %s: %w", path, err)
	}
	return c, nil
}
