package ebpf

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/dataplane"
)

// verifyPinned runs VerifyPinned over the env's bpffs with the open
// dataplane's Maglev size.
func (e *dpEnv) verifyPinned(s *dataplane.State) error {
	return VerifyPinned(e.bpffs, s, e.dp.cfg.MaglevTableSize)
}

// TestVerifyPinned checks that VerifyPinned accepts what Apply wrote,
// draining frontends included, and names what differs from a state or was
// changed behind the dataplane's back.
func TestVerifyPinned(t *testing.T) {
	e := newDPEnv(t, []string{"client", "be1", "be2", "be3"}, dpSmallMaps)
	e.open(nil)
	weighted := e.service("test/weighted", dpVIPA, dataplane.TCP,
		dpBE{pod: "be1", state: dataplane.BackendReady, weight: 1}, dpBE{pod: "be2", state: dataplane.BackendReady, weight: 3},
		dpBE{pod: "be3", state: dataplane.BackendTerminating, weight: 1})
	sticky := e.service("test/sticky", dpVIPB, dataplane.UDP, dpReady("be3"))
	sticky.Affinity = dataplane.SessionAffinity{ClientIP: true, Timeout: 30 * time.Second}
	maglev := e.service("test/maglev", dpVIPC, dataplane.TCP, dpReady("be1"), dpReady("be2"))
	maglev.LoadBalancing = dataplane.LoadBalancingMaglev
	all := dpState(1, nil, weighted, sticky, maglev)
	e.apply(all)
	if err := e.verifyPinned(all); err != nil {
		t.Fatalf("VerifyPinned after a full apply: %v", err)
	}

	// A deleted service drains: its master stays, and that is in order.
	without := dpState(2, []string{sticky.Name}, weighted, maglev)
	e.apply(without)
	if err := e.verifyPinned(without); err != nil {
		t.Fatalf("VerifyPinned with a draining frontend: %v", err)
	}
	err := e.verifyPinned(all)
	if err == nil || !strings.Contains(err.Error(), "198.19.0.11:80/UDP") {
		t.Fatalf("VerifyPinned of a state that still has the deleted service: %v, want a difference naming its frontend", err)
	}

	// Entries changed behind the dataplane's back are found.
	slot1 := svcKeyOf(feKey{addr: dpVIPA, port: 80, proto: ipprotoTCP}, 1)
	if err := e.dp.objs.VipdServices.Delete(slot1); err != nil {
		t.Fatal(err)
	}
	if err := e.verifyPinned(without); err == nil || !strings.Contains(err.Error(), "slot 1 missing") {
		t.Fatalf("VerifyPinned after a slot was deleted: %v, want it to say so", err)
	}
	stale := bpfMemberKey{RevNatId: 999, BackendId: 999}
	if err := e.dp.objs.VipdMembers.Put(stale, uint32(1)); err != nil {
		t.Fatal(err)
	}
	if err := e.verifyPinned(without); err == nil || !strings.Contains(err.Error(), "stale member: reverse-NAT ID 999") {
		t.Fatalf("VerifyPinned with a stale member: %v, want it to say so", err)
	}
	// A full apply rewrites the slot. (It does not look for entries it did
	// not write while the maps are clean: the stale member goes by hand.)
	if err := e.dp.objs.VipdMembers.Delete(stale); err != nil {
		t.Fatal(err)
	}
	e.apply(dpState(3, nil, weighted, maglev))
	if err := e.verifyPinned(without); err != nil {
		t.Fatalf("VerifyPinned after a full apply repaired the maps: %v", err)
	}
	e.expectBackends(dpVIPA, "be1", "be2")
}

// TestDataplaneFullAfterRefusal: a change refused because it does not fit
// the maps is still an error, after which the next Apply must be a full
// one (the dataplane contract): here, a full apply is what repairs an entry
// deleted behind the dataplane's back before the refusal.
func TestDataplaneFullAfterRefusal(t *testing.T) {
	sizes := MapSizes{LB: 32, Backends: 8, Conntrack: 1024, Affinity: 64, Sockets: 64}
	e := newDPEnv(t, []string{"client", "be1", "be2", "be3"}, sizes)
	e.open(nil)
	first := e.service("test/first", dpVIPA, dataplane.TCP, dpReady("be1"), dpReady("be2"))
	e.apply(dpState(1, nil, first))

	// Drift: first's slot 2 (in its master: it is dense) names no backend.
	mk := svcKeyOf(feKey{addr: dpVIPA, port: 80, proto: ipprotoTCP}, 0)
	var master bpfSvcVal
	if err := e.dp.objs.VipdServices.Lookup(mk, &master); err != nil {
		t.Fatal(err)
	}
	master.Slots[1] = 0
	if err := e.dp.objs.VipdServices.Put(mk, master); err != nil {
		t.Fatal(err)
	}
	many := e.service("test/many", dpVIPB, dataplane.TCP)
	for i := range 9 {
		many.Backends = append(many.Backends, dataplane.Backend{
			IP: netip.AddrFrom4([4]byte{198, 18, 1, byte(200 + i)}), State: dataplane.BackendReady, Weight: 1,
		})
	}
	err := e.dp.Apply(context.Background(), dpState(2, []string{many.Name}, first, many))
	if !errors.Is(err, dataplane.ErrResourceExhausted) {
		t.Fatalf("Apply of 9 more backends into a backend map of 8: %v, want ErrResourceExhausted", err)
	}

	second := e.service("test/second", dpVIPB, dataplane.TCP, dpReady("be3"))
	s := dpState(3, []string{second.Name}, first, second)
	e.apply(s)
	if err := e.verifyPinned(s); err != nil {
		t.Fatalf("the apply after a refusal was not a full one: the drift it would have repaired is still there: %v", err)
	}
	e.expectBackends(dpVIPA, "be1", "be2")
	e.expectBackends(dpVIPB, "be3")
}
