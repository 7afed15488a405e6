package ebpf

// Guards of the fast paths of FASTPATH.md: each test fails when its fast
// path is gone, by a difference the fast path makes that a packet or the
// event ring shows. Their costs are in BenchmarkProgRunPath.

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
	"golang.org/x/sys/unix"
)

// A reply entry whose source is not in vipd_ct_srcs is never looked up:
// the programs take the packet for untracked. (The packet path itself
// never makes such an entry: ct_create marks the source first.)
func TestProgRunFastPathReverseSkipsUnmarkedSources(t *testing.T) {
	r := newPREnv(t)
	fe := prFrontend{vip: prVIP4, proto: prTCP, id: 1}
	be := prBackends4[0]
	r.addService(fe, be)

	// A flow the programs made: its reply is translated.
	r.run(r.objs.VipdFromPod, prTCPFrame(prClient4, prVIP4, 1000, 0, prSYN, nil))
	synAck := prTCPFrame(be.addr, prClient4, 5000, 1001, prSYN|prACK, nil)
	ret, out := r.run(r.objs.VipdToPod, synAck)
	prWantVerdict(t, ret, prTCOK)
	prWantFrame(t, out, prTCPFrame(prVIP4, prClient4, 5000, 1001, prSYN|prACK, nil))

	// The same entries planted for a source the filter never saw.
	other := prAP("198.18.1.7:8080")
	rk := prCTKey(be.addr, prClient4, prTCP, prDirReply)
	var rev bpfCtEntry
	if err := r.objs.VipdCt.Lookup(&rk, &rev); err != nil {
		t.Fatalf("reply entry: %v", err)
	}
	planted := prCTKey(other, prClient4, prTCP, prDirReply)
	if err := r.objs.VipdCt.Put(&planted, &rev); err != nil {
		t.Fatalf("plant reply entry: %v", err)
	}
	f := prTCPFrame(other, prClient4, 5000, 1001, prSYN|prACK, nil)
	ret, out = r.run(r.objs.VipdToPod, f)
	prWantVerdict(t, ret, prTCOK)
	prWantFrame(t, out, f)
}

// A packet whose destination is not in vipd_svc_addrs is never looked up
// in vipd_services: a frontend planted there without its filter bit takes
// no traffic, and takes it once its bit is set.
func TestProgRunFastPathFrontendFilter(t *testing.T) {
	r := newPREnv(t)
	fe := prFrontend{vip: prVIP4, proto: prTCP, id: 1}
	r.addService(fe, prBackends4[0])
	syn := prTCPFrame(prClient4, prVIP4, 1000, 0, prSYN, nil)
	if _, out := r.run(r.objs.VipdFromPod, syn); bytes.Equal(out, syn) {
		t.Fatal("the SYN to a marked frontend went untranslated")
	}

	// The same master planted for another VIP, its bit not set.
	planted := prFrontend{vip: prAP("198.19.0.77:80"), proto: prTCP, id: 1}
	k, pk := fe.key(0), planted.key(0)
	if svcFilterBit(k)/64 == svcFilterBit(pk)/64 {
		t.Fatal("the two frontends share a filter word: pick another address")
	}
	var master bpfSvcVal
	if err := r.objs.VipdServices.Lookup(&k, &master); err != nil {
		t.Fatalf("master: %v", err)
	}
	if err := r.objs.VipdServices.Put(&pk, &master); err != nil {
		t.Fatalf("plant master: %v", err)
	}
	syn = prTCPFrame(prClient4, planted.vip, 1001, 0, prSYN, nil)
	ret, out := r.run(r.objs.VipdFromPod, syn)
	prWantVerdict(t, ret, prTCOK)
	prWantFrame(t, out, syn)

	if err := markFrontends(r.objs.VipdSvcAddrs, []bpfSvcKey{pk}); err != nil {
		t.Fatalf("mark: %v", err)
	}
	if _, out := r.run(r.objs.VipdFromPod, syn); bytes.Equal(out, syn) {
		t.Fatal("the SYN to the frontend, marked now, went untranslated")
	}
}

// A live reply of a tracked flow on vipd_from_pod (which leaves plain
// replies to vipd_to_pod) is never taken for a new flow to a frontend,
// even one at the client's address and port: no frontend lookup.
func TestProgRunFastPathReplyIsNoNewFlow(t *testing.T) {
	r := newPREnv(t)
	fe := prFrontend{vip: prVIP4, proto: prTCP, id: 1}
	be := prBackends4[0]
	r.addService(fe, be)
	// A frontend where the client is: 198.18.1.2:40000.
	r.addService(prFrontend{vip: prClient4, proto: prTCP, id: 2}, prBackends4[1])

	r.run(r.objs.VipdFromPod, prTCPFrame(prClient4, prVIP4, 1000, 0, prSYN, nil))
	reply := prTCPFrame(be.addr, prClient4, 5000, 1001, prSYN|prACK, nil)
	ret, out := r.run(r.objs.VipdFromPod, reply)
	prWantVerdict(t, ret, prTCOK)
	prWantFrame(t, out, reply)
	if _, ok := r.ct(be.addr, prClient4, prTCP, prDirForward); ok {
		t.Error("the reply started a flow of its own")
	}
}

// Flow events wake the ring's reader only when it has read the ring to its
// end (adaptive notification), not once per event: the reader's epoll,
// edge-triggered, sees one wakeup for the 300 NEW events of 300 flows while
// nobody reads them, and one more for the next 300 after it read them all.
// (Waking only when the unread events cross a multiple of 512, as before,
// woke it for neither.)
func TestProgRunFastPathEventWakeups(t *testing.T) {
	r := newPREnv(t)
	r.addService(prFrontend{vip: prVIP4, proto: prTCP, id: 1}, prBackends4...)
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		t.Fatalf("epoll: %v", err)
	}
	defer unix.Close(ep)
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, r.objs.VipdEvents.FD(), &ev); err != nil {
		t.Fatalf("epoll add ring: %v", err)
	}
	rd, err := newEventReader(r.objs.VipdEvents)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	wakeups := 0
	harvest := func(timeout int) {
		evs := make([]unix.EpollEvent, 1)
		for {
			n, err := unix.EpollWait(ep, evs, timeout)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				t.Fatalf("epoll wait: %v", err)
			}
			wakeups += n
			return
		}
	}
	const flows = 300
	client := 0
	sendNew := func() {
		for range flows {
			ret, _ := r.run(r.objs.VipdFromPod, prTCPFrame(prbClient(client), prVIP4, 1000, 0, prSYN, nil))
			prWantVerdict(t, ret, prTCOK)
			client++
			harvest(0)
		}
		time.Sleep(20 * time.Millisecond) // a wakeup is an irq_work
		harvest(0)
	}
	sendNew()
	if wakeups != 1 {
		t.Errorf("%d wakeups of the event reader for %d events nobody read, want 1", wakeups, flows)
	}
	var rec ringbuf.Record
	for read := 0; ; read++ {
		ok, err := rd.TryRead(&rec)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			if read != flows {
				t.Fatalf("read %d events, want %d", read, flows)
			}
			break
		}
	}
	sendNew()
	if wakeups != 2 {
		t.Errorf("%d wakeups of the event reader for %d more events after it read all, want 2 in all", wakeups, flows)
	}
}

// A conntrack table pinned without its source filter (pins of a vipd from
// before the filter, or a filter pin removed by hand) is replaced: its
// flows' replies would otherwise be taken for untracked packets.
func TestRemoveUnfilteredConntrack(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pinned []string
		wantCT bool
	}{
		{"conntrack and filter", []string{"vipd_ct", "vipd_ct_srcs"}, true},
		{"conntrack alone", []string{"vipd_ct"}, false},
		{"nothing", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, n := range tc.pinned {
				if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			removeUnfilteredConntrack(hclog.NewNullLogger(), dir)
			_, err := os.Stat(filepath.Join(dir, "vipd_ct"))
			if got := err == nil; got != tc.wantCT {
				t.Errorf("vipd_ct kept: %v, want %v", got, tc.wantCT)
			}
		})
	}
}

// A vipd that finds the services pinned but not their filter (its pin
// removed) fills the new filter from them when it opens, before any apply:
// else every frontend would be dead.
func TestDataplaneFrontendFilterRefilledAtOpen(t *testing.T) {
	e := newDPEnv(t, []string{"client", "be1"}, dpSmallMaps)
	svc := e.service("test/a", dpVIPA, dataplane.TCP, dpReady("be1"))
	e.open(nil)
	e.apply(dpState(1, nil, svc))
	e.expectBackends(dpVIPA, "be1")
	e.close()

	if err := os.Remove(filepath.Join(e.bpffs, "vipd_svc_addrs")); err != nil {
		t.Fatalf("remove the filter's pin: %v", err)
	}
	dp := e.open(nil)
	b := svcFilterBit(svcKeyOf(feKey{addr: dpVIPA, port: 80, proto: unix.IPPROTO_TCP}, 0))
	var word uint64
	if err := dp.objs.VipdSvcAddrs.Lookup(b/64, &word); err != nil || word&(1<<(b%64)) == 0 {
		t.Fatalf("after the restart the filter lacks %s's bit (word %#x, %v)", dpVIPA, word, err)
	}
	e.expectBackends(dpVIPA, "be1")
}

// A node-local TCP connection to a VIP is recorded in the socket's own
// storage (vipd_sock_conn), not in the vipd_sock_revnat LRU, and still
// shows the VIP as its peer; UDP keeps the LRU.
func TestDataplaneSocketStorageForTCP(t *testing.T) {
	e := newDPEnv(t, []string{"be1"}, dpSmallMaps)
	tcp := e.service("test/tcp", dpVIPA, dataplane.TCP, dpReady("be1"))
	udp := e.service("test/udp", dpVIPB, dataplane.UDP, dpReady("be1"))
	dp := e.open(nil)
	e.apply(dpState(1, nil, tcp, udp))
	local, err := e.node.StartClient(context.Background(), e.cgroup)
	if err != nil {
		t.Fatalf("start a node process in the test cgroup: %v", err)
	}
	t.Cleanup(func() { local.Close() })
	request := func(network string, vip netip.Addr) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), dpReplyTimeout)
		defer cancel()
		r, err := local.Request(ctx, network, dpVIPPort(vip))
		if err != nil {
			t.Fatalf("%s request to %s: %v", network, vip, err)
		}
		if r.Backend != "be1" || r.Remote != netip.AddrPortFrom(vip, 80) {
			t.Fatalf("%s request to %s: answered by %q, the client's peer %v; want be1, the VIP", network, vip, r.Backend, r.Remote)
		}
	}

	for range 3 {
		request("tcp", dpVIPA)
	}
	if n := dpCount(t, dp.objs.VipdSockRevnat); n != 0 {
		t.Fatalf("TCP connections left %d records in vipd_sock_revnat, want none (socket storage)", n)
	}
	request("udp", dpVIPB)
	if n := dpCount(t, dp.objs.VipdSockRevnat); n == 0 {
		t.Fatal("a UDP request left no record in vipd_sock_revnat")
	}
}
