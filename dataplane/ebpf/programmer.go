package ebpf

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/hashicorp/go-hclog"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/ebpf/maglev"
)

// programmer turns frontends into map entries and keeps the IDs stable.
//
// IDs: every frontend has a reverse-NAT ID and every backend (address,
// port) a backend ID. Both only grow and are never reused while vipd runs,
// so a conntrack entry naming an old ID can never point at a different
// backend. A restarted vipd reads them back from the maps (restore).
type programmer struct {
	log       hclog.Logger
	maps      *bpfMaps
	innerSpec *ebpf.MapSpec // template of a Maglev table
	maglevMin uint32

	frontends map[feKey]*programmed
	byService map[string][]feKey
	// draining are deleted frontends whose draining master stays while
	// flows use it, by reverse-NAT ID. noDrain deletes leaving frontends
	// outright instead: when the maps are too full to keep them.
	draining map[feKey]uint32
	noDrain  bool

	revNatIDs  map[feKey]uint32
	nextRevNat uint32
	// backendIDs maps every backend in the maps to its ID and to the
	// number of frontends that have it as a member.
	backendIDs  backendTable
	nextBackend uint32

	// w is the write buffer of apply, kept across applies so that its
	// batch-sized slices are allocated once.
	w writes

	// clean is true while vipd has found the maps empty and written nothing
	// yet: the first full apply of clean maps needs no audit. Every other
	// full apply audits, since another tool may have written the maps.
	clean bool

	// changed is what the last full apply changed in the maps.
	changed entryCounts

	// Entry counts, for capacity checks before any write.
	svcEntries, memberEntries int

	// onMembersRemoved is called with the UDP backends that left a
	// frontend, after they did (to destroy node-local sockets stuck on them).
	onMembersRemoved func(fe feKey, revNat uint32, gone []beKey)
}

// programmed is a frontend as written into the maps.
type programmed struct {
	fe     *frontend
	revNat uint32
	// memberIDs are the backend IDs of fe.members, index for index, and
	// slotIDs those of fe.slots (one allocation holds both).
	memberIDs []uint32
	slotIDs   []uint32
}

func newProgrammer(log hclog.Logger, maps *bpfMaps, innerSpec *ebpf.MapSpec, maglevMin uint32) *programmer {
	return &programmer{
		log:         log,
		maps:        maps,
		innerSpec:   innerSpec,
		maglevMin:   maglevMin,
		frontends:   map[feKey]*programmed{},
		draining:    map[feKey]uint32{},
		byService:   map[string][]feKey{},
		revNatIDs:   map[feKey]uint32{},
		backendIDs:  newBackendTable(),
		nextRevNat:  1,
		nextBackend: 1,
	}
}

// restore reads the IDs a previous vipd left in the pinned maps, so that
// the entries it wrote keep their meaning: conntrack and affinity entries
// name backends and frontends by ID.
func (p *programmer) restore() error {
	err := forEach(p.maps.VipdRevnat, func(id uint32, rn bpfRevNat) {
		k := feKey{addr: fromWords(rn.Addr.W), port: fromBE16(rn.Port), proto: rn.Proto}
		p.revNatIDs[k] = id
		p.nextRevNat = max(p.nextRevNat, id+1)
	})
	if err != nil {
		return fmt.Errorf("read reverse-NAT map: %w", err)
	}
	err = forEach(p.maps.VipdBackends, func(id uint32, be bpfBackend) {
		p.backendIDs.put(packWords(be.Addr.W, fromBE16(be.Port)), backendRef{id: id})
		p.nextBackend = max(p.nextBackend, id+1)
	})
	if err != nil {
		return fmt.Errorf("read backend map: %w", err)
	}
	err = forEach(p.maps.VipdServices, func(sk bpfSvcKey, sv bpfSvcVal) {
		if sk.Slot == 0 && sv.Flags&svcFlagDraining != 0 {
			p.draining[feKey{addr: fromWords(sk.Addr.W), port: fromBE16(sk.Port), proto: sk.Proto}] = sv.RevNatId
		}
	})
	if err != nil {
		return fmt.Errorf("read service map: %w", err)
	}
	// The counters survive restarts: IDs freed before one are not reused.
	var next uint32
	if p.maps.VipdIds.Lookup(uint32(0), &next) == nil {
		p.nextBackend = max(p.nextBackend, next)
	}
	if p.maps.VipdIds.Lookup(uint32(1), &next) == nil {
		p.nextRevNat = max(p.nextRevNat, next)
	}
	p.clean = len(p.revNatIDs) == 0 && p.backendIDs.len() == 0 &&
		isEmpty(p.maps.VipdServices) && isEmpty(p.maps.VipdMembers) && isEmpty(p.maps.VipdMaglev)
	return nil
}

// change is the desired content of one frontend: nil removes it.
type change struct {
	key feKey
	fe  *frontend
}

// apply writes changes into the maps. prune additionally deletes every
// map entry that no desired frontend accounts for (a full sync after a
// restart or an error).
//
// Order (make-before-break; no packet ever sees a half-written frontend):
//  0. frontends that leave, master first (it becomes a draining master);
//  1. backends new to the maps (every backend, on a full apply);
//     then frontend by frontend, in chunks of about a batch of entries:
//  2. reverse-NAT entries and members;
//  3. Maglev tables (a new inner map, swapped in whole);
//  4. slots 1..n;
//  5. the master entry (slot 0, with the count) last of the frontend's
//     entries: before it, packets use the old slots 1..old count, which all
//     still name live backends;
//  6. then stale slots beyond the new count, members and Maglev tables no
//     longer used;
//     and once every chunk is done, backends no frontend references any more.
func (p *programmer) apply(changes []change, desiredAll map[feKey]*frontend, prune bool) (err error) {
	var (
		newBackends []bePacked
		gone        []change
	)
	// Allocate IDs; compute the new programmed state of each frontend,
	// index for index with changes. The programmed values and their ID
	// lists come from two allocations for all changes: a full apply
	// replaces every frontend, and with it these.
	next := make([]*programmed, len(changes))
	nfe, nids := 0, 0
	for _, c := range changes {
		if c.fe != nil {
			nfe++
			nids += len(c.fe.members) + len(c.fe.slots)
		}
	}
	prs := make([]programmed, nfe)
	ids := make([]uint32, nids)
	offs := make([]int32, len(changes)) // of each programmed's IDs in ids
	if len(p.frontends) == 0 {
		// The first apply: size the table once instead of growing it
		// step by step. (Not so the backend table: members only bound
		// its size from above.)
		p.frontends = make(map[feKey]*programmed, nfe)
	}
	// New members count as references right away; should the apply fail,
	// they are taken back (the IDs stay taken).
	defer func() {
		if err != nil {
			for _, pr := range next {
				if pr != nil {
					p.unref(pr, nil)
				}
			}
		}
	}()
	for i, c := range changes {
		if c.fe == nil {
			if p.frontends[c.key] != nil {
				gone = append(gone, c)
			}
			continue
		}
		revNat, ok := p.revNatIDs[c.key]
		if !ok {
			revNat = p.nextRevNat
			p.nextRevNat++
			p.revNatIDs[c.key] = revNat
		}
		pr := &prs[0]
		prs = prs[1:]
		offs[i] = int32(nids - len(ids))
		m, n := len(c.fe.members), len(c.fe.members)+len(c.fe.slots)
		*pr = programmed{fe: c.fe, revNat: revNat, memberIDs: ids[:m:m], slotIDs: ids[m:n:n]}
		ids = ids[n:]
		for j := range c.fe.members {
			k := c.fe.members[j].key
			ref, ok := p.backendIDs.get(k)
			if !ok {
				ref.id = p.nextBackend
				p.nextBackend++
				if !prune {
					newBackends = append(newBackends, k)
				}
			}
			ref.refs++
			p.backendIDs.put(k, ref)
			pr.memberIDs[j] = ref.id
		}
		for j, sl := range c.fe.slots {
			pr.slotIDs[j] = pr.memberIDs[sl.member]
		}
		next[i] = pr
	}

	// Record the ID counters before any entry uses a new ID.
	if err := p.saveCounters(); err != nil {
		return p.fail(err)
	}

	// 0. Frontends that leave go first, master first: they are leaving
	// anyway, and their room may be needed. On a full apply of maps a
	// previous run left behind, so do frontends no service has any more.
	//
	// A leaving frontend's master becomes a draining one (count 0, no new
	// flow translated, new connections pass as if there were no service)
	// so that its established TCP and SCTP flows finish, as conntrack's
	// DNAT lets them under iptables; its reverse-NAT entry stays. The
	// conntrack collector removes both once no flow uses them.
	var leaving writes
	for _, c := range gone {
		old := p.frontends[c.key]
		if p.noDrain {
			leaving.deleteSlot(c.key, 0)
			leaving.deleteRevNat(old.revNat)
		} else {
			leaving.svcKeys = append(leaving.svcKeys, svcKeyOf(c.key, 0))
			leaving.svcVals = append(leaving.svcVals, bpfSvcVal{RevNatId: old.revNat, Flags: svcFlagDraining})
		}
		for i := range old.slotIDs {
			leaving.deleteSlot(c.key, uint32(i+1))
		}
		for _, id := range old.memberIDs {
			leaving.deleteMember(old.revNat, id)
		}
		if old.fe.flags&svcFlagMaglev != 0 {
			leaving.deleteMaglev(old.revNat)
		}
	}
	var au *audit
	if prune {
		if !p.clean {
			if au, err = p.auditMaps(changes, next, offs, nids, gone); err != nil {
				return p.fail(fmt.Errorf("read maps: %w", err))
			}
			leaving.append(&au.absent)
		}
		p.clean = false
		p.changed = au.counts(next, &p.backendIDs)
	}
	if err := leaving.flush(p.maps); err != nil {
		return p.fail(err)
	}

	// 1. Backends, before any frontend that uses them.
	w := &p.w
	put := func(id uint32, k bePacked) error {
		w.backend(id, k)
		if len(w.backendKeys) < batchSize {
			return nil
		}
		return w.flush(p.maps)
	}
	if prune {
		// Rewrite every backend in use but those found correct: it
		// repairs whatever an earlier failed apply left half-written.
		for k, ref := range p.backendIDs.all() {
			if ref.refs <= 0 || au != nil && au.backendOK.has(int(ref.id)) {
				continue
			}
			if err := put(ref.id, k); err != nil {
				return p.fail(err)
			}
		}
	} else {
		for _, k := range newBackends {
			ref, _ := p.backendIDs.get(k)
			if err := put(ref.id, k); err != nil {
				return p.fail(err)
			}
		}
	}
	if err := w.flush(p.maps); err != nil {
		return p.fail(err)
	}

	// 2.–6. Frontend by frontend, in chunks of about a batch of entries
	// each, so that the write buffers stay small however many frontends
	// change: the order holds within each frontend, and no frontend of a
	// chunk depends on another's entries.
	for lo := 0; lo < len(changes); {
		hi, n := lo, 0
		for hi < len(changes) && n < batchSize {
			if pr := next[hi]; pr != nil {
				n += 1 + len(pr.slotIDs) + len(pr.memberIDs)
			}
			hi++
		}
		if err := p.applyChunk(changes[lo:hi], next[lo:hi], prune, au, lo, offs[lo:hi]); err != nil {
			return p.fail(err)
		}
		lo = hi
	}

	// Commit the in-memory view. The new members' references were
	// counted above, before any old one's goes: a backend moving between
	// frontends never looks unreferenced.
	var deadBackends writes
	var udpGone []func()
	for _, c := range gone {
		old := p.frontends[c.key]
		if c.key.proto == ipprotoUDP && p.onMembersRemoved != nil && len(old.fe.members) > 0 {
			// Node-local sockets connected through the frontend have
			// nowhere to go: destroy them so the application notices.
			key, revNat, members := c.key, old.revNat, memberKeys(old.fe.members)
			udpGone = append(udpGone, func() { p.onMembersRemoved(key, revNat, members) })
		}
		p.unref(old, &deadBackends)
		p.svcEntries -= 1 + len(old.slotIDs)
		p.memberEntries -= len(old.memberIDs)
		p.unindex(old.fe.service, c.key)
		delete(p.frontends, c.key)
		if p.noDrain {
			delete(p.revNatIDs, c.key)
		} else {
			p.draining[c.key] = old.revNat // its ID stays taken while it drains
		}
	}
	for i, pr := range next {
		if pr == nil {
			continue
		}
		key := changes[i].key
		old := p.frontends[key]
		if old != nil {
			p.svcEntries -= 1 + len(old.slotIDs)
			p.memberEntries -= len(old.memberIDs)
			if key.proto == ipprotoUDP && p.onMembersRemoved != nil {
				var removed []beKey
				walkMembers(old.fe.members, pr.fe.members, func(i, j int) {
					if j < 0 {
						removed = append(removed, old.fe.members[i].key.unpack())
					}
				})
				if len(removed) > 0 {
					udpGone = append(udpGone, func() { p.onMembersRemoved(key, old.revNat, removed) })
				}
			}
			p.unref(old, &deadBackends)
		}
		p.svcEntries += 1 + len(pr.slotIDs)
		p.memberEntries += len(pr.memberIDs)
		delete(p.draining, key) // back before it drained: a live master again
		if old == nil || old.fe.service != pr.fe.service {
			if old != nil {
				p.unindex(old.fe.service, key)
			}
			p.byService[pr.fe.service] = append(p.byService[pr.fe.service], key)
		}
		p.frontends[key] = pr
	}
	if err := deadBackends.flush(p.maps); err != nil {
		p.log.Warn("delete unreferenced backends", "error", err)
	}
	if au != nil {
		// The new state is in force already: a failed prune leaves stale
		// entries no packet can reach (their masters are gone), for the
		// next full apply to remove.
		p.forget()
		if err := au.stale.flush(p.maps); err != nil {
			p.log.Warn("prune stale entries; the next full apply retries", "error", err)
		}
	}
	for _, f := range udpGone {
		f()
	}
	return nil
}

// applyChunk runs steps 2–6 of apply for the changes from index base on
// (next holds their programmed state, index for index, nil for a removal,
// which step 0 did; offs the offsets of their IDs). The backends are in
// place already. Entries au found correct are not written again.
func (p *programmer) applyChunk(changes []change, next []*programmed, prune bool, au *audit, base int, offs []int32) error {
	w := &p.w
	var revNatOK, masterOK, entryOK bitset // all empty without an audit
	if au != nil {
		revNatOK, masterOK, entryOK = au.revNatOK, au.masterOK, au.entryOK
	}
	// 2. Reverse NAT and members.
	for i, c := range changes {
		pr := next[i]
		if pr == nil {
			continue
		}
		old := p.frontends[c.key]
		if old == nil || prune {
			if !revNatOK.has(base + i) {
				w.revNat(pr.revNat, c.key)
			}
			for j, id := range pr.memberIDs {
				if !entryOK.has(int(offs[i]) + j) {
					w.member(pr.revNat, id, pr.fe.members[j].flags)
				}
			}
			continue
		}
		walkMembers(old.fe.members, pr.fe.members, func(i, j int) {
			if j >= 0 && (i < 0 || old.fe.members[i].flags != pr.fe.members[j].flags) {
				w.member(pr.revNat, pr.memberIDs[j], pr.fe.members[j].flags)
			}
		})
	}
	if err := w.flush(p.maps); err != nil {
		return err
	}

	// 3. Maglev tables.
	for i, c := range changes {
		pr := next[i]
		if pr == nil || pr.fe.flags&svcFlagMaglev == 0 {
			continue
		}
		old := p.frontends[c.key]
		if old != nil && !prune && old.fe.maglevM == pr.fe.maglevM && old.fe.flags&svcFlagMaglev != 0 &&
			slices.Equal(old.slotIDs, pr.slotIDs) &&
			slices.EqualFunc(old.fe.slots, pr.fe.slots, func(a, b slot) bool { return a.weight == b.weight }) {
			continue
		}
		if err := p.writeMaglev(pr); err != nil {
			return fmt.Errorf("frontend %s: %w", c.key, err)
		}
	}

	// 4. Slots, then 5. masters.
	for i, c := range changes {
		pr := next[i]
		if pr == nil {
			continue
		}
		old := p.frontends[c.key]
		m := int(offs[i]) + len(pr.memberIDs)
		for j, id := range pr.slotIDs {
			if old == nil || prune || j >= len(old.slotIDs) || old.slotIDs[j] != id || old.fe.slots[j].cum != pr.fe.slots[j].cum {
				if !entryOK.has(m + j) {
					w.slot(c.key, uint32(j+1), id, pr.fe.slots[j].cum)
				}
			}
		}
	}
	if err := w.flush(p.maps); err != nil {
		return err
	}
	for i, c := range changes {
		pr := next[i]
		if pr == nil {
			continue
		}
		if old := p.frontends[c.key]; old == nil || prune || !old.fe.equal(pr.fe) || old.revNat != pr.revNat {
			if !masterOK.has(base + i) {
				w.master(c.key, pr)
			}
		}
	}
	if err := w.flush(p.maps); err != nil {
		return err
	}

	// 6. Break: stale slots and members, and Maglev tables no longer
	// used (unreferenced backends go once every chunk is done).
	for i, c := range changes {
		pr, old := next[i], p.frontends[c.key]
		if pr == nil || old == nil {
			continue
		}
		for j := len(pr.slotIDs); j < len(old.slotIDs); j++ {
			w.deleteSlot(c.key, uint32(j+1))
		}
		walkMembers(old.fe.members, pr.fe.members, func(i, j int) {
			if j < 0 {
				w.deleteMember(old.revNat, old.memberIDs[i])
			}
		})
		if old.fe.flags&svcFlagMaglev != 0 && pr.fe.flags&svcFlagMaglev == 0 {
			w.deleteMaglev(old.revNat)
		}
	}
	return w.flush(p.maps)
}

// unref drops the references of pr's members. Backends left without one
// leave the table, and dead queues their deletion; with dead nil (taking
// back the references of a failed apply) they stay in the table, for a
// later full apply to rewrite or prune.
func (p *programmer) unref(pr *programmed, dead *writes) {
	for j, id := range pr.memberIDs {
		k := pr.fe.members[j].key
		ref, ok := p.backendIDs.get(k)
		if !ok || ref.id != id {
			continue
		}
		ref.refs--
		if ref.refs > 0 || dead == nil {
			p.backendIDs.put(k, backendRef{id: id, refs: max(ref.refs, 0)})
			continue
		}
		p.backendIDs.del(k)
		dead.deleteBackend(id)
	}
}

// walkMembers walks two sorted member lists together, calling fn with the
// index in a and in b of every key either holds; -1 where one lacks it.
func walkMembers(a, b []member, fn func(i, j int)) {
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		c := 0
		switch {
		case i == len(a):
			c = 1
		case j == len(b):
			c = -1
		default:
			c = a[i].key.compare(b[j].key)
		}
		switch {
		case c < 0:
			fn(i, -1)
			i++
		case c > 0:
			fn(-1, j)
			j++
		default:
			fn(i, j)
			i++
			j++
		}
	}
}

func memberKeys(ms []member) []beKey {
	out := make([]beKey, len(ms))
	for i, m := range ms {
		out[i] = m.key.unpack()
	}
	return out
}

// drained removes the draining masters (and reverse-NAT entries) of deleted
// frontends that no live flow uses any more: live holds the reverse-NAT IDs
// of the live flows. It returns how many it removed.
func (p *programmer) drained(live map[uint32]bool) (int, error) {
	var w writes
	var done []feKey
	for k, id := range p.draining {
		if live[id] {
			continue
		}
		w.deleteSlot(k, 0)
		w.deleteRevNat(id)
		done = append(done, k)
	}
	if len(done) == 0 {
		return 0, nil
	}
	if err := w.flush(p.maps); err != nil {
		return 0, err
	}
	for _, k := range done {
		delete(p.draining, k)
		delete(p.revNatIDs, k)
	}
	return len(done), nil
}

// saveCounters stores the next IDs in the pinned vipd_ids map.
func (p *programmer) saveCounters() error {
	if err := p.maps.VipdIds.Put(uint32(0), p.nextBackend); err != nil {
		return fmt.Errorf("save backend ID counter: %w", err)
	}
	if err := p.maps.VipdIds.Put(uint32(1), p.nextRevNat); err != nil {
		return fmt.Errorf("save reverse-NAT ID counter: %w", err)
	}
	return nil
}

// unindex removes key from the frontends of service.
func (p *programmer) unindex(service string, key feKey) {
	keys := slices.DeleteFunc(p.byService[service], func(k feKey) bool { return k == key })
	if len(keys) == 0 {
		delete(p.byService, service)
	} else {
		p.byService[service] = keys
	}
}

// fail marks the programmer's in-memory IDs as possibly ahead of the maps:
// the caller rebuilds fully on the next apply.
func (p *programmer) fail(err error) error {
	p.clean = false
	if errors.Is(err, errMapFull) {
		return fmt.Errorf("%w: %w", dataplane.ErrResourceExhausted, err)
	}
	return err
}

// writeMaglev builds the frontend's Maglev table into a new inner map and
// swaps it into the outer map in one update.
func (p *programmer) writeMaglev(pr *programmed) error {
	backends := make([]maglev.Backend, len(pr.fe.slots))
	for i, s := range pr.fe.slots {
		backends[i] = maglev.Backend{ID: pr.slotIDs[i], Key: pr.fe.members[s.member].key.String(), Weight: s.weight}
	}
	table, err := maglev.Table(backends, pr.fe.maglevM)
	if err != nil {
		return err
	}
	spec := p.innerSpec.Copy()
	spec.MaxEntries = pr.fe.maglevM
	inner, err := ebpf.NewMap(spec)
	if err != nil {
		return fmt.Errorf("create Maglev table: %w", err)
	}
	defer inner.Close()
	keys := make([]uint32, len(table))
	for i := range keys {
		keys[i] = uint32(i)
	}
	if err := batchPut(inner, keys, table); err != nil {
		return fmt.Errorf("fill Maglev table: %w", err)
	}
	if err := p.maps.VipdMaglev.Put(pr.revNat, inner); err != nil {
		return fmt.Errorf("install Maglev table: %w", mapErr(err))
	}
	return nil
}

// checkCapacity fails, before anything is written, when the changes would
// not fit the maps.
func (p *programmer) checkCapacity(changes []change) error {
	// Departing frontends go first (apply step 0); a changing frontend
	// holds the union of its old and new members, and its longer slot list,
	// until its stale entries are trimmed (step 6): count that peak.
	svc, members, frontends := p.svcEntries+len(p.draining), p.memberEntries, len(p.frontends)+len(p.draining)
	newBackends := 0 // counted once per frontend: an upper bound
	for _, c := range changes {
		old := p.frontends[c.key]
		if old != nil {
			svc -= 1 + len(old.slotIDs)
			members -= len(old.memberIDs)
			frontends--
		}
		if c.fe == nil {
			if old != nil && !p.noDrain {
				svc++ // it drains: its master and reverse-NAT entry stay
				frontends++
			}
			continue
		}
		frontends++
		svc += 1 + len(c.fe.slots)
		members += len(c.fe.members)
		if old != nil {
			svc += max(len(old.slotIDs)-len(c.fe.slots), 0)
			walkMembers(old.fe.members, c.fe.members, func(_, j int) {
				if j < 0 {
					members++
				}
			})
		}
		for i := range c.fe.members {
			if _, ok := p.backendIDs.get(c.fe.members[i].key); !ok {
				newBackends++
			}
		}
	}
	// backendIDs also holds restored backends no service uses any more:
	// they leave the map only after the writes.
	backends := p.backendIDs.len() + newBackends
	if backends > int(p.maps.VipdBackends.MaxEntries()) {
		// The bound may count a backend of several frontends more than
		// once: count exactly.
		seen := map[bePacked]bool{}
		for _, c := range changes {
			if c.fe == nil {
				continue
			}
			for i := range c.fe.members {
				if k := c.fe.members[i].key; !seen[k] {
					if _, ok := p.backendIDs.get(k); !ok {
						seen[k] = true
					}
				}
			}
		}
		backends = p.backendIDs.len() + len(seen)
	}
	check := func(what string, n int, m *ebpf.Map, flag string) error {
		if max := int(m.MaxEntries()); n > max {
			return fmt.Errorf("%w: the %s map would need %d entries and holds %d (raise %s)", dataplane.ErrResourceExhausted, what, n, max, flag)
		}
		return nil
	}
	return errors.Join(
		check("service", svc, p.maps.VipdServices, "--bpf-lb-map-max"),
		check("member", members, p.maps.VipdMembers, "--bpf-lb-map-max"),
		check("backend", backends, p.maps.VipdBackends, "--bpf-backend-map-max"),
		check("reverse-NAT", frontends, p.maps.VipdRevnat, "--bpf-lb-map-max"),
	)
}
