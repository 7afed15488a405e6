package ebpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// errMapFull is wrapped by map writes that failed because a map is full.
var errMapFull = errors.New("BPF map full")

// mapErr wraps the errors of a full map (E2BIG, ENOSPC, ENOMEM) in errMapFull.
func mapErr(err error) error {
	if errors.Is(err, unix.E2BIG) || errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.ENOMEM) {
		return fmt.Errorf("%w: %w", errMapFull, err)
	}
	return err
}

// writes collects map updates and deletions, and flushes them in batches
// in a fixed order: backends, members, reverse NAT, services (slots and
// masters as queued), then deletions of services, members, reverse NAT,
// Maglev tables and backends. Members come before reverse NAT: a
// frontend whose members move out of its reverse-NAT value into
// vipd_members has them there before its value says so.
type writes struct {
	backendKeys []uint32
	backendVals []bpfBackend
	revNatKeys  []uint32
	revNatVals  []bpfRevNat
	memberKeys  []bpfMemberKey
	memberVals  []uint32
	svcKeys     []bpfSvcKey
	svcVals     []bpfSvcVal

	svcDeletes     []bpfSvcKey
	memberDeletes  []bpfMemberKey
	revNatDeletes  []uint32
	maglevDeletes  []uint32
	backendDeletes []uint32
}

func svcKeyOf(k feKey, slot uint32) bpfSvcKey {
	var sk bpfSvcKey
	sk.Addr.W = toWords(k.addr)
	sk.Port = be16(k.port)
	sk.Proto = k.proto
	sk.Scope = k.scope
	sk.Slot = slot
	return sk
}

func (w *writes) backend(id uint32, k bePacked) {
	var b bpfBackend
	for i := range b.Addr.W {
		b.Addr.W[i] = binary.NativeEndian.Uint32(k.addr[4*i:])
	}
	b.Port = be16(k.port)
	b.Used = backendUsed
	w.backendKeys = append(w.backendKeys, id)
	w.backendVals = append(w.backendVals, b)
}

func (w *writes) revNat(id uint32, r bpfRevNat) {
	w.revNatKeys = append(w.revNatKeys, id)
	w.revNatVals = append(w.revNatVals, r)
}

// revNatBase is the reverse-NAT value of frontend k with no member.
func revNatBase(k feKey) bpfRevNat {
	var r bpfRevNat
	r.Addr.W = toWords(k.addr)
	r.Port = be16(k.port)
	r.Proto = k.proto
	r.Scope = k.scope
	return r
}

// revNatVal is the reverse-NAT value of a programmed frontend: its
// members inline when they fit, else revNatMembersMap (they are in
// vipd_members).
func revNatVal(k feKey, pr *programmed) bpfRevNat {
	r := revNatBase(k)
	if !pr.fe.inlineMembers() {
		r.Members = revNatMembersMap
		return r
	}
	r.Members = uint32(len(pr.memberIDs()))
	for j, id := range pr.memberIDs() {
		r.MemberIds[j] = id
		r.MemberFlags[j] = pr.fe.members[j].flags
	}
	return r
}

// memberUnion is a changing frontend's members between apply steps 2 and
// 6: its old members and its new ones together, the new ones with their
// new flags. Members that leave stay members until the new master is in
// place (the break comes last), as they did as vipd_members entries.
type memberUnion struct {
	n int // members in the union
	// removed: some old member leaves; changed: some member is new or
	// has new flags.
	removed, changed bool
	// rn is the union's reverse-NAT value: inline when n fits
	// (n <= revNatInlineMembers), else revNatMembersMap.
	rn bpfRevNat
}

// unionOf computes the member union of a frontend changing from old to pr.
func unionOf(k feKey, old, pr *programmed) memberUnion {
	u := memberUnion{rn: revNatBase(k)}
	walkMembers(old.fe.members, pr.fe.members, func(i, j int) {
		var id uint32
		var flags uint8
		if j >= 0 {
			id, flags = pr.memberIDs()[j], pr.fe.members[j].flags
			if i < 0 || old.fe.members[i].flags != flags {
				u.changed = true
			}
		} else {
			id, flags = old.memberIDs()[i], old.fe.members[i].flags
			u.removed = true
		}
		if u.n < revNatInlineMembers {
			u.rn.MemberIds[u.n] = id
			u.rn.MemberFlags[u.n] = flags
		}
		u.n++
	})
	if u.n <= revNatInlineMembers {
		u.rn.Members = uint32(u.n)
	} else {
		u.rn = revNatBase(k)
		u.rn.Members = revNatMembersMap
	}
	return u
}

// inline reports whether the union's members are inline.
func (u *memberUnion) inline() bool { return u.n <= revNatInlineMembers }

func (w *writes) member(revNat, backend, flags uint32) {
	w.memberKeys = append(w.memberKeys, bpfMemberKey{RevNatId: revNat, BackendId: backend})
	w.memberVals = append(w.memberVals, flags)
}

func (w *writes) slot(k feKey, slot, backend, cum uint32) {
	w.svcKeys = append(w.svcKeys, svcKeyOf(k, slot))
	w.svcVals = append(w.svcVals, bpfSvcVal{BackendId: backend, Weight: cum})
}

func (w *writes) master(k feKey, pr *programmed) {
	w.svcKeys = append(w.svcKeys, svcKeyOf(k, 0))
	w.svcVals = append(w.svcVals, masterVal(pr))
}

// masterVal is the master entry of a programmed frontend: with its slots'
// backend IDs when it is dense.
func masterVal(pr *programmed) bpfSvcVal {
	v := bpfSvcVal{
		Count:           uint32(len(pr.slotIDs())),
		RevNatId:        pr.revNat,
		Flags:           pr.fe.flags,
		AffinityTimeout: pr.fe.timeout,
		Weight:          pr.fe.weight,
		MaglevSize:      pr.fe.maglevM,
	}
	if pr.fe.dense() {
		copy(v.Slots[:], pr.slotIDs())
	}
	return v
}

func (w *writes) deleteSlot(k feKey, slot uint32) {
	w.svcDeletes = append(w.svcDeletes, svcKeyOf(k, slot))
}
func (w *writes) deleteMember(revNat, backend uint32) {
	w.memberDeletes = append(w.memberDeletes, bpfMemberKey{RevNatId: revNat, BackendId: backend})
}
func (w *writes) deleteRevNat(id uint32)  { w.revNatDeletes = append(w.revNatDeletes, id) }
func (w *writes) deleteMaglev(id uint32)  { w.maglevDeletes = append(w.maglevDeletes, id) }
func (w *writes) deleteBackend(id uint32) { w.backendDeletes = append(w.backendDeletes, id) }

// flush writes everything queued, in order, and empties w; the backend
// slots through b, m.VipdBackends's mapping.
func (w *writes) flush(m *bpfMaps, b *backendSlots) error {
	defer w.reset()
	steps := []struct {
		what string
		run  func() error
	}{
		{"backends", func() error { return putBackends(b, w.backendKeys, w.backendVals) }},
		{"members", func() error { return batchPut(m.VipdMembers, w.memberKeys, w.memberVals) }},
		{"reverse NAT", func() error { return batchPut(m.VipdRevnat, w.revNatKeys, w.revNatVals) }},
		{"frontend filter", func() error { return markFrontends(m.VipdSvcAddrs, w.svcKeys) }},
		{"services", func() error { return batchPut(m.VipdServices, w.svcKeys, w.svcVals) }},
		{"delete services", func() error { return batchDelete(m.VipdServices, w.svcDeletes) }},
		{"delete members", func() error { return batchDelete(m.VipdMembers, w.memberDeletes) }},
		{"delete reverse NAT", func() error { return batchDelete(m.VipdRevnat, w.revNatDeletes) }},
		{"delete Maglev tables", func() error { return batchDelete(m.VipdMaglev, w.maglevDeletes) }},
		{"delete backends", func() error { return clearBackends(b, w.backendDeletes) }},
	}
	for _, s := range steps {
		if err := s.run(); err != nil {
			return fmt.Errorf("write %s: %w", s.what, err)
		}
	}
	return nil
}

// reserve grows w's buffers, at once, to the room the new frontends of
// ch need (steps 2, 4 and 5 each flush before the next queues), so that
// they do not grow an entry at a time: step by step a large slice grows by
// a quarter, and its copies add up to about five times the final buffer,
// garbage while the apply runs. The room stays for the next chunks and
// applies.
func (w *writes) reserve(ch chunk) {
	var fes, slots, members int
	for _, pr := range ch.next {
		if pr != nil {
			fes++
			slots += pr.fe.slotEntries()
			members += pr.fe.memberEntries()
		}
	}
	svc := max(fes, slots)
	w.svcKeys, w.svcVals = slices.Grow(w.svcKeys, svc), slices.Grow(w.svcVals, svc)
	w.revNatKeys, w.revNatVals = slices.Grow(w.revNatKeys, fes), slices.Grow(w.revNatVals, fes)
	w.memberKeys, w.memberVals = slices.Grow(w.memberKeys, members), slices.Grow(w.memberVals, members)
}

// reset empties w, keeping its room.
func (w *writes) reset() {
	*w = writes{
		backendKeys: w.backendKeys[:0], backendVals: w.backendVals[:0],
		revNatKeys: w.revNatKeys[:0], revNatVals: w.revNatVals[:0],
		memberKeys: w.memberKeys[:0], memberVals: w.memberVals[:0],
		svcKeys: w.svcKeys[:0], svcVals: w.svcVals[:0],
		svcDeletes: w.svcDeletes[:0], memberDeletes: w.memberDeletes[:0], revNatDeletes: w.revNatDeletes[:0],
		maglevDeletes: w.maglevDeletes[:0], backendDeletes: w.backendDeletes[:0],
	}
}

// isEmpty reports whether m has no entries.
func isEmpty(m *ebpf.Map) bool {
	k := make([]byte, m.KeySize())
	err := m.NextKey(nil, k)
	return errors.Is(err, ebpf.ErrKeyNotExist)
}

// batchSize bounds one batch syscall, so that a huge sync does not need one
// huge kernel buffer.
const batchSize = 16384

// batchPut writes keys[i] = vals[i] with BPF batch updates where the kernel
// has them (about 3x cheaper per entry than single updates), one by one
// elsewhere. A large write is split among a few goroutines: the kernel's
// hash maps lock per bucket, so updates of one map scale across CPUs. All
// of it is written when batchPut returns; on error, any part may be.
func batchPut[K, V any](m *ebpf.Map, keys []K, vals []V) error {
	par := min(runtime.GOMAXPROCS(0), maxWriters, len(keys)/minPart)
	if par <= 1 {
		return batchPutSerial(m, keys, vals)
	}
	var wg sync.WaitGroup
	errs := make([]error, par)
	per := (len(keys) + par - 1) / par
	for i := range par {
		lo, hi := i*per, min((i+1)*per, len(keys))
		wg.Go(func() { errs[i] = batchPutSerial(m, keys[lo:hi], vals[lo:hi]) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

const (
	// maxWriters bounds the goroutines of one batchPut.
	maxWriters = 4
	// minPart is the fewest entries worth a goroutine of their own.
	minPart = 2048
)

func batchPutSerial[K, V any](m *ebpf.Map, keys []K, vals []V) error {
	for len(keys) > 0 {
		n := min(len(keys), batchSize)
		if _, err := m.BatchUpdate(keys[:n], vals[:n], nil); err != nil {
			if !errors.Is(err, ebpf.ErrNotSupported) {
				return mapErr(err)
			}
			for i := range n {
				if err := m.Put(&keys[i], &vals[i]); err != nil {
					return mapErr(err)
				}
			}
		}
		keys, vals = keys[n:], vals[n:]
	}
	return nil
}

// batchDelete deletes keys; keys that are already gone are not an error.
func batchDelete[K any](m *ebpf.Map, keys []K) error {
	for len(keys) > 0 {
		n := min(len(keys), batchSize)
		if _, err := m.BatchDelete(keys[:n], nil); err != nil {
			// A batch stops at the first missing key: finish one by one.
			for i := range n {
				if err := m.Delete(&keys[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
					return err
				}
			}
		}
		keys = keys[n:]
	}
	return nil
}

// forEach calls fn with every entry of m, read in batches where the kernel
// can (one syscall per few thousand entries, instead of two per entry).
// Entries that change meanwhile may be seen or not. fn runs on the
// caller's goroutine while another one reads the next batch: for a large
// map the kernel's copying and fn's work overlap.
func forEach[K, V any](m *ebpf.Map, fn func(K, V)) error {
	type batch struct {
		keys []K
		vals []V
		n    int
		err  error
	}
	// Two buffers: fn walks one while the reader fills the other. The
	// reader stops after the batch that ends the walk (ErrKeyNotExist or
	// an error), and so does the loop below: neither waits on the other
	// after that.
	free, full := make(chan *batch, 2), make(chan *batch, 2)
	defer close(free) // ends the reader, should fn panic
	for range 2 {
		free <- &batch{keys: make([]K, 4096), vals: make([]V, 4096)}
	}
	go func() {
		var cursor ebpf.MapBatchCursor
		for b := range free {
			b.n, b.err = m.BatchLookup(&cursor, b.keys, b.vals, nil)
			full <- b
			if b.err != nil {
				return
			}
		}
	}()
	for first := true; ; first = false {
		b := <-full
		for i := range b.n {
			fn(b.keys[i], b.vals[i])
		}
		switch {
		case errors.Is(b.err, ebpf.ErrKeyNotExist):
			return nil
		case b.err != nil && first && b.n == 0:
			// No batch lookups for this map type or kernel.
			var k K
			var v V
			it := m.Iterate()
			for it.Next(&k, &v) {
				fn(k, v)
			}
			return it.Err()
		case b.err != nil:
			return b.err
		}
		free <- b
	}
}

// append queues everything o queued, after what w queued.
func (w *writes) append(o *writes) {
	w.backendKeys = append(w.backendKeys, o.backendKeys...)
	w.backendVals = append(w.backendVals, o.backendVals...)
	w.revNatKeys = append(w.revNatKeys, o.revNatKeys...)
	w.revNatVals = append(w.revNatVals, o.revNatVals...)
	w.memberKeys = append(w.memberKeys, o.memberKeys...)
	w.memberVals = append(w.memberVals, o.memberVals...)
	w.svcKeys = append(w.svcKeys, o.svcKeys...)
	w.svcVals = append(w.svcVals, o.svcVals...)
	w.svcDeletes = append(w.svcDeletes, o.svcDeletes...)
	w.memberDeletes = append(w.memberDeletes, o.memberDeletes...)
	w.revNatDeletes = append(w.revNatDeletes, o.revNatDeletes...)
	w.maglevDeletes = append(w.maglevDeletes, o.maglevDeletes...)
	w.backendDeletes = append(w.backendDeletes, o.backendDeletes...)
}

// len is the number of entries queued.
func (w *writes) len() int {
	return len(w.backendKeys) + len(w.revNatKeys) + len(w.memberKeys) + len(w.svcKeys) +
		len(w.svcDeletes) + len(w.memberDeletes) + len(w.revNatDeletes) + len(w.maglevDeletes) + len(w.backendDeletes)
}
