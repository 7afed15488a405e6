package store

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/vipd/vipd/dataplane"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/protobuf/proto"
)

// Entry is one stored service in its two forms. An Entry is immutable.
type Entry struct {
	// Service is the normalized API form, with its generation set.
	Service *vipdv1.Service
	// Dataplane is the same service as the dataplane sees it.
	Dataplane *dataplane.Service
	// encoded caches the serialized Service for the state file.
	encoded []byte
}

// NewEntry pairs a validated, normalized service with its dataplane form and
// stamps both with generation gen. It copies nothing: the caller hands over
// ownership of svc and dp.
func NewEntry(svc *vipdv1.Service, dp *dataplane.Service, gen uint64) (*Entry, error) {
	svc.Generation = gen
	dp.Generation = gen
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(svc)
	if err != nil {
		return nil, fmt.Errorf("encode service %s: %w", svc.Name, err)
	}
	return &Entry{Service: svc, Dataplane: dp, encoded: b}, nil
}

// SameSpec reports whether e and svc describe the same service, ignoring generation.
func (e *Entry) SameSpec(svc *vipdv1.Service) bool {
	g := svc.Generation
	svc.Generation = e.Service.Generation
	same := proto.Equal(e.Service, svc)
	svc.Generation = g
	return same
}

// Claim is one VIP:port/protocol that a service forwards. Two services may
// not hold the same claim.
type Claim struct {
	VIP      netip.Addr
	Protocol dataplane.Protocol
	Port     uint16
}

func (c Claim) String() string {
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(c.VIP, c.Port), c.Protocol)
}

// claimsOf lists the claims of svc.
func claimsOf(svc *dataplane.Service) []Claim {
	var cs []Claim
	for _, vip := range svc.VIPs {
		for _, p := range svc.Ports {
			cs = append(cs, Claim{VIP: vip, Protocol: p.Protocol, Port: p.Port})
		}
	}
	return cs
}

// Snapshot is an immutable, complete desired state.
type Snapshot struct {
	revision uint64
	services map[string]*Entry
	claims   map[Claim]string
	backends int
	// parent is the revision of the snapshot this one was committed on,
	// and delta the names that differ from it (nil: unknown). The state
	// directory journals just those.
	parent uint64
	delta  []string
}

// Empty returns the snapshot of a store with no services.
func Empty() *Snapshot {
	return &Snapshot{services: map[string]*Entry{}, claims: map[Claim]string{}}
}

// Revision is the highest generation ever assigned in this store. It only grows.
func (s *Snapshot) Revision() uint64 { return s.revision }

// Len is the number of services.
func (s *Snapshot) Len() int { return len(s.services) }

// BackendCount is the number of backends summed over all services.
func (s *Snapshot) BackendCount() int { return s.backends }

// Get returns the named service.
func (s *Snapshot) Get(name string) (*Entry, bool) {
	e, ok := s.services[name]
	return e, ok
}

// List returns the services of owner, or all when owner is empty, sorted by name.
func (s *Snapshot) List(owner string) []*Entry {
	var res []*Entry
	for _, e := range s.services {
		if owner == "" || e.Service.Owner == owner {
			res = append(res, e)
		}
	}
	slices.SortFunc(res, func(a, b *Entry) int { return cmp.Compare(a.Service.Name, b.Service.Name) })
	return res
}

// DataplaneState returns the state a dataplane needs to forward s, with
// changed as the hint of what differs from the previously applied state.
func (s *Snapshot) DataplaneState(changed []string) *dataplane.State {
	svcs := make(map[string]*dataplane.Service, len(s.services))
	for name, e := range s.services {
		svcs[name] = e.Dataplane
	}
	return &dataplane.State{Generation: s.revision, Services: svcs, Changed: changed}
}

// ConflictError says that a service claims a VIP:port/protocol that another
// service holds already.
type ConflictError struct {
	Service string
	Claim   Claim
	Holder  string
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("service %s: %s is already used by service %s", e.Service, e.Claim, e.Holder)
}

// Txn stages changes on top of a Snapshot, or on top of a parent Txn (see
// Sub). A Txn is used by one goroutine.
type Txn struct {
	base     *Snapshot
	parent   *Txn
	revision uint64
	services map[string]*Entry // nil value: deleted
	claims   map[Claim]string  // "" value: released
}

// Begin starts a transaction on top of s. s itself never changes.
func (s *Snapshot) Begin() *Txn {
	return &Txn{base: s, revision: s.revision, services: map[string]*Entry{}, claims: map[Claim]string{}}
}

// Sub starts a nested transaction that sees t's staged changes. Its own
// changes reach t only through Merge, so a failed step can be dropped without
// undoing anything. t must not change while the Sub is open.
func (t *Txn) Sub() *Txn {
	return &Txn{base: t.base, parent: t, revision: t.revision, services: map[string]*Entry{}, claims: map[Claim]string{}}
}

// Merge moves a Sub's changes into its parent.
func (t *Txn) Merge() {
	p := t.parent
	maps.Copy(p.services, t.services)
	maps.Copy(p.claims, t.claims)
	p.revision = t.revision
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
	seen := map[string]bool{}
	var names []string
	visit := func(name string) {
		if seen[name] {
			return
		}
		seen[name] = true
		if e, ok := t.Get(name); ok && e.Service.Owner == owner {
			names = append(names, name)
		}
	}
	for x := t; x != nil; x = x.parent {
		for name := range x.services {
			visit(name)
		}
	}
	for name := range t.base.services {
		visit(name)
	}
	slices.Sort(names)
	return names
}

func (t *Txn) holder(c Claim) string {
	for x := t; x != nil; x = x.parent {
		if h, ok := x.claims[c]; ok {
			return h
		}
	}
	return t.base.claims[c]
}

// Put stores svc (normalized, in dataplane form dp) under a new generation,
// replacing any service of the same name. It fails with a *ConflictError, and
// stages nothing, if another service holds one of svc's claims.
func (t *Txn) Put(svc *vipdv1.Service, dp *dataplane.Service) (*Entry, error) {
	for _, c := range claimsOf(dp) {
		if h := t.holder(c); h != "" && h != svc.Name {
			return nil, &ConflictError{Service: svc.Name, Claim: c, Holder: h}
		}
	}
	e, err := NewEntry(svc, dp, t.revision+1)
	if err != nil {
		return nil, err
	}
	t.revision++
	t.release(svc.Name)
	for _, c := range claimsOf(dp) {
		t.claims[c] = svc.Name
	}
	t.services[svc.Name] = e
	return e, nil
}

// Delete removes the named service; it reports whether it existed.
func (t *Txn) Delete(name string) bool {
	if _, ok := t.Get(name); !ok {
		return false
	}
	t.release(name)
	t.services[name] = nil
	t.revision++
	return true
}

func (t *Txn) release(name string) {
	if old, ok := t.Get(name); ok {
		for _, c := range claimsOf(old.Dataplane) {
			if t.holder(c) == name {
				t.claims[c] = ""
			}
		}
	}
}

// Changed lists the names the transaction touched, sorted. It is meant for a
// top-level Txn.
func (t *Txn) Changed() []string {
	return slices.Sorted(maps.Keys(t.services))
}

// Commit returns the snapshot with the staged changes applied. It is meant
// for a top-level Txn. The base snapshot is not modified, so Commit may be
// called on a Txn that is then thrown away.
func (t *Txn) Commit() *Snapshot {
	if len(t.services) == 0 {
		return t.base
	}
	s := &Snapshot{
		revision: t.revision,
		services: maps.Clone(t.base.services),
		claims:   maps.Clone(t.base.claims),
		backends: t.base.backends,
		parent:   t.base.revision,
		delta:    t.Changed(),
	}
	for name, e := range t.services {
		if old, ok := s.services[name]; ok {
			s.backends -= len(old.Dataplane.Backends)
		}
		if e == nil {
			delete(s.services, name)
			continue
		}
		s.services[name] = e
		s.backends += len(e.Dataplane.Backends)
	}
	for c, h := range t.claims {
		if h == "" {
			delete(s.claims, c)
		} else {
			s.claims[c] = h
		}
	}
	return s
}

// build makes a snapshot from entries, as read from a state file. It fails
// if two entries claim the same VIP:port/protocol.
func build(revision uint64, entries []*Entry) (*Snapshot, error) {
	s := Empty()
	s.revision = revision
	for _, e := range entries {
		name := e.Service.Name
		if _, dup := s.services[name]; dup {
			return nil, fmt.Errorf("service %s is stored twice", name)
		}
		if e.Service.Generation > revision {
			return nil, fmt.Errorf("service %s has generation %d, above the store revision %d", name, e.Service.Generation, revision)
		}
		for _, c := range claimsOf(e.Dataplane) {
			if h, taken := s.claims[c]; taken {
				return nil, &ConflictError{Service: name, Claim: c, Holder: h}
			}
			s.claims[c] = name
		}
		s.services[name] = e
		s.backends += len(e.Dataplane.Backends)
	}
	return s, nil
}
