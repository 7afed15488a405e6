package ebpf

// The programmer's apply, step by step. eBPF has no transaction across
// maps, so apply writes in make-before-break order, and each step of that
// order is a method of its own below. The steps that decide (which IDs,
// which entries, which chunk, what is unreferenced) touch no map and are
// tested without one; the steps that write only flush what they queued.

import (
	"fmt"
	"iter"
	"slices"
)

// change is the desired content of one frontend: nil removes it.
type change struct {
	key feKey
	fe  *frontend
}

// applyPlan is one apply's changes with the programmed state allocateIDs
// computed for them.
type applyPlan struct {
	changes []change
	// next is the new programmed state of each change, index for index;
	// nil for a removal.
	next []*programmed
	// offs are the offsets of each programmed's member and slot IDs in
	// the apply's ID slab of nids IDs: audit bitsets index entries by it.
	offs []int32
	nids int
	// gone are the removals of frontends that are programmed now.
	gone []change
	// fresh has the bit of each backend ID this apply handed out (a
	// never-used or a recycled one): an incremental apply writes those
	// backends (a full apply writes every backend in use).
	fresh bitset
}

// apply writes changes into the maps. prune additionally deletes every
// map entry that no desired frontend accounts for (a full sync after a
// restart or an error).
//
// Order (make-before-break; no packet ever sees a half-written frontend):
//  0. frontends that leave, master first (it becomes a draining master);
//  1. backends new to the maps (every backend, on a full apply);
//     then frontend by frontend, in chunks of about a batch of entries:
//  2. members and reverse-NAT entries: a frontend of at most
//     revNatInlineMembers members keeps them in its reverse-NAT value, a
//     larger one in vipd_members (members first, then the value that
//     points there); a changing frontend's old and new members together
//     (memberUnion), so that a member leaves only at step 6;
//  3. Maglev tables (a new inner map, swapped in whole);
//  4. slots 1..n (none for a dense frontend: see frontend.dense);
//  5. the master entry (slot 0, with the count, and a dense frontend's
//     slots) last of the frontend's entries, in one update: before it,
//     packets use the old slots 1..old count, which all still name live
//     backends;
//  6. then stale slots beyond the new count, members (the reverse-NAT
//     value without them, then the vipd_members entries no longer used)
//     and Maglev tables no longer used;
//     and once every chunk is done, backends no frontend references any more.
//
// Before step 0, IDs are allocated (allocateIDs) and their counters saved;
// a full apply of maps vipd did not write alone first reads them
// (auditFull), so that it writes only what is missing or wrong. After
// step 6 the in-memory view takes the new state (commit), and what no
// frontend uses any more is deleted (freeUnreferenced).
func (p *programmer) apply(changes []change, prune bool) (err error) {
	pl := p.allocateIDs(changes)
	// New members count as references right away; should the apply fail,
	// they are taken back (the IDs stay taken).
	defer func() {
		if err != nil {
			p.takeBack(pl)
		}
	}()
	// Record the ID counters before any entry uses a new ID.
	if err := p.saveCounters(); err != nil {
		return p.fail(err)
	}
	au, err := p.auditFull(pl, prune)
	if err != nil {
		return p.fail(err)
	}
	if pl.writesEntries() {
		// An apply of no frontend (a start with an empty state) leaves
		// clean maps clean: the first sync after it needs no audit.
		p.clean = false
	}
	if err := p.removeLeaving(pl, au); err != nil {
		return p.fail(err)
	}
	if err := p.writeBackends(pl, au, prune); err != nil {
		return p.fail(err)
	}
	if err := p.writeFrontends(pl, au, prune); err != nil {
		return p.fail(err)
	}
	dead, udpGone := p.commit(pl)
	p.freeUnreferenced(&dead, au)
	for _, f := range udpGone {
		f()
	}
	return nil
}

// allocateIDs computes the new programmed state of each change, and gives
// IDs to what has none: a reverse-NAT ID to a frontend that never had one
// (a draining or restored frontend keeps its own), a backend ID to a
// backend that is in no frontend and not in the maps (newBackendID: a
// never-used ID, else the oldest freed one). Every member of a changed
// frontend counts as a reference to its backend from here on; takeBack
// undoes that. It touches no map.
func (p *programmer) allocateIDs(changes []change) *applyPlan {
	// The programmed values and their ID lists come from two allocations
	// for all changes: a full apply replaces every frontend, and with it
	// these.
	pl := &applyPlan{changes: changes, next: make([]*programmed, len(changes))}
	// pl.nids counts a slot ID of each slot (audit bitsets index them so);
	// the slab leaves out those of frontends that share identitySlots,
	// whose slot IDs are a prefix of their member IDs.
	nfe, nslab := 0, 0
	// Into an empty backend table (the first apply of a sync), n4 and n6
	// members come: a bound of the backends it will hold, by family.
	emptyTable, n4, n6 := p.backendIDs.len() == 0, 0, 0
	for _, c := range changes {
		if c.fe != nil {
			nfe++
			if emptyTable && len(c.fe.members) > 0 {
				if _, ok := v4Key(c.fe.members[0].key); ok {
					n4 += len(c.fe.members)
				} else {
					n6 += len(c.fe.members)
				}
			}
			pl.nids += len(c.fe.members) + len(c.fe.slots)
			nslab += len(c.fe.members)
			if !c.fe.sharesIdentitySlots() {
				nslab += len(c.fe.slots)
			}
		}
	}
	prs := make([]programmed, nfe)
	ids := make([]uint32, nslab)
	off := 0
	pl.offs = make([]int32, len(changes))
	// On the first apply (the reverse-NAT IDs may be restored ones), size
	// the tables once instead of growing them step by step. (Not so the
	// backend table: members only bound its size from above.)
	if len(p.frontends) == 0 {
		p.frontends = make(map[feKey]*programmed, nfe)
	}
	if len(p.byService) == 0 {
		p.byService = make(map[string]feKey, nfe)
	}
	// An empty backend table is sized for the members (no more than the
	// map holds), and remade smaller once the IDs are handed out (fit)
	// should the members name far fewer backends.
	if emptyTable {
		// IDs are handed out from nextBackend on (every ID below it is
		// free: newBackendID takes the never-used ones first).
		limit := int(min(p.backendLimit(), 1<<30))
		n4, n6 = min(n4, limit), min(n6, limit)
		p.backendIDs.reserve(n4, n6, min(int(p.nextBackend)+n4+n6, limit+1))
		defer p.backendIDs.fit(n4, n6)
	}
	for i, c := range changes {
		if c.fe == nil {
			if p.frontends[c.key] != nil {
				pl.gone = append(pl.gone, c)
			}
			continue
		}
		revNat, ok := p.revNatOf(c.key)
		if !ok {
			revNat = p.nextRevNat
			p.nextRevNat++
		}
		pr := &prs[0]
		prs = prs[1:]
		pl.offs[i] = int32(off)
		m, s := len(c.fe.members), len(c.fe.slots)
		off += m + s
		identity := c.fe.sharesIdentitySlots()
		n := m
		if !identity {
			n += s
		}
		*pr = programmed{fe: c.fe, revNat: revNat, ids: ids[:n:n]}
		ids = ids[n:]
		for j := range c.fe.members {
			k := c.fe.members[j].key
			ref, ok := p.backendIDs.get(k)
			if !ok {
				ref.id = p.newBackendID()
				pl.fresh = pl.fresh.grown(int(ref.id))
				pl.fresh.set(int(ref.id))
			}
			ref.refs++
			p.backendIDs.put(k, ref)
			pr.ids[j] = ref.id
		}
		if !identity {
			for j, sl := range c.fe.slots {
				pr.ids[m+j] = pr.ids[sl.member]
			}
		}
		pl.next[i] = pr
	}
	return pl
}

// writesEntries reports whether the apply writes any service map entry:
// whether it programs or removes any frontend.
func (pl *applyPlan) writesEntries() bool {
	return len(pl.gone) > 0 || slices.ContainsFunc(pl.next, func(pr *programmed) bool { return pr != nil })
}

// takeBack drops the references allocateIDs counted for a failed apply.
// The backends stay in the table (and their IDs taken), for a later full
// apply to rewrite or prune; so do the reverse-NAT IDs it gave new
// frontends (the maps may hold entries that name them).
func (p *programmer) takeBack(pl *applyPlan) {
	for i, pr := range pl.next {
		if pr == nil {
			continue
		}
		p.unref(pr, nil)
		if k := pl.changes[i].key; p.frontends[k] == nil {
			p.revNatIDs[k] = pr.revNat
		}
	}
}

// auditFull reads the maps before a full apply (prune) unless vipd found
// them empty and has written nothing since, and records in p.changed what
// the apply changes in them. It returns nil, and reads nothing, on an
// incremental apply and on clean maps: then every entry is written.
func (p *programmer) auditFull(pl *applyPlan, prune bool) (*audit, error) {
	if !prune {
		return nil, nil
	}
	var au *audit
	if !p.clean {
		var err error
		if au, err = p.auditMaps(pl.changes, pl.next, pl.offs, pl.nids, pl.gone, nil); err != nil {
			return nil, fmt.Errorf("read maps: %w", err)
		}
	}
	p.changed = au.counts(pl.next, &p.backendIDs)
	return au, nil
}

// removeLeaving is step 0: it deletes the frontends that leave, and those
// au found that no service has any more, before anything is written.
func (p *programmer) removeLeaving(pl *applyPlan, au *audit) error {
	leaving := p.leavingWrites(pl.gone)
	if au != nil {
		leaving.append(&au.absent)
	}
	return leaving.flush(p.maps, p.slots)
}

// leavingWrites queues step 0 for the frontends in gone, master first:
// they are leaving anyway, and their room may be needed.
//
// A leaving frontend's master becomes a draining one (count 0, no new
// flow translated, new connections pass as if there were no service)
// so that its established TCP and SCTP flows finish, as conntrack's
// DNAT lets them under iptables; its reverse-NAT entry stays. The
// conntrack collector removes both once no flow uses them. With noDrain
// (the maps are too full) the master and reverse-NAT entry go at once.
// It touches no map.
func (p *programmer) leavingWrites(gone []change) writes {
	var leaving writes
	for _, c := range gone {
		old := p.frontends[c.key]
		if p.noDrain {
			leaving.deleteSlot(c.key, 0)
			leaving.deleteRevNat(old.revNat)
		} else {
			leaving.svcKeys = append(leaving.svcKeys, svcKeyOf(c.key, 0))
			leaving.svcVals = append(leaving.svcVals, bpfSvcVal{RevNatId: old.revNat, Flags: svcFlagDraining})
			// Its reverse-NAT entry stays, with no member (inline, so
			// that the vipd_members entries below may go).
			leaving.revNat(old.revNat, revNatBase(c.key))
		}
		for i := range old.fe.slotEntries() {
			leaving.deleteSlot(c.key, uint32(i+1))
		}
		if !old.fe.inlineMembers() {
			for _, id := range old.memberIDs() {
				leaving.deleteMember(old.revNat, id)
			}
		}
		if old.fe.flags&svcFlagMaglev != 0 {
			leaving.deleteMaglev(old.revNat)
		}
	}
	return leaving
}

// writeBackends is step 1: it writes the backends before any frontend that
// uses them, a batch at a time.
func (p *programmer) writeBackends(pl *applyPlan, au *audit, prune bool) error {
	w := &p.w
	for id, k := range p.backendsToWrite(pl, au, prune) {
		w.backend(id, k)
		if len(w.backendKeys) < batchSize {
			continue
		}
		if err := w.flush(p.maps, p.slots); err != nil {
			return err
		}
	}
	return w.flush(p.maps, p.slots)
}

// backendsToWrite yields the backends step 1 writes, by ID: on an
// incremental apply those new to the maps; on a full one every backend in
// use but those au found correct, which repairs whatever an earlier failed
// apply left half-written. It touches no map.
func (p *programmer) backendsToWrite(pl *applyPlan, au *audit, prune bool) iter.Seq2[uint32, bePacked] {
	return func(yield func(uint32, bePacked) bool) {
		if prune {
			for k, ref := range p.backendIDs.all() {
				if ref.refs <= 0 || au != nil && au.backendOK.has(int(ref.id)) {
					continue
				}
				if !yield(ref.id, k) {
					return
				}
			}
			return
		}
		// Each new backend once, however many members name it.
		seen := newBitset(64 * len(pl.fresh))
		for _, pr := range pl.next {
			if pr == nil {
				continue
			}
			for j, id := range pr.memberIDs() {
				if !pl.fresh.has(int(id)) || seen.has(int(id)) {
					continue
				}
				seen.set(int(id))
				if !yield(id, pr.fe.members[j].key) {
					return
				}
			}
		}
	}
}

// writeFrontends is steps 2–6, frontend by frontend, in chunks of about a
// batch of entries each, so that the write buffers stay small however
// many frontends change: the order holds within each frontend, and no
// frontend of a chunk depends on another's entries.
func (p *programmer) writeFrontends(pl *applyPlan, au *audit, prune bool) error {
	for lo := 0; lo < len(pl.changes); {
		hi := chunkEnd(pl.next, lo, batchSize)
		ch := chunk{changes: pl.changes[lo:hi], next: pl.next[lo:hi], offs: pl.offs[lo:hi], base: lo}
		if err := p.applyChunk(ch, prune, au); err != nil {
			return err
		}
		lo = hi
	}
	return nil
}

// chunkEnd returns the end of the chunk of next that starts at lo: it
// takes frontends until they hold limit entries or more (a master, its
// slots and its members each), and at least one. Removals (nil) hold none:
// step 0 wrote them.
func chunkEnd(next []*programmed, lo, limit int) int {
	hi, n := lo, 0
	for hi < len(next) && n < limit {
		if pr := next[hi]; pr != nil {
			n += 1 + pr.fe.slotEntries() + pr.fe.memberEntries()
		}
		hi++
	}
	return hi
}

// chunk is a run of an apply's changes that steps 2–6 write together:
// changes from index base on, next their programmed state index for index
// (nil for a removal, which step 0 did), offs the offsets of their IDs in
// the apply's ID slab.
type chunk struct {
	changes []change
	next    []*programmed
	offs    []int32
	base    int
}

// applyChunk runs steps 2–6 of apply for one chunk. The backends are in
// place already. Entries au found correct are not written again.
func (p *programmer) applyChunk(ch chunk, prune bool, au *audit) error {
	w := &p.w
	found := au
	if found == nil {
		found = &audit{} // its bitsets all empty: every entry is written
	}
	w.reserve(ch)
	p.queueMembers(w, ch, prune, found)
	if err := w.flush(p.maps, p.slots); err != nil {
		return err
	}
	if err := p.writeMaglevs(ch, prune); err != nil {
		return err
	}
	p.queueSlots(w, ch, prune, found)
	if err := w.flush(p.maps, p.slots); err != nil {
		return err
	}
	p.queueMasters(w, ch, prune, found)
	if err := w.flush(p.maps, p.slots); err != nil {
		return err
	}
	p.queueStale(w, ch)
	return w.flush(p.maps, p.slots)
}

// queueMembers queues step 2: the reverse-NAT entry and the members of a
// new frontend, but those au found correct (on a full apply); of a
// changed one, its member union (old and new members, see memberUnion):
// inline in its reverse-NAT value when it fits and anything changed (or
// the value may be wrong, on a full apply), else as vipd_members entries,
// those that are new or changed or not there yet. It touches no map.
func (p *programmer) queueMembers(w *writes, ch chunk, prune bool, au *audit) {
	for i, c := range ch.changes {
		pr := ch.next[i]
		if pr == nil {
			continue
		}
		off := int(ch.offs[i])
		// revNatOK: the maps hold pr's final reverse-NAT value.
		revNatOK := au.revNatOK.has(ch.base + i)
		old := p.frontends[c.key]
		if old == nil {
			if !pr.fe.inlineMembers() {
				for j, id := range pr.memberIDs() {
					if !au.memberOK.has(off + j) {
						w.member(pr.revNat, id, uint32(pr.fe.members[j].flags))
					}
				}
			}
			if !revNatOK {
				w.revNat(pr.revNat, revNatVal(c.key, pr))
			}
			continue
		}
		u := unionOf(c.key, old, pr)
		if u.inline() {
			// old's members are inline too (the union holds them).
			if u.changed || prune && (!revNatOK || u.removed) {
				w.revNat(pr.revNat, u.rn)
			}
			continue
		}
		oldInline := old.fe.inlineMembers()
		walkMembers(old.fe.members, pr.fe.members, func(i, j int) {
			switch {
			case j >= 0 && (oldInline || i < 0 || old.fe.members[i].flags != pr.fe.members[j].flags ||
				prune && !au.memberOK.has(off+j)):
				w.member(pr.revNat, pr.memberIDs()[j], uint32(pr.fe.members[j].flags))
			case j < 0 && oldInline:
				w.member(old.revNat, old.memberIDs()[i], uint32(old.fe.members[i].flags))
			}
		})
		if oldInline || prune && (!revNatOK || pr.fe.inlineMembers()) {
			w.revNat(pr.revNat, u.rn) // after its members: see writes.flush
		}
	}
}

// writeMaglevs is step 3: it builds and swaps in the Maglev table of every
// Maglev frontend of the chunk whose table may differ from the one in
// place.
func (p *programmer) writeMaglevs(ch chunk, prune bool) error {
	for i, c := range ch.changes {
		pr := ch.next[i]
		if pr == nil || pr.fe.flags&svcFlagMaglev == 0 {
			continue
		}
		if old := p.frontends[c.key]; !prune && sameMaglevTable(old, pr) {
			continue
		}
		if err := p.writeMaglev(pr); err != nil {
			return fmt.Errorf("frontend %s: %w", c.key, err)
		}
	}
	return nil
}

// sameMaglevTable reports whether old (nil: none) has the Maglev table pr
// would build: the same size, and the same backend IDs with the same
// weights slot for slot.
func sameMaglevTable(old, pr *programmed) bool {
	return old != nil && old.fe.maglevM == pr.fe.maglevM && old.fe.flags&svcFlagMaglev != 0 &&
		slices.Equal(old.slotIDs(), pr.slotIDs()) &&
		slices.EqualFunc(old.fe.slots, pr.fe.slots, func(a, b slot) bool { return a.weight == b.weight })
}

// queueSlots queues step 4: the slot entries that are new or changed (all
// of them on a full apply), but those au found correct. A dense frontend
// has none: its master holds its slots. It touches no map.
func (p *programmer) queueSlots(w *writes, ch chunk, prune bool, au *audit) {
	for i, c := range ch.changes {
		pr := ch.next[i]
		if pr == nil {
			continue
		}
		old := p.frontends[c.key]
		m := int(ch.offs[i]) + len(pr.memberIDs())
		for j, id := range pr.slotIDs()[:pr.fe.slotEntries()] {
			if old == nil || prune || j >= old.fe.slotEntries() || old.slotIDs()[j] != id || old.fe.slots[j].cum != pr.fe.slots[j].cum {
				if !au.slotOK.has(m + j) {
					w.slot(c.key, uint32(j+1), id, pr.fe.slots[j].cum)
				}
			}
		}
	}
}

// queueMasters queues step 5: the master of every new or changed frontend
// (all of them on a full apply), but those au found correct. It touches
// no map.
func (p *programmer) queueMasters(w *writes, ch chunk, prune bool, au *audit) {
	for i, c := range ch.changes {
		pr := ch.next[i]
		if pr == nil {
			continue
		}
		if old := p.frontends[c.key]; old == nil || prune || !old.fe.equal(pr.fe) || old.revNat != pr.revNat {
			if !au.masterOK.has(ch.base + i) {
				w.master(c.key, pr)
			}
		}
	}
}

// queueStale queues step 6, the break: of each changed frontend, the
// slots beyond its new count, the members it no longer has, and its
// Maglev table when it no longer uses Maglev. (Unreferenced backends go
// once every chunk is done.) It touches no map.
func (p *programmer) queueStale(w *writes, ch chunk) {
	for i, c := range ch.changes {
		pr, old := ch.next[i], p.frontends[c.key]
		if pr == nil || old == nil {
			continue
		}
		for j := pr.fe.slotEntries(); j < old.fe.slotEntries(); j++ {
			w.deleteSlot(c.key, uint32(j+1))
		}
		// The reverse-NAT value without the members that left (its
		// final value) is written before the vipd_members entries go
		// (writes.flush puts before it deletes).
		u := unionOf(c.key, old, pr)
		inline := pr.fe.inlineMembers()
		if inline && (!u.inline() || u.removed) {
			w.revNat(pr.revNat, revNatVal(c.key, pr))
		}
		if !u.inline() {
			walkMembers(old.fe.members, pr.fe.members, func(i, j int) {
				switch {
				case j < 0:
					w.deleteMember(old.revNat, old.memberIDs()[i])
				case inline:
					w.deleteMember(pr.revNat, pr.memberIDs()[j])
				}
			})
		}
		if old.fe.flags&svcFlagMaglev != 0 && pr.fe.flags&svcFlagMaglev == 0 {
			w.deleteMaglev(old.revNat)
		}
	}
}

// commit makes the in-memory view the state apply wrote: the leaving
// frontends drain (or, with noDrain, give up their reverse-NAT IDs), the
// others take their new programmed state, and the entry counts follow.
// The new members' references were counted by allocateIDs, before any old
// one's goes here: a backend moving between frontends never looks
// unreferenced. It returns the deletions of the backends no frontend
// references any more, and the onMembersRemoved calls to make once they
// are deleted. It touches no map.
func (p *programmer) commit(pl *applyPlan) (dead writes, udpGone []func()) {
	for _, c := range pl.gone {
		old := p.frontends[c.key]
		if c.key.proto == ipprotoUDP && p.onMembersRemoved != nil && len(old.fe.members) > 0 {
			// Node-local sockets connected through the frontend have
			// nowhere to go: destroy them so the application notices.
			key, revNat, members := c.key, old.revNat, memberKeys(old.fe.members)
			udpGone = append(udpGone, func() { p.onMembersRemoved(key, revNat, members) })
		}
		p.unref(old, &dead)
		p.svcEntries -= 1 + old.fe.slotEntries()
		p.memberEntries -= old.fe.memberEntries()
		p.unindex(old.fe.service, c.key)
		delete(p.frontends, c.key)
		if p.noDrain {
			delete(p.revNatIDs, c.key)
		} else {
			// Its ID stays taken while it drains.
			p.draining[c.key] = old.revNat
			p.revNatIDs[c.key] = old.revNat
		}
	}
	// A frontend programmed now has its reverse-NAT ID in p.frontends
	// alone. The map is remade once most of it went (after the full apply
	// of a restart, which programs every restored frontend): a Go map
	// never shrinks.
	moved := 0
	for i, pr := range pl.next {
		if pr == nil {
			continue
		}
		key := pl.changes[i].key
		old := p.frontends[key]
		if old != nil {
			p.svcEntries -= 1 + old.fe.slotEntries()
			p.memberEntries -= old.fe.memberEntries()
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
			p.unref(old, &dead)
		}
		p.svcEntries += 1 + pr.fe.slotEntries()
		p.memberEntries += pr.fe.memberEntries()
		delete(p.draining, key) // back before it drained: a live master again
		if old == nil || old.fe.service != pr.fe.service {
			if old != nil {
				p.unindex(old.fe.service, key)
			}
			p.index(pr.fe.service, key)
		}
		p.frontends[key] = pr
		if _, ok := p.revNatIDs[key]; ok {
			delete(p.revNatIDs, key)
			moved++
		}
	}
	if moved > 0 && len(p.revNatIDs) < moved {
		ids := make(map[feKey]uint32, len(p.revNatIDs))
		for k, id := range p.revNatIDs {
			ids[k] = id
		}
		p.revNatIDs = ids
	}
	return dead, udpGone
}

// freeUnreferenced deletes, once the new state is in force, the backends
// in dead and, after an audit, the stale entries au found; the in-memory
// IDs nothing holds any more go with them (forget). Its failures only log:
// no packet can reach these entries any more.
func (p *programmer) freeUnreferenced(dead *writes, au *audit) {
	if err := dead.flush(p.maps, p.slots); err != nil {
		p.log.Warn("delete unreferenced backends", "error", err)
	}
	if au != nil {
		// A failed prune leaves stale entries no packet can reach (their
		// masters are gone), for the next full apply to remove.
		p.forget()
		if err := au.stale.flush(p.maps, p.slots); err != nil {
			p.log.Warn("prune stale entries; the next full apply retries", "error", err)
		}
	}
}

// unref drops the references of pr's members. Backends left without one
// leave the table, and dead queues their deletion; with dead nil (taking
// back the references of a failed apply) they stay in the table, for a
// later full apply to rewrite or prune.
func (p *programmer) unref(pr *programmed, dead *writes) {
	for j, id := range pr.memberIDs() {
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
		dead.deleteBackend(id) // zeroed in this apply, before any reuse
		p.freeBackendID(id)
	}
}
