package ebpf

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vipd/vipd/dataplane"
)

// clsactFilters counts vipd's clsact filters on the node's pod veths.
func (e *dpEnv) clsactFilters() int {
	e.t.Helper()
	n := 0
	err := e.node.Do(func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			n += vipdClsactFilters(l)
		}
		return nil
	})
	if err != nil {
		e.t.Fatalf("list clsact filters: %v", err)
	}
	return n
}

// vipdClsactFilters counts vipd's clsact filters on link l, in ingress and
// egress; run it in l's namespace.
func vipdClsactFilters(l netlink.Link) int {
	n := 0
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		filters, err := netlink.FilterList(l, parent)
		if err != nil {
			continue
		}
		for _, f := range filters {
			if bf, ok := f.(*netlink.BpfFilter); ok && bf.Name == filterName {
				n++
			}
		}
	}
	return n
}

// TestTCAttachModes runs traffic with the clsact fallback (what kernels
// without tcx get), then restarts onto tcx and back: each switch leaves the
// programs attached exactly once, and traffic flows throughout.
func TestTCAttachModes(t *testing.T) {
	e := newDPEnv(t, []string{"client", "be1", "be2"}, dpSmallMaps)
	vip := netip.MustParseAddr("198.19.0.10")
	svc := e.service("svc", vip, dataplane.TCP, dpReady("be1"), dpReady("be2"))

	e.cfg.TCAttach = TCAttachClsact
	e.open(nil)
	e.apply(dpState(1, nil, svc))
	e.expectBackends(vip, "be1", "be2")
	// 3 veths, ingress and egress.
	if n, tcx := e.clsactFilters(), len(e.tcPrograms()); n != 6 || tcx != 0 {
		t.Fatalf("clsact mode: %d vipd clsact filters and %d tcx attachments, want 6 and 0", n, tcx)
	}
	ctx, cancel := context.WithTimeout(context.Background(), dpReplyTimeout)
	defer cancel()
	c, err := e.pod("client").Dial(ctx, "tcp", dpVIPPort(vip))
	if err != nil {
		t.Fatalf("dial %s: %v", vip, err)
	}
	defer c.Close()
	first := connRequest(t, c, "on clsact")
	e.close()

	e.cfg.TCAttach = TCAttachTCX
	e.open(nil)
	e.apply(dpState(2, nil, svc))
	if n, tcx := e.clsactFilters(), len(e.tcPrograms()); n != 0 || tcx != 6 {
		t.Fatalf("after switching to tcx: %d clsact filters and %d tcx attachments, want 0 and 6", n, tcx)
	}
	e.expectBackends(vip, "be1", "be2")
	if got := connRequest(t, c, "after switching to tcx"); got != first {
		t.Fatalf("established connection answered by %s after switching to tcx, want %s", got, first)
	}
	e.close()

	e.cfg.TCAttach = TCAttachClsact
	e.open(nil)
	e.apply(dpState(3, nil, svc))
	if n, tcx := e.clsactFilters(), len(e.tcPrograms()); n != 6 || tcx != 0 {
		t.Fatalf("after switching back to clsact: %d clsact filters and %d tcx attachments, want 6 and 0", n, tcx)
	}
	e.expectBackends(vip, "be1", "be2")
	if got := connRequest(t, c, "after switching back to clsact"); got != first {
		t.Fatalf("established connection answered by %s after switching back, want %s", got, first)
	}
}

// TestNewPodInterface checks that a pod whose interface appears after vipd
// attached is served too (the netlink link subscription), and that
// interfaces outside --pod-interfaces are left alone.
func TestNewPodInterface(t *testing.T) {
	e := newDPEnv(t, []string{"client", "be1"}, dpSmallMaps)
	vip := netip.MustParseAddr("198.19.0.10")
	e.open(nil)
	e.apply(dpState(1, nil, e.service("svc", vip, dataplane.TCP, dpReady("be1"))))
	e.expectBackends(vip, "be1")

	late, err := e.node.AddPod(context.Background(), "late")
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		backend string
		err     error
	}
	for range 50 { // the subscription attaches within milliseconds
		ctx, cancel := context.WithTimeout(context.Background(), dpDeadTimeout)
		rep, err := late.Request(ctx, "tcp", dpVIPPort(vip))
		cancel()
		r.backend, r.err = rep.Backend, err
		if err == nil {
			break
		}
	}
	if r.err != nil || r.backend != "be1" {
		t.Fatalf("request from a pod added after vipd started: got %q, %v; want be1", r.backend, r.err)
	}
	if got := e.tcPrograms()[late.HostVeth()+"/ingress"]; got != 1 {
		t.Fatalf("tcx programs on %s ingress: %d, want 1", late.HostVeth(), got)
	}
	if got := e.tcPrograms()["lo/ingress"]; got != 0 {
		t.Fatalf("tcx programs on lo: %d, want 0 (not a pod interface)", got)
	}
}

// TestNeverUsedIDsFirstAfterRestart: a restarted vipd hands out
// never-used backend IDs before it recycles one freed before the restart
// (the programs' slot check keeps a recycled ID safe, backendids.go; this
// keeps it rare).
func TestNeverUsedIDsFirstAfterRestart(t *testing.T) {
	e := newDPEnv(t, []string{"client", "be1", "be2", "be3"}, dpSmallMaps)
	vip := netip.MustParseAddr("198.19.0.10")
	e.open(nil)
	e.apply(dpState(1, nil, e.service("svc", vip, dataplane.TCP, dpReady("be1"), dpReady("be2"))))
	old := dpSnapshot(t, &e.dp.objs.bpfMaps).backendID(t, e.pod("be2").IPv4())
	e.apply(dpState(2, []string{"svc"}, e.service("svc", vip, dataplane.TCP, dpReady("be1"))))
	e.close()

	e.open(nil)
	e.apply(dpState(3, nil, e.service("svc", vip, dataplane.TCP, dpReady("be1"), dpReady("be3"))))
	if got := dpSnapshot(t, &e.dp.objs.bpfMaps).backendID(t, e.pod("be3").IPv4()); got <= old {
		t.Fatalf("be3 got backend ID %d after the restart; be2 had %d before it: never-used IDs come before freed ones", got, old)
	}
	e.expectBackends(vip, "be1", "be3")
}

// TestResizeOneMapKeepsConntrack: restarting with another event-ring size
// replaces that map alone; conntrack survives, and with it an established
// connection.
func TestResizeOneMapKeepsConntrack(t *testing.T) {
	e := newDPEnv(t, []string{"client", "be1", "be2"}, dpSmallMaps)
	vip := netip.MustParseAddr("198.19.0.10")
	svc := e.service("svc", vip, dataplane.TCP, dpReady("be1"), dpReady("be2"))
	e.open(nil)
	e.apply(dpState(1, nil, svc))
	ctx, cancel := context.WithTimeout(context.Background(), dpReplyTimeout)
	defer cancel()
	c, err := e.pod("client").Dial(ctx, "tcp", dpVIPPort(vip))
	if err != nil {
		t.Fatalf("dial %s: %v", vip, err)
	}
	defer c.Close()
	first := connRequest(t, c, "before the restart")
	ctInfo, err := e.dp.objs.VipdCt.Info()
	if err != nil {
		t.Fatal(err)
	}
	ctID, _ := ctInfo.ID()
	evInfo, err := e.dp.objs.VipdEvents.Info()
	if err != nil {
		t.Fatal(err)
	}
	evID, _ := evInfo.ID()
	e.close()

	e.cfg.Maps.Events = 1 << 20
	e.open(nil)
	e.apply(dpState(2, nil, svc))
	if info, err := e.dp.objs.VipdCt.Info(); err != nil {
		t.Fatal(err)
	} else if id, _ := info.ID(); id != ctID {
		t.Errorf("conntrack map was replaced (ID %d, was %d) when only the event ring changed size", id, ctID)
	}
	if info, err := e.dp.objs.VipdEvents.Info(); err != nil {
		t.Fatal(err)
	} else if id, _ := info.ID(); id == evID || e.dp.objs.VipdEvents.MaxEntries() != 1<<20 {
		t.Errorf("event ring: ID %d (was %d), %d bytes; want a new map of %d bytes", id, evID, e.dp.objs.VipdEvents.MaxEntries(), 1<<20)
	}
	if got := connRequest(t, c, "after the restart"); got != first {
		t.Fatalf("established connection answered by %s after resizing the event ring, want %s", got, first)
	}
	e.expectBackends(vip, "be1", "be2")
}

// TestDeletedServiceDrains: deleting a service leaves its established TCP
// connections working, as conntrack's DNAT does under iptables, while new
// connections to the VIP are no longer translated; once the last flow is
// gone, the collector removes the draining entries.
func TestDeletedServiceDrains(t *testing.T) {
	e := newDPEnv(t, []string{"client", "be1"}, dpSmallMaps)
	e.cfg.GCInterval = 200 * time.Millisecond
	e.cfg.ConntrackTimeouts = ConntrackTimeouts{TCPClose: time.Second}
	vip := netip.MustParseAddr("198.19.0.10")
	e.open(nil)
	e.apply(dpState(1, nil, e.service("svc", vip, dataplane.TCP, dpReady("be1"))))
	ctx, cancel := context.WithTimeout(context.Background(), dpReplyTimeout)
	defer cancel()
	c, err := e.pod("client").Dial(ctx, "tcp", dpVIPPort(vip))
	if err != nil {
		t.Fatalf("dial %s: %v", vip, err)
	}
	connRequest(t, c, "before the delete")

	e.apply(dpState(2, []string{"svc"}))
	for i := range 3 {
		if got := connRequest(t, c, "after the service was deleted"); got != "be1" {
			t.Fatalf("request %d on the established connection after the delete answered by %s, want be1", i, got)
		}
	}
	e.expectDead(vip)
	master := svcKeyOf(feKey{addr: vip, port: 80, proto: ipprotoTCP}, 0)
	var v bpfSvcVal
	if err := e.dp.objs.VipdServices.Lookup(&master, &v); err != nil || v.Flags&svcFlagDraining == 0 {
		t.Fatalf("master entry while a flow drains: %+v, %v; want a draining one", v, err)
	}

	c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for e.dp.objs.VipdServices.Lookup(&master, &v) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("the draining master is still there 10 s after its last flow closed: %+v", v)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The VIP can come back, and works at once.
	e.apply(dpState(3, []string{"svc"}, e.service("svc", vip, dataplane.TCP, dpReady("be1"))))
	e.expectBackends(vip, "be1")
}

// TestNodeLocalUnconnectedUDPSticks: datagrams of one unconnected node-local
// UDP socket (sendto per datagram) to a VIP stay on one backend, as a UDP
// conntrack entry would keep them, with replies from the VIP; when that
// backend leaves, the socket moves on.
func TestNodeLocalUnconnectedUDPSticks(t *testing.T) {
	e := newDPEnv(t, []string{"be1", "be2", "be3"}, dpSmallMaps)
	svc := e.service("test/udp", dpVIPA, dataplane.UDP, dpReady("be1"), dpReady("be2"), dpReady("be3"))
	e.open(nil)
	e.apply(dpState(1, nil, svc))
	vip := netip.AddrPortFrom(dpVIPA, 80)
	c := e.startUDPClient(vip)
	if line := c.do("open"); line != "ok" {
		t.Fatalf("open: %s", line)
	}
	sendto := func(what string) string {
		t.Helper()
		line := c.do("sendto")
		var backend, from string
		if _, err := fmt.Sscanf(line, "reply %s from %s", &backend, &from); err != nil {
			t.Fatalf("%s: the UDP client process said %q, want a reply", what, line)
		}
		if from != vip.String() {
			t.Fatalf("%s: reply from %s, want the VIP %s", what, from, vip)
		}
		return backend
	}
	first := sendto("datagram 1")
	for i := 2; i <= 20; i++ {
		if got := sendto(fmt.Sprintf("datagram %d", i)); got != first {
			t.Fatalf("datagram %d of one unconnected socket answered by %s, datagram 1 by %s: want one backend per socket", i, got, first)
		}
	}
	var rest []dpBE
	for _, b := range []string{"be1", "be2", "be3"} {
		if b != first {
			rest = append(rest, dpReady(b))
		}
	}
	svc2 := e.service("test/udp", dpVIPA, dataplane.UDP, rest...)
	svc2.Generation = 2
	e.apply(dpState(2, []string{svc2.Name}, svc2))
	moved := sendto("after its backend left")
	if moved == first {
		t.Fatalf("the socket still reaches %s, which left the service", first)
	}
	for i := range 5 {
		if got := sendto("after the move"); got != moved {
			t.Fatalf("datagram %d after the move answered by %s, then by %s", i, moved, got)
		}
	}
}
