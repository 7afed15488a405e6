package dataplane

import (
	"iter"
	"maps"
	"net/netip"
	"slices"
	"time"
)

// State is the complete desired state handed to Dataplane.Apply.
//
// The services come either in Set or, when Set is nil, in the Services
// map. Dataplanes read them only through Get, Len, All and ServiceSet, so
// that a store can hand over its persistent index (Set) without building a
// map of every service for each Apply.
type State struct {
	// Generation is the store revision this state reflects. It only grows.
	Generation uint64
	// Set holds every service. It never changes, so a dataplane may keep it
	// after Apply returns. When Set is not nil, Services is ignored.
	Set ServiceSet
	// Services holds every service, keyed by name, when Set is nil: the
	// simple form for tests and tools. The caller must not change the map
	// while a dataplane may read it. A *Service is immutable in either form:
	// a changed service is a new value with a higher Generation.
	Services map[string]*Service
	// Changed names the services added, changed or removed since the State of
	// the previous successful Apply. It is only a hint for incremental
	// dataplanes; nil means "unknown, diff everything". A change of Node is
	// never listed in it: a dataplane compares Node with the Node of its
	// previous successful Apply (Node.Equal).
	Changed []string
	// Node is what the node's network looks like, for the external half of
	// the services (node ports, external and load-balancer IPs, external
	// traffic policy). The zero Node has no node-port address and no
	// external interface: node ports are served nowhere and no traffic
	// counts as from outside the node.
	Node Node
}

// Node describes the node's network as the dataplanes need it for
// external traffic. The daemon keeps it current (internal/nodenet) and
// hands it over in every State.
type Node struct {
	// NodePortAddresses are the addresses node ports are served on: the
	// node's addresses, or those within vipd run --nodeport-addresses,
	// never loopback. Sorted and distinct.
	NodePortAddresses []netip.Addr
	// Interfaces are the node's interfaces that are up and either have a
	// unicast address or are external, sorted by name.
	Interfaces []Interface
}

// Interface is one network interface of the node.
type Interface struct {
	Name  string
	Index int
	// Addrs are the interface's unicast addresses (no link-local IPv6),
	// sorted.
	Addrs []netip.Addr
	// External marks an interface that traffic from outside the node
	// arrives on (vipd run --external-interfaces; by default those that
	// hold a default route). A packet that enters the node on one is
	// external traffic, subject to a service's ExternalTrafficPolicy;
	// every other packet (from a pod's interface, or sent by the node
	// itself) gets cluster semantics.
	External bool
}

// ExternalInterfaces returns the names of n's external interfaces, sorted.
func (n *Node) ExternalInterfaces() []string {
	var names []string
	for _, i := range n.Interfaces {
		if i.External {
			names = append(names, i.Name)
		}
	}
	return names
}

// Equal reports whether n and o describe the same node network.
func (n *Node) Equal(o *Node) bool {
	return slices.Equal(n.NodePortAddresses, o.NodePortAddresses) &&
		slices.EqualFunc(n.Interfaces, o.Interfaces, func(a, b Interface) bool {
			return a.Name == b.Name && a.Index == b.Index && a.External == b.External && slices.Equal(a.Addrs, b.Addrs)
		})
}

// ServiceSet is an immutable set of services keyed by name. Its methods are
// safe for concurrent use.
type ServiceSet interface {
	// Get returns the named service.
	Get(name string) (*Service, bool)
	// Len is the number of services.
	Len() int
	// All yields every service with its name, in name order.
	All() iter.Seq2[string, *Service]
}

// ServiceMap is a ServiceSet over a plain map. The map must not change
// while the set is in use.
type ServiceMap map[string]*Service

// Get implements ServiceSet.
func (m ServiceMap) Get(name string) (*Service, bool) {
	svc, ok := m[name]
	return svc, ok && svc != nil
}

// Len implements ServiceSet.
func (m ServiceMap) Len() int { return len(m) }

// All implements ServiceSet. It sorts the names first: O(n log n).
func (m ServiceMap) All() iter.Seq2[string, *Service] {
	return func(yield func(string, *Service) bool) {
		for _, name := range slices.Sorted(maps.Keys(m)) {
			if !yield(name, m[name]) {
				return
			}
		}
	}
}

// ServiceSet returns s's services as a set: Set, or else the Services map.
func (s *State) ServiceSet() ServiceSet {
	if s.Set != nil {
		return s.Set
	}
	return ServiceMap(s.Services)
}

// Get returns the named service of s.
func (s *State) Get(name string) (*Service, bool) {
	if s.Set != nil {
		return s.Set.Get(name)
	}
	svc, ok := s.Services[name]
	return svc, ok && svc != nil
}

// Len is the number of services in s.
func (s *State) Len() int { return s.ServiceSet().Len() }

// All yields every service of s with its name, in name order.
func (s *State) All() iter.Seq2[string, *Service] { return s.ServiceSet().All() }

// Map returns a new map of every service in s. It costs O(n): it is for
// tests and for dataplanes that rebuild everything anyway.
func (s *State) Map() map[string]*Service {
	if s.Set == nil {
		return maps.Clone(s.Services)
	}
	m := make(map[string]*Service, s.Set.Len())
	for name, svc := range s.Set.All() {
		m[name] = svc
	}
	return m
}

// Service is one load-balanced service, with every default already filled in
// and every address parsed.
type Service struct {
	Name       string
	Owner      string
	Generation uint64
	// VIPs are distinct unicast addresses, at least one.
	VIPs []netip.Addr
	// Ports are unique by (Protocol, Port).
	Ports []Port
	// Backends are unique by IP, sorted by IP.
	Backends []Backend
	// Affinity is the session-affinity setting.
	Affinity SessionAffinity
	// TrafficPolicy is the internal traffic policy.
	TrafficPolicy TrafficPolicy
	// LoadBalancing is the algorithm that picks a backend.
	LoadBalancing LoadBalancing

	// ExternalIPs are addresses vipd does not own, routed to this node and
	// served on Ports: distinct, each of a family of one of the VIPs, never
	// a VIP or a backend of any service, never one of LoadBalancerIPs.
	ExternalIPs []netip.Addr
	// LoadBalancerIPs are served on Ports like ExternalIPs.
	LoadBalancerIPs []netip.Addr
	// LoadBalancerSourceRanges, when not empty, are the only sources whose
	// packets to LoadBalancerIPs are forwarded; the others are dropped,
	// whether they come from outside the node or from a pod. Masked
	// (Prefix.Masked) and distinct.
	LoadBalancerSourceRanges []netip.Prefix
	// ExternalTrafficPolicy applies to external traffic (see
	// Interface.External) to a node port, an external IP or a
	// load-balancer IP: Cluster picks from ExternalBackends with the
	// source masqueraded to the node's address; Local picks from the
	// node-local ones with the source kept, and drops the packets when
	// there is none. Every other packet to these addresses gets cluster
	// semantics: ExternalBackends with policy Cluster, no masquerade.
	ExternalTrafficPolicy TrafficPolicy
	// HealthCheckNodePort is the TCP port, on the NodePortAddresses, of the
	// daemon's HTTP health answer for an ExternalTrafficPolicy of Local; 0
	// means none. Dataplanes program nothing for it.
	HealthCheckNodePort uint16
}

// HasExternal reports whether s asks for any external traffic: a node
// port, an external IP or a load-balancer IP.
func (s *Service) HasExternal() bool {
	if len(s.ExternalIPs) > 0 || len(s.LoadBalancerIPs) > 0 {
		return true
	}
	for _, p := range s.Ports {
		if p.NodePort != 0 {
			return true
		}
	}
	return false
}

// Port is one (protocol, port) served on every VIP of a service.
type Port struct {
	Name       string
	Protocol   Protocol
	Port       uint16
	TargetPort uint16
	// NodePort, when not 0, also serves the port on every node-port
	// address (Node.NodePortAddresses) at this port. Unique by (Protocol,
	// NodePort) over every service.
	NodePort uint16
}

// Backend is one endpoint of a service.
type Backend struct {
	IP netip.Addr
	// Ports overrides a port's TargetPort for this backend, by port name.
	// Every key names a port of the service; the key "" names the
	// service's only port when that port has no name.
	Ports map[string]uint16
	// OnlyNamedPorts makes the backend serve only the ports that Ports
	// names: for every other port of the service it is not a backend at
	// all (see Serves). False: it serves every port.
	OnlyNamedPorts bool
	State          BackendState
	Weight         uint16
	NodeLocal      bool
	Zone           string
}

// SessionAffinity pins a client IP to a backend for Timeout after its last new
// connection. The zero value means no affinity.
type SessionAffinity struct {
	ClientIP bool
	Timeout  time.Duration
}

// TargetPort is the port b listens on for p: its override in Ports, else
// p's TargetPort.
func (b *Backend) TargetPort(p Port) uint16 {
	if tp, ok := b.Ports[p.Name]; ok {
		return tp
	}
	return p.TargetPort
}

// Serves reports whether b is a backend of port p at all: always, unless
// OnlyNamedPorts is set and Ports does not name p. A backend that does not
// serve p gets none of p's connections, whatever its state, and is no
// member of p's backend set (its UDP flows to p move as if it had left the
// service).
func (b *Backend) Serves(p Port) bool {
	if !b.OnlyNamedPorts {
		return true
	}
	_, ok := b.Ports[p.Name]
	return ok
}

// EligibleBackends returns the backends that may receive a new connection
// to port p from this node, following Kubernetes semantics, port by port as
// kube-proxy computes them: only backends that serve p count (Serves); with
// an internal traffic policy of Local only node-local ones; READY backends
// are used while any exists, otherwise TERMINATING ones; NOT_SERVING never
// is. Only backends of the requested address family (IPv6 when is6) are
// returned, in the order of s.Backends. An empty result means that new
// connections to p are refused.
func (s *Service) EligibleBackends(p Port, is6 bool) []*Backend {
	return s.eligible(p, is6, s.TrafficPolicy)
}

// ExternalBackends returns the backends that may receive a new connection
// to port p through a node port, an external IP or a load-balancer IP, as
// EligibleBackends does but under policy instead of the internal traffic
// policy: s.ExternalTrafficPolicy for external traffic, TrafficPolicyCluster
// for traffic from the node and its pods. With Local, an empty result means
// the packets are dropped; with Cluster, that connections are refused.
func (s *Service) ExternalBackends(p Port, is6 bool, policy TrafficPolicy) []*Backend {
	return s.eligible(p, is6, policy)
}

func (s *Service) eligible(p Port, is6 bool, policy TrafficPolicy) []*Backend {
	var ready, terminating []*Backend
	for i := range s.Backends {
		b := &s.Backends[i]
		if b.IP.Is6() != is6 || !b.Serves(p) {
			continue
		}
		if policy == TrafficPolicyLocal && !b.NodeLocal {
			continue
		}
		switch b.State {
		case BackendReady:
			ready = append(ready, b)
		case BackendTerminating:
			terminating = append(terminating, b)
		}
	}
	if len(ready) > 0 {
		return ready
	}
	return terminating
}

// Protocol is an L4 protocol.
type Protocol uint8

// Protocols.
const (
	TCP Protocol = iota + 1
	UDP
	SCTP
)

func (p Protocol) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	case SCTP:
		return "SCTP"
	}
	return "unknown"
}

// BackendState says whether a backend may take new connections.
type BackendState uint8

// Backend states.
const (
	BackendReady BackendState = iota + 1
	BackendTerminating
	BackendNotServing
)

func (s BackendState) String() string {
	switch s {
	case BackendReady:
		return "ready"
	case BackendTerminating:
		return "terminating"
	case BackendNotServing:
		return "not-serving"
	}
	return "unknown"
}

// TrafficPolicy restricts which backends serve traffic from this node.
type TrafficPolicy uint8

// Traffic policies.
const (
	TrafficPolicyCluster TrafficPolicy = iota + 1
	TrafficPolicyLocal
)

// LoadBalancing is a backend-selection algorithm.
type LoadBalancing uint8

// Load-balancing algorithms.
const (
	LoadBalancingRandom LoadBalancing = iota + 1
	LoadBalancingMaglev
)

func (l LoadBalancing) String() string {
	switch l {
	case LoadBalancingRandom:
		return "random"
	case LoadBalancingMaglev:
		return "maglev"
	}
	return "unknown"
}

// BackendCount is the number of backends summed over all services.
func (s *State) BackendCount() int {
	n := 0
	for _, svc := range s.All() {
		n += len(svc.Backends)
	}
	return n
}
