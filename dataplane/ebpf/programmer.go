package ebpf

import (
	"errors"
	"fmt"
	"iter"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/hashicorp/go-hclog"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/ebpf/maglev"
)

// programmer turns frontends into map entries and keeps the IDs stable.
//
// IDs: every frontend has a reverse-NAT ID and every backend (address,
// port) a backend ID. Reverse-NAT IDs only grow and are never reused, so a
// conntrack entry naming an old one can never point at a different
// frontend. Backend IDs index the vipd_backends array and are recycled:
// never-used ones first, then freed ones oldest first, each slot zeroed
// when its backend goes; the programs check that a recycled ID still
// names a flow's backend (backendids.go states the rule). A restarted
// vipd reads them back from the maps (restore).
type programmer struct {
	log       hclog.Logger
	maps      *bpfMaps
	slots     *backendSlots // the backend map's mapping (backendslots.go)
	innerSpec *ebpf.MapSpec // template of a Maglev table
	maglevMin uint32

	frontends map[feKey]*programmed
	// byService has the key of one frontend of each service, and
	// moreOf the keys of any others (index, unindex, keysOf): most
	// services have one frontend, and a slice of one key each took an
	// allocation of 32 bytes more (3.2 MB at 100,000 services).
	byService map[string]feKey
	moreOf    map[string][]feKey
	// draining are deleted frontends whose draining master stays while
	// flows use it, by reverse-NAT ID. noDrain deletes leaving frontends
	// outright instead: when the maps are too full to keep them.
	draining map[feKey]uint32
	noDrain  bool

	// revNatIDs are the reverse-NAT IDs of the frontends that have one
	// but are not programmed: draining ones, those restored from the maps
	// that no apply has programmed yet, and those a failed apply gave one
	// (revNatOf). A programmed frontend's ID is in its programmed value
	// alone: a second copy here took 6 MB at 100,000 frontends.
	revNatIDs  map[feKey]uint32
	nextRevNat uint32
	// backendIDs maps every backend in the maps to its ID and to the
	// number of frontends that have it as a member.
	backendIDs backendTable
	// nextBackend is the lowest backend ID never handed out, and freeIDs
	// the IDs below it that no backend holds, oldest-freed first: every
	// ID below nextBackend (but 0) is in exactly one of backendIDs and
	// freeIDs (newBackendID, freeBackendID).
	nextBackend uint32
	freeIDs     idQueue

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
	// ids are the backend IDs of fe.members, index for index, then those
	// of fe.slots unless fe shares identitySlots (its slot IDs are then a
	// prefix of its member IDs): memberIDs and slotIDs. One slice, not
	// two: 24 bytes a frontend less. They do not change once allocateIDs
	// has filled them.
	ids []uint32
}

// memberIDs returns the backend IDs of pr.fe.members, index for index.
func (pr *programmed) memberIDs() []uint32 { return pr.ids[:len(pr.fe.members)] }

// slotIDs returns the backend IDs of pr.fe.slots, index for index.
func (pr *programmed) slotIDs() []uint32 {
	if pr.fe.sharesIdentitySlots() {
		return pr.ids[:len(pr.fe.slots)]
	}
	return pr.ids[len(pr.fe.members):]
}

func newProgrammer(log hclog.Logger, maps *bpfMaps, innerSpec *ebpf.MapSpec, maglevMin uint32) *programmer {
	var slots *backendSlots
	if maps != nil {
		slots = newBackendSlots(maps.VipdBackends)
	}
	return &programmer{
		slots:       slots,
		log:         log,
		maps:        maps,
		innerSpec:   innerSpec,
		maglevMin:   maglevMin,
		frontends:   map[feKey]*programmed{},
		draining:    map[feKey]uint32{},
		byService:   map[string]feKey{},
		moreOf:      map[string][]feKey{},
		revNatIDs:   map[feKey]uint32{},
		backendIDs:  newBackendTable(),
		nextRevNat:  1,
		nextBackend: 1,
	}
}

// restore reads the IDs a previous vipd left in the pinned maps, so that
// the entries it wrote keep their meaning: conntrack and affinity entries
// name backends and frontends by ID.
//
// The three maps are read in parallel: each fills its own fields.
func (p *programmer) restore() error {
	err := parallel(func() error {
		err := forEach(p.maps.VipdRevnat, func(id uint32, rn bpfRevNat) {
			k := feKey{addr: fromWords(rn.Addr.W), port: fromBE16(rn.Port), proto: rn.Proto, scope: rn.Scope}
			p.revNatIDs[k] = id
			p.nextRevNat = max(p.nextRevNat, id+1)
		})
		if err != nil {
			return fmt.Errorf("read reverse-NAT map: %w", err)
		}
		return nil
	}, func() error {
		// The slots come in ID order: the free ones between them are
		// queued as met.
		p.freeIDs = idQueue{}
		// Count them first (a read of the mapping) to size the table
		// once: grown step by step, it would leave as much again as
		// garbage (backendTable.reserve).
		var n4, n6, ids int
		err := forEachBackend(p.maps.VipdBackends, func(id uint32, be bpfBackend) {
			if _, ok := v4Key(packWords(be.Addr.W, 0)); ok {
				n4++
			} else {
				n6++
			}
			ids = int(id) + 1
		})
		if err != nil {
			return fmt.Errorf("read backend map: %w", err)
		}
		p.backendIDs.reserve(n4, n6, ids)
		err = forEachBackend(p.maps.VipdBackends, func(id uint32, be bpfBackend) {
			p.backendIDs.put(packWords(be.Addr.W, fromBE16(be.Port)), backendRef{id: id})
			for free := max(p.nextBackend, 1); free < id; free++ {
				p.freeIDs.push(free)
			}
			p.nextBackend = max(p.nextBackend, id+1)
		})
		if err != nil {
			return fmt.Errorf("read backend map: %w", err)
		}
		return nil
	}, func() error {
		err := forEach(p.maps.VipdServices, func(sk bpfSvcKey, sv bpfSvcVal) {
			if sk.Slot == 0 && sv.Flags&svcFlagDraining != 0 {
				p.draining[feKey{addr: fromWords(sk.Addr.W), port: fromBE16(sk.Port), proto: sk.Proto, scope: sk.Scope}] = sv.RevNatId
			}
		})
		if err != nil {
			return fmt.Errorf("read service map: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	// The counters survive restarts: reverse-NAT IDs freed before one are
	// not reused, and never-used backend IDs still go first. The free
	// backend IDs (the gaps between held ones, then those up to the
	// counter) are queued in ID order: the order they were freed in is
	// lost with the previous vipd.
	var next uint32
	if p.maps.VipdIds.Lookup(uint32(0), &next) == nil {
		for free := p.nextBackend; free < min(next, p.backendLimit()); free++ {
			p.freeIDs.push(free)
		}
		p.nextBackend = max(p.nextBackend, min(next, p.backendLimit()))
	}
	if p.maps.VipdIds.Lookup(uint32(1), &next) == nil {
		p.nextRevNat = max(p.nextRevNat, next)
	}
	p.clean = len(p.revNatIDs) == 0 && p.backendIDs.len() == 0 &&
		isEmpty(p.maps.VipdServices) && isEmpty(p.maps.VipdMembers) && isEmpty(p.maps.VipdMaglev)
	return nil
}

// revNatOf returns the reverse-NAT ID of the frontend k, programmed or
// not, and whether it has one.
func (p *programmer) revNatOf(k feKey) (uint32, bool) {
	if pr := p.frontends[k]; pr != nil {
		return pr.revNat, true
	}
	id, ok := p.revNatIDs[k]
	return id, ok
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
	if err := w.flush(p.maps, p.slots); err != nil {
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

// index adds key to the frontends of service.
func (p *programmer) index(service string, key feKey) {
	if _, ok := p.byService[service]; !ok {
		p.byService[service] = key
		return
	}
	p.moreOf[service] = append(p.moreOf[service], key)
}

// unindex removes key from the frontends of service.
func (p *programmer) unindex(service string, key feKey) {
	first, ok := p.byService[service]
	if !ok {
		return
	}
	more := p.moreOf[service]
	if first == key {
		if len(more) == 0 {
			delete(p.byService, service)
			return
		}
		p.byService[service], more = more[0], more[1:]
	} else {
		more = slices.DeleteFunc(more, func(k feKey) bool { return k == key })
	}
	if len(more) == 0 {
		delete(p.moreOf, service)
	} else {
		p.moreOf[service] = more
	}
}

// keysOf yields the keys of the frontends of service.
func (p *programmer) keysOf(service string) iter.Seq[feKey] {
	return func(yield func(feKey) bool) {
		first, ok := p.byService[service]
		if !ok || !yield(first) {
			return
		}
		for _, k := range p.moreOf[service] {
			if !yield(k) {
				return
			}
		}
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
		backends[i] = maglev.Backend{ID: pr.slotIDs()[i], Key: pr.fe.members[s.member].key.String(), Weight: s.weight}
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
			svc -= 1 + old.fe.slotEntries()
			members -= old.fe.memberEntries()
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
		svc += 1 + c.fe.slotEntries()
		if old != nil {
			svc += max(old.fe.slotEntries()-c.fe.slotEntries(), 0)
			// The union lives in vipd_members unless it is inline.
			n := 0
			walkMembers(old.fe.members, c.fe.members, func(_, _ int) { n++ })
			if n > revNatInlineMembers {
				members += n
			}
		} else {
			members += c.fe.memberEntries()
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
	if backends > backendCapacity(p.maps.VipdBackends) {
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
	check := func(what string, n, max int, flag string) error {
		if n > max {
			return fmt.Errorf("%w: the %s map would need %d entries and holds %d (raise %s)", dataplane.ErrResourceExhausted, what, n, max, flag)
		}
		return nil
	}
	// The backend map holds its size less slot 0 (ID 0 is "none"). The
	// backends in use after the apply fit it exactly when newBackendID
	// finds an ID for each below the map's size: every ID below it is
	// held, free or never used.
	return errors.Join(
		check("service", svc, int(p.maps.VipdServices.MaxEntries()), "--bpf-lb-map-max"),
		check("member", members, int(p.maps.VipdMembers.MaxEntries()), "--bpf-lb-map-max"),
		check("backend", backends, backendCapacity(p.maps.VipdBackends), "--bpf-backend-map-max"),
		check("reverse-NAT", frontends, int(p.maps.VipdRevnat.MaxEntries()), "--bpf-lb-map-max"),
	)
}
