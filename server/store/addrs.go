package store

import (
	"encoding/binary"
	"fmt"
	"iter"
	"net/netip"
	"slices"

	"github.com/vipd/vipd/dataplane"
)

// addrUse counts the services that use one address as a VIP and as a
// backend. The store keeps one per address in use (Snapshot.addrs), so
// that a Put finds out in O(its own addresses) whether it would make an
// address both: a backend that is a VIP vipd serves would catch its own
// forwarded traffic, and connections to it hang.
//
// The services that use an address as an external or load-balancer IP
// are counted apart (Snapshot.externals), since few addresses are: such an
// address is never a VIP or a backend either (it would be forwarded by two
// rules at once), but services may share it (on different ports: the
// claims see to that). Keeping that count out of addrUse keeps the index
// of a ClusterIP-only store as small as it was.
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

// AddrRole is what an address is to a service.
type AddrRole uint8

// Address roles.
const (
	RoleVIP AddrRole = iota + 1
	RoleBackend
	RoleExternalIP
	RoleLoadBalancerIP
)

func (r AddrRole) String() string {
	switch r {
	case RoleVIP:
		return "VIP"
	case RoleBackend:
		return "backend"
	case RoleExternalIP:
		return "external IP"
	case RoleLoadBalancerIP:
		return "load-balancer IP"
	}
	return "unknown role"
}

// external reports whether r is one of the external roles, which the
// address index counts together.
func (r AddrRole) external() bool { return r == RoleExternalIP || r == RoleLoadBalancerIP }

// AddressConflictError says that a change would give an address two roles
// that exclude each other, in one service or two: a VIP and a backend, or
// an external or load-balancer IP and a VIP or a backend.
type AddressConflictError struct {
	// Service is the service being stored, Addr the address, and Role
	// what Addr is to Service.
	Service string
	Addr    netip.Addr
	Role    AddrRole
	// Holder is the service that has Addr in HolderRole; it may be
	// Service itself.
	Holder     string
	HolderRole AddrRole
}

// Rule says which rule the conflict breaks, for an error message.
func (e *AddressConflictError) Rule() string {
	if e.Role.external() || e.HolderRole.external() {
		other := e.Role
		if other.external() {
			other = e.HolderRole
		}
		if other == RoleVIP {
			return "an external or load-balancer IP cannot be a VIP that vipd serves"
		}
		return "an external or load-balancer IP cannot be a backend"
	}
	return "a VIP that vipd serves cannot be a backend"
}

func (e *AddressConflictError) Error() string {
	return fmt.Sprintf("service %s: %s %s is a %s of service %s; %s", e.Service, e.Role, e.Addr, e.HolderRole, e.Holder, e.Rule())
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

// externalUses returns how many services, as t sees them, use a as an
// external or load-balancer IP.
func (t *Txn) externalUses(a netip.Addr) int32 {
	k := keyOf(a)
	for x := t; x != nil; x = x.parent {
		if n, ok := x.externals[k]; ok {
			return n
		}
	}
	n, _ := t.base.externals.Get(k)
	return n
}

// extCount is an address's count of external uses as a Put will stage it.
type extCount struct {
	a netip.Addr
	n int32
}

// checkAddrs fails with an *AddressConflictError if svc, replacing old
// (nil: none), adds a backend that is a VIP or an external or
// load-balancer IP of any service, a VIP that is a backend or an external
// or load-balancer IP of any service, or an external or load-balancer IP
// that is a VIP or a backend of any service, itself included. What old
// had is not checked again: no other service can have taken it up since.
// had and has test membership in old's and svc's backends (backendSet).
// Otherwise it returns the counts of the addresses svc adds, as VIPs and
// backends and as external addresses, for stageAddrs, in t's scratch
// buffers: each address is looked up once.
func (t *Txn) checkAddrs(old, svc *dataplane.Service, had, has func(netip.Addr) bool) ([]addrCount, []extCount, error) {
	var oldVIPs []netip.Addr
	oldExternal := func(netip.Addr) bool { return false }
	if old != nil {
		oldVIPs = old.VIPs
		oldExternal = func(a netip.Addr) bool { return isExternal(old, a) }
	}
	conflict := func(a netip.Addr, role, holderRole AddrRole) ([]addrCount, []extCount, error) {
		holder, holderRole := t.userOf(svc, a, holderRole)
		return nil, nil, &AddressConflictError{Service: svc.Name, Addr: a, Role: role, Holder: holder, HolderRole: holderRole}
	}
	// externals is how many services other than old use a as an external
	// or load-balancer IP; most stores have none, and then no lookup is
	// made.
	anyExternal := t.base.externals.Len() > 0
	for x := t; x != nil && !anyExternal; x = x.parent {
		anyExternal = len(x.externals) > 0
	}
	externals := func(a netip.Addr) int32 {
		if !anyExternal {
			return 0
		}
		n := t.externalUses(a)
		if oldExternal(a) {
			n--
		}
		return n
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
			return conflict(b.IP, RoleBackend, RoleVIP)
		}
		if externals(b.IP) > 0 || isExternal(svc, b.IP) {
			return conflict(b.IP, RoleBackend, RoleExternalIP)
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
			return conflict(a, RoleVIP, RoleBackend)
		}
		// svc's own external addresses are never its VIPs: the
		// conversion refuses that.
		if externals(a) > 0 {
			return conflict(a, RoleVIP, RoleExternalIP)
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
	extAdds := t.extScratch[:0]
	for _, list := range [2][]netip.Addr{svc.ExternalIPs, svc.LoadBalancerIPs} {
		for _, a := range list {
			if oldExternal(a) {
				continue
			}
			role := externalRole(svc, a)
			u := t.use(a)
			vips := u.vips
			if slices.Contains(oldVIPs, a) {
				vips--
			}
			if vips > 0 {
				return conflict(a, role, RoleVIP)
			}
			backends := u.backends
			if had(a) {
				backends--
			}
			if backends > 0 || has(a) {
				return conflict(a, role, RoleBackend)
			}
			// The conversion lets no address be in both lists.
			extAdds = append(extAdds, extCount{a, t.externalUses(a) + 1})
		}
	}
	t.scratch, t.extScratch = adds, extAdds
	return adds, extAdds, nil
}

// stageAddrs stages the address counts of replacing old (nil: none) by
// svc (nil: none): adds and extAdds, from checkAddrs, and then one less
// for each address old had in a role that svc does not. has tests
// membership in svc's backends (backendSet).
func (t *Txn) stageAddrs(old, svc *dataplane.Service, adds []addrCount, extAdds []extCount, has func(netip.Addr) bool) {
	// Order matters: adds were counted before this Put staged anything,
	// and an address may move from one role to the other.
	for _, c := range adds {
		t.addrs[keyOf(c.a)] = c.u
	}
	for _, c := range extAdds {
		t.stageExternal(c.a, c.n)
	}
	if old == nil {
		return
	}
	var newVIPs []netip.Addr
	newExternal := func(netip.Addr) bool { return false }
	if svc != nil {
		newVIPs = svc.VIPs
		newExternal = func(a netip.Addr) bool { return isExternal(svc, a) }
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
	for _, list := range [2][]netip.Addr{old.ExternalIPs, old.LoadBalancerIPs} {
		for _, a := range list {
			if !newExternal(a) {
				t.stageExternal(a, t.externalUses(a)-1)
			}
		}
	}
}

// stageExternal stages n services using a as an external or load-balancer
// IP.
func (t *Txn) stageExternal(a netip.Addr, n int32) {
	if t.externals == nil {
		t.externals = map[addrKey]int32{}
	}
	t.externals[keyOf(a)] = n
}

// isExternal reports whether a is one of s's external or load-balancer
// IPs.
func isExternal(s *dataplane.Service, a netip.Addr) bool {
	return slices.Contains(s.ExternalIPs, a) || slices.Contains(s.LoadBalancerIPs, a)
}

// externalRole is a's external role in s: RoleExternalIP unless a is one
// of its load-balancer IPs.
func externalRole(s *dataplane.Service, a netip.Addr) AddrRole {
	if slices.Contains(s.LoadBalancerIPs, a) {
		return RoleLoadBalancerIP
	}
	return RoleExternalIP
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

// userOf names the service that has a in role (RoleExternalIP: as an
// external or a load-balancer IP), and returns the role it has it in: svc
// itself if it does, else the first by name among the services as t sees
// them, not counting svc's stored version. It reads every service, so it
// is only for an error.
func (t *Txn) userOf(svc *dataplane.Service, a netip.Addr, role AddrRole) (string, AddrRole) {
	uses := func(s *dataplane.Service) bool {
		switch role {
		case RoleVIP:
			return slices.Contains(s.VIPs, a)
		case RoleBackend:
			return slices.ContainsFunc(s.Backends, func(b dataplane.Backend) bool { return b.IP == a })
		}
		return isExternal(s, a)
	}
	found, in := "", (*dataplane.Service)(nil)
	if uses(svc) {
		found, in = svc.Name, svc
	} else {
		consider := func(name string) {
			if name == svc.Name || found != "" && name >= found {
				return
			}
			if e, ok := t.Get(name); ok && uses(e.Dataplane) {
				found, in = name, e.Dataplane
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
	}
	if role.external() && in != nil {
		role = externalRole(in, a)
	}
	return found, role
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

// usesOf yields the uses of addresses of the services of entries, one a
// use, for a snapshot being built: buildAddrIndex then sums them into the
// snapshot's index. It may be walked more than once.
func usesOf(entries []*Entry) iter.Seq[addrEntry] {
	return func(yield func(addrEntry) bool) {
		for _, e := range entries {
			for _, a := range e.Dataplane.VIPs {
				if !yield(addrEntry{keyOf(a), addrUse{vips: 1}}) {
					return
				}
			}
			for i := range e.Dataplane.Backends {
				if !yield(addrEntry{keyOf(e.Dataplane.Backends[i].IP), addrUse{backends: 1}}) {
					return
				}
			}
		}
	}
}
