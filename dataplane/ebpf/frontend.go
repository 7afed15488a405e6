package ebpf

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"iter"
	"math"
	"math/bits"
	"net/netip"
	"slices"
	"strconv"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/ebpf/maglev"
)

// feKey names a frontend: one (VIP, port, protocol) of a service, and
// the traffic it serves (scopeCluster or scopeExternal).
type feKey struct {
	addr  netip.Addr
	port  uint16
	proto uint8
	scope uint8
}

func (k feKey) String() string {
	s := netip.AddrPortFrom(k.addr, k.port).String() + "/" + protoName(k.proto)
	if k.scope == scopeExternal {
		s += " (external)"
	}
	return s
}

// beKey names a backend as the maps know it: an address and a port.
type beKey struct {
	addr netip.Addr
	port uint16
}

func (k beKey) String() string { return netip.AddrPortFrom(k.addr, k.port).String() }

// bePacked is a beKey as the backend table keys it: the address as the
// maps hold it (IPv4 mapped into IPv6), and no pointer, so that the
// collector need not scan a table of a million backends.
type bePacked struct {
	addr [16]byte
	port uint16
}

func (k beKey) packed() bePacked { return bePacked{addr: k.addr.As16(), port: k.port} }

func packWords(w addrWords, port uint16) bePacked {
	var k bePacked
	for i := range w {
		binary.NativeEndian.PutUint32(k.addr[4*i:], w[i])
	}
	k.port = port
	return k
}

func (k bePacked) unpack() beKey { return beKey{addr: netip.AddrFrom16(k.addr).Unmap(), port: k.port} }

func (k bePacked) String() string { return k.unpack().String() }

// backendRef is a backend's entry in the backend table.
type backendRef struct {
	id   uint32
	refs int32 // frontends that have it as a member
}

// backendTable maps backends to their backendRef. IPv4 backends, the
// common case, are kept densely, for a table of a million: their keys (a
// uint64 of address and port) and reference counts in slices indexed by
// backend ID (IDs are dense: they index the vipd_backends array), and an
// open-addressing hash table of IDs (linear probing) to find them by key.
// That is 20 bytes a backend at a million, where a Go map of key to
// backendRef takes 36 (its 16-byte slots, at the load its power-of-two
// sizes leave). The slices are as long as the highest ID in use, not the
// number of backends: after much churn, recycled IDs may spread over the
// whole vipd_backends array, 12 bytes per entry of it at most (14 MB at
// the default 1.2 million). IPv6 backends are in a plain map. The zero
// value is an empty table.
type backendTable struct {
	// slots holds, for each IPv4 backend, its ID plus one (0: empty), at
	// its key's hash or after it; a power of two long, at most 3/4 full.
	slots []uint32
	n4    int
	// key4 and refs4 are, by ID, an IPv4 backend's key plus one (0: the
	// ID holds no IPv4 backend) and its references.
	key4  []uint64
	refs4 []int32
	v6    map[bePacked]backendRef
}

func newBackendTable() backendTable { return backendTable{} }

// v4Key returns the uint64 key of an IPv4 (mapped) backend.
func v4Key(k bePacked) (uint64, bool) {
	if binary.NativeEndian.Uint64(k.addr[:8]) != 0 || k.addr[8] != 0 || k.addr[9] != 0 ||
		k.addr[10] != 0xff || k.addr[11] != 0xff {
		return 0, false
	}
	return uint64(binary.BigEndian.Uint32(k.addr[12:]))<<16 | uint64(k.port), true
}

// unpackV4 is the inverse of v4Key.
func unpackV4(k4 uint64) bePacked {
	k := bePacked{port: uint16(k4)}
	k.addr[10], k.addr[11] = 0xff, 0xff
	binary.BigEndian.PutUint32(k.addr[12:], uint32(k4>>16))
	return k
}

// home is the slot where the search for k4 starts (Fibonacci hashing:
// the top bits of the key times 2^64/φ).
func (t *backendTable) home(k4 uint64) int {
	return int((k4 * 0x9e3779b97f4a7c15) >> (64 - bits.TrailingZeros(uint(len(t.slots)))))
}

// find returns the slot holding k4, or -1.
func (t *backendTable) find(k4 uint64) int {
	if len(t.slots) == 0 {
		return -1
	}
	mask := len(t.slots) - 1
	for i := t.home(k4); ; i = (i + 1) & mask {
		s := t.slots[i]
		if s == 0 {
			return -1
		}
		if t.key4[s-1] == k4+1 {
			return i
		}
	}
}

func (t *backendTable) get(k bePacked) (backendRef, bool) {
	if k4, ok := v4Key(k); ok {
		i := t.find(k4)
		if i < 0 {
			return backendRef{}, false
		}
		id := t.slots[i] - 1
		return backendRef{id: id, refs: t.refs4[id]}, true
	}
	r, ok := t.v6[k]
	return r, ok
}

// put sets k's backendRef. r.id must not be another backend's ID (an ID
// names one backend at a time: IDs are handed out only when free); k may
// move from one ID to another.
func (t *backendTable) put(k bePacked, r backendRef) {
	k4, ok := v4Key(k)
	if !ok {
		if t.v6 == nil {
			t.v6 = map[bePacked]backendRef{}
		}
		t.v6[k] = r
		return
	}
	i := t.find(k4)
	if i < 0 {
		if 4*(t.n4+1) > 3*len(t.slots) {
			t.rehash(max(2*len(t.slots), 16))
		}
		mask := len(t.slots) - 1
		for i = t.home(k4); t.slots[i] != 0; i = (i + 1) & mask {
		}
		t.n4++
	} else if old := t.slots[i] - 1; old != r.id {
		t.key4[old] = 0 // the key moves to another ID
	}
	t.slots[i] = r.id + 1
	if int(r.id) >= len(t.key4) {
		t.key4 = slices.Grow(t.key4, int(r.id)+1-len(t.key4))[:r.id+1]
		t.refs4 = slices.Grow(t.refs4, int(r.id)+1-len(t.refs4))[:r.id+1]
	}
	t.key4[r.id], t.refs4[r.id] = k4+1, r.refs
}

func (t *backendTable) del(k bePacked) {
	k4, ok := v4Key(k)
	if !ok {
		delete(t.v6, k)
		return
	}
	i := t.find(k4)
	if i < 0 {
		return
	}
	id := t.slots[i] - 1
	t.key4[id], t.refs4[id] = 0, 0
	t.n4--
	// Backward-shift deletion: move back every later entry of the run
	// whose home is not between the hole and it (cyclically), so that
	// every search still finds its key before an empty slot.
	mask := len(t.slots) - 1
	for j := (i + 1) & mask; t.slots[j] != 0; j = (j + 1) & mask {
		h := t.home(t.key4[t.slots[j]-1] - 1)
		if (j-h)&mask >= (j-i)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = 0
}

// rehash rebuilds the slots, n long (a power of two).
func (t *backendTable) rehash(n int) {
	old := t.slots
	t.slots = make([]uint32, n)
	mask := n - 1
	for _, s := range old {
		if s == 0 {
			continue
		}
		i := t.home(t.key4[s-1] - 1)
		for t.slots[i] != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = s
	}
}

func (t *backendTable) len() int { return t.n4 + len(t.v6) }

// reserve sizes an empty table for n4 IPv4 backends with IDs below ids
// and n6 IPv6 backends, so that filling it does not grow it step by step:
// each step of growing leaves the smaller tables as garbage while no
// collection runs. A table that holds a backend is left as it is.
func (t *backendTable) reserve(n4, n6, ids int) {
	if t.len() != 0 {
		return
	}
	t.slots = nil
	if n4 > 0 {
		t.slots = make([]uint32, slotsFor(n4))
	}
	t.key4, t.refs4 = make([]uint64, 0, ids), make([]int32, 0, ids)
	t.v6 = make(map[bePacked]backendRef, n6)
}

// slotsFor is the number of slots for n IPv4 backends: a power of two,
// with n at most 3/4 of it.
func slotsFor(n int) int { return max(16, 1<<bits.Len(uint(4*n/3))) }

// fit remakes what reserve sized for n4 (n6) backends when the table holds
// fewer than a quarter of that (the count reserve had was a bound:
// members of many frontends may be the same backend), so that the room
// does not stay.
func (t *backendTable) fit(n4, n6 int) {
	const slack = 4
	if n4 > slack*t.n4+1024 {
		t.rehash(slotsFor(t.n4))
		if cap(t.key4) > slack*len(t.key4)+1024 {
			t.key4, t.refs4 = slices.Clone(t.key4), slices.Clone(t.refs4)
		}
	}
	if n6 > slack*len(t.v6)+1024 {
		v6 := make(map[bePacked]backendRef, len(t.v6))
		for k, r := range t.v6 {
			v6[k] = r
		}
		t.v6 = v6
	}
}

// all yields every backend, the IPv4 ones in ID order; the loop body may
// delete the one it is given.
func (t *backendTable) all() iter.Seq2[bePacked, backendRef] {
	return func(yield func(bePacked, backendRef) bool) {
		for id, k4 := range t.key4 {
			if k4 == 0 {
				continue
			}
			if !yield(unpackV4(k4-1), backendRef{id: uint32(id), refs: t.refs4[id]}) {
				return
			}
		}
		for k, r := range t.v6 {
			if !yield(k, r) {
				return
			}
		}
	}
}

// frontend is the desired map content of one frontend, before IDs.
type frontend struct {
	key     feKey
	service string
	flags   uint32
	timeout uint32 // affinity timeout, seconds
	weight  uint32 // total weight, when weighted
	maglevM uint32 // Maglev table size, when Maglev
	// slots are the backends that may take new connections, in slot order,
	// each with its cumulative weight (exclusive end).
	slots []slot
	// srcRanges points to the load-balancer source ranges of a frontend
	// with svcFlagSrcRanges (vipd_src_ranges, written by syncSrcRanges):
	// few have any, and a pointer, not a slice, keeps a frontend in the
	// 128-byte size class (frontendSizeMax) rather than the 144-byte one.
	srcRanges *[]netip.Prefix
	// members are every backend of the VIP's family the service lists
	// and that serves the frontend's port (dataplane.Backend.Serves),
	// sorted by key, each with its member flags. A slice, not a map: a
	// frontend has few members, and 100,000 small maps cost more to build
	// and hold than the merge walks that compare sorted slices.
	members []member
}

// member is a backend of a frontend and its member flags (a byte, as
// rev_nat.member_flags holds them: 20 bytes a member, not 24).
type member struct {
	key   bePacked
	flags uint8
}

func (k bePacked) compare(o bePacked) int {
	if c := bytes.Compare(k.addr[:], o.addr[:]); c != 0 {
		return c
	}
	return cmp.Compare(k.port, o.port)
}

func compareMembers(a, b member) int { return a.key.compare(b.key) }

// memberIndex returns the index of k in f.members, or -1.
func (f *frontend) memberIndex(k bePacked) int { return f.memberIndexFrom(k, 0) }

// memberIndexFrom is memberIndex, trying index hint first: backends are
// mostly listed in key order, so that the next member is a good guess.
func (f *frontend) memberIndexFrom(k bePacked, hint int) int {
	if hint < len(f.members) && f.members[hint].key == k {
		return hint
	}
	i, ok := slices.BinarySearchFunc(f.members, k, func(m member, k bePacked) int { return m.key.compare(k) })
	if !ok {
		return -1
	}
	return i
}

// svcInlineSlots is SVC_INLINE_SLOTS of bpf/maps.h: the most slots a
// master's value holds.
const svcInlineSlots = 16

// dense reports whether f keeps its slots in its master's value and has
// no slot entries (svc_dense of bpf/lb.h): unweighted, with at most
// svcInlineSlots slots.
func (f *frontend) dense() bool {
	return f.flags&svcFlagWeighted == 0 && len(f.slots) <= svcInlineSlots
}

// slotEntries is the number of slot entries (besides its master) f has in
// vipd_services: none when it is dense, else one per slot.
func (f *frontend) slotEntries() int {
	if f.dense() {
		return 0
	}
	return len(f.slots)
}

// inlineMembers reports whether f keeps its members in its reverse-NAT
// value (struct rev_nat of bpf/maps.h) and has no vipd_members entries: at
// most revNatInlineMembers of them.
func (f *frontend) inlineMembers() bool { return len(f.members) <= revNatInlineMembers }

// memberEntries is the number of vipd_members entries f has: none when its
// members are inline, else one per member.
func (f *frontend) memberEntries() int {
	if f.inlineMembers() {
		return 0
	}
	return len(f.members)
}

// slotBackend returns the backend of slot i (0-based).
func (f *frontend) slotBackend(i int) beKey { return f.members[f.slots[i].member].key.unpack() }

// slot is a backend that may take new connections: the index of its
// member (every slot is one), its weight and its cumulative weight.
type slot struct {
	member uint32
	weight uint16
	cum    uint32
}

// identitySlots[j] is slot j of a frontend whose members all take new
// connections, with weight 1: member j, cumulative weight j+1. Such
// frontends (most) share a prefix of it instead of slots of their own;
// slots are never changed once built.
var identitySlots = func() []slot {
	s := make([]slot, 1024)
	for j := range s {
		s[j] = slot{member: uint32(j), weight: 1, cum: uint32(j + 1)}
	}
	return s
}()

// sharesIdentitySlots reports whether f's slots are a prefix of
// identitySlots: slot j is member j.
func (f *frontend) sharesIdentitySlots() bool {
	return len(f.slots) > 0 && &f.slots[0] == &identitySlots[0]
}

// sharedSlots returns slots, or the prefix of identitySlots equal to them.
func sharedSlots(slots []slot) []slot {
	if len(slots) == 0 || len(slots) > len(identitySlots) || !slices.Equal(slots, identitySlots[:len(slots)]) {
		return slots
	}
	return identitySlots[:len(slots):len(slots)]
}

// equal reports whether f and g program the same map entries.
func (f *frontend) equal(g *frontend) bool {
	if f.key != g.key || f.flags != g.flags || f.timeout != g.timeout || f.weight != g.weight ||
		f.maglevM != g.maglevM || len(f.members) != len(g.members) {
		return false
	}
	return slices.Equal(f.slots, g.slots) && slices.Equal(f.members, g.members) && slices.Equal(f.ranges(), g.ranges())
}

// ranges returns f's load-balancer source ranges.
func (f *frontend) ranges() []netip.Prefix {
	if f.srcRanges == nil {
		return nil
	}
	return *f.srcRanges
}

// frontendSizeMax is the most bytes a frontend takes: a Go size class
// (TestApplyMemoryBudget checks it), for the 100,000 of a large sync.
const frontendSizeMax = 128

func protoNumber(p dataplane.Protocol) uint8 {
	switch p {
	case dataplane.TCP:
		return ipprotoTCP
	case dataplane.UDP:
		return ipprotoUDP
	case dataplane.SCTP:
		return ipprotoSCTP
	}
	return 0
}

func protoName(p uint8) string {
	switch p {
	case ipprotoTCP:
		return "TCP"
	case ipprotoUDP:
		return "UDP"
	case ipprotoSCTP:
		return "SCTP"
	}
	return strconv.Itoa(int(p))
}

// frontendsOf turns a service into its frontends, one per VIP and port. It
// fails, wrapping dataplane.ErrUnsupported, for an SCTP port whose target
// port differs: rewriting an SCTP port means recomputing the CRC32c of the
// whole packet, which this dataplane does not do.
func frontendsOf(svc *dataplane.Service, maglevMin uint32) ([]*frontend, error) {
	return appendFrontendsOf(nil, svc, maglevMin)
}

// appendFrontendsOf is frontendsOf, appending the frontends to dst.
func appendFrontendsOf(dst []*frontend, svc *dataplane.Service, maglevMin uint32) ([]*frontend, error) {
	var n4, n6 int
	for i := range svc.Backends {
		if svc.Backends[i].IP.Is6() {
			n6++
		} else {
			n4++
		}
	}
	// One allocation each for the frontends, their members and their slots
	// (when they do not share identitySlots).
	nfe := len(svc.VIPs) * len(svc.Ports)
	out, base := slices.Grow(dst, nfe), len(dst)
	fes := make([]frontend, nfe)
	var nm int
	for _, vip := range svc.VIPs {
		if vip.Is6() {
			nm += len(svc.Ports) * n6
		} else {
			nm += len(svc.Ports) * n4
		}
	}
	members := make([]member, 0, nm)
	var slots []slot
	for _, vip := range svc.VIPs {
		is6 := vip.Is6()
		for _, p := range svc.Ports {
			// Per port: a backend may serve some ports of the service only.
			eligible := eligibilityOf(svc, p, is6, svc.TrafficPolicy)
			fe := &fes[len(out)-base]
			*fe = frontend{
				key:     feKey{addr: vip, port: p.Port, proto: protoNumber(p.Protocol)},
				service: svc.Name,
			}
			start := len(members)
			for i := range svc.Backends {
				b := &svc.Backends[i]
				if b.IP.Is6() != is6 || !b.Serves(p) {
					continue
				}
				k := bePacked{addr: b.IP.As16(), port: b.TargetPort(p)}
				if p.Protocol == dataplane.SCTP && k.port != p.Port {
					return nil, &dataplane.UnsupportedError{
						Service: svc.Name,
						Feature: fmt.Sprintf("SCTP port %d with target port %d (backend %s)", p.Port, k.port, b.IP),
						Hint:    "an SCTP port must equal its target port on the ebpf dataplane (a port rewrite needs the CRC32c of the whole packet recomputed); use the iptables dataplane",
					}
				}
				members = append(members, member{key: k})
			}
			fe.members = members[start:len(members):len(members)]
			if !slices.IsSortedFunc(fe.members, compareMembers) {
				slices.SortFunc(fe.members, compareMembers)
			}
			// Backends are unique by IP; should two still share a key, they
			// are one member.
			fe.members = slices.CompactFunc(fe.members, func(a, b member) bool { return a.key == b.key })
			start = len(slots)
			uniform := true
			// While the slots are identitySlots[:n] (weight 1, member j
			// in slot j, the common case), none is stored: fe shares
			// identitySlots.
			n, hint := 0, 0
			for j := range svc.Backends {
				b := &svc.Backends[j]
				if !eligible.has(b) {
					continue
				}
				i := fe.memberIndexFrom(bePacked{addr: b.IP.As16(), port: b.TargetPort(p)}, hint)
				if i < 0 {
					continue // eligible backends are among the service's
				}
				hint = i + 1
				fe.members[i].flags = memberFlagEligible
				w := max(b.Weight, 1)
				fe.weight += uint32(w)
				if n >= 0 && i == n && w == 1 && n < len(identitySlots) {
					n++
					continue
				}
				if n >= 0 {
					if slots == nil {
						slots = make([]slot, 0, len(svc.Ports)*len(svc.VIPs)*len(svc.Backends))
					}
					slots = append(slots, identitySlots[:n]...)
					n = -1
				}
				slots = append(slots, slot{member: uint32(i), weight: w, cum: fe.weight})
				if w != slots[start].weight {
					uniform = false
				}
			}
			switch {
			case n > 0:
				fe.slots = identitySlots[:n:n]
			case len(slots) > start:
				fe.slots = slots[start:len(slots):len(slots)]
			}
			if err := fe.setChoice(svc, uniform, maglevMin); err != nil {
				return nil, err
			}
			out = append(out, fe)
		}
	}
	return out, nil
}

// eligibility tells the backends of a service that may receive a new
// connection to one of its ports, for one address family and traffic
// policy: those dataplane.Service.ExternalBackends returns, in the same
// order, without building their list (a slice per frontend, 19 MB of
// garbage for a render of 100,000 services). eligibility_test.go checks
// the two agree.
type eligibility struct {
	p     dataplane.Port
	is6   bool
	local bool                   // only node-local backends (TrafficPolicyLocal)
	state dataplane.BackendState // BackendReady when any candidate is ready, else BackendTerminating
}

// eligibilityOf returns the eligibility of svc's backends for port p of
// family is6 under policy.
func eligibilityOf(svc *dataplane.Service, p dataplane.Port, is6 bool, policy dataplane.TrafficPolicy) eligibility {
	e := eligibility{p: p, is6: is6, local: policy == dataplane.TrafficPolicyLocal, state: dataplane.BackendReady}
	for i := range svc.Backends {
		if b := &svc.Backends[i]; e.candidate(b) && b.State == dataplane.BackendReady {
			return e
		}
	}
	e.state = dataplane.BackendTerminating
	return e
}

// candidate reports whether b serves e's port and family, and is node-local
// when e wants that, whatever its state.
func (e eligibility) candidate(b *dataplane.Backend) bool {
	return b.IP.Is6() == e.is6 && b.Serves(e.p) && (!e.local || b.NodeLocal)
}

// has reports whether b is eligible.
func (e eligibility) has(b *dataplane.Backend) bool { return b.State == e.state && e.candidate(b) }

// serviceFrontends returns every frontend of a service: its VIPs'
// (frontendsOf) and, when it has external traffic, those of its node
// ports, external IPs and load-balancer IPs (externalFrontendsOf).
func serviceFrontends(svc *dataplane.Service, maglevMin uint32, node *dataplane.Node) ([]*frontend, error) {
	return appendServiceFrontends(nil, svc, maglevMin, node)
}

// appendServiceFrontends is serviceFrontends, appending the frontends to
// dst.
func appendServiceFrontends(dst []*frontend, svc *dataplane.Service, maglevMin uint32, node *dataplane.Node) ([]*frontend, error) {
	fes, err := appendFrontendsOf(dst, svc, maglevMin)
	if err != nil || !svc.HasExternal() {
		return fes, err
	}
	ext, err := externalFrontendsOf(svc, maglevMin, node)
	if err != nil {
		return nil, err
	}
	return append(fes, ext...), nil
}

// externalFrontendsOf returns the frontends of a service's node ports (on
// every node.NodePortAddresses address), external IPs and load-balancer
// IPs. Each address and port has two: a cluster-scope one, for pods and
// the node's own processes, with the backends of
// ExternalBackends(Cluster) and no masquerade; and an external-scope one,
// for packets entering on an external interface, with those of
// ExternalBackends(ExternalTrafficPolicy), masqueraded (svcFlagSNAT)
// under Cluster, dropped when empty (svcFlagDropEmpty) under Local. Those
// of load-balancer IPs with source ranges carry svcFlagSrcRanges, in both
// scopes.
func externalFrontendsOf(svc *dataplane.Service, maglevMin uint32, node *dataplane.Node) ([]*frontend, error) {
	type target struct {
		addr   netip.Addr
		port   uint16
		ranges []netip.Prefix
	}
	policy := svc.ExternalTrafficPolicy
	if policy != dataplane.TrafficPolicyLocal {
		policy = dataplane.TrafficPolicyCluster
	}
	var out []*frontend
	for _, p := range svc.Ports {
		var targets []target
		if p.NodePort != 0 {
			for _, a := range node.NodePortAddresses {
				targets = append(targets, target{addr: a.Unmap(), port: p.NodePort})
			}
		}
		for _, a := range svc.ExternalIPs {
			targets = append(targets, target{addr: a.Unmap(), port: p.Port})
		}
		for _, a := range svc.LoadBalancerIPs {
			targets = append(targets, target{addr: a.Unmap(), port: p.Port, ranges: svc.LoadBalancerSourceRanges})
		}
		for _, t := range targets {
			is6 := t.addr.Is6()
			for _, scope := range []uint8{scopeCluster, scopeExternal} {
				pol, flags := dataplane.TrafficPolicyCluster, uint32(0)
				if scope == scopeExternal {
					pol = policy
					if policy == dataplane.TrafficPolicyLocal {
						flags |= svcFlagDropEmpty
					} else {
						flags |= svcFlagSNAT
					}
				}
				key := feKey{addr: t.addr, port: t.port, proto: protoNumber(p.Protocol), scope: scope}
				fe, err := buildFrontend(svc, key, p, svc.ExternalBackends(p, is6, pol), maglevMin)
				if err != nil {
					return nil, err
				}
				fe.flags |= flags
				if len(t.ranges) > 0 {
					fe.flags |= svcFlagSrcRanges
					ranges := t.ranges
					fe.srcRanges = &ranges
					if scope == scopeCluster && nodeInRanges(node, is6, t.ranges) {
						fe.flags |= svcFlagNodeAllowed
					}
				}
				out = append(out, fe)
			}
		}
	}
	return out, nil
}

// nodeInRanges reports whether one of the node's addresses of a family is
// in ranges.
func nodeInRanges(node *dataplane.Node, is6 bool, ranges []netip.Prefix) bool {
	for _, ifc := range node.Interfaces {
		for _, a := range ifc.Addrs {
			if a.Is6() != is6 {
				continue
			}
			for _, r := range ranges {
				if r.Contains(a) {
					return true
				}
			}
		}
	}
	return false
}

// buildFrontend is one frontend of frontendsOf, for key and port p of
// svc, whose new connections go to eligible.
func buildFrontend(svc *dataplane.Service, key feKey, p dataplane.Port, eligible []*dataplane.Backend, maglevMin uint32) (*frontend, error) {
	is6 := key.addr.Is6()
	fe := &frontend{key: key, service: svc.Name}
	for i := range svc.Backends {
		b := &svc.Backends[i]
		if b.IP.Is6() != is6 || !b.Serves(p) {
			continue
		}
		k := bePacked{addr: b.IP.As16(), port: b.TargetPort(p)}
		if p.Protocol == dataplane.SCTP && k.port != key.port {
			return nil, &dataplane.UnsupportedError{
				Service: svc.Name,
				Feature: fmt.Sprintf("SCTP port %d with target port %d (backend %s)", key.port, k.port, b.IP),
				Hint:    "an SCTP port must equal its target port on the ebpf dataplane (a port rewrite needs the CRC32c of the whole packet recomputed); use the iptables dataplane",
			}
		}
		fe.members = append(fe.members, member{key: k})
	}
	slices.SortFunc(fe.members, compareMembers)
	fe.members = slices.CompactFunc(fe.members, func(a, b member) bool { return a.key == b.key })
	uniform, hint := true, 0
	for _, b := range eligible {
		i := fe.memberIndexFrom(bePacked{addr: b.IP.As16(), port: b.TargetPort(p)}, hint)
		if i < 0 {
			continue
		}
		hint = i + 1
		fe.members[i].flags = memberFlagEligible
		w := max(b.Weight, 1)
		fe.weight += uint32(w)
		fe.slots = append(fe.slots, slot{member: uint32(i), weight: w, cum: fe.weight})
		if w != fe.slots[0].weight {
			uniform = false
		}
	}
	fe.slots = sharedSlots(fe.slots)
	if err := fe.setChoice(svc, uniform, maglevMin); err != nil {
		return nil, err
	}
	return fe, nil
}

// setChoice sets how fe picks among its slots, once they are filled:
// weighted unless every slot has the same weight (uniform), svc's session
// affinity, and a Maglev table of at least maglevMin entries for svc's
// Maglev balancing.
func (fe *frontend) setChoice(svc *dataplane.Service, uniform bool, maglevMin uint32) error {
	if !uniform {
		fe.flags |= svcFlagWeighted
	}
	if svc.Affinity.ClientIP {
		fe.flags |= svcFlagAffinity
		fe.timeout = uint32(min(math.Ceil(svc.Affinity.Timeout.Seconds()), math.MaxUint32))
	}
	if svc.LoadBalancing == dataplane.LoadBalancingMaglev && len(fe.slots) > 0 {
		m, err := maglev.TableSize(maglevMin, len(fe.slots))
		if err != nil {
			return fmt.Errorf("service %s: %w", svc.Name, err)
		}
		fe.flags |= svcFlagMaglev
		fe.maglevM = m
	}
	return nil
}
