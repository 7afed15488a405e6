package store

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vipd/vipd/dataplane"
)

// addrUse counts the services that use one address as a VIP and as a
// backend. The store keeps one per address in use (Snapshot.addrs), so
// that a Put finds out in O(its own addresses) whether it would make an
// address both: a backend that is a VIP vipd serves would catch its own
// forwarded traffic, and connections to it hang.
type addrUse struct{ vips, backends int32 }

// addrKey is an address as Snapshot.addrs keys it: its 16-byte form, in
// two words. Unlike a netip.Addr it holds no pointer, so the index costs
// the collector nothing to scan and compares as plain memory. It is exact
// because a stored address is never IPv4-mapped (the conversion unmaps
// it) and never has a zone, so an IPv4 address and an IPv6 one never
// share a key.
type addrKey [2]uint64

func keyOf(a netip.Addr) addrKey {
	b := a.As16()
	return addrKey{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
}

// AddressConflictError says that a change would make an address a VIP of
// one service and a backend of another, or of the same one.
type AddressConflictError struct {
	// Service is the service being stored, and Addr the address.
	Service string
	Addr    netip.Addr
	// AsBackend is true when Addr is one of Service's backends and Holder
	// serves it as a VIP; false when Addr is one of Service's VIPs and
	// Holder has it as a backend. Holder may be Service itself.
	AsBackend bool
	Holder    string
}

func (e *AddressConflictError) Error() string {
	if e.AsBackend {
		return fmt.Sprintf("service %s: backend %s is a VIP of service %s; a VIP that vipd serves cannot be a backend", e.Service, e.Addr, e.Holder)
	}
	return fmt.Sprintf("service %s: VIP %s is a backend of service %s; a VIP that vipd serves cannot be a backend", e.Service, e.Addr, e.Holder)
}

// use returns how the services as t sees them use a.
func (t *Txn) use(a netip.Addr) addrUse {
	k := keyOf(a)
	for x := t; x != nil; x = x.parent {
		if u, ok := x.addrs[k]; ok {
			return u
		}
	}
	return t.base.addrs.get(k)
}

// addrCount is an address's count as a Put will stage it.
type addrCount struct {
	a netip.Addr
	u addrUse
}

// checkAddrs fails with an *AddressConflictError if svc, replacing old
// (nil: none), adds a backend that is a VIP of any service, or a VIP that
// is a backend of any service, itself included. What old had is not
// checked again: no other service can have taken it up since. had and has
// test membership in old's and svc's backends (backendSet). Otherwise it
// returns the counts of the addresses svc adds, for stageAddrs, in t's
// scratch buffer: each address is looked up once.
func (t *Txn) checkAddrs(old, svc *dataplane.Service, had, has func(netip.Addr) bool) ([]addrCount, error) {
	var oldVIPs []netip.Addr
	if old != nil {
		oldVIPs = old.VIPs
	}
	adds := t.scratch[:0]
	for _, b := range svc.Backends {
		if had(b.IP) {
			continue
		}
		u := t.use(b.IP)
		vips := u.vips
		if slices.Contains(oldVIPs, b.IP) {
			vips-- // old's own, which svc replaces
		}
		if (vips > 0 || slices.Contains(svc.VIPs, b.IP)) && !t.legacy(svc.Name, b.IP, true) {
			return nil, &AddressConflictError{Service: svc.Name, Addr: b.IP, AsBackend: true, Holder: t.userOf(svc, b.IP, true)}
		}
		u.backends++
		adds = append(adds, addrCount{b.IP, u})
	}
	for _, a := range svc.VIPs {
		if slices.Contains(oldVIPs, a) {
			continue
		}
		u := t.use(a)
		backends := u.backends
		if had(a) {
			backends--
		}
		if (backends > 0 || has(a)) && !t.legacy(svc.Name, a, false) {
			return nil, &AddressConflictError{Service: svc.Name, Addr: a, AsBackend: false, Holder: t.userOf(svc, a, false)}
		}
		if has(a) {
			// Also a backend of svc, as an old state may have it: if
			// added above too, count both roles in one entry.
			if i := slices.IndexFunc(adds, func(c addrCount) bool { return c.a == a }); i >= 0 {
				adds[i].u.vips++
				continue
			}
		}
		u.vips++
		adds = append(adds, addrCount{a, u})
	}
	t.scratch = adds
	return adds, nil
}

// stageAddrs stages the address counts of replacing old (nil: none) by
// svc (nil: none): adds, from checkAddrs, and then one less for each
// address old had in a role that svc does not. has tests membership in
// svc's backends (backendSet).
func (t *Txn) stageAddrs(old, svc *dataplane.Service, adds []addrCount, has func(netip.Addr) bool) {
	// Order matters: adds were counted before this Put staged anything,
	// and an address may move from one role to the other.
	for _, c := range adds {
		t.addrs[keyOf(c.a)] = c.u
	}
	if old == nil {
		return
	}
	var newVIPs []netip.Addr
	if svc != nil {
		newVIPs = svc.VIPs
	}
	for _, a := range old.VIPs {
		if !slices.Contains(newVIPs, a) {
			u := t.use(a)
			u.vips--
			t.addrs[keyOf(a)] = u
		}
	}
	for _, b := range old.Backends {
		if !has(b.IP) {
			u := t.use(b.IP)
			u.backends--
			t.addrs[keyOf(b.IP)] = u
		}
	}
}

// legacy reports whether service name had a as a backend (asBackend) or
// as a VIP in the snapshot the transaction began on, where a was both a
// VIP and a backend already: a state stored before vipd refused that may
// keep it, even through a SyncServices that deletes and stores the
// service again, but no other service may join in.
func (t *Txn) legacy(name string, a netip.Addr, asBackend bool) bool {
	if u := t.base.addrs.get(keyOf(a)); u.vips == 0 || u.backends == 0 {
		return false
	}
	e, ok := t.base.Get(name)
	switch {
	case !ok:
		return false
	case asBackend:
		return slices.ContainsFunc(e.Dataplane.Backends, func(b dataplane.Backend) bool { return b.IP == a })
	}
	return slices.Contains(e.Dataplane.VIPs, a)
}

// userOf names the service that has a as a VIP (asVIP) or as a backend:
// svc itself if it does, else the first by name among the services as t
// sees them, not counting svc's stored version. It reads every service,
// so it is only for an error.
func (t *Txn) userOf(svc *dataplane.Service, a netip.Addr, asVIP bool) string {
	uses := func(s *dataplane.Service) bool {
		if asVIP {
			return slices.Contains(s.VIPs, a)
		}
		return slices.ContainsFunc(s.Backends, func(b dataplane.Backend) bool { return b.IP == a })
	}
	if uses(svc) {
		return svc.Name
	}
	var found string
	consider := func(name string) {
		if name == svc.Name || found != "" && name >= found {
			return
		}
		if e, ok := t.Get(name); ok && uses(e.Dataplane) {
			found = name
		}
	}
	for x := t; x != nil; x = x.parent {
		for name := range x.services {
			consider(name)
		}
	}
	for name := range t.base.services.All() {
		consider(name)
	}
	return found
}

// backendSet returns a membership test for the IPs of bs: a scan while
// they are few, a set when they are many.
func backendSet(bs []dataplane.Backend) func(netip.Addr) bool {
	if len(bs) <= 16 {
		return func(a netip.Addr) bool {
			return slices.ContainsFunc(bs, func(b dataplane.Backend) bool { return b.IP == a })
		}
	}
	set := make(map[netip.Addr]struct{}, len(bs))
	for _, b := range bs {
		set[b.IP] = struct{}{}
	}
	return func(a netip.Addr) bool { _, ok := set[a]; return ok }
}

// usesOf appends svc's uses of addresses to uses, for a snapshot being
// built: buildAddrIndex then sums them into the snapshot's index.
func usesOf(uses []addrEntry, svc *dataplane.Service) []addrEntry {
	for _, a := range svc.VIPs {
		uses = append(uses, addrEntry{keyOf(a), addrUse{vips: 1}})
	}
	for _, be := range svc.Backends {
		uses = append(uses, addrEntry{keyOf(be.IP), addrUse{backends: 1}})
	}
	return uses
}
