package reconcile

import (
	"context"
	"fmt"
	"iter"
	"maps"
	"net/netip"
	"slices"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/vipd/vipd/dataplane"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/store"
)

// Topology is this node's place in the cluster, for topology-aware
// routing (vipd.v1.Service.traffic_distribution and the backends' hints).
type Topology struct {
	// NodeName is matched against a backend's for_nodes; empty matches
	// none.
	NodeName string
	// Zone is matched against a backend's zone and for_zones; empty
	// matches none.
	Zone string
}

// WithTopology makes t the node's topology. Without it the node has no
// name and no zone: hints never match, and only the node_local preference
// of TRAFFIC_DISTRIBUTION_PREFER_SAME_NODE has an effect.
func WithTopology(t Topology) Option {
	return func(r *Reconciler) {
		r.topology = t
		r.status.Topology = t
	}
}

// SetZone makes zone the node's zone (Topology.Zone) for every later
// apply. A zone that differs from the current one takes the same path as
// a Do: it is batched with other changes and applied all or nothing, and
// the apply also names in State.Changed every service whose backends
// topology-aware routing selects differently under either zone (only
// services with a traffic distribution or hints can be among them).
// SetZone returns once the dataplane has it, or the apply's error, in
// which case the previous zone stays in force. An equal zone applies
// nothing. While the reconciler holds (WithHold), zone is kept without an
// apply and the releasing sync carries it. The zone is not desired state:
// it uses up no generation and is not saved.
func (r *Reconciler) SetZone(ctx context.Context, zone string) error {
	return r.submit(ctx, &request{ctx: ctx, zone: &zone, done: make(chan result, 1), submitted: time.Now()}).err
}

// overlay is what every apply carries besides the desired state: the
// health overlay, the Node and the topology. Run's goroutine only.
type overlay struct {
	failing  failingSet
	node     dataplane.Node
	topology Topology
}

func (r *Reconciler) overlay() overlay {
	return overlay{failing: r.failing, node: r.node, topology: r.topology}
}

func (r *Reconciler) setOverlay(o overlay) {
	r.failing, r.node = o.failing, o.node
	r.setTopology(o.topology)
}

// setTopology sets the topology of later applies, and Status's copy.
func (r *Reconciler) setTopology(t Topology) {
	r.topology = t
	r.mu.Lock()
	r.status.Topology = t
	r.mu.Unlock()
}

// Field numbers of vipd.v1.Service and vipd.v1.Backend that the topology
// filter reads from a stored spec without decoding the rest.
const (
	serviceBackendsField     protowire.Number = 5
	serviceDistributionField protowire.Number = 17
	backendIPField           protowire.Number = 1
	backendForZonesField     protowire.Number = 8
	backendForNodesField     protowire.Number = 9
)

// serviceTopology is the part of a service's spec that topology reads
// and the dataplane form lacks.
type serviceTopology struct {
	distribution vipdv1.TrafficDistribution
	hints        map[netip.Addr]backendHints
}

type backendHints struct{ forZones, forNodes []string }

// readTopology reads a stored service's traffic distribution and hints
// from its spec. It returns nil for a service that has neither, which
// topology leaves alone: most services.
func readTopology(e *store.Entry) (*serviceTopology, error) {
	var t serviceTopology
	for b := e.Spec(); len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case num == serviceDistributionField && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			t.distribution = vipdv1.TrafficDistribution(v)
			b = b[n:]
			continue
		case num == serviceBackendsField && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			if err := t.readBackend(v); err != nil {
				return nil, err
			}
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
	}
	if t.distribution == vipdv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_UNSPECIFIED && len(t.hints) == 0 {
		return nil, nil
	}
	// A copy escapes, so that t stays on the stack for the services
	// without topology.
	out := t
	return &out, nil
}

// readBackend records one encoded vipd.v1.Backend's hints, if it has any.
func (t *serviceTopology) readBackend(b []byte) error {
	var ip []byte // converted only for a backend with hints: most have none
	var h backendHints
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if typ == protowire.BytesType && (num == backendIPField || num == backendForZonesField || num == backendForNodesField) {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			switch num {
			case backendIPField:
				ip = v
			case backendForZonesField:
				h.forZones = append(h.forZones, string(v))
			case backendForNodesField:
				h.forNodes = append(h.forNodes, string(v))
			}
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
	}
	if len(h.forZones) == 0 && len(h.forNodes) == 0 {
		return nil
	}
	a, err := netip.ParseAddr(string(ip))
	if err != nil {
		return fmt.Errorf("backend ip: %w", err)
	}
	if t.hints == nil {
		t.hints = map[netip.Addr]backendHints{}
	}
	t.hints[a] = h
	return nil
}

// Select returns the indices in svc.Backends of the backends that get
// this node's new connections under the topology rule of
// vipd.v1.Service.traffic_distribution, or nil when the rule keeps every
// backend (no preference, incomplete hints, or no match). svc's states
// must already carry health checks' results: only READY backends are
// usable. t holds the service's distribution and hints.
func (tp Topology) selectBackends(svc *dataplane.Service, t *serviceTopology) []int {
	var usable []int
	anyHint := false
	for i := range svc.Backends {
		if svc.Backends[i].State != dataplane.BackendReady {
			continue
		}
		usable = append(usable, i)
		if _, ok := t.hints[svc.Backends[i].IP]; ok {
			anyHint = true
		}
	}
	if len(usable) == 0 {
		return nil
	}
	pick := func(match func(*dataplane.Backend) bool) []int {
		var out []int
		for _, i := range usable {
			if match(&svc.Backends[i]) {
				out = append(out, i)
			}
		}
		return out
	}
	every := func(has func(backendHints) bool) bool {
		for _, i := range usable {
			if !has(t.hints[svc.Backends[i].IP]) {
				return false
			}
		}
		return true
	}
	if anyHint {
		// Kubernetes' way (kube-proxy's CategorizeEndpoints): node hints
		// when every usable backend has them and one is for this node,
		// else zone hints under the same rule, else every backend.
		if tp.NodeName != "" && every(func(h backendHints) bool { return len(h.forNodes) > 0 }) {
			if out := pick(func(b *dataplane.Backend) bool {
				return slices.Contains(t.hints[b.IP].forNodes, tp.NodeName)
			}); len(out) > 0 {
				return out
			}
		}
		if tp.Zone != "" && every(func(h backendHints) bool { return len(h.forZones) > 0 }) {
			if out := pick(func(b *dataplane.Backend) bool {
				return slices.Contains(t.hints[b.IP].forZones, tp.Zone)
			}); len(out) > 0 {
				return out
			}
		}
		return nil
	}
	sameZone := func() []int {
		if tp.Zone == "" {
			return nil
		}
		return pick(func(b *dataplane.Backend) bool { return b.Zone == tp.Zone })
	}
	switch t.distribution {
	case vipdv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_PREFER_SAME_ZONE:
		return sameZone()
	case vipdv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_PREFER_SAME_NODE:
		if out := pick(func(b *dataplane.Backend) bool { return b.NodeLocal }); len(out) > 0 {
			return out
		}
		return sameZone()
	}
	return nil
}

// filter returns svc with the READY backends that topology leaves out
// lowered to NOT_SERVING, and their addresses; svc itself and nil when it
// leaves none out. Under a TRAFFIC_POLICY_LOCAL policy the node_local
// backends are never left out: the Local traffic needs them.
func (tp Topology) filter(svc *dataplane.Service, t *serviceTopology) (*dataplane.Service, []netip.Addr) {
	keep := tp.selectBackends(svc, t)
	if keep == nil {
		return svc, nil
	}
	local := svc.TrafficPolicy == dataplane.TrafficPolicyLocal || svc.ExternalTrafficPolicy == dataplane.TrafficPolicyLocal
	var out *dataplane.Service
	var left []netip.Addr
	for i := range svc.Backends {
		b := &svc.Backends[i]
		if b.State != dataplane.BackendReady || slices.Contains(keep, i) || (local && b.NodeLocal) {
			continue
		}
		if out == nil {
			c := *svc
			c.Backends = slices.Clone(svc.Backends)
			out = &c
		}
		out.Backends[i].State = dataplane.BackendNotServing
		left = append(left, b.IP)
	}
	if out == nil {
		return svc, nil
	}
	return out, left
}

// topoState is what the topology filter made of the applied state: the
// services it changed, as the dataplane has them, and the backends it
// left out of each. It is replaced, never changed, and becomes the
// Reconciler's only when an apply succeeds, so that a failed apply goes
// back to the previous one.
type topoState struct {
	// tp is the topology the state was made for.
	tp   Topology
	over map[string]*dataplane.Service
	left map[string][]netip.Addr
}

// next returns the topology state for an apply of snap, whose services
// as the dataplane gets them (health included) are base, with changed
// naming what differs from the state ts was made for (nil: everything).
// Only the services that changed names are recomputed: for the others,
// nothing topology reads has changed, unless tp is not the topology ts
// was made for, which recomputes every service. ts may be nil (none
// applied yet).
func (ts *topoState) next(tp Topology, snap *store.Snapshot, base dataplane.ServiceSet, changed []string) (*topoState, error) {
	type result struct {
		svc  *dataplane.Service
		left []netip.Addr
	}
	compute := func(name string, e *store.Entry) (result, error) {
		t, err := readTopology(e)
		if err != nil || t == nil {
			if err != nil {
				err = fmt.Errorf("read topology of service %s: %w", name, err)
			}
			return result{}, err
		}
		svc, ok := base.Get(name)
		if !ok {
			return result{}, nil
		}
		f, left := tp.filter(svc, t)
		return result{f, left}, nil
	}
	if changed == nil || ts == nil || ts.tp != tp {
		out := &topoState{tp: tp, over: map[string]*dataplane.Service{}, left: map[string][]netip.Addr{}}
		// In no order: the result is maps, and the sort of All would
		// cost a full apply of 100,000 services some 17 ms.
		for name, e := range snap.Each() {
			res, err := compute(name, e)
			if err != nil {
				return nil, err
			}
			if res.left != nil {
				out.over[name], out.left[name] = res.svc, res.left
			}
		}
		return out, nil
	}
	var delta map[string]result
	for _, name := range changed {
		var res result
		if e, ok := snap.Get(name); ok {
			var err error
			if res, err = compute(name, e); err != nil {
				return nil, err
			}
		}
		if _, had := ts.over[name]; res.left == nil && !had {
			continue
		}
		if delta == nil {
			delta = map[string]result{}
		}
		delta[name] = res
	}
	if delta == nil {
		return ts, nil
	}
	out := &topoState{tp: tp, over: maps.Clone(ts.over), left: maps.Clone(ts.left)}
	for name, res := range delta {
		if res.left == nil {
			delete(out.over, name)
			delete(out.left, name)
			continue
		}
		out.over[name], out.left[name] = res.svc, res.left
	}
	return out, nil
}

// changedSince returns changed with the services added whose dataplane
// form may differ between prev and ts because their topologies differ:
// those that either state changed. With equal topologies (or prev nil,
// the first apply, which is full) it returns changed.
func (ts *topoState) changedSince(prev *topoState, changed []string) []string {
	if prev == nil || ts == nil || prev.tp == ts.tp {
		return changed
	}
	out := slices.Clone(changed)
	seen := make(map[string]bool, len(changed))
	for _, n := range changed {
		seen[n] = true
	}
	for _, over := range []map[string]*dataplane.Service{prev.over, ts.over} {
		for n := range over {
			if !seen[n] {
				seen[n] = true
				out = append(out, n)
			}
		}
	}
	if out == nil {
		out = []string{}
	}
	return out
}

// set returns base with the services topology changed replaced.
func (ts *topoState) set(base dataplane.ServiceSet) dataplane.ServiceSet {
	if ts == nil || len(ts.over) == 0 {
		return base
	}
	return topoSet{base: base, over: ts.over}
}

// topoSet is a ServiceSet with some services replaced by their copies
// with the backends topology leaves out lowered.
type topoSet struct {
	base dataplane.ServiceSet
	over map[string]*dataplane.Service
}

func (s topoSet) Get(name string) (*dataplane.Service, bool) {
	if svc, ok := s.over[name]; ok {
		return svc, true
	}
	return s.base.Get(name)
}

func (s topoSet) Len() int { return s.base.Len() }

func (s topoSet) All() iter.Seq2[string, *dataplane.Service] {
	return func(yield func(string, *dataplane.Service) bool) {
		for name, svc := range s.base.All() {
			if o, ok := s.over[name]; ok {
				svc = o
			}
			if !yield(name, svc) {
				return
			}
		}
	}
}

// TopologyLeftOut returns the backends of service that topology-aware
// routing (vipd.v1.Service.traffic_distribution and the backends' hints)
// leaves out of this node's new connections in the applied state, in
// the service's backend order; nil when it leaves none out.
func (r *Reconciler) TopologyLeftOut(service string) []netip.Addr {
	ts := r.topo.Load()
	if ts == nil {
		return nil
	}
	return slices.Clone(ts.left[service])
}
