package dataplane

import (
	"context"
	"errors"
	"slices"
)

// Dataplane programs the kernel so that it forwards exactly the services in a State.
//
// One goroutine calls Apply at a time; implementations need not be safe for
// concurrent Apply calls, but Name, Capabilities and Close may be called from
// any goroutine.
type Dataplane interface {
	// Name is the dataplane's short name, such as "iptables" or "ebpf".
	Name() string

	// Capabilities reports what the dataplane can honour. It does not change
	// while the dataplane is open.
	Capabilities() Capabilities

	// Apply makes the kernel match s. It is all-or-nothing: on error the
	// previously applied state stays in force, and Apply may be retried.
	//
	// A dataplane may diff s against what it last applied (s.Changed is a hint
	// for that) to keep updates cheap, but after any error it must rebuild
	// fully on the next Apply. The first Apply after the dataplane is opened is
	// always a full one. Apply must not retain s or its maps after it returns;
	// it may retain the *Service values, which are never mutated.
	//
	// Errors wrap ErrUnsupported when s asks for something the dataplane
	// cannot do, and ErrResourceExhausted when a kernel table is full.
	Apply(ctx context.Context, s *State) error

	// Close releases the dataplane's handles. It leaves the kernel programmed:
	// traffic keeps flowing while vipd is down. Removing the rules is a
	// separate, explicit operation.
	Close() error
}

// Capabilities is what a dataplane can honour.
type Capabilities struct {
	// LoadBalancing lists the supported algorithms.
	LoadBalancing []LoadBalancing
	// Protocols lists the protocols the dataplane forwards.
	Protocols []Protocol
	// External is true when the dataplane serves node ports, external IPs,
	// load-balancer IPs and the external traffic policy.
	External bool
	// Hint is added to unsupported-feature errors: what to use instead.
	Hint string
}

// Sentinel errors that dataplanes wrap; match them with errors.Is.
var (
	// ErrUnsupported means the state asks for a feature the dataplane lacks.
	ErrUnsupported = errors.New("not supported by this dataplane")
	// ErrResourceExhausted means a kernel table or map is full.
	ErrResourceExhausted = errors.New("dataplane resource exhausted")
)

// Check reports, wrapping ErrUnsupported, the first setting of svc that caps
// cannot honour. It returns nil when every setting is supported.
func (caps Capabilities) Check(svc *Service) error {
	if !slices.Contains(caps.LoadBalancing, svc.LoadBalancing) {
		return &UnsupportedError{Service: svc.Name, Feature: "load balancing " + svc.LoadBalancing.String(), Hint: caps.Hint}
	}
	for _, p := range svc.Ports {
		if !slices.Contains(caps.Protocols, p.Protocol) {
			return &UnsupportedError{Service: svc.Name, Feature: "protocol " + p.Protocol.String(), Hint: caps.Hint}
		}
	}
	if !caps.External && svc.HasExternal() {
		return &UnsupportedError{Service: svc.Name, Feature: "external traffic (node ports, external IPs, load-balancer IPs)", Hint: caps.Hint}
	}
	return nil
}

// UnsupportedError names a feature that a dataplane cannot honour for a service.
// It matches ErrUnsupported with errors.Is.
type UnsupportedError struct {
	Service string
	Feature string
	// Hint optionally tells the user what to do instead.
	Hint string
}

func (e *UnsupportedError) Error() string {
	msg := "service " + e.Service + ": " + e.Feature + " is " + ErrUnsupported.Error()
	if e.Hint != "" {
		msg += "; " + e.Hint
	}
	return msg
}

// Is makes errors.Is(err, ErrUnsupported) true.
func (e *UnsupportedError) Is(target error) bool { return target == ErrUnsupported }

// DriftDetector is implemented by dataplanes that can check, cheaply enough
// to run every few seconds, that the kernel still holds what they
// programmed: another tool (a firewall reload, a hand-run command) may have
// removed a hook, flushed a chain, detached a program or replaced a map.
//
// DetectDrift only reads the kernel. It is called from the goroutine that
// calls Apply, never concurrently with Apply. It returns nil when nothing is
// missing, and an error only when it could not check. Whatever it reports,
// a full Apply (one with a nil State.Changed) repairs: the reconciler runs
// one at once when drift is found.
type DriftDetector interface {
	DetectDrift(ctx context.Context) ([]Drift, error)
	// DriftKinds lists every Drift.What that DetectDrift may report, so
	// that metrics can export each kind at zero before its first repair.
	DriftKinds() []string
}

// Drift is one piece of a dataplane's programming found missing or altered.
type Drift struct {
	// What is a short, stable label for the vipd_dataplane_drift_repairs_total
	// metric, such as "hook", "chain", "tc-link", "cgroup-link" or "map".
	What string
	// Detail says exactly what was found, for the log, such as
	// "ipv4 nat PREROUTING: no jump to VIPD-SERVICES".
	Detail string
}
