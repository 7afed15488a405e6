package ebpf

// Drift tests: another tool detaches vipd's programs, rewrites its maps or
// replaces their pins; DetectDrift reports it and a full Apply repairs it,
// with real traffic from a pod (tc path) and from a node process in the
// test cgroup (socket hooks).

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/hashicorp/go-hclog"
	"github.com/vishvananda/netlink"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/internal/testkit/netlab"
	"github.com/vipd/vipd/internal/testkit/syncbuf"
)

// driftEnv is a dpEnv with a TCP service on dpVIPA, a UDP service on
// dpVIPB, a node process in the test cgroup to make node-local requests,
// and the dataplane's log at INFO.
type driftEnv struct {
	*dpEnv
	svcs  []*dataplane.Service
	gen   uint64
	local *netlab.Client
	log   *syncbuf.Buffer
}

func newDriftEnv(t *testing.T, mode string) *driftEnv {
	e := &driftEnv{dpEnv: newDPEnv(t, []string{"client", "be1", "be2"}, dpSmallMaps), log: &syncbuf.Buffer{}}
	e.cfg.TCAttach = mode
	e.svcs = []*dataplane.Service{
		e.service("test/tcp", dpVIPA, dataplane.TCP, dpReady("be1"), dpReady("be2")),
		e.service("test/udp", dpVIPB, dataplane.UDP, dpReady("be1"), dpReady("be2")),
	}
	e.open(hclog.New(&hclog.LoggerOptions{Output: e.log, Level: hclog.Info}))
	e.fullApply()
	local, err := e.node.StartClient(context.Background(), e.cgroup)
	if err != nil {
		t.Fatalf("start a node process in the test cgroup: %v", err)
	}
	t.Cleanup(func() { local.Close() })
	e.local = local
	e.expectWorks("after the first apply")
	e.expectNoDrift("after the first apply")
	return e
}

// fullApply applies the services with a nil Changed and returns what it
// logged at INFO.
func (e *driftEnv) fullApply() string {
	e.t.Helper()
	before := len(e.log.String())
	e.gen++
	e.apply(dpState(e.gen, nil, e.svcs...))
	return e.log.String()[before:]
}

// detect runs DetectDrift, with the service maps compared this time.
func (e *driftEnv) detect() []dataplane.Drift {
	e.t.Helper()
	e.dp.entriesChecked = time.Time{}
	drifts, err := e.dp.DetectDrift(context.Background())
	if err != nil {
		e.t.Fatalf("DetectDrift: %v", err)
	}
	return drifts
}

func (e *driftEnv) expectNoDrift(when string) {
	e.t.Helper()
	if d := e.detect(); len(d) > 0 {
		e.t.Fatalf("%s: DetectDrift reported %v, want nothing", when, d)
	}
}

// expectDrift checks that DetectDrift reports a drift what whose detail
// contains detail.
func (e *driftEnv) expectDrift(what, detail string) {
	e.t.Helper()
	drifts := e.detect()
	if !slices.ContainsFunc(drifts, func(d dataplane.Drift) bool {
		return d.What == what && strings.Contains(d.Detail, detail)
	}) {
		e.t.Fatalf("DetectDrift reported %v, want a %q drift saying %q", drifts, what, detail)
	}
}

// request makes one request: from the client pod, or with local from the
// node process in the test cgroup.
func (e *driftEnv) request(local bool, network string, vip netip.Addr, timeout time.Duration) (netlab.Reply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if local {
		return e.local.Request(ctx, network, dpVIPPort(vip))
	}
	return e.pod("client").Request(ctx, network, dpVIPPort(vip))
}

// expectWorks checks that TCP to dpVIPA and UDP to dpVIPB reach a backend
// from the pod and from the node.
func (e *driftEnv) expectWorks(when string) {
	e.t.Helper()
	for _, local := range []bool{false, true} {
		for _, c := range []struct {
			network string
			vip     netip.Addr
		}{{"tcp", dpVIPA}, {"udp", dpVIPB}} {
			r, err := e.request(local, c.network, c.vip, dpReplyTimeout)
			if err != nil {
				e.t.Fatalf("%s: %s request to %s (node-local %v): %v", when, c.network, c.vip, local, err)
			}
			if r.Backend != "be1" && r.Backend != "be2" {
				e.t.Fatalf("%s: %s request to %s (node-local %v) answered by %q", when, c.network, c.vip, local, r.Backend)
			}
		}
	}
}

// expectBroken checks that a request reaches no backend.
func (e *driftEnv) expectBroken(local bool, network string, vip netip.Addr, when string) {
	e.t.Helper()
	if r, err := e.request(local, network, vip, dpDeadTimeout); err == nil {
		e.t.Fatalf("%s: %s request to %s (node-local %v) answered by %s, want no translation", when, network, vip, local, r.Backend)
	}
}

// expectRepairLog checks that a full apply logged its repair, naming want.
func expectRepairLog(t *testing.T, logged string, want ...string) {
	t.Helper()
	if !strings.Contains(logged, "full apply changed the dataplane") {
		t.Fatalf("the repairing full apply logged %q, want a line saying what it changed", logged)
	}
	for _, w := range want {
		if !strings.Contains(logged, w) {
			t.Errorf("the repairing full apply logged %q, want it to say %q", logged, w)
		}
	}
}

// repairAndCheck runs a full apply, checks its log, that traffic works and
// that no drift is left, and that a further full apply logs nothing.
func (e *driftEnv) repairAndCheck(logWants ...string) {
	e.t.Helper()
	logged := e.fullApply()
	e.t.Logf("the repairing full apply logged: %s", logged)
	expectRepairLog(e.t, logged, logWants...)
	e.expectWorks("after the repairing full apply")
	e.expectNoDrift("after the repairing full apply")
	if logged := e.fullApply(); logged != "" {
		e.t.Fatalf("a full apply that changed nothing logged %q at INFO", logged)
	}
}

// TestDriftTCLinkDetached: a tcx link detached by hand (what `bpftool link
// detach` does) or unpinned stops the pod's traffic; DetectDrift names the
// interface and a full apply attaches the program again.
func TestDriftTCLinkDetached(t *testing.T) {
	e := newDriftEnv(t, TCAttachTCX)
	veth := e.pod("client").HostVeth()
	ifindex := e.ifindex(veth)

	l, err := link.LoadPinnedLink(e.dp.tc.pinPath(ifindex, "ingress"), nil)
	if err != nil {
		t.Fatalf("load the pinned tcx link: %v", err)
	}
	if err := l.Detach(); err != nil {
		t.Fatalf("detach the tcx link: %v", err)
	}
	l.Close()
	e.expectBroken(false, "tcp", dpVIPA, "with the tcx link detached")
	e.expectBroken(false, "udp", dpVIPB, "with the tcx link detached")
	e.expectDrift(driftTCLink, veth+" ingress: vipd_from_pod not attached")
	e.repairAndCheck("links_reattached=1", veth+" ingress: vipd_from_pod not attached")

	// An unpinned link goes with its last reference.
	if err := unpinLink(e.dp.tc.pinPath(ifindex, "egress")); err != nil {
		t.Fatalf("unpin the egress link: %v", err)
	}
	e.expectBroken(false, "tcp", dpVIPA, "with the egress tcx link unpinned")
	e.expectDrift(driftTCLink, veth+" egress: vipd_to_pod not attached")
	e.repairAndCheck(veth + " egress")
}

// TestDriftClsactFilterDeleted: `tc filter del dev <veth> ingress` removes
// vipd's clsact filter; DetectDrift names it and a full apply puts it back.
func TestDriftClsactFilterDeleted(t *testing.T) {
	e := newDriftEnv(t, TCAttachClsact)
	veth := e.pod("client").HostVeth()
	err := e.node.Do(func() error {
		l, err := netlink.LinkByName(veth)
		if err != nil {
			return err
		}
		filters, err := netlink.FilterList(l, netlink.HANDLE_MIN_INGRESS)
		if err != nil {
			return err
		}
		for _, f := range filters {
			if err := netlink.FilterDel(f); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("delete the ingress filters of %s: %v", veth, err)
	}
	e.expectBroken(false, "tcp", dpVIPA, "with the clsact filter deleted")
	e.expectBroken(false, "udp", dpVIPB, "with the clsact filter deleted")
	e.expectDrift(driftTCLink, veth+" ingress: vipd_from_pod not attached")
	e.repairAndCheck(veth + " ingress")
	if n := e.clsactFilters(); n != 6 {
		t.Fatalf("after the repair: %d vipd clsact filters, want 6 (3 veths, both directions)", n)
	}
}

// TestDriftCgroupHookDetached: the socket hooks' links detached by hand
// stop node-local traffic to VIPs; DetectDrift names the hooks and a full
// apply attaches them again.
func TestDriftCgroupHookDetached(t *testing.T) {
	e := newDriftEnv(t, TCAttachAuto)
	for _, hook := range []string{"connect4", "sendmsg4"} {
		l, err := link.LoadPinnedLink(filepath.Join(e.dp.linkDir(), "cgroup_"+hook), nil)
		if err != nil {
			t.Fatalf("load the pinned %s link: %v", hook, err)
		}
		if err := l.Detach(); err != nil {
			t.Fatalf("detach the %s link: %v", hook, err)
		}
		l.Close()
	}
	e.expectBroken(true, "tcp", dpVIPA, "with the connect4 hook detached")
	e.expectBroken(true, "udp", dpVIPB, "with the sendmsg4 hook detached")
	e.expectDrift(driftCgroupLink, "connect4: vipd_sock_connect4 not attached")
	e.expectDrift(driftCgroupLink, "sendmsg4: vipd_sock_sendmsg4 not attached")
	e.repairAndCheck("links_reattached=2", "connect4: vipd_sock_connect4 not attached", "sendmsg4")
	if got := e.cgroupPrograms(); len(got) != len(dpCgroupHooks) || slices.ContainsFunc(dpCgroupHooks, func(a ebpf.AttachType) bool { return got[a] != 1 }) {
		t.Fatalf("after the repair, socket hooks on the cgroup %v, want one of each of %v", got, dpCgroupHooks)
	}
}

// TestDriftMapEntries: entries deleted, altered or added by another tool
// change what VIPs do; DetectDrift counts them and a full apply restores
// the maps to the state, logging its counts per map.
func TestDriftMapEntries(t *testing.T) {
	e := newDriftEnv(t, TCAttachAuto)
	m := &e.dp.objs.bpfMaps
	want := dpSnapshot(t, m)
	tcp := feKey{addr: dpVIPA, port: 80, proto: ipprotoTCP}
	udp := feKey{addr: dpVIPB, port: 80, proto: ipprotoUDP}
	bogus := feKey{addr: dpVIPC, port: 80, proto: ipprotoTCP}

	// The TCP service's master deleted: new connections pass untranslated.
	if err := m.VipdServices.Delete(svcKeyOf(tcp, 0)); err != nil {
		t.Fatalf("delete the master of %s: %v", tcp, err)
	}
	// The UDP service's slots pointed at a backend that does not exist.
	var master bpfSvcVal
	if err := m.VipdServices.Lookup(svcKeyOf(udp, 0), &master); err != nil {
		t.Fatalf("read the master of %s: %v", udp, err)
	}
	// Dense (unweighted, few slots): the slots are in the master, which is
	// then the one wrong entry; else every slot entry is.
	nslots := int(master.Count)
	slotEntries := master.Count
	if master.Flags&svcFlagWeighted == 0 && master.Count <= svcInlineSlots {
		for i := range master.Count {
			master.Slots[i] = 4242
		}
		if err := m.VipdServices.Put(svcKeyOf(udp, 0), &master); err != nil {
			t.Fatalf("write the master of %s: %v", udp, err)
		}
		nslots, slotEntries = 1, 0
	}
	for slot := uint32(1); slot <= slotEntries; slot++ {
		var v bpfSvcVal
		if err := m.VipdServices.Lookup(svcKeyOf(udp, slot), &v); err != nil {
			t.Fatalf("read slot %d of %s: %v", slot, udp, err)
		}
		v.BackendId = 4242
		if err := m.VipdServices.Put(svcKeyOf(udp, slot), &v); err != nil {
			t.Fatalf("write slot %d of %s: %v", slot, udp, err)
		}
	}
	// A service no one asked for, on dpVIPC, sending to be1.
	be1 := want.backendID(t, e.pod("be1").IPv4())
	var rn bpfRevNat
	rn.Addr.W = toWords(bogus.addr)
	rn.Port = be16(bogus.port)
	rn.Proto = bogus.proto
	const bogusRevNat = 777
	for what, err := range map[string]error{
		// Marked in the frontend filter too, or the packet path never looks.
		"filter":      markFrontends(m.VipdSvcAddrs, []bpfSvcKey{svcKeyOf(bogus, 0)}),
		"reverse NAT": m.VipdRevnat.Put(uint32(bogusRevNat), &rn),
		"member":      m.VipdMembers.Put(&bpfMemberKey{RevNatId: bogusRevNat, BackendId: be1}, uint32(memberFlagEligible)),
		"master": m.VipdServices.Put(svcKeyOf(bogus, 0), &bpfSvcVal{Count: 1, RevNatId: bogusRevNat,
			Slots: [svcInlineSlots]uint32{be1}}), // dense: its one slot in the master
	} {
		if err != nil {
			t.Fatalf("insert a bogus %s entry: %v", what, err)
		}
	}

	e.expectBroken(false, "tcp", dpVIPA, "with the master deleted")
	e.expectBroken(true, "tcp", dpVIPA, "with the master deleted")
	e.expectBroken(false, "udp", dpVIPB, "with the slots altered")
	if r, err := e.request(false, "tcp", dpVIPC, dpReplyTimeout); err != nil || r.Backend != "be1" {
		t.Fatalf("the bogus entries do not take effect (reply %+v, %v): the test tampers wrongly", r, err)
	}
	e.expectDrift(driftMapEntries, "vipd_services: 1 entries missing, "+itoa(nslots)+" wrong, 1 no service accounts for")

	e.repairAndCheck("vipd_services=\"added=1 fixed="+itoa(nslots)+" removed=1\"",
		"vipd_members=\"added=0 fixed=0 removed=1\"", "vipd_revnat=\"added=0 fixed=0 removed=1\"")
	dpWantSnap(t, "the maps after the repair", dpSnapshot(t, m), want)
	e.expectBroken(false, "tcp", dpVIPC, "after the repair")

	// What vipd itself writes is no drift: a changed backend set, and a
	// deleted service whose master drains while a connection uses it.
	ctx, cancel := context.WithTimeout(context.Background(), dpReplyTimeout)
	defer cancel()
	c, err := e.pod("client").Dial(ctx, "tcp", dpVIPPort(dpVIPA))
	if err != nil {
		t.Fatalf("dial %s: %v", dpVIPA, err)
	}
	defer c.Close()
	connRequest(t, c, "before the service is deleted")
	udp2 := e.service("test/udp", dpVIPB, dataplane.UDP, dpReady("be2"))
	udp2.Generation = 2
	e.gen++
	e.apply(dpState(e.gen, []string{udp2.Name}, e.svcs[0], udp2))
	e.expectNoDrift("after an incremental apply")
	e.gen++
	e.apply(dpState(e.gen, []string{e.svcs[0].Name}, udp2))
	if len(e.dp.prog.draining) != 1 {
		t.Fatalf("draining frontends %v, want the deleted TCP one", e.dp.prog.draining)
	}
	e.expectNoDrift("with a deleted service draining")
}

// TestDriftMapPinReplaced: a pin that names another map than vipd's (a map
// replaced by hand, which the next vipd would load) and a pin removed are
// reported; a full apply pins vipd's maps there again, and a restarted
// vipd finds the state it left.
func TestDriftMapPinReplaced(t *testing.T) {
	e := newDriftEnv(t, TCAttachAuto)
	svcPin := filepath.Join(e.bpffs, "vipd_services")
	info, err := e.dp.objs.VipdServices.Info()
	if err != nil {
		t.Fatal(err)
	}
	impostor, err := ebpf.NewMap(&ebpf.MapSpec{Type: info.Type, KeySize: info.KeySize, ValueSize: info.ValueSize,
		MaxEntries: info.MaxEntries, Flags: info.Flags})
	if err != nil {
		t.Fatalf("create a map: %v", err)
	}
	defer impostor.Close()
	if err := os.Remove(svcPin); err != nil {
		t.Fatal(err)
	}
	if err := impostor.Pin(svcPin); err != nil {
		t.Fatalf("pin the impostor: %v", err)
	}
	if err := os.Remove(filepath.Join(e.bpffs, "vipd_ct")); err != nil {
		t.Fatal(err)
	}
	// The programs keep vipd's maps: traffic still flows, but a restarted
	// vipd would load the impostor.
	e.expectWorks("with vipd_services replaced")
	e.expectDrift(driftMap, "vipd_services: pin "+svcPin+" names map")
	e.expectDrift(driftMap, "vipd_ct: pin "+filepath.Join(e.bpffs, "vipd_ct")+" removed")
	e.repairAndCheck("maps_repinned=2", "vipd_services: pin", "vipd_ct: pin")
	for name, want := range e.dp.mapIDs {
		m, err := ebpf.LoadPinnedMap(filepath.Join(e.bpffs, name), nil)
		if err != nil {
			t.Fatalf("after the repair: load pinned %s: %v", name, err)
		}
		mi, err := m.Info()
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
		if id, _ := mi.ID(); id != want {
			t.Errorf("after the repair, %s pins map %d, want vipd's %d", name, id, want)
		}
	}

	// A restart over the repaired pins keeps the established connection.
	ctx, cancel := context.WithTimeout(context.Background(), dpReplyTimeout)
	defer cancel()
	c, err := e.pod("client").Dial(ctx, "tcp", dpVIPPort(dpVIPA))
	if err != nil {
		t.Fatalf("dial %s: %v", dpVIPA, err)
	}
	defer c.Close()
	first := connRequest(t, c, "before the restart")
	e.close()
	e.open(nil)
	if n := len(e.dp.prog.revNatIDs); n != 2 {
		t.Fatalf("the restarted dataplane found %d frontends in the pinned maps, want 2", n)
	}
	e.fullApply()
	if got := connRequest(t, c, "after the restart"); got != first {
		t.Fatalf("established connection answered by %s after the restart, want %s", got, first)
	}
	e.expectWorks("after the restart")
}

func (e *driftEnv) ifindex(name string) int {
	e.t.Helper()
	var idx int
	err := e.node.Do(func() error {
		l, err := netlink.LinkByName(name)
		if err == nil {
			idx = l.Attrs().Index
		}
		return err
	})
	if err != nil {
		e.t.Fatalf("interface %s: %v", name, err)
	}
	return idx
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestDriftClsactQdiscDeleted: `tc qdisc del dev <veth> clsact` takes
// vipd's filters with it; that is drift (not a failed check), and a full
// apply puts qdisc and filters back.
func TestDriftClsactQdiscDeleted(t *testing.T) {
	e := newDriftEnv(t, TCAttachClsact)
	veth := e.pod("client").HostVeth()
	err := e.node.Do(func() error {
		l, err := netlink.LinkByName(veth)
		if err != nil {
			return err
		}
		return netlink.QdiscDel(&netlink.GenericQdisc{QdiscType: "clsact", QdiscAttrs: netlink.QdiscAttrs{
			LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}})
	})
	if err != nil {
		t.Fatalf("delete the clsact qdisc of %s: %v", veth, err)
	}
	e.expectBroken(false, "tcp", dpVIPA, "with the clsact qdisc deleted")
	e.expectDrift(driftTCLink, veth+" ingress: vipd_from_pod not attached (no vipd clsact filter)")
	e.expectDrift(driftTCLink, veth+" egress: vipd_to_pod not attached (no vipd clsact filter)")
	e.repairAndCheck(veth+" ingress", veth+" egress")
}
