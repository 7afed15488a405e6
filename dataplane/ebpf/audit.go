package ebpf

// The audit of a full apply: one read of every service map, compared with
// the state the apply is about to write, so that it rewrites only what is
// missing or wrong and deletes what no frontend accounts for.

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
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
	// members and slots by their index in the apply's ID slab (one bitset
	// each, so that the maps are audited in parallel); backends by ID (nil
	// when IDs run too high for a bitset).
	revNatOK, masterOK, memberOK, slotOK, backendOK bitset
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
		want[mapServices] += 1 + pr.fe.slotEntries()
		want[mapMembers] += pr.fe.memberEntries()
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

// grown returns b, grown if need be to hold bit i.
func (b bitset) grown(i int) bitset {
	if n := i/64 + 1; n > len(b) {
		b = append(b, make(bitset, max(n-len(b), len(b)))...)
	}
	return b
}

// maxBackendBitset bounds the backend IDs audit tracks in a bitset (8 MiB).
const maxBackendBitset = 64 << 20

// auditMaps reads every service map once and compares it with the state
// apply is about to write: changes, with their programmed state next (index
// for index, offs their offsets in the ID slab of nids IDs), and gone, the
// frontends leaving; used are the backends referenced then (nil: those of
// the backend table). It replaces a prune after the writes: a full apply
// ends with the desired frontends and the draining ones alone.
//
// The maps are read in parallel, one goroutine each (reverse NAT and
// Maglev together): each fills parts of the audit no other touches, and
// all only read the desired state.
func (p *programmer) auditMaps(changes []change, next []*programmed, offs []int32, nids int, gone []change, used *usedBackends) (*audit, error) {
	a := p.newAuditor(changes, next, offs, nids, gone)
	a.used = used
	a.countUsed()
	readers := []func() error{
		func() error {
			if err := forEach(p.maps.VipdRevnat, a.revNatEntry); err != nil {
				return fmt.Errorf("reverse-NAT map: %w", err)
			}
			if err := forEach(p.maps.VipdMaglev, a.maglevEntry); err != nil {
				return fmt.Errorf("Maglev map: %w", err)
			}
			return nil
		},
		func() error {
			if err := forEach(p.maps.VipdServices, a.serviceEntry); err != nil {
				return fmt.Errorf("service map: %w", err)
			}
			a.au.absent.svcDeletes = append(a.au.absent.svcDeletes, a.absentSlots...)
			return nil
		},
		func() error {
			if err := forEach(p.maps.VipdMembers, a.memberEntry); err != nil {
				return fmt.Errorf("member map: %w", err)
			}
			return nil
		},
		func() error {
			if err := forEachBackend(p.maps.VipdBackends, a.backendEntry); err != nil {
				return fmt.Errorf("backend map: %w", err)
			}
			return nil
		},
	}
	if err := parallel(readers...); err != nil {
		return nil, err
	}
	return a.au, nil
}

// parallel runs fns each in a goroutine of its own and returns their
// errors, joined, once all have returned.
func parallel(fns ...func() error) error {
	errs := make([]error, len(fns))
	var wg sync.WaitGroup
	for i, fn := range fns {
		wg.Go(func() { errs[i] = fn() })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// auditor is one auditMaps under way: the audit it fills, map entry by map
// entry, and the desired state it compares the entries with. Its entry
// methods touch no map: auditMaps feeds them what it reads.
type auditor struct {
	p    *programmer
	au   *audit
	next []*programmed
	offs []int32
	// at are the desired frontends by their master's key, as the maps
	// spell it (no address to convert for each of a million service
	// entries); byRevNat the same by reverse-NAT ID; both give the index
	// in changes.
	at       map[bpfSvcKey]int
	byRevNat revNatIndex
	// drains are the masters of the frontends that are not desired but
	// keep their master and reverse-NAT entry while they drain, with
	// their reverse-NAT IDs.
	drains map[bpfSvcKey]uint32
	// absentSlots are the slots of frontends that are neither desired
	// nor draining: deleted after their masters.
	absentSlots []bpfSvcKey
	// memberIndex maps backend IDs to member indexes, for the frontends
	// with many members, as they are met.
	memberIndex map[int]map[uint32]int
	// used are the backends referenced after the apply (countUsed).
	used *usedBackends
}

func (p *programmer) newAuditor(changes []change, next []*programmed, offs []int32, nids int, gone []change) *auditor {
	a := &auditor{
		p: p,
		au: &audit{
			revNatOK: newBitset(len(changes)),
			masterOK: newBitset(len(changes)),
			memberOK: newBitset(nids),
			slotOK:   newBitset(nids),
		},
		next:        next,
		offs:        offs,
		at:          make(map[bpfSvcKey]int, len(changes)),
		byRevNat:    newRevNatIndex(p.nextRevNat, len(changes)),
		drains:      make(map[bpfSvcKey]uint32, len(p.draining)+len(gone)),
		memberIndex: map[int]map[uint32]int{},
	}
	if p.nextBackend <= maxBackendBitset {
		a.au.backendOK = newBitset(int(p.nextBackend))
	}
	for i, pr := range next {
		if pr != nil {
			a.at[svcKeyOf(changes[i].key, 0)] = i
			a.byRevNat.set(pr.revNat, i)
		}
	}
	// A frontend that is not desired keeps its master and reverse-NAT
	// entry while it drains: those that drain already and, unless they go
	// outright, those that leave now.
	for k, id := range p.draining {
		if _, ok := a.at[svcKeyOf(k, 0)]; !ok {
			a.drains[svcKeyOf(k, 0)] = id
		}
	}
	if !p.noDrain {
		for _, c := range gone {
			a.drains[svcKeyOf(c.key, 0)] = p.frontends[c.key].revNat
		}
	}
	return a
}

// maxRevNatSlice bounds the reverse-NAT IDs a revNatIndex keeps in a
// slice (4 bytes each: 64 MiB).
const maxRevNatSlice = 16 << 20

// revNatIndex maps reverse-NAT IDs to frontend indexes. IDs are handed out
// by a counter (and never reused), so while the counter is not far beyond
// the frontends an audit compares, a slice indexed by ID serves: a million
// member entries then cost a million array reads rather than map lookups.
// Past that, it is a map.
type revNatIndex struct {
	dense []int32 // by ID: index+1, 0 for none
	m     map[uint32]int
}

// newRevNatIndex returns an empty index for IDs below next, of about n
// frontends.
func newRevNatIndex(next uint32, n int) revNatIndex {
	if next <= maxRevNatSlice && int(next) <= 8*n+4096 {
		return revNatIndex{dense: make([]int32, next)}
	}
	return revNatIndex{m: make(map[uint32]int, n)}
}

func (x *revNatIndex) set(id uint32, i int) {
	if int(id) < len(x.dense) {
		x.dense[id] = int32(i) + 1
		return
	}
	if x.m == nil {
		x.m = map[uint32]int{}
	}
	x.m[id] = i
}

func (x *revNatIndex) get(id uint32) (int, bool) {
	if int(id) < len(x.dense) {
		i := x.dense[id]
		return int(i) - 1, i != 0
	}
	i, ok := x.m[id]
	return i, ok
}

// revNatEntry audits one reverse-NAT entry: correct (the frontend's key
// and its inline members, or the mark that they are in vipd_members), to
// rewrite, kept for a draining frontend, or absent.
func (a *auditor) revNatEntry(id uint32, rn bpfRevNat) {
	var k bpfSvcKey
	k.Addr, k.Port, k.Proto, k.Scope = rn.Addr, rn.Port, rn.Proto, rn.Scope
	if i, ok := a.byRevNat.get(id); ok {
		if j, ok := a.at[k]; ok && j == i && rn == revNatVal(a.next[i].fe.key, a.next[i]) {
			a.au.revNatOK.set(i)
			a.au.ok[mapRevNat]++
		} else {
			a.au.wrong[mapRevNat]++ // rewritten
		}
		return
	}
	if d, ok := a.drains[k]; ok && d == id {
		return
	}
	a.au.absent.deleteRevNat(id)
}

// serviceEntry audits one service entry: a master or slot of a desired
// frontend is correct or to rewrite, a slot beyond its slot entries
// (any slot entry of a dense frontend) stale; a
// master of a draining frontend stays; the rest is absent, masters first.
func (a *auditor) serviceEntry(sk bpfSvcKey, sv bpfSvcVal) {
	au := a.au
	k := sk
	k.Slot = 0
	i, ok := a.at[k]
	switch {
	case !ok && sk.Slot == 0:
		if _, drains := a.drains[k]; !drains {
			au.absent.svcDeletes = append(au.absent.svcDeletes, sk) // masters first
		}
	case !ok:
		a.absentSlots = append(a.absentSlots, sk)
	case sk.Slot == 0:
		if sv == masterVal(a.next[i]) {
			au.masterOK.set(i)
			au.ok[mapServices]++
		} else {
			au.wrong[mapServices]++
		}
	case int(sk.Slot) <= a.next[i].fe.slotEntries():
		j := int(sk.Slot) - 1
		if sv == (bpfSvcVal{BackendId: a.next[i].slotIDs()[j], Weight: a.next[i].fe.slots[j].cum}) {
			au.slotOK.set(int(a.offs[i]) + len(a.next[i].memberIDs()) + j)
			au.ok[mapServices]++
		} else {
			au.wrong[mapServices]++
		}
	default:
		au.stale.svcDeletes = append(au.stale.svcDeletes, sk)
	}
}

// memberOf returns the index of backend id among the members of the
// desired frontend i, or -1. Most frontends have few members; the others
// get an index as they are met.
func (a *auditor) memberOf(i int, id uint32) int {
	ids := a.next[i].memberIDs()
	if len(ids) <= 16 {
		return slices.Index(ids, id)
	}
	m, ok := a.memberIndex[i]
	if !ok {
		m = make(map[uint32]int, len(ids))
		for j, id := range ids {
			m[id] = j
		}
		a.memberIndex[i] = m
	}
	if j, ok := m[id]; ok {
		return j
	}
	return -1
}

// memberEntry audits one member entry: of a desired frontend, correct, to
// rewrite or stale (any of a frontend whose members are inline); of any
// other, absent.
func (a *auditor) memberEntry(mk bpfMemberKey, flags uint32) {
	au := a.au
	i, ok := a.byRevNat.get(mk.RevNatId)
	if !ok {
		au.absent.memberDeletes = append(au.absent.memberDeletes, mk)
		return
	}
	j := -1
	if !a.next[i].fe.inlineMembers() {
		j = a.memberOf(i, mk.BackendId)
	}
	switch {
	case j < 0:
		au.stale.memberDeletes = append(au.stale.memberDeletes, mk)
	case uint32(a.next[i].fe.members[j].flags) == flags:
		au.memberOK.set(int(a.offs[i]) + j)
		au.ok[mapMembers]++
	default:
		au.wrong[mapMembers]++
	}
}

// maglevEntry audits one Maglev table by its frontend alone: tables are
// rebuilt whole in any case.
func (a *auditor) maglevEntry(id uint32, _ uint32) {
	au := a.au
	if i, ok := a.byRevNat.get(id); !ok {
		au.absent.maglevDeletes = append(au.absent.maglevDeletes, id)
	} else if a.next[i].fe.flags&svcFlagMaglev == 0 {
		au.stale.maglevDeletes = append(au.stale.maglevDeletes, id)
	} else {
		au.ok[mapMaglev]++
	}
}

// usedBackend is a backend referenced after the apply: its ID, and its
// address and port as v4Key packs them, or usedV6 for an IPv6 backend
// (found in the backend table instead).
type usedBackend struct {
	id  uint32
	key uint64
}

const usedV6 = 1 << 63 // never a v4Key: those have 48 bits

// maxUsedSlice bounds the backend IDs usedOf keeps in a slice indexed by
// ID (8 bytes each: 128 MiB).
const maxUsedSlice = 16 << 20

// usedBackends are the backends referenced after an apply, which
// backendEntry needs. Read in place (usedIn), they are the backend table's
// IPv4 ones, by ID in its key4 and refs4, and its IPv6 ones in sorted.
// Copied (usedOf), they are by ID in byID while the ID counter is not far
// beyond them (IDs are below nextBackend, and freed ones are recycled),
// else in sorted.
type usedBackends struct {
	n int // how many
	// table is the backend table read in place, or nil.
	table *backendTable
	// byID holds each by ID (key+1; 0: not used), when kept so; then
	// sorted holds only IDs past its end, sorted by ID.
	byID   []uint64
	sorted []usedBackend
}

// usedIn returns the backends of t that are referenced, read in place
// rather than copied as usedOf does (8 MB for a million backends, at the
// end of a sync or restart, when the heap peaks): t must not change while
// they are used.
func usedIn(t *backendTable) *usedBackends {
	u := &usedBackends{table: t}
	for id, refs := range t.refs4 {
		if refs > 0 && t.key4[id] != 0 {
			u.n++
		}
	}
	for _, ref := range t.v6 {
		if ref.refs > 0 {
			u.n++
			u.sorted = append(u.sorted, usedBackend{id: ref.id, key: usedV6})
		}
	}
	slices.SortFunc(u.sorted, func(x, y usedBackend) int { return cmp.Compare(x.id, y.id) })
	return u
}

// usedOf collects the backends of t that are referenced, next being the
// backend ID counter.
func usedOf(t *backendTable, next uint32) *usedBackends {
	u := &usedBackends{}
	for _, ref := range t.all() {
		if ref.refs > 0 {
			u.n++
		}
	}
	if next <= maxUsedSlice && int(next) <= 8*u.n+4096 {
		u.byID = make([]uint64, next)
	}
	for k, ref := range t.all() {
		if ref.refs > 0 {
			k4, ok := v4Key(k)
			if !ok {
				k4 = usedV6
			}
			if int(ref.id) < len(u.byID) {
				u.byID[ref.id] = k4 + 1
			} else {
				u.sorted = append(u.sorted, usedBackend{id: ref.id, key: k4})
			}
		}
	}
	slices.SortFunc(u.sorted, func(x, y usedBackend) int { return cmp.Compare(x.id, y.id) })
	return u
}

// key returns the key recorded for backend id, and whether the backend is
// referenced after the apply.
func (u *usedBackends) key(id uint32) (uint64, bool) {
	if t := u.table; t != nil && int(id) < len(t.key4) && t.key4[id] != 0 {
		// An IPv4 backend's ID: no IPv6 one has it.
		return t.key4[id] - 1, t.refs4[id] > 0
	}
	if int(id) < len(u.byID) {
		k := u.byID[id]
		return k - 1, k != 0
	}
	i, ok := slices.BinarySearchFunc(u.sorted, id, func(u usedBackend, id uint32) int { return cmp.Compare(u.id, id) })
	if !ok {
		return 0, false
	}
	return u.sorted[i].key, true
}

// countUsed collects the backends referenced after the apply from the
// backend table, unless the auditor was given them.
func (a *auditor) countUsed() {
	if a.used == nil {
		// The apply holds its lock, and the audit only reads the table.
		a.used = usedIn(&a.p.backendIDs)
	}
	a.au.used = a.used.n
}

// usedKey returns the key countUsed recorded for backend id, and whether
// the backend is referenced after the apply.
func (a *auditor) usedKey(id uint32) (uint64, bool) { return a.used.key(id) }

// backendEntry audits one backend entry: of a referenced backend, correct
// or to rewrite; of any other, stale.
func (a *auditor) backendEntry(id uint32, be bpfBackend) {
	au := a.au
	want, ok := a.usedKey(id)
	if !ok {
		au.stale.backendDeletes = append(au.stale.backendDeletes, id)
		return
	}
	k := packWords(be.Addr.W, fromBE16(be.Port))
	var same bool
	if want == usedV6 {
		ref, _ := a.p.backendIDs.get(k)
		same = ref.id == id
	} else {
		k4, ok := v4Key(k)
		same = ok && k4 == want
	}
	if !same {
		au.wrong[mapBackends]++
		return
	}
	au.ok[mapBackends]++
	if au.backendOK != nil {
		au.backendOK.set(int(id))
	}
}

// forget drops the in-memory IDs that no frontend, live or draining, holds
// any more, after an audited full apply: backends restored from the maps
// that no service uses, and reverse-NAT IDs of frontends that are gone.
func (p *programmer) forget() {
	for k, ref := range p.backendIDs.all() {
		if ref.refs <= 0 {
			// Not used, so not in a.used: its slot is zeroed with
			// the stale entries, right after.
			p.backendIDs.del(k)
			p.freeBackendID(ref.id)
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
