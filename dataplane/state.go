package dataplane

import (
	"net/netip"
	"time"
)

// State is the complete desired state handed to Dataplane.Apply.
type State struct {
	// Generation is the store revision this state reflects. It only grows.
	Generation uint64
	// Services holds every service, keyed by name. A *Service is immutable:
	// a changed service is a new value with a higher Generation.
	Services map[string]*Service
	// Changed names the services added, changed or removed since the State of
	// the previous successful Apply. It is only a hint for incremental
	// dataplanes; nil means "unknown, diff everything".
	Changed []string
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
}

// Port is one (protocol, port) served on every VIP of a service.
type Port struct {
	Name       string
	Protocol   Protocol
	Port       uint16
	TargetPort uint16
}

// Backend is one endpoint of a service.
type Backend struct {
	IP netip.Addr
	// Ports overrides a port's TargetPort for this backend, by port name.
	Ports     map[string]uint16
	State     BackendState
	Weight    uint16
	NodeLocal bool
	Zone      string
}

// SessionAffinity pins a client IP to a backend for Timeout after its last new
// connection. The zero value means no affinity.
type SessionAffinity struct {
	ClientIP bool
	Timeout  time.Duration
}

// TargetPort is the port b listens on for p.
func (b *Backend) TargetPort(p Port) uint16 {
	if tp, ok := b.Ports[p.Name]; ok && p.Name != "" {
		return tp
	}
	return p.TargetPort
}

// EligibleBackends returns the backends that may receive a new connection
// from this node, following Kubernetes semantics: with an internal traffic
// policy of Local only node-local backends count; READY backends are used
// while any exists, otherwise TERMINATING ones; NOT_SERVING never is. Only
// backends of the requested address family (IPv6 when is6) are returned.
func (s *Service) EligibleBackends(is6 bool) []*Backend {
	var ready, terminating []*Backend
	for i := range s.Backends {
		b := &s.Backends[i]
		if b.IP.Is6() != is6 {
			continue
		}
		if s.TrafficPolicy == TrafficPolicyLocal && !b.NodeLocal {
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
	for _, svc := range s.Services {
		n += len(svc.Backends)
	}
	return n
}
