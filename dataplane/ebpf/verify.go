package ebpf

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/vipd/vipd/dataplane"
)

// maxVerifyDiffs bounds the differences VerifyPinned reports one by one.
const maxVerifyDiffs = 20

// VerifyPinned reads the service maps pinned under bpffs, read-only, and
// reports how they differ from what a successful Apply of s leaves there
// (maglevMin is the configured Maglev table size, --maglev-table-size).
// It returns nil when they match: every frontend of s has its master entry
// (count, flags, weights, affinity timeout, Maglev size), its reverse-NAT
// entry, one slot per backend that may take new connections, naming that
// backend's address and port with its cumulative weight, and one member
// entry per backend of its family with its eligibility; and the maps hold
// nothing else but the draining masters (and their reverse-NAT entries)
// of deleted frontends.
//
// It is for tests and tools that check a vipd from the outside: vipd must
// not be writing the maps meanwhile, or the comparison sees a half-done
// update. It never writes.
func VerifyPinned(bpffs string, s *dataplane.State, maglevMin uint32) error {
	maps := map[string]*ebpf.Map{}
	defer func() {
		for _, m := range maps {
			m.Close()
		}
	}()
	for _, name := range []string{bpfMapVipdServices, bpfMapVipdMembers, bpfMapVipdRevnat, bpfMapVipdBackends, bpfMapVipdMaglev} {
		m, err := ebpf.LoadPinnedMap(filepath.Join(bpffs, name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			return fmt.Errorf("verify pinned maps: open %s: %w", name, err)
		}
		maps[name] = m
	}

	services := map[bpfSvcKey]bpfSvcVal{}
	members := map[bpfMemberKey]uint32{}
	revNat := map[uint32]bpfRevNat{}
	backends := map[uint32]beKey{}
	maglevs := map[uint32]bool{}
	err := errors.Join(
		forEach(maps[bpfMapVipdServices], func(k bpfSvcKey, v bpfSvcVal) { services[k] = v }),
		forEach(maps[bpfMapVipdMembers], func(k bpfMemberKey, v uint32) { members[k] = v }),
		forEach(maps[bpfMapVipdRevnat], func(id uint32, v bpfRevNat) { revNat[id] = v }),
		forEachBackend(maps[bpfMapVipdBackends], func(id uint32, v bpfBackend) {
			backends[id] = beKey{addr: fromWords(v.Addr.W), port: fromBE16(v.Port)}
		}),
		forEach(maps[bpfMapVipdMaglev], func(id uint32, _ uint32) { maglevs[id] = true }),
	)
	if err != nil {
		return fmt.Errorf("verify pinned maps: read: %w", err)
	}

	var diffs []string
	diff := func(format string, args ...any) { diffs = append(diffs, fmt.Sprintf(format, args...)) }

	// The entries each desired frontend accounts for; whatever is left
	// over afterwards is stale.
	usedSvc := map[bpfSvcKey]bool{}
	usedMember := map[bpfMemberKey]bool{}
	usedRevNat := map[uint32]bool{}
	usedBackend := map[uint32]bool{}
	for name, svc := range s.All() {
		fes, err := serviceFrontends(svc, maglevMin, &s.Node)
		if err != nil {
			return fmt.Errorf("verify pinned maps: service %s: %w", name, err)
		}
		for _, fe := range fes {
			verifyFrontend(fe, services, members, revNat, backends, maglevs, usedSvc, usedMember, usedRevNat, usedBackend, diff)
		}
	}
	for k, v := range services {
		if usedSvc[k] {
			continue
		}
		fe := feKey{addr: fromWords(k.Addr.W), port: fromBE16(k.Port), proto: k.Proto, scope: k.Scope}
		switch {
		case k.Slot != 0:
			diff("frontend %s: stale slot %d (backend ID %d)", fe, k.Slot, v.BackendId)
		case v.Flags&svcFlagDraining == 0 || v.Count != 0:
			diff("frontend %s: no service has it, but its master entry is live (count %d, flags %#x)", fe, v.Count, v.Flags)
		case revNatKey(revNat[v.RevNatId]) != fe:
			diff("frontend %s: draining master names reverse-NAT ID %d, which maps to %v", fe, v.RevNatId, revNatKey(revNat[v.RevNatId]))
		default:
			usedRevNat[v.RevNatId] = true // a draining frontend keeps it
		}
	}
	for k, flags := range members {
		if !usedMember[k] {
			diff("stale member: reverse-NAT ID %d, backend ID %d (flags %#x)", k.RevNatId, k.BackendId, flags)
		}
	}
	for id, rn := range revNat {
		if !usedRevNat[id] {
			diff("stale reverse-NAT entry %d: %s", id, revNatKey(rn))
		}
	}
	for id, k := range backends {
		if !usedBackend[id] {
			diff("stale backend %d: %s", id, k)
		}
	}
	for id := range maglevs {
		if !usedRevNat[id] {
			diff("stale Maglev table of reverse-NAT ID %d", id)
		}
	}
	if len(diffs) == 0 {
		return nil
	}
	slices.Sort(diffs)
	n := len(diffs)
	if n > maxVerifyDiffs {
		diffs = append(diffs[:maxVerifyDiffs], fmt.Sprintf("... and %d more", n-maxVerifyDiffs))
	}
	return fmt.Errorf("pinned maps in %s differ from the state of %d services in %d ways:\n  %s", bpffs, s.Len(), n, strings.Join(diffs, "\n  "))
}

// revNatKey is the frontend a reverse-NAT value names.
func revNatKey(v bpfRevNat) feKey {
	return feKey{addr: fromWords(v.Addr.W), port: fromBE16(v.Port), proto: v.Proto, scope: v.Scope}
}

// verifyFrontend compares one desired frontend with the maps, marking the
// entries it accounts for as used. Its members are compared wherever they
// are: inline in its reverse-NAT value, or in vipd_members (any
// vipd_members entry of a frontend whose members are inline is stale).
func verifyFrontend(fe *frontend, services map[bpfSvcKey]bpfSvcVal, members map[bpfMemberKey]uint32,
	revNat map[uint32]bpfRevNat, backends map[uint32]beKey, maglevs map[uint32]bool,
	usedSvc map[bpfSvcKey]bool, usedMember map[bpfMemberKey]bool, usedRevNat, usedBackend map[uint32]bool,
	diff func(string, ...any)) {
	mk := svcKeyOf(fe.key, 0)
	master, ok := services[mk]
	if !ok {
		diff("frontend %s (service %s): no master entry", fe.key, fe.service)
		return
	}
	usedSvc[mk] = true
	want := bpfSvcVal{Count: uint32(len(fe.slots)), RevNatId: master.RevNatId, Flags: fe.flags,
		AffinityTimeout: fe.timeout, Weight: fe.weight, MaglevSize: fe.maglevM}
	if fe.dense() {
		// The slots' IDs are the maps' business: compared by backend below.
		copy(want.Slots[:len(fe.slots)], master.Slots[:len(fe.slots)])
	}
	if master != want {
		diff("frontend %s (service %s): master entry %+v, want %+v", fe.key, fe.service, master, want)
	}
	rn, ok := revNat[master.RevNatId]
	if k := revNatKey(rn); !ok || k != fe.key {
		diff("frontend %s (service %s): reverse-NAT ID %d maps to %v (present %v)", fe.key, fe.service, master.RevNatId, k, ok)
	}
	inline := rn.Members != revNatMembersMap
	if inline != fe.inlineMembers() {
		diff("frontend %s (service %s): reverse-NAT value has %d members inline (%#x: in the member map), want them inline: %v",
			fe.key, fe.service, rn.Members, uint32(revNatMembersMap), fe.inlineMembers())
	}
	usedRevNat[master.RevNatId] = true
	if fe.flags&svcFlagMaglev != 0 && !maglevs[master.RevNatId] {
		diff("frontend %s (service %s): no Maglev table", fe.key, fe.service)
	}
	for j := range fe.slots {
		if fe.dense() {
			id := master.Slots[j]
			usedBackend[id] = true
			if got, want := backends[id], fe.slotBackend(j); got != want {
				diff("frontend %s (service %s): slot %d is backend %d (%v), want %v", fe.key, fe.service, j+1, id, got, want)
			}
			continue
		}
		sk := svcKeyOf(fe.key, uint32(j+1))
		v, ok := services[sk]
		if !ok {
			diff("frontend %s (service %s): slot %d missing", fe.key, fe.service, j+1)
			continue
		}
		usedSvc[sk] = true
		usedBackend[v.BackendId] = true
		if got, want := backends[v.BackendId], fe.slotBackend(j); got != want || v.Weight != fe.slots[j].cum {
			diff("frontend %s (service %s): slot %d is backend %d (%v) up to weight %d, want %v up to %d",
				fe.key, fe.service, j+1, v.BackendId, got, v.Weight, want, fe.slots[j].cum)
		}
	}
	// Members, by backend address: IDs are the maps' business.
	got := map[beKey]uint32{}
	if inline {
		if rn.Members > revNatInlineMembers {
			diff("frontend %s (service %s): reverse-NAT value has %d members inline, at most %d fit", fe.key, fe.service, rn.Members, revNatInlineMembers)
		}
		for j := range min(int(rn.Members), revNatInlineMembers) {
			id := rn.MemberIds[j]
			usedBackend[id] = true
			b, ok := backends[id]
			if !ok {
				diff("frontend %s (service %s): inline member backend ID %d is not in the backend map", fe.key, fe.service, id)
				continue
			}
			got[b] = uint32(rn.MemberFlags[j])
		}
	}
	for k, flags := range members {
		if k.RevNatId != master.RevNatId || inline {
			continue
		}
		usedMember[k] = true
		usedBackend[k.BackendId] = true
		b, ok := backends[k.BackendId]
		if !ok {
			diff("frontend %s (service %s): member backend ID %d is not in the backend map", fe.key, fe.service, k.BackendId)
			continue
		}
		got[b] = flags
	}
	for _, m := range fe.members {
		k := m.key.unpack()
		flags, ok := got[k]
		switch {
		case !ok:
			diff("frontend %s (service %s): member %s missing", fe.key, fe.service, k)
		case flags != uint32(m.flags):
			diff("frontend %s (service %s): member %s has flags %#x, want %#x", fe.key, fe.service, k, flags, m.flags)
		}
		delete(got, k)
	}
	for k := range got {
		diff("frontend %s (service %s): member %s is not a backend of the service", fe.key, fe.service, k)
	}
}
