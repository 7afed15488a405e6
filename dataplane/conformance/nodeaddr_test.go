package conformance

import (
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// nodeNetWait bounds how long vipd may take to follow a change of node1's
// addresses (its watcher debounces for 100ms, then the dataplane applies).
const nodeNetWait = 5 * time.Second

// setNode1Addr adds (add) or removes the address a, as a host route, on
// node1's uplink; the upstream router sends extRange4/6, which holds it,
// to node1 either way.
func (e *env) setNode1Addr(a netip.Addr, add bool) {
	e.t.Helper()
	err := e.lab.Node(1).Do(func() error {
		l, err := netlink.LinkByName(e.lab.Node(1).Uplink())
		if err != nil {
			return err
		}
		addr := &netlink.Addr{IPNet: ipNetOf(netip.PrefixFrom(a, a.BitLen())), Flags: unix.IFA_F_NODAD}
		if add {
			return netlink.AddrAdd(l, addr)
		}
		return netlink.AddrDel(l, addr)
	})
	if err != nil {
		e.fatalf("add (%v) address %v on node1: %v", add, a, err)
	}
}

// within polls a request from h to dst until answered (want true) or not
// answered (want false), for up to nodeNetWait, and reports how long that
// took, failing the scenario when it never happens.
func (e *env) within(h host, proto string, dst netip.AddrPort, want bool, what string) time.Duration {
	e.t.Helper()
	start := time.Now()
	for {
		_, err := request(h, proto, dst, 500*time.Millisecond)
		if (err == nil) == want {
			return time.Since(start)
		}
		if time.Since(start) > nodeNetWait {
			e.fatalf("%s %v from %s: %s, still not so after %v (last: %v)", upper(proto), dst, h.name, what, nodeNetWait, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// should serve a node port on an address added to the node while vipd
// runs, within moments (the node-network watcher), and stop serving it
// once the address is removed, over TCP and UDP, IPv4 and IPv6.
func nodePortAddressAddedRemoved(e *env) {
	svc := e.externalService(ports(withNodePort(tcpPort(80, 8080), nodePort), withNodePort(udpPort(80, 8081), nodePort)), e.be1, e.be4)
	if !e.upsertExternal(svc) {
		return
	}
	for _, f := range families {
		a := f.externalIP(99) // routed to node1, owned by nothing yet
		np := ap(a, nodePort)
		e.expectDead(e.out, "tcp", np)
		e.setNode1Addr(a, true)
		took := e.within(e.out, "tcp", np, true, "the node port on an address added to node1 answers")
		e.logf("node port on %v served %v after the address was added", a, took.Round(time.Millisecond))
		e.expectSeenAs(e.out, "tcp", np, e.masqueraded(f), 20, echoes(8080, e.be1, e.be4)...)
		e.expectSeenAs(e.out, "udp", np, e.masqueraded(f), 20, echoes(8081, e.be1, e.be4)...)
		e.setNode1Addr(a, false)
		took = e.within(e.out, "tcp", np, false, "the node port on an address removed from node1 stops answering")
		e.logf("node port on %v not served %v after the address was removed", a, took.Round(time.Millisecond))
		e.expectDead(e.out, "tcp", np)
		e.expectDead(e.out, "udp", np)
		// The node's own addresses are served throughout.
		e.expectSeenAs(e.out, "tcp", ap(e.node1.addr(f), nodePort), e.masqueraded(f), 20, echoes(8080, e.be1, e.be4)...)
	}
}

func ipNetOf(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
