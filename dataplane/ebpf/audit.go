package ebpf

// The audit of a full apply: one read of every service map, compared with
// the state the apply is about to write, so that it rewrites only what is
// missing or wrong and deletes what no frontend accounts for.

import (
	"fmt"
	"slices"
)

// audit is what one read of the maps found, before a full apply writes
// them when they may hold more than the applies wrote (after a restart or
// a failure): the entries to delete, and those that already hold what the
// apply would write, which it skips.
type audit struct {
	// absent are the entries of frontends that are neither desired nor
	// draining, deleted before the writes (their room may be needed).
	absent writes
	// stale are the entries that desired frontends no longer use and
	// unreferenced backends, deleted after the writes.
	stale writes
	// Entries found correct: reverse NAT and master by change index;
	// members and slots by their index in the apply's ID slab; backends
	// by ID (nil when IDs run too high for a bitset).
	revNatOK, masterOK, entryOK, backendOK bitset
	// ok and wrong count, by map, the desired entries found correct and
	// those found holding another value.
	ok, wrong [numServiceMaps]int
	// used is the number of backends the desired frontends reference.
	used int
}

// The maps that hold the services, as indexes of entryCounts.
const (
	mapServices = iota
	mapMembers
	mapRevNat
	mapBackends
	mapMaglev
	numServiceMaps
)

var serviceMapNames = [numServiceMaps]string{"vipd_services", "vipd_members", "vipd_revnat", "vipd_backends", "vipd_maglev"}

// entryCounts counts, map by map, the entries a full apply adds (they
// were missing), fixes (they held another value) and removes (no service
// accounts for them).
type entryCounts [numServiceMaps]struct{ added, fixed, removed int }

// any reports whether c counts any entry.
func (c *entryCounts) any() bool { return *c != entryCounts{} }

// logArgs renders the maps with changes as key-value pairs for the log,
// such as "vipd_services", "added=1 fixed=0 removed=2".
func (c *entryCounts) logArgs() []any {
	var args []any
	for i, n := range c {
		if n.added+n.fixed+n.removed > 0 {
			args = append(args, serviceMapNames[i], fmt.Sprintf("added=%d fixed=%d removed=%d", n.added, n.fixed, n.removed))
		}
	}
	return args
}

// counts computes what a full apply of next changes in the maps, given
// what au found in them (au nil: the maps were empty). backends is the
// backend table after the apply's references were counted.
func (au *audit) counts(next []*programmed, backends *backendTable) entryCounts {
	var want [numServiceMaps]int
	for _, pr := range next {
		if pr == nil {
			continue
		}
		want[mapServices] += 1 + len(pr.slotIDs)
		want[mapMembers] += len(pr.memberIDs)
		want[mapRevNat]++
		if pr.fe.flags&svcFlagMaglev != 0 {
			want[mapMaglev]++
		}
	}
	if au != nil {
		want[mapBackends] = au.used
	} else {
		for _, ref := range backends.all() {
			if ref.refs > 0 {
				want[mapBackends]++
			}
		}
	}
	var c entryCounts
	for i := range c {
		c[i].added = want[i]
	}
	if au == nil {
		return c
	}
	for i := range c {
		c[i].added -= au.ok[i] + au.wrong[i]
		c[i].fixed = au.wrong[i]
	}
	c[mapServices].removed = len(au.absent.svcDeletes) + len(au.stale.svcDeletes)
	c[mapMembers].removed = len(au.absent.memberDeletes) + len(au.stale.memberDeletes)
	c[mapRevNat].removed = len(au.absent.revNatDeletes)
	c[mapMaglev].removed = len(au.absent.maglevDeletes) + len(au.stale.maglevDeletes)
	c[mapBackends].removed = len(au.stale.backendDeletes)
	return c
}

// bitset is a set of small non-negative integers.
type bitset []uint64

func newBitset(n int) bitset { return make(bitset, (n+63)/64) }

func (b bitset) set(i int) { b[i/64] |= 1 << (i % 64) }

func (b bitset) has(i int) bool { return i/64 < len(b) && b[i/64]&(1<<(i%64)) != 0 }

// maxBackendBitset bounds the backend IDs audit tracks in a bitset (8 MiB).
const maxBackendBitset = 64 << 20

// auditMaps reads every service map once and compares it with the state
// apply is about to write: changes, with their programmed state next (index
// for index, offs their offsets in the ID slab of nids IDs), and gone, the
// frontends leaving. It replaces a prune after the writes: a full apply
// ends with the desired frontends and the draining ones alone.
func (p *programmer) auditMaps(changes []change, next []*programmed, offs []int32, nids int, gone []change) (*audit, error) {
	au := &audit{
		revNatOK: newBitset(len(changes)),
		masterOK: newBitset(len(changes)),
		entryOK:  newBitset(nids),
	}
	if p.nextBackend <= maxBackendBitset {
		au.backendOK = newBitset(int(p.nextBackend))
	}
	// Desired frontends by key, as the maps spell it (no address to
	// convert for each of a million service entries), and by reverse-NAT ID.
	at := make(map[bpfSvcKey]int, len(changes))
	byRevNat := make(map[uint32]int, len(changes))
	for i, pr := range next {
		if pr != nil {
			at[svcKeyOf(changes[i].key, 0)] = i
			byRevNat[pr.revNat] = i
		}
	}
	// A frontend that is not desired keeps its master and reverse-NAT
	// entry while it drains: those that drain already and, unless they go
	// outright, those that leave now.
	drains := make(map[bpfSvcKey]uint32, len(p.draining)+len(gone))
	for k, id := range p.draining {
		if _, ok := at[svcKeyOf(k, 0)]; !ok {
			drains[svcKeyOf(k, 0)] = id
		}
	}
	if !p.noDrain {
		for _, c := range gone {
			drains[svcKeyOf(c.key, 0)] = p.frontends[c.key].revNat
		}
	}

	err := forEach(p.maps.VipdRevnat, func(id uint32, rn bpfRevNat) {
		var k bpfSvcKey
		k.Addr, k.Port, k.Proto = rn.Addr, rn.Port, rn.Proto
		if i, ok := byRevNat[id]; ok {
			if j, ok := at[k]; ok && j == i {
				au.revNatOK.set(i)
				au.ok[mapRevNat]++
			} else {
				au.wrong[mapRevNat]++ // rewritten
			}
			return
		}
		if d, ok := drains[k]; ok && d == id {
			return
		}
		au.absent.deleteRevNat(id)
	})
	if err != nil {
		return nil, err
	}

	var absentSlots []bpfSvcKey
	err = forEach(p.maps.VipdServices, func(sk bpfSvcKey, sv bpfSvcVal) {
		k := sk
		k.Slot = 0
		i, ok := at[k]
		switch {
		case !ok && sk.Slot == 0:
			if _, drains := drains[k]; !drains {
				au.absent.svcDeletes = append(au.absent.svcDeletes, sk) // masters first
			}
		case !ok:
			absentSlots = append(absentSlots, sk)
		case sk.Slot == 0:
			if sv == masterVal(next[i]) {
				au.masterOK.set(i)
				au.ok[mapServices]++
			} else {
				au.wrong[mapServices]++
			}
		case int(sk.Slot) <= len(next[i].slotIDs):
			j := int(sk.Slot) - 1
			if sv == (bpfSvcVal{BackendId: next[i].slotIDs[j], Weight: next[i].fe.slots[j].cum}) {
				au.entryOK.set(int(offs[i]) + len(next[i].memberIDs) + j)
				au.ok[mapServices]++
			} else {
				au.wrong[mapServices]++
			}
		default:
			au.stale.svcDeletes = append(au.stale.svcDeletes, sk)
		}
	})
	if err != nil {
		return nil, err
	}
	au.absent.svcDeletes = append(au.absent.svcDeletes, absentSlots...)

	// Member j of a frontend, by backend ID: most frontends have few
	// members; the others get an index as they are met.
	index := map[int]map[uint32]int{}
	memberOf := func(i int, id uint32) int {
		ids := next[i].memberIDs
		if len(ids) <= 16 {
			return slices.Index(ids, id)
		}
		m, ok := index[i]
		if !ok {
			m = make(map[uint32]int, len(ids))
			for j, id := range ids {
				m[id] = j
			}
			index[i] = m
		}
		if j, ok := m[id]; ok {
			return j
		}
		return -1
	}
	err = forEach(p.maps.VipdMembers, func(mk bpfMemberKey, flags uint32) {
		i, ok := byRevNat[mk.RevNatId]
		if !ok {
			au.absent.memberDeletes = append(au.absent.memberDeletes, mk)
			return
		}
		j := memberOf(i, mk.BackendId)
		switch {
		case j < 0:
			au.stale.memberDeletes = append(au.stale.memberDeletes, mk)
		case next[i].fe.members[j].flags == flags:
			au.entryOK.set(int(offs[i]) + j)
			au.ok[mapMembers]++
		default:
			au.wrong[mapMembers]++
		}
	})
	if err != nil {
		return nil, err
	}

	err = forEach(p.maps.VipdMaglev, func(id uint32, _ uint32) {
		// Maglev tables are rebuilt whole in any case.
		if i, ok := byRevNat[id]; !ok {
			au.absent.maglevDeletes = append(au.absent.maglevDeletes, id)
		} else if next[i].fe.flags&svcFlagMaglev == 0 {
			au.stale.maglevDeletes = append(au.stale.maglevDeletes, id)
		} else {
			au.ok[mapMaglev]++
		}
	})
	if err != nil {
		return nil, err
	}

	var used []uint32 // IDs of the backends referenced after the apply, sorted
	for _, ref := range p.backendIDs.all() {
		if ref.refs > 0 {
			used = append(used, ref.id)
		}
	}
	slices.Sort(used)
	au.used = len(used)
	err = forEach(p.maps.VipdBackends, func(id uint32, be bpfBackend) {
		if _, ok := slices.BinarySearch(used, id); !ok {
			au.stale.backendDeletes = append(au.stale.backendDeletes, id)
			return
		}
		if ref, _ := p.backendIDs.get(packWords(be.Addr.W, fromBE16(be.Port))); ref.id != id {
			au.wrong[mapBackends]++
			return
		}
		au.ok[mapBackends]++
		if au.backendOK != nil {
			au.backendOK.set(int(id))
		}
	})
	if err != nil {
		return nil, err
	}
	return au, nil
}

// forget drops the in-memory IDs that no frontend, live or draining, holds
// any more, after an audited full apply: backends restored from the maps
// that no service uses, and reverse-NAT IDs of frontends that are gone.
func (p *programmer) forget() {
	for k, ref := range p.backendIDs.all() {
		if ref.refs <= 0 {
			p.backendIDs.del(k)
		}
	}
	for k, id := range p.revNatIDs {
		if pr := p.frontends[k]; pr != nil && pr.revNat == id {
			continue
		}
		if d, ok := p.draining[k]; ok && d == id {
			continue
		}
		delete(p.revNatIDs, k)
	}
}
