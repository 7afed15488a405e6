package conformance

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vipd/vipd/internal/testkit/netlab"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// Path MTU discovery through a node port: the ICMP errors a router sends
// about an external flow's packets ("fragmentation needed", ICMPv6
// "packet too big") reach the end that sent them, translated, as
// netfilter's conntrack translates a NATed connection's RELATED errors.

const (
	// bulkPort is the port of the bulk servers the PMTU scenario starts
	// on its backends, bulkSize what they send or take per connection.
	bulkPort = 9000
	bulkSize = 256 << 10
	// pmtuMTU is the lowered MTU of a router link (IPv6's minimum), below
	// the 1500 of every end, so that only PMTU discovery gets full-sized
	// segments through (the ends' MSS is 1460).
	pmtuMTU = 1280
	// bulkTimeout bounds one transfer: a path whose ICMP errors are lost
	// stalls for good (TCP's blackhole probing is off by default).
	bulkTimeout = 10 * time.Second
	// node2Link is node2's link on the upstream router (netlab names it so).
	node2Link = "node2"
)

// startBulk runs a bulk server in h's namespace on bulkPort of both its
// addresses until the scenario ends: "get\n" gets bulkSize bytes back;
// "put\n" and bulkSize bytes get "ok\n".
func (e *env) startBulk(h host) {
	e.t.Helper()
	for _, f := range families {
		var l net.Listener
		err := h.NS.Do(func() (err error) {
			l, err = net.Listen("tcp", ap(h.addr(f), bulkPort).String())
			return err
		})
		if err != nil {
			e.fatalf("bulk server on %s: %v", h.name, err)
		}
		e.t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go serveBulk(c)
			}
		}()
	}
}

func serveBulk(c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * bulkTimeout))
	r := bufio.NewReader(c)
	cmd, err := r.ReadString('\n')
	if err != nil {
		return
	}
	switch cmd {
	case "get\n":
		c.Write(make([]byte, bulkSize))
	case "put\n":
		if n, _ := io.CopyN(io.Discard, r, bulkSize); n == bulkSize {
			c.Write([]byte("ok\n"))
		}
	}
}

// bulk makes one transfer from h to dst: a download ("get") or an upload
// ("put") of bulkSize bytes.
func bulk(h host, cmd string, dst netip.AddrPort) error {
	var c net.Conn
	err := h.NS.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", dst.String(), rpcTimeout)
		return err
	})
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(bulkTimeout))
	if _, err := c.Write([]byte(cmd + "\n")); err != nil {
		return err
	}
	switch cmd {
	case "get":
		n, err := io.ReadFull(c, make([]byte, bulkSize))
		if err != nil {
			return fmt.Errorf("got %d of %d bytes: %w", n, bulkSize, err)
		}
	case "put":
		if n, err := c.Write(make([]byte, bulkSize)); err != nil {
			return fmt.Errorf("sent %d of %d bytes: %w", n, bulkSize, err)
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || line != "ok\n" {
			return fmt.Errorf("upload not acknowledged (%q): %w", line, errors.Join(err, errors.New("no ok")))
		}
	}
	return nil
}

// setRouterMTU sets the MTU of the upstream router's link named link.
func (e *env) setRouterMTU(link string, mtu int) {
	e.t.Helper()
	e.setMTU(e.lab.Upstream(), link, mtu)
}

// setMTU sets the MTU of the link named link in ns.
func (e *env) setMTU(ns *netlab.NS, link string, mtu int) {
	e.t.Helper()
	err := ns.Do(func() error {
		l, err := netlink.LinkByName(link)
		if err != nil {
			return err
		}
		return netlink.LinkSetMTU(l, mtu)
	})
	if err != nil {
		e.fatalf("set the MTU of %s's %s to %d: %v", ns, link, mtu, err)
	}
}

// should keep path MTU discovery working through a node port, both ways:
// with the router's link to the client at a lower MTU, downloads from a
// remote backend (CLUSTER: the error about the masqueraded reply goes to
// the backend) and from a local one under LOCAL (client address kept);
// with the router's link to the remote backend's node at a lower MTU,
// uploads from the client (the error about the masqueraded packet goes
// to the client); with node1's link to a local backend at a lower MTU,
// uploads under LOCAL (node1's own error, quoting the backend, goes to
// the client quoting the node port).
func nodePortPMTU(e *env) {
	cluster := e.externalService(ports(withNodePort(tcpPort(90, bulkPort), nodePort)), e.be4)
	if !e.upsertExternal(cluster) {
		return
	}
	local := e.externalService(ports(withNodePort(tcpPort(90, bulkPort), nodePort+1)), e.be1)
	local.Name = svcName + "-local"
	local.Vips = []string{ipv4.vip(11).String(), ipv6.vip(11).String()}
	local.ExternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	e.upsert(local)
	// be2, for the LOCAL upload: be1 learns a path MTU to out in the
	// download, and would announce a smaller MSS.
	local2 := e.externalService(ports(withNodePort(tcpPort(90, bulkPort), nodePort+2)), e.be2)
	local2.Name = svcName + "-local2"
	local2.Vips = []string{ipv4.vip(12).String(), ipv6.vip(12).String()}
	local2.ExternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	e.upsert(local2)
	e.startBulk(e.be4)
	e.startBulk(e.be1)
	e.startBulk(e.be2)
	outLink := e.lab.ExternalHost(e.out.name).RouterLink()

	for _, f := range families {
		// Full-sized segments pass at first: the transfers work without
		// PMTU discovery, so a failure below is its failure.
		if err := bulk(e.out, "get", ap(e.node1.addr(f), nodePort)); err != nil {
			e.fatalf("download through node port %v before any MTU change: %v", ap(e.node1.addr(f), nodePort), err)
		}
	}
	e.setRouterMTU(outLink, pmtuMTU)
	for _, f := range families {
		for _, c := range []struct {
			what string
			port uint16
		}{{"CLUSTER, remote backend be4", nodePort}, {"LOCAL, local backend be1", nodePort + 1}} {
			np := ap(e.node1.addr(f), c.port)
			if err := bulk(e.out, "get", np); err != nil {
				e.errorf("download of %d bytes through node port %v (%s) with the router's link to out at MTU %d: %v; "+
					"the router's error about the reply must reach the backend translated", bulkSize, np, c.what, pmtuMTU, err)
			}
		}
	}
	e.setRouterMTU(outLink, 1500)
	e.setRouterMTU(node2Link, pmtuMTU)
	for _, f := range families {
		np := ap(e.node1.addr(f), nodePort)
		if err := bulk(e.out, "put", np); err != nil {
			e.errorf("upload of %d bytes through node port %v (CLUSTER, remote backend be4) with the router's link to node2 at MTU %d: %v; "+
				"the router's error about the masqueraded packet must reach the client translated", bulkSize, np, pmtuMTU, err)
		}
	}
	e.setRouterMTU(node2Link, 1500)
	// LOCAL: node1 itself cannot forward the client's full-sized packets
	// to be2; its error quotes client -> be2 and must show the node port.
	// To node1's secondary address: out learnt the path MTU to its
	// primary one in the upload above.
	n1 := e.lab.Node(1)
	e.setMTU(n1.NS, n1.Pod("be2").HostVeth(), pmtuMTU)
	for _, f := range families {
		np := ap(n1.SecondaryIPv4(), nodePort+2)
		if f == ipv6 {
			np = ap(n1.SecondaryIPv6(), nodePort+2)
		}
		if err := bulk(e.out, "put", np); err != nil {
			e.errorf("upload of %d bytes through node port %v (LOCAL, local backend be2) with node1's link to be2 at MTU %d: %v; "+
				"node1's error about the packet to be2 must reach the client quoting the node port", bulkSize, np, pmtuMTU, err)
		}
	}
}
