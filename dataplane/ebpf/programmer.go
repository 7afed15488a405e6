package ebpf

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"

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

	revNatIDs   map[feKey]uint32
	nextRevNat  uint32
	backendIDs  map[beKey]uint32
	backendKeys map[uint32]beKey
	backendRefs map[uint32]int
	nextBackend uint32

	// clean is true while the maps hold nothing but what applies wrote:
	// vipd found them empty, and no apply failed since. A full apply of
	// clean maps needs no prune.
	clean bool

	// Entry counts, for capacity checks before any write.
	svcEntries, memberEntries int

	// onMembersRemoved is called with the UDP backends that left a
	// frontend, after they did (to destroy node-local sockets stuck on them).
	onMembersRemoved func(fe feKey, revNat uint32, gone []beKey)
}

// programmed is a frontend as written into the maps.
type programmed struct {
	fe        *frontend
	revNat    uint32
	slotIDs   []uint32
	memberIDs map[uint32]uint32
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
		backendIDs:  map[beKey]uint32{},
		backendKeys: map[uint32]beKey{},
		backendRefs: map[uint32]int{},
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
		k := beKey{addr: fromWords(be.Addr.W), port: fromBE16(be.Port)}
		p.backendIDs[k] = id
		p.backendKeys[id] = k
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
	p.clean = len(p.revNatIDs) == 0 && len(p.backendIDs) == 0 &&
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
//  1. backends, reverse-NAT entries and members;
//  2. Maglev tables (a new inner map, swapped in whole);
//  3. slots 1..n of each frontend;
//  4. the master entry (slot 0, with the count) last of the frontend's
//     entries: before it, packets use the old slots 1..old count, which all
//     still name live backends;
//  5. then stale slots beyond the new count, removed frontends (master
//     first), members and reverse-NAT entries no longer used, and backends
//     no frontend references any more.
func (p *programmer) apply(changes []change, desiredAll map[feKey]*frontend, prune bool) error {
	var (
		newBackends []beKey
		trim        writes
		gone        []change
	)
	w := newWrites(changes)
	// Allocate IDs; compute the new programmed state of each frontend.
	next := make(map[feKey]*programmed, len(changes))
	refDelta := map[uint32]int{}
	for _, c := range changes {
		old := p.frontends[c.key]
		if c.fe == nil {
			if old != nil {
				gone = append(gone, c)
				for id := range old.memberIDs {
					refDelta[id]--
				}
			}
			continue
		}
		revNat, ok := p.revNatIDs[c.key]
		if !ok {
			revNat = p.nextRevNat
			p.nextRevNat++
			p.revNatIDs[c.key] = revNat
		}
		pr := &programmed{fe: c.fe, revNat: revNat, memberIDs: make(map[uint32]uint32, len(c.fe.members))}
		for k, flags := range c.fe.members {
			id, ok := p.backendIDs[k]
			if !ok {
				id = p.nextBackend
				p.nextBackend++
				p.backendIDs[k] = id
				p.backendKeys[id] = k
				newBackends = append(newBackends, k)
			}
			pr.memberIDs[id] = flags
			refDelta[id]++
		}
		for _, s := range c.fe.slots {
			pr.slotIDs = append(pr.slotIDs, p.backendIDs[s.backend])
		}
		if old != nil {
			for id := range old.memberIDs {
				refDelta[id]--
			}
		}
		next[c.key] = pr
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
		for id := range old.memberIDs {
			leaving.deleteMember(old.revNat, id)
		}
		if old.fe.flags&svcFlagMaglev != 0 {
			leaving.deleteMaglev(old.revNat)
		}
	}
	if prune && !p.clean {
		if err := p.queueAbsent(&leaving, desiredAll); err != nil {
			return p.fail(fmt.Errorf("read maps: %w", err))
		}
	}
	if err := leaving.flush(p.maps); err != nil {
		return p.fail(err)
	}

	// 1. Backends, reverse NAT, members.
	if prune {
		// Rewrite every backend: idempotent, and it repairs whatever an
		// earlier failed apply left half-written.
		for k, id := range p.backendIDs {
			w.backend(id, k)
		}
	} else {
		for _, k := range newBackends {
			w.backend(p.backendIDs[k], k)
		}
	}
	for _, c := range changes {
		pr := next[c.key]
		if pr == nil {
			continue
		}
		old := p.frontends[c.key]
		if old == nil || prune {
			w.revNat(pr.revNat, c.key)
		}
		for id, flags := range pr.memberIDs {
			if old == nil || prune {
				w.member(pr.revNat, id, flags)
			} else if f, had := old.memberIDs[id]; !had || f != flags {
				w.member(pr.revNat, id, flags)
			}
		}
	}
	if err := w.flush(p.maps); err != nil {
		return p.fail(err)
	}

	// 2. Maglev tables.
	for _, c := range changes {
		pr := next[c.key]
		if pr == nil || pr.fe.flags&svcFlagMaglev == 0 {
			continue
		}
		old := p.frontends[c.key]
		if old != nil && !prune && old.fe.maglevM == pr.fe.maglevM && slices.Equal(old.fe.slots, pr.fe.slots) &&
			old.fe.flags&svcFlagMaglev != 0 {
			continue
		}
		if err := p.writeMaglev(pr); err != nil {
			return p.fail(fmt.Errorf("frontend %s: %w", c.key, err))
		}
	}

	// 3. Slots, then 4. masters.
	var masters writes
	for _, c := range changes {
		pr := next[c.key]
		if pr == nil {
			continue
		}
		old := p.frontends[c.key]
		for i, id := range pr.slotIDs {
			if old == nil || prune || i >= len(old.slotIDs) || old.slotIDs[i] != id || old.fe.slots[i].cum != pr.fe.slots[i].cum {
				w.slot(c.key, uint32(i+1), id, pr.fe.slots[i].cum)
			}
		}
		if old == nil || prune || !old.fe.equal(pr.fe) || old.revNat != pr.revNat {
			masters.master(c.key, pr)
		}
		if old != nil {
			for i := len(pr.slotIDs); i < len(old.slotIDs); i++ {
				trim.deleteSlot(c.key, uint32(i+1))
			}
			for id := range old.memberIDs {
				if _, keep := pr.memberIDs[id]; !keep {
					trim.deleteMember(old.revNat, id)
				}
			}
		}
	}
	if err := w.flush(p.maps); err != nil {
		return p.fail(err)
	}
	if err := masters.flush(p.maps); err != nil {
		return p.fail(err)
	}

	// 5. Break: stale slots and members, Maglev tables no longer used,
	// and (below) unreferenced backends.
	for _, c := range changes {
		if pr, old := next[c.key], p.frontends[c.key]; pr != nil && old != nil &&
			old.fe.flags&svcFlagMaglev != 0 && pr.fe.flags&svcFlagMaglev == 0 {
			trim.deleteMaglev(old.revNat)
		}
	}
	if err := trim.flush(p.maps); err != nil {
		return p.fail(err)
	}

	// Commit the in-memory view.
	var udpGone []func()
	for _, c := range gone {
		old := p.frontends[c.key]
		if c.key.proto == ipprotoUDP && p.onMembersRemoved != nil && len(old.fe.members) > 0 {
			// Node-local sockets connected through the frontend have
			// nowhere to go: destroy them so the application notices.
			key, revNat, members := c.key, old.revNat, slices.Collect(maps.Keys(old.fe.members))
			udpGone = append(udpGone, func() { p.onMembersRemoved(key, revNat, members) })
		}
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
	for key, pr := range next {
		if old := p.frontends[key]; old != nil {
			p.svcEntries -= 1 + len(old.slotIDs)
			p.memberEntries -= len(old.memberIDs)
			if key.proto == ipprotoUDP && p.onMembersRemoved != nil {
				var removed []beKey
				for k := range old.fe.members {
					if _, ok := pr.fe.members[k]; !ok {
						removed = append(removed, k)
					}
				}
				if len(removed) > 0 {
					udpGone = append(udpGone, func() { p.onMembersRemoved(key, old.revNat, removed) })
				}
			}
		}
		p.svcEntries += 1 + len(pr.slotIDs)
		p.memberEntries += len(pr.memberIDs)
		delete(p.draining, key) // back before it drained: a live master again
		if old := p.frontends[key]; old == nil || old.fe.service != pr.fe.service {
			if old != nil {
				p.unindex(old.fe.service, key)
			}
			p.byService[pr.fe.service] = append(p.byService[pr.fe.service], key)
		}
		p.frontends[key] = pr
	}
	var deadBackends writes
	for id, d := range refDelta {
		p.backendRefs[id] += d
		if p.backendRefs[id] <= 0 {
			delete(p.backendRefs, id)
			if k, ok := p.backendKeys[id]; ok {
				delete(p.backendIDs, k)
				delete(p.backendKeys, id)
			}
			deadBackends.deleteBackend(id)
		}
	}
	if err := deadBackends.flush(p.maps); err != nil {
		p.log.Warn("delete unreferenced backends", "error", err)
	}
	if prune && !p.mapsEmpty() {
		// The new state is in force already: a failed prune leaves stale
		// entries no packet can reach (their masters are gone), for the
		// next full apply to remove.
		if err := p.prune(desiredAll); err != nil {
			p.clean = false
			p.log.Warn("prune stale entries; the next full apply retries", "error", err)
		}
	}
	for _, f := range udpGone {
		f()
	}
	return nil
}

// fail marks the programmer's in-memory IDs as possibly ahead of the maps:
// the caller rebuilds fully on the next apply.
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
		backends[i] = maglev.Backend{ID: pr.slotIDs[i], Key: s.backend.String(), Weight: s.weight}
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
	// until its stale entries are trimmed (step 5): count that peak.
	svc, members, frontends := p.svcEntries+len(p.draining), p.memberEntries, len(p.frontends)+len(p.draining)
	newBackends := make(map[beKey]bool, len(changes))
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
			for id := range old.memberIDs {
				if _, keep := c.fe.members[p.backendKeys[id]]; !keep {
					members++
				}
			}
		}
		for k := range c.fe.members {
			if _, ok := p.backendIDs[k]; !ok {
				newBackends[k] = true
			}
		}
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
		// backendIDs also holds restored backends no service uses any more:
		// they leave the map only after the writes.
		check("backend", len(p.backendIDs)+len(newBackends), p.maps.VipdBackends, "--bpf-backend-map-max"),
		check("reverse-NAT", frontends, p.maps.VipdRevnat, "--bpf-lb-map-max"),
	)
}

// queueAbsent queues the deletion of every map entry of a frontend that is
// not desired at all (left by a previous run), master entries first.
func (p *programmer) queueAbsent(w *writes, desired map[feKey]*frontend) error {
	absent := map[uint32]bool{}
	err := forEach(p.maps.VipdRevnat, func(id uint32, rn bpfRevNat) {
		k := feKey{addr: fromWords(rn.Addr.W), port: fromBE16(rn.Port), proto: rn.Proto}
		if desired[k] == nil && p.draining[k] != id {
			absent[id] = true
			w.deleteRevNat(id)
		}
	})
	if err != nil {
		return err
	}
	var slots []bpfSvcKey
	err = forEach(p.maps.VipdServices, func(sk bpfSvcKey, _ bpfSvcVal) {
		k := feKey{addr: fromWords(sk.Addr.W), port: fromBE16(sk.Port), proto: sk.Proto}
		if desired[k] != nil {
			return
		}
		if _, drains := p.draining[k]; drains && sk.Slot == 0 {
			return
		}
		if sk.Slot == 0 {
			w.svcDeletes = append(w.svcDeletes, sk)
		} else {
			slots = append(slots, sk)
		}
	})
	if err != nil {
		return err
	}
	w.svcDeletes = append(w.svcDeletes, slots...)
	err = forEach(p.maps.VipdMembers, func(mk bpfMemberKey, _ uint32) {
		if absent[mk.RevNatId] {
			w.memberDeletes = append(w.memberDeletes, mk)
		}
	})
	if err != nil {
		return err
	}
	return forEach(p.maps.VipdMaglev, func(id uint32, _ uint32) {
		if absent[id] {
			w.maglevDeletes = append(w.maglevDeletes, id)
		}
	})
}

// mapsEmpty reports whether the maps hold only what this apply wrote:
// true when they were empty when vipd started and no apply failed since.
func (p *programmer) mapsEmpty() bool { return p.clean }

// prune deletes map entries that no desired frontend accounts for: what a
// previous run left behind for services that no longer exist.
func (p *programmer) prune(desired map[feKey]*frontend) error {
	var del writes
	err := forEach(p.maps.VipdServices, func(sk bpfSvcKey, _ bpfSvcVal) {
		k := feKey{addr: fromWords(sk.Addr.W), port: fromBE16(sk.Port), proto: sk.Proto}
		if _, drains := p.draining[k]; drains && sk.Slot == 0 {
			return
		}
		pr := p.frontends[k]
		if pr == nil || desired[k] == nil || int(sk.Slot) > len(pr.slotIDs) {
			del.svcDeletes = append(del.svcDeletes, sk)
		}
	})
	if err != nil {
		return err
	}
	// Masters before slots: sort deletes so that slot 0 goes first.
	sort.SliceStable(del.svcDeletes, func(i, j int) bool { return del.svcDeletes[i].Slot < del.svcDeletes[j].Slot })

	byRevNat := make(map[uint32]*programmed, len(p.frontends))
	for _, pr := range p.frontends {
		byRevNat[pr.revNat] = pr
	}
	drainingIDs := make(map[uint32]bool, len(p.draining))
	for _, id := range p.draining {
		drainingIDs[id] = true
	}
	err = forEach(p.maps.VipdMembers, func(mk bpfMemberKey, _ uint32) {
		if pr := byRevNat[mk.RevNatId]; pr == nil {
			del.memberDeletes = append(del.memberDeletes, mk)
		} else if _, ok := pr.memberIDs[mk.BackendId]; !ok {
			del.memberDeletes = append(del.memberDeletes, mk)
		}
	})
	if err != nil {
		return err
	}
	err = forEach(p.maps.VipdRevnat, func(id uint32, _ bpfRevNat) {
		if byRevNat[id] == nil && !drainingIDs[id] {
			del.revNatDeletes = append(del.revNatDeletes, id)
		}
	})
	if err != nil {
		return err
	}
	err = forEach(p.maps.VipdMaglev, func(id uint32, _ uint32) {
		if pr := byRevNat[id]; pr == nil || pr.fe.flags&svcFlagMaglev == 0 {
			del.maglevDeletes = append(del.maglevDeletes, id)
		}
	})
	if err != nil {
		return err
	}
	err = forEach(p.maps.VipdBackends, func(id uint32, _ bpfBackend) {
		if p.backendRefs[id] == 0 {
			del.backendDeletes = append(del.backendDeletes, id)
		}
	})
	if err != nil {
		return err
	}
	for k, id := range p.backendIDs {
		if p.backendRefs[id] == 0 {
			delete(p.backendIDs, k)
			delete(p.backendKeys, id)
		}
	}
	for k, id := range p.revNatIDs {
		if byRevNat[id] == nil && !drainingIDs[id] {
			delete(p.revNatIDs, k)
		}
	}
	n := len(del.svcDeletes) + len(del.memberDeletes) + len(del.revNatDeletes) + len(del.maglevDeletes) + len(del.backendDeletes)
	if n > 0 {
		p.log.Info("pruned entries no service accounts for", "entries", n)
	}
	return del.flush(p.maps)
}
