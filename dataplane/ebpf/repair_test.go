package ebpf

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vipd/vipd/dataplane"
)

// TestRepairFailureDoesNotFailApply: a pod interface that tc cannot attach
// to (here its tcx link's pin path is taken by a directory, so pinning
// fails every time) does not make Apply fail: the applied change is live,
// the failure is logged, and the gap is reported again only after a
// backoff that grows while the repair keeps failing. Once the obstacle
// goes, a full apply repairs the gap.
func TestRepairFailureDoesNotFailApply(t *testing.T) {
	e := newDriftEnv(t, TCAttachTCX)
	veth := e.pod("client").HostVeth()
	pin := e.dp.tc.pinPath(e.ifindex(veth), "ingress")
	if err := unpinLink(pin); err != nil {
		t.Fatalf("unpin the ingress link: %v", err)
	}
	if err := os.Mkdir(pin, 0o700); err != nil {
		t.Fatalf("block the pin path: %v", err)
	}
	defer os.Remove(pin)
	gap := veth + " ingress: vipd_from_pod not attached"
	e.expectDrift(driftTCLink, gap)

	// A full apply with a change: it succeeds and the change is live
	// (node-local traffic does not go through the pod's tc program).
	e.svcs[0] = e.service("test/tcp", dpVIPA, dataplane.TCP, dpReady("be2"))
	before := len(e.log.String())
	e.gen++
	if err := e.dp.Apply(context.Background(), dpState(e.gen, nil, e.svcs...)); err != nil {
		t.Fatalf("a full Apply with an unrepairable tc gap failed: %v", err)
	}
	logged := e.log.String()[before:]
	if !strings.Contains(logged, "attachment repair failed") || !strings.Contains(logged, gap) || !strings.Contains(logged, "retrying after 10s") {
		t.Errorf("the full apply logged %q, want the failed repair of %q and its retry in 10s", logged, gap)
	}
	for i := 0; i < 5; i++ {
		r, err := e.request(true, "tcp", dpVIPA, dpReplyTimeout)
		if err != nil || r.Backend != "be2" {
			t.Fatalf("after the apply, node-local TCP to %s: %v, %v; want be2 alone", dpVIPA, r.Backend, err)
		}
	}
	// A partial apply is not held up either.
	e.svcs[0] = e.service("test/tcp", dpVIPA, dataplane.TCP, dpReady("be1"))
	e.gen++
	e.apply(dpState(e.gen, []string{"test/tcp"}, e.svcs...))
	if r, err := e.request(true, "tcp", dpVIPA, dpReplyTimeout); err != nil || r.Backend != "be1" {
		t.Fatalf("after the partial apply, node-local TCP to %s: %v, %v; want be1", dpVIPA, r.Backend, err)
	}

	// Held back: the reconciler does not full-apply every check.
	e.expectNoDrift("right after the failed repair")
	// When the backoff ends, it is reported again, and another failed
	// repair doubles the wait.
	e.dp.repairs.next = time.Now().Add(-time.Second)
	e.expectDrift(driftTCLink, gap)
	before = len(e.log.String())
	e.fullApply()
	if logged := e.log.String()[before:]; !strings.Contains(logged, "retrying after 20s") {
		t.Errorf("the second failed repair logged %q, want a retry after 20s", logged)
	}
	e.expectNoDrift("right after the second failed repair")

	// The obstacle goes: the next due repair closes the gap.
	if err := os.Remove(pin); err != nil {
		t.Fatal(err)
	}
	e.dp.repairs.next = time.Now().Add(-time.Second)
	e.expectDrift(driftTCLink, gap)
	e.svcs[0] = e.service("test/tcp", dpVIPA, dataplane.TCP, dpReady("be1"), dpReady("be2"))
	e.repairAndCheck("links_reattached=1", gap)
}

// TestFirstAttachSkipsAnUnattachableInterface: at the first Apply, a pod
// interface tc cannot attach to does not keep the dataplane detached: the
// other pods and node-local sockets are served, and the gap is drift.
func TestFirstAttachSkipsAnUnattachableInterface(t *testing.T) {
	e := &driftEnv{dpEnv: newDPEnv(t, []string{"client", "be1", "be2"}, dpSmallMaps)}
	e.cfg.TCAttach = TCAttachTCX
	e.open(nil)
	veth := e.pod("client").HostVeth()
	pin := e.dp.tc.pinPath(e.ifindex(veth), "ingress")
	if err := os.MkdirAll(pin, 0o700); err != nil {
		t.Fatalf("block the pin path: %v", err)
	}
	defer os.Remove(pin)
	e.apply(dpState(1, nil, e.service("test/tcp", dpVIPA, dataplane.TCP, dpReady("be1"))))
	if r, err := e.pod("be2").Request(context.Background(), "tcp", dpVIPPort(dpVIPA)); err != nil || r.Backend != "be1" {
		t.Fatalf("from pod be2, TCP to %s: %v, %v; want be1", dpVIPA, r.Backend, err)
	}
	e.expectDrift(driftTCLink, veth+" ingress: vipd_from_pod not attached")
}

// TestDriftNewInterfaceGrace: a pod interface the watcher has not got to
// yet (here: the watcher is stopped, so it never does) is not drift while
// the pod is being created; if it stays unattached past unprocessedGrace,
// as when the watcher missed it, it is, and a full apply attaches to it.
func TestDriftNewInterfaceGrace(t *testing.T) {
	e := newDriftEnv(t, TCAttachTCX)
	e.dp.tc.stop()
	err := e.node.Do(func() error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "vethnew"}, PeerName: "vipdpeer"})
	})
	if err != nil {
		t.Fatalf("add a veth: %v", err)
	}
	e.expectNoDrift("right after a new pod interface appeared")
	ifindex := e.ifindex("vethnew")
	e.dp.tc.mu.Lock()
	if _, ok := e.dp.tc.unprocessed[ifindex]; !ok {
		t.Errorf("the check did not note vethnew as not processed yet: %v", e.dp.tc.unprocessed)
	}
	e.dp.tc.unprocessed[ifindex] = time.Now().Add(-unprocessedGrace)
	e.dp.tc.mu.Unlock()
	e.expectDrift(driftTCLink, "vethnew ingress: vipd_from_pod not attached")
	e.repairAndCheck("links_reattached=2", "vethnew ingress", "vethnew egress")
}

// TestDriftEntryCheckUnlocked: DetectDrift reads the service maps without
// holding the apply lock, so an Apply can run during the read; the entries
// that Apply wrote are not reported as drift (the difference is checked
// again under the lock), while real drift still is.
func TestDriftEntryCheckUnlocked(t *testing.T) {
	e := newDriftEnv(t, TCAttachAuto)
	applied := false
	e.dp.beforeEntryCompare = func() {
		if !e.dp.applyMu.TryLock() {
			t.Error("DetectDrift holds the apply lock while it reads the service maps")
			return
		}
		e.dp.applyMu.Unlock()
		// An Apply between the copy and the read: a new service.
		e.svcs = append(e.svcs, e.service("test/c", dpVIPC, dataplane.TCP, dpReady("be1")))
		e.gen++
		e.apply(dpState(e.gen, []string{"test/c"}, e.svcs...))
		applied = true
	}
	e.expectNoDrift("with an Apply during the entry comparison")
	if !applied {
		t.Fatal("the entry comparison did not run")
	}
	e.dp.beforeEntryCompare = nil
	if r, err := e.pod("client").Request(context.Background(), "tcp", dpVIPPort(dpVIPC)); err != nil || r.Backend != "be1" {
		t.Fatalf("TCP to %s: %v, %v; want be1", dpVIPC, r.Backend, err)
	}

	// Real drift is still reported through the re-check.
	var k bpfSvcKey
	var v bpfSvcVal
	if err := e.dp.objs.VipdServices.Iterate().Next(&k, &v); !err {
		t.Fatal("no service entry to delete")
	}
	if err := e.dp.objs.VipdServices.Delete(&k); err != nil {
		t.Fatal(err)
	}
	e.expectDrift(driftMapEntries, "vipd_services: 1 entries missing")
}

// TestDriftConfig: vipd_config rewritten by another tool (here: the
// conntrack timeouts and the host namespace cookie) is drift, and a full
// apply writes vipd's entry back.
func TestDriftConfig(t *testing.T) {
	e := newDriftEnv(t, TCAttachAuto)
	other := e.dp.config
	other.CtOther, other.HostNetnsCookie = 1, 0
	if err := writeConfig(&e.dp.objs.bpfMaps, other); err != nil {
		t.Fatal(err)
	}
	e.expectDrift(driftMapEntries, "vipd_config: holds")
	e.repairAndCheck("vipd_config: holds")
	var got bpfConfig
	if err := e.dp.objs.VipdConfig.Lookup(uint32(0), &got); err != nil || got != e.dp.config {
		t.Fatalf("after the repair vipd_config holds %+v (%v), want %+v", got, err, e.dp.config)
	}
}
