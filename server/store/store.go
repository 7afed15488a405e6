package store

import (
	"bytes"
	"fmt"
	"iter"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/internal/pmap"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Entry is one stored service. An Entry is immutable, and so is
// everything it holds: its Dataplane service, which the dataplanes and the
// snapshots committed after it share, is never modified once stored (the
// store and its callers only ever replace an entry), so that no stored
// service is kept in more than one copy.
//
// It keeps the dataplane form, which the dataplane reads on every apply,
// and the API form only serialized: that is what the state file and the
// journal hold anyway, and it takes a fraction of the memory of the
// decoded messages (a store of 100,000 services with 10 backends each
// would otherwise keep a million backend messages alive). Service decodes
// it on demand. The serialized form leaves out the backends, which it
// encodes from the dataplane form when needed (see spec.go).
type Entry struct {
	// Dataplane is the service as the dataplane sees it. Its Name, Owner
	// and Generation are the service's. It must not be modified.
	Dataplane *dataplane.Service
	// spec is the normalized API form without its generation (see
	// EncodeSpec); the generation is Dataplane's. When backendsAt is not
	// negative, the backends field is cut out of spec at that offset: it
	// is appendBackends(Dataplane.Backends). Entries of different
	// generations, such as those of a retried mutation, may share it.
	spec       []byte
	backendsAt int32
}

// Spec is a validated, normalized service encoded as an Entry keeps it:
// EncodeSpec's form, with the backends cut out when its dataplane form
// gives them back (see spec.go). NewSpec makes one. A Spec is immutable,
// and the entries put with it share it, so that a caller that keeps
// services encoded until they are stored (a big SyncServices) keeps them
// once.
type Spec struct {
	b  []byte
	at int32 // where the backends are cut out of b; -1: b is whole
	// backends is the dataplane form the backends were cut against.
	backends []dataplane.Backend
}

// NewSpec encodes svc, whose dataplane form is dp, as an Entry keeps it.
// It leaves svc as it was, and keeps nothing of it.
func NewSpec(svc *vipdv1.Service, dp *dataplane.Service) (Spec, error) {
	// The whole encoding is scratch: what the Spec keeps is the cut one
	// (slimSpec copies it out), so a big sync encodes 100,000 services
	// into one reused buffer rather than 100,000 new ones.
	scratch := specScratch.Get().(*[]byte)
	defer specScratch.Put(scratch)
	full, err := appendEncodedSpec(*scratch, svc)
	if err != nil {
		return Spec{}, err
	}
	*scratch = full[:0]
	spec := newSpec(full, dp.Backends)
	if spec.at < 0 {
		spec.b = slices.Clone(full) // kept whole: full is the scratch's
	}
	return spec, nil
}

// specScratch holds NewSpec's buffers.
var specScratch = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

func newSpec(full []byte, bs []dataplane.Backend) Spec {
	b, at := slimSpec(full, bs)
	return Spec{b: b, at: at, backends: bs}
}

// appendFull appends EncodeSpec's form of the service.
func (s Spec) appendFull(b []byte) []byte {
	if s.at < 0 {
		return append(b, s.b...)
	}
	b = append(b, s.b[:s.at]...)
	b, _ = appendBackends(b, s.backends) // slimSpec checked it
	return append(b, s.b[s.at:]...)
}

// sameBackends reports whether a and b, the same length, are the same
// backends or encode to the same bytes.
func sameBackends(a, b []dataplane.Backend) bool {
	if len(a) == 0 || &a[0] == &b[0] {
		return true
	}
	var x, y [1024]byte
	ea, _ := appendBackends(x[:0], a)
	eb, _ := appendBackends(y[:0], b)
	return bytes.Equal(ea, eb)
}

// generationField is vipd.v1.Service's generation field number.
const generationField protowire.Number = 10

// EncodeSpec serializes a validated, normalized service without its
// generation: the form an Entry keeps, and what SameSpec compares. It
// leaves svc as it was.
func EncodeSpec(svc *vipdv1.Service) ([]byte, error) { return appendEncodedSpec(nil, svc) }

// appendEncodedSpec appends EncodeSpec's form of svc to b.
func appendEncodedSpec(b []byte, svc *vipdv1.Service) ([]byte, error) {
	g := svc.Generation
	svc.Generation = 0
	b, err := proto.MarshalOptions{Deterministic: true}.MarshalAppend(b, svc)
	svc.Generation = g
	if err != nil {
		return nil, fmt.Errorf("encode service %s: %w", svc.Name, err)
	}
	return b, nil
}

// NewEntry pairs a validated, normalized service with its dataplane form and
// stamps both with generation gen. It sets svc.Generation but does not keep
// svc; it keeps dp, which the caller hands over and must not change again.
func NewEntry(svc *vipdv1.Service, dp *dataplane.Service, gen uint64) (*Entry, error) {
	spec, err := NewSpec(svc, dp)
	if err != nil {
		return nil, err
	}
	svc.Generation = gen
	return newEntry(spec, dp, gen), nil
}

// newEntry is NewEntry for a service already encoded. The entry shares
// spec. A spec cut against other backends than dp's (not NewSpec(svc, dp)'s)
// is cut again.
func newEntry(spec Spec, dp *dataplane.Service, gen uint64) *Entry {
	dp.Generation = gen
	if spec.at >= 0 && (len(spec.backends) != len(dp.Backends) || !sameBackends(spec.backends, dp.Backends)) {
		spec = newSpec(spec.appendFull(nil), dp.Backends)
	}
	return &Entry{Dataplane: dp, spec: spec.b, backendsAt: spec.at}
}

// specOf is the Spec e keeps.
func (e *Entry) specOf() Spec {
	return Spec{b: e.spec, at: e.backendsAt, backends: e.Dataplane.Backends}
}

// appendSpec appends EncodeSpec's form of the service: spec with its
// backends put back.
func (e *Entry) appendSpec(b []byte) []byte { return e.specOf().appendFull(b) }

// specLen is the length of appendSpec's output.
func (e *Entry) specLen() int {
	if e.backendsAt < 0 {
		return len(e.spec)
	}
	return len(e.spec) + backendsSize(e.Dataplane.Backends)
}

// Name is the service's name.
func (e *Entry) Name() string { return e.Dataplane.Name }

// Owner is the service's owner.
func (e *Entry) Owner() string { return e.Dataplane.Owner }

// Generation is the generation the service was stored with.
func (e *Entry) Generation() uint64 { return e.Dataplane.Generation }

// Service returns the normalized API form, with its generation set. It
// decodes a new message on every call, which the caller owns: the message
// shares no memory with the entry.
func (e *Entry) Service() *vipdv1.Service {
	svc := &vipdv1.Service{}
	var buf [1024]byte
	if err := proto.Unmarshal(e.appendSpec(buf[:0]), svc); err != nil {
		// EncodeSpec made it: it cannot fail to decode.
		panic(fmt.Sprintf("decode stored service %s: %v", e.Name(), err))
	}
	svc.Generation = e.Generation()
	return svc
}

// Spec is the normalized API form without its generation, as EncodeSpec
// made it, for a reader that decodes only the fields it needs (the
// reconciler's topology filter), except that it may lack backends: those
// whose API form says no more than their dataplane form (Dataplane.Backends)
// are cut out (see slimSpec). So a backend with a field that only the API
// form has (for_zones, for_nodes) is always in it. The entry shares it:
// the caller must not change it.
func (e *Entry) Spec() []byte { return e.spec }

// healthCheckField is vipd.v1.Service's health_check field number.
const healthCheckField protowire.Number = 11

// HealthCheck returns the service's health check (nil: none), as
// Service().GetHealthCheck() does, but decodes only that field: the
// health prober asks it of every stored service, and most have none. The
// caller owns the message.
func (e *Entry) HealthCheck() *vipdv1.HealthCheck {
	var hc *vipdv1.HealthCheck
	for b := e.spec; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			panic(fmt.Sprintf("decode stored service %s: %v", e.Name(), protowire.ParseError(n)))
		}
		b = b[n:]
		if num == healthCheckField && typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				panic(fmt.Sprintf("decode stored service %s: %v", e.Name(), protowire.ParseError(m)))
			}
			// A message field given twice is merged, as proto.Unmarshal does.
			if hc == nil {
				hc = &vipdv1.HealthCheck{}
			}
			if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(v, hc); err != nil {
				panic(fmt.Sprintf("decode stored service %s: %v", e.Name(), err))
			}
			b = b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			panic(fmt.Sprintf("decode stored service %s: %v", e.Name(), protowire.ParseError(m)))
		}
		b = b[m:]
	}
	return hc
}

// encodedLen is the length of appendEncoded's output.
func (e *Entry) encodedLen() int {
	return e.specLen() + protowire.SizeTag(generationField) + protowire.SizeVarint(e.Generation())
}

// appendEncoded appends the service, generation included, as one
// vipd.v1.Service message: the form of the state file and the journal.
func (e *Entry) appendEncoded(b []byte) []byte {
	b = e.appendSpec(b)
	b = protowire.AppendTag(b, generationField, protowire.VarintType)
	return protowire.AppendVarint(b, e.Generation())
}

// SameSpec reports whether e and svc describe the same service, ignoring
// generation. svc must be normalized, as stored services are.
func (e *Entry) SameSpec(svc *vipdv1.Service) bool {
	b, err := EncodeSpec(svc)
	return err == nil && e.sameEncoded(b)
}

// sameEncoded is SameSpec for a service encoded by EncodeSpec.
func (e *Entry) sameEncoded(full []byte) bool {
	if e.backendsAt < 0 {
		return bytes.Equal(full, e.spec)
	}
	if len(full) != e.specLen() {
		return false
	}
	var buf [1024]byte
	return bytes.Equal(full, e.appendSpec(buf[:0]))
}

// SameEncodedSpec is SameSpec for a service encoded by NewSpec.
func (e *Entry) SameEncodedSpec(spec Spec) bool {
	if spec.at == e.backendsAt && len(spec.backends) == len(e.Dataplane.Backends) {
		return bytes.Equal(spec.b, e.spec) && (spec.at < 0 || sameBackends(spec.backends, e.Dataplane.Backends))
	}
	var buf [1024]byte
	return e.sameEncoded(spec.appendFull(buf[:0]))
}

// Claim is one VIP:port/protocol, external or load-balancer IP:port/protocol,
// or node port/protocol that a service forwards. Two services may not hold
// the same claim.
type Claim struct {
	// VIP is the address; for a ClaimNodePort it is the zero Addr.
	VIP      netip.Addr
	Protocol dataplane.Protocol
	Port     uint16
	Kind     ClaimKind
}

// ClaimKind is what a Claim's address is.
type ClaimKind uint8

// Claim kinds.
const (
	// ClaimVIP is a VIP:port/protocol (the zero ClaimKind).
	ClaimVIP ClaimKind = iota
	// ClaimExternal is an external or load-balancer IP's port/protocol:
	// services may share the address on different ports, and no VIP is
	// one (the address index sees to that), so it is a claim of its own.
	ClaimExternal
	// ClaimNodePort is a node port/protocol, on every node-port address.
	// A health_check_node_port is a TCP one.
	ClaimNodePort
)

func (c Claim) String() string {
	if c.Kind == ClaimNodePort {
		return fmt.Sprintf("node port %d/%s", c.Port, c.Protocol)
	}
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(c.VIP, c.Port), c.Protocol)
}

// claimsOf lists the claims of svc.
func claimsOf(svc *dataplane.Service) iter.Seq[Claim] {
	// An iterator rather than a slice: a big sync walks the claims of
	// 100,000 services twice, and would allocate a slice each time.
	return func(yield func(Claim) bool) {
		for _, vip := range svc.VIPs {
			for _, p := range svc.Ports {
				if !yield(Claim{VIP: vip, Protocol: p.Protocol, Port: p.Port}) {
					return
				}
			}
		}
		for _, list := range [2][]netip.Addr{svc.ExternalIPs, svc.LoadBalancerIPs} {
			for _, a := range list {
				for _, p := range svc.Ports {
					if !yield(Claim{VIP: a, Protocol: p.Protocol, Port: p.Port, Kind: ClaimExternal}) {
						return
					}
				}
			}
		}
		for _, p := range svc.Ports {
			if p.NodePort != 0 {
				if !yield(Claim{Protocol: p.Protocol, Port: p.NodePort, Kind: ClaimNodePort}) {
					return
				}
			}
		}
		if svc.HealthCheckNodePort != 0 {
			yield(Claim{Protocol: dataplane.TCP, Port: svc.HealthCheckNodePort, Kind: ClaimNodePort})
		}
	}
}

// claimUse names the field of svc that makes claim c, such as
// "ports[1].node_port" or "load_balancer_ips[0]", for an error message;
// "" when svc does not make it.
func claimUse(svc *dataplane.Service, c Claim) string {
	switch c.Kind {
	case ClaimExternal:
		if i := slices.Index(svc.ExternalIPs, c.VIP); i >= 0 {
			return fmt.Sprintf("external_ips[%d]", i)
		}
		if i := slices.Index(svc.LoadBalancerIPs, c.VIP); i >= 0 {
			return fmt.Sprintf("load_balancer_ips[%d]", i)
		}
	case ClaimNodePort:
		for i, p := range svc.Ports {
			if p.NodePort == c.Port && p.Protocol == c.Protocol {
				return fmt.Sprintf("ports[%d].node_port", i)
			}
		}
		if c.Protocol == dataplane.TCP && svc.HealthCheckNodePort == c.Port {
			return "health_check_node_port"
		}
	}
	return ""
}

// Snapshot is an immutable, complete desired state.
//
// Its services and claims live in persistent hash maps (internal/pmap): a
// commit copies only the few nodes on the paths to the keys it changes and
// shares everything else with the snapshot it was committed on, so a
// change costs O(change), not O(services), however many services exist,
// and older snapshots stay valid for concurrent readers.
type Snapshot struct {
	revision uint64
	services pmap.Map[string, *Entry] // by name
	claims   pmap.Map[Claim, string]  // the holder's name
	addrs    addrIndex                // persistent too, in buckets
	// externals counts the services using each address as an external or
	// load-balancer IP (see addrUse).
	externals pmap.Map[addrKey, int32]
	backends  int
	limits    validation.Limits // only the totals
	// parent is the revision of the snapshot this one was committed on,
	// and delta the names that differ from it (nil: unknown). The state
	// directory journals just those.
	parent uint64
	delta  []string
	// history is the last commits that led to s, the newest (s's own)
	// last; empty when not known (see ChangedSince). Never modified in
	// place: snapshots share it.
	history []commit
	// order is services in name order, once a caller asked for it; nil
	// in a Snapshot made otherwise than by this package's constructors.
	order *byName
}

// Empty returns the snapshot of a store with no services.
func Empty() *Snapshot {
	return &Snapshot{history: []commit{{mark: &commitMark{}}}, order: &byName{}}
}

// WithLimits returns s with the totals of l (MaxServices and
// MaxTotalBackends; 0 is no limit) enforced on every transaction begun on
// it and on the snapshots those commit: a Put that would take the store
// past l.MaxServices services or l.MaxTotalBackends backends fails with a
// *LimitError. The other fields of l are the validator's and are ignored.
// A snapshot already past a limit (the limit was lowered since) stays as
// it is, and may still shrink, or change without growing. s itself does
// not change.
func (s *Snapshot) WithLimits(l validation.Limits) *Snapshot {
	c := *s
	c.limits = validation.Limits{MaxServices: l.MaxServices, MaxTotalBackends: l.MaxTotalBackends}
	return &c
}

// Limits returns the totals s enforces (see WithLimits).
func (s *Snapshot) Limits() validation.Limits { return s.limits }

// Revision is the highest generation ever assigned in this store. It only grows.
func (s *Snapshot) Revision() uint64 { return s.revision }

// Len is the number of services.
func (s *Snapshot) Len() int { return s.services.Len() }

// BackendCount is the number of backends summed over all services.
func (s *Snapshot) BackendCount() int { return s.backends }

// Get returns the named service.
func (s *Snapshot) Get(name string) (*Entry, bool) { return s.services.Get(name) }

// All yields every service in name order. The first All of a snapshot (or
// of its DataplaneState) sorts the names, in O(n log n) before the first
// entry; the snapshot keeps the order for the next.
func (s *Snapshot) All() iter.Seq2[string, *Entry] {
	return func(yield func(string, *Entry) bool) {
		for _, ne := range s.order.entries(s.services) {
			if !yield(ne.name, ne.e) {
				return
			}
		}
	}
}

// Each yields every service in no particular order: All without its sort,
// for a caller that needs no order. At 100,000 services All's sort takes
// some 17 ms and a 2.4 MB slice of the names.
func (s *Snapshot) Each() iter.Seq2[string, *Entry] { return s.services.All() }

// List returns the services of owner, or all when owner is empty, sorted by name.
func (s *Snapshot) List(owner string) []*Entry {
	var res []*Entry
	if owner == "" {
		res = make([]*Entry, 0, s.services.Len())
	}
	for _, e := range s.services.All() {
		if owner == "" || e.Owner() == owner {
			res = append(res, e)
		}
	}
	slices.SortFunc(res, func(a, b *Entry) int { return strings.Compare(a.Name(), b.Name()) })
	return res
}

// DataplaneState returns the state a dataplane needs to forward s, with
// changed as the hint of what differs from the previously applied state.
// It costs O(1): the state reads s's services in place.
func (s *Snapshot) DataplaneState(changed []string) *dataplane.State {
	return &dataplane.State{Generation: s.revision, Set: dataplaneSet{s.services, s.order}, Changed: changed}
}

// dataplaneSet shows a snapshot's services to a dataplane.
type dataplaneSet struct {
	m     pmap.Map[string, *Entry]
	order *byName
}

func (d dataplaneSet) Get(name string) (*dataplane.Service, bool) {
	e, ok := d.m.Get(name)
	if !ok {
		return nil, false
	}
	return e.Dataplane, true
}

func (d dataplaneSet) Len() int { return d.m.Len() }

func (d dataplaneSet) All() iter.Seq2[string, *dataplane.Service] {
	return func(yield func(string, *dataplane.Service) bool) {
		for _, ne := range d.order.entries(d.m) {
			if !yield(ne.name, ne.e.Dataplane) {
				return
			}
		}
	}
}

// byName is a snapshot's services in name order, sorted on first use and
// then kept, for as long as the snapshot: a full apply walks them in that
// order several times (the dataplane, the health prober, the node
// checks), and each sort of 100,000 names took some 17 ms and a 2.4 MB
// slice, which the order now costs once. Snapshots of the same services
// share one.
type byName struct {
	once sync.Once
	all  []namedEntry
}

type namedEntry struct {
	name string
	e    *Entry
}

// entries returns m, the services o orders, in name order. A nil o sorts
// them every time.
func (o *byName) entries(m pmap.Map[string, *Entry]) []namedEntry {
	if o == nil {
		return sortByName(m)
	}
	o.once.Do(func() { o.all = sortByName(m) })
	return o.all
}

// sortByName returns m's entries in key order.
func sortByName(m pmap.Map[string, *Entry]) []namedEntry {
	all := make([]namedEntry, 0, m.Len())
	for k, e := range m.All() {
		all = append(all, namedEntry{k, e})
	}
	slices.SortFunc(all, func(a, b namedEntry) int { return strings.Compare(a.name, b.name) })
	return all
}

// ConflictError says that a service claims a VIP:port/protocol, an
// external or load-balancer IP:port/protocol or a node port that another
// service holds already.
type ConflictError struct {
	Service string
	Claim   Claim
	Holder  string
	// Use and HolderUse name the fields of Service and Holder that make
	// the claim (see claimUse), for claims other than a VIP's.
	Use, HolderUse string
}

func (e *ConflictError) Error() string {
	if e.Claim.Kind == ClaimVIP {
		return fmt.Sprintf("service %s: %s is already used by service %s", e.Service, e.Claim, e.Holder)
	}
	return fmt.Sprintf("service %s: %s (its %s) is already used by service %s (its %s)", e.Service, e.Claim, e.Use, e.Holder, e.HolderUse)
}

// conflict returns the *ConflictError of svc's claim c, which holder holds
// as t sees it.
func (t *Txn) conflict(svc *dataplane.Service, c Claim, holder string) *ConflictError {
	e := &ConflictError{Service: svc.Name, Claim: c, Holder: holder, Use: claimUse(svc, c)}
	if h, ok := t.Get(holder); ok {
		e.HolderUse = claimUse(h.Dataplane, c)
	}
	return e
}

// LimitError says that a change would take the store past one of its
// totals (see Snapshot.WithLimits).
type LimitError struct {
	// Service is the service whose Put would have crossed the limit.
	Service string
	// Resource is what is counted: "services" or "backends".
	Resource string
	// Limit is the limit, and Count the total the Put would have made.
	Limit, Count int
	// Flag is vipd's flag that sets the limit, such as "--max-services".
	Flag string
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("service %s: storing it would make %d %s in all, above the limit of %d (%s); nothing was changed",
		e.Service, e.Count, e.Resource, e.Limit, e.Flag)
}

// Txn stages changes on top of a Snapshot, or on top of a parent Txn (see
// Sub). A Txn is used by one goroutine.
type Txn struct {
	base     *Snapshot
	parent   *Txn
	revision uint64
	services map[string]*Entry // nil value: deleted
	claims   map[Claim]string  // "" value: released
	addrs    map[addrKey]addrUse
	// externals is nil until a Put or Delete stages a count.
	externals  map[addrKey]int32
	extScratch []extCount  // checkAddrs's buffer
	scratch    []addrCount // checkAddrs's buffer
	changed    []string    // Changed's cache; nil when stale
	// count and backends are the totals of services and backends as the
	// transaction sees them, for the limits.
	count, backends int
}

// Begin starts a transaction on top of s. s itself never changes.
func (s *Snapshot) Begin() *Txn {
	return &Txn{base: s, revision: s.revision, services: map[string]*Entry{}, claims: map[Claim]string{},
		addrs: map[addrKey]addrUse{}, count: s.Len(), backends: s.backends}
}

// Sub starts a nested transaction that sees t's staged changes. Its own
// changes reach t only through Merge, so a failed step can be dropped without
// undoing anything. t must not change while the Sub is open.
func (t *Txn) Sub() *Txn {
	return &Txn{base: t.base, parent: t, revision: t.revision, services: map[string]*Entry{}, claims: map[Claim]string{},
		addrs: map[addrKey]addrUse{}, count: t.count, backends: t.backends}
}

// Grow makes room in t for at least services more staged services that
// hold claims claims between them (see ClaimCount), so that a change of
// many services does not grow t's maps step by step: for a SyncServices of
// 100,000 services the growing maps allocated, and dropped, some 15 MB
// more than their final size. Small changes (under growMin services) are
// left to grow as they go.
func (t *Txn) Grow(services, claims int) {
	if services < growMin {
		return
	}
	t.services = grown(t.services, services)
	t.claims = grown(t.claims, claims)
}

// growMin is the fewest services that Txn.Grow makes room for.
const growMin = 1024

// grown returns m, or a copy of it with room for n more keys.
func grown[K comparable, V any](m map[K]V, n int) map[K]V {
	c := make(map[K]V, len(m)+n)
	maps.Copy(c, m)
	return c
}

// ClaimCount returns how many claims svc holds (claimsOf), for Txn.Grow.
func ClaimCount(svc *dataplane.Service) int {
	n := 0
	for range claimsOf(svc) {
		n++
	}
	return n
}

// Merge moves a Sub's changes into its parent.
func (t *Txn) Merge() {
	p := t.parent
	if len(p.services) == 0 && len(p.claims) == 0 {
		// The common case of a batch of one (a big SyncServices among
		// them): hand the maps over rather than copy them.
		p.services, p.claims, p.addrs = t.services, t.claims, t.addrs
		t.services, t.claims, t.addrs = map[string]*Entry{}, map[Claim]string{}, map[addrKey]addrUse{}
	} else {
		maps.Copy(p.services, t.services)
		maps.Copy(p.claims, t.claims)
		maps.Copy(p.addrs, t.addrs)
	}
	switch {
	case len(t.externals) == 0:
	case p.externals == nil:
		p.externals, t.externals = t.externals, nil
	default:
		maps.Copy(p.externals, t.externals)
	}
	p.changed = nil
	p.revision = t.revision
	p.count, p.backends = t.count, t.backends
}

// NextGeneration returns the generation the next Put will assign.
func (t *Txn) NextGeneration() uint64 { return t.revision + 1 }

// Get returns the named service as the transaction sees it.
func (t *Txn) Get(name string) (*Entry, bool) {
	for x := t; x != nil; x = x.parent {
		if e, ok := x.services[name]; ok {
			return e, e != nil
		}
	}
	return t.base.Get(name)
}

// Names returns the names of owner's services as the transaction sees them, sorted.
func (t *Txn) Names(owner string) []string {
	// Only the staged names need a set to be visited once: a name of the
	// base that is not staged is the base's entry. The base is walked in
	// no order (the names are sorted at the end), so that a SyncServices
	// over 100,000 stored services neither sorts them nor sets them.
	seen := map[string]bool{}
	var names []string
	for x := t; x != nil; x = x.parent {
		for name := range x.services {
			if seen[name] {
				continue
			}
			seen[name] = true
			if e, ok := t.Get(name); ok && e.Owner() == owner {
				names = append(names, name)
			}
		}
	}
	for name, e := range t.base.Each() {
		if e.Owner() == owner && !t.staged(name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// staged reports whether t or a parent staged a change of name.
func (t *Txn) staged(name string) bool {
	for x := t; x != nil; x = x.parent {
		if _, ok := x.services[name]; ok {
			return true
		}
	}
	return false
}

func (t *Txn) holder(c Claim) string {
	for x := t; x != nil; x = x.parent {
		if h, ok := x.claims[c]; ok {
			return h
		}
	}
	h, _ := t.base.Holder(c)
	return h
}

// Put stores svc (normalized, in dataplane form dp) under a new generation,
// replacing any service of the same name, and sets svc.Generation to it.
// It keeps dp as PutSpec does.
// It fails, and stages nothing, with a *ConflictError if another service
// holds one of svc's claims (claimsOf), with an *AddressConflictError if it
// would give an address two roles (see checkAddrs), and
// with a *LimitError if the store would then hold more services or
// backends than its limits allow. The totals
// are checked at each Put, so a change that frees room (SyncServices
// dropping services) must Delete before it Puts.
func (t *Txn) Put(svc *vipdv1.Service, dp *dataplane.Service) (*Entry, error) {
	spec, err := NewSpec(svc, dp)
	if err != nil {
		return nil, err
	}
	e, err := t.PutSpec(spec, dp)
	if err != nil {
		return nil, err
	}
	svc.Generation = e.Generation()
	return e, nil
}

// PutSpec is Put for a service encoded by NewSpec, so that a caller may
// drop the decoded message early: the Entry shares spec.
//
// A dp that was never stored (its Generation is 0, as validation returns
// it) is taken over: the entry keeps it, stamped with its generation, and
// the caller must not change it afterwards. A dp stored before, such as
// the one a retried mutation puts again, is copied first: a stored
// service never changes, and a dataplane may still hold it.
func (t *Txn) PutSpec(spec Spec, dp *dataplane.Service) (*Entry, error) {
	for c := range claimsOf(dp) {
		if h := t.holder(c); h != "" && h != dp.Name {
			return nil, t.conflict(dp, c, h)
		}
	}
	count, backends := t.count+1, t.backends+len(dp.Backends)
	var old *dataplane.Service
	if e, ok := t.Get(dp.Name); ok {
		old = e.Dataplane
		count, backends = t.count, backends-len(old.Backends)
	}
	if err := t.checkLimits(dp.Name, count, backends); err != nil {
		return nil, err
	}
	had, has := backendSet(nil), backendSet(dp.Backends)
	if old != nil {
		had = backendSet(old.Backends)
	}
	adds, extAdds, err := t.checkAddrs(old, dp, had, has)
	if err != nil {
		return nil, err
	}
	t.stageAddrs(old, dp, adds, extAdds, has)
	if dp.Generation != 0 {
		c := *dp
		dp = &c
	}
	e := newEntry(spec, dp, t.revision+1)
	t.revision++
	t.release(dp.Name)
	for c := range claimsOf(dp) {
		t.claims[c] = dp.Name
	}
	t.services[dp.Name] = e
	t.changed = nil
	t.count, t.backends = count, backends
	return e, nil
}

// checkLimits fails if storing service name would make count services and
// backends backends, past a limit that the transaction's totals are not
// past already: a store above a lowered limit may still change without
// growing.
func (t *Txn) checkLimits(name string, count, backends int) error {
	lim := t.base.limits
	if m := lim.MaxServices; m > 0 && count > m && count > t.count {
		return &LimitError{Service: name, Resource: "services", Limit: m, Count: count, Flag: "--max-services"}
	}
	if m := lim.MaxTotalBackends; m > 0 && backends > m && backends > t.backends {
		return &LimitError{Service: name, Resource: "backends", Limit: m, Count: backends, Flag: "--max-total-backends"}
	}
	return nil
}

// Delete removes the named service; it reports whether it existed.
func (t *Txn) Delete(name string) bool {
	old, ok := t.Get(name)
	if !ok {
		return false
	}
	t.count--
	t.backends -= len(old.Dataplane.Backends)
	t.stageAddrs(old.Dataplane, nil, nil, nil, backendSet(nil))
	t.release(name)
	t.services[name] = nil
	t.changed = nil
	t.revision++
	return true
}

func (t *Txn) release(name string) {
	if old, ok := t.Get(name); ok {
		for c := range claimsOf(old.Dataplane) {
			if t.holder(c) == name {
				t.claims[c] = ""
			}
		}
	}
}

// Changed lists the names the transaction touched, sorted. It is meant for a
// top-level Txn. The caller must not modify the slice.
func (t *Txn) Changed() []string {
	if t.changed == nil && len(t.services) > 0 {
		// Sized once: collected from the map's keys, the slice grows
		// step by step (a sync of 100,000 services left ~7 MB of garbage).
		t.changed = make([]string, 0, len(t.services))
		for name := range t.services {
			t.changed = append(t.changed, name)
		}
		slices.Sort(t.changed)
	}
	return t.changed
}

// Dirty reports whether the transaction staged any change: Changed is not
// empty. It costs O(1).
func (t *Txn) Dirty() bool { return len(t.services) > 0 }

// Commit returns the snapshot with the staged changes applied. It is meant
// for a top-level Txn. The base snapshot is not modified, so Commit may be
// called on a Txn that is then thrown away. It costs O(changes × key
// length): the new snapshot shares every unchanged service with the base.
func (t *Txn) Commit() *Snapshot {
	if len(t.services) == 0 {
		return t.base
	}
	delta := t.Changed()
	s := &Snapshot{
		revision: t.revision,
		backends: t.backends,
		limits:   t.base.limits,
		parent:   t.base.revision,
		delta:    delta,
		history:  withCommit(t.base.history, commit{mark: &commitMark{}, names: delta}),
		order:    &byName{},
	}
	svcs := t.base.services.Builder()
	for name, e := range t.services {
		if e == nil {
			svcs.Delete(name)
		} else {
			svcs.Set(name, e)
		}
	}
	s.services = svcs.Map()
	claims := t.base.claims.Builder()
	for c, h := range t.claims {
		if h == "" {
			claims.Delete(c)
		} else {
			claims.Set(c, h)
		}
	}
	s.claims = claims.Map()
	s.addrs = t.base.addrs.with(t.addrs)
	s.externals = t.base.externals
	if len(t.externals) > 0 {
		ext := s.externals.Builder()
		for k, n := range t.externals {
			if n == 0 {
				ext.Delete(k)
			} else {
				ext.Set(k, n)
			}
		}
		s.externals = ext.Map()
	}
	return s
}

// build makes a snapshot from entries, as read from a state file. It
// fails if two entries claim the same VIP:port/protocol. It accepts a
// backend that is also a VIP, which vipd accepted before it refused them
// (see Txn.checkAddrs).
//
// The address indexes, which cannot fail, are built on a goroutine of
// their own while the services and claims are checked and indexed in
// entries' order, so that an error is the one a single pass gives: at
// 100,000 services each half takes about a tenth of a second.
func build(revision uint64, entries []*Entry) (*Snapshot, error) {
	s := &Snapshot{revision: revision, history: []commit{{mark: &commitMark{}}}, order: &byName{}}
	var (
		addrs     addrIndex
		externals pmap.Map[addrKey, int32]
		indexed   = make(chan struct{})
	)
	go func() {
		defer close(indexed)
		ext := pmap.Map[addrKey, int32]{}.Builder()
		for _, e := range entries {
			for _, list := range [2][]netip.Addr{e.Dataplane.ExternalIPs, e.Dataplane.LoadBalancerIPs} {
				for _, a := range list {
					n, _ := ext.Get(keyOf(a))
					ext.Set(keyOf(a), n+1)
				}
			}
		}
		addrs, externals = buildAddrIndex(usesOf(entries)), ext.Map()
	}()
	svcs := pmap.Map[string, *Entry]{}.Builder()
	claims := pmap.Map[Claim, string]{}.Builder()
	err := func() error {
		for _, e := range entries {
			name := e.Name()
			if _, dup := svcs.Get(name); dup {
				return fmt.Errorf("service %s is stored twice", name)
			}
			if e.Generation() > revision {
				return fmt.Errorf("service %s has generation %d, above the store revision %d", name, e.Generation(), revision)
			}
			for c := range claimsOf(e.Dataplane) {
				if h, taken := claims.Get(c); taken {
					ce := &ConflictError{Service: name, Claim: c, Holder: h, Use: claimUse(e.Dataplane, c)}
					if he, ok := svcs.Get(h); ok {
						ce.HolderUse = claimUse(he.Dataplane, c)
					}
					return ce
				}
				claims.Set(c, name)
			}
			svcs.Set(name, e)
			s.backends += len(e.Dataplane.Backends)
		}
		return nil
	}()
	<-indexed
	if err != nil {
		return nil, err
	}
	s.services, s.claims, s.addrs, s.externals = svcs.Map(), claims.Map(), addrs, externals
	return s, nil
}
