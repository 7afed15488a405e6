package flowhub

import (
	"net/netip"
	"slices"
	"time"

	"github.com/vipd/vipd/dataplane"
)

// Flow is a dataplane flow with the service port that claims its VIP, port
// and protocol. Service and PortName are empty when no service does.
type Flow struct {
	dataplane.Flow
	Service  string
	PortName string
}

// Event is one event of one flow, as subscribers get it, or a backend's
// health transition (Type HealthTransition; see Hub.PublishHealth).
type Event struct {
	Type dataplane.FlowEventType
	// Time is when the kernel reported the event, or when the health
	// transition happened.
	Time time.Time
	Flow Flow
	// Health is set on HealthTransition events only.
	Health *Health
}

// Filter selects flows and event types. Every field that is set must
// match; the zero Filter matches everything.
type Filter struct {
	// Service is the name of the service that claims the flow.
	Service string
	// VIP is the service address; VIPPort, when not 0, its port.
	VIP     netip.Addr
	VIPPort uint16
	// Backend is the backend address; BackendPort, when not 0, its port.
	Backend     netip.Addr
	BackendPort uint16
	// Client is the range the client's address lies in.
	Client netip.Prefix
	// Protocol, when not 0, is the flow's protocol.
	Protocol dataplane.Protocol
	// Types, when not empty, are the event types a subscriber gets,
	// HealthTransition among them. List ignores it.
	Types []dataplane.FlowEventType
}

// Match reports whether f selects fl, ignoring Types. A health
// transition's flow has only a service and a backend: a filter with a
// VIP, client or protocol never selects it.
func (f *Filter) Match(fl *Flow) bool {
	return (f.Service == "" || fl.Service == f.Service) &&
		(f.Protocol == 0 || fl.Protocol == f.Protocol) &&
		matchAddr(f.VIP, f.VIPPort, fl.VIP) &&
		matchAddr(f.Backend, f.BackendPort, fl.Backend) &&
		(!f.Client.IsValid() || f.Client.Contains(fl.Client.Addr().Unmap()))
}

// MatchEvent reports whether f selects e, Types included.
func (f *Filter) MatchEvent(e *Event) bool {
	return (len(f.Types) == 0 || slices.Contains(f.Types, e.Type)) && f.Match(&e.Flow)
}

func matchAddr(want netip.Addr, port uint16, have netip.AddrPort) bool {
	if !want.IsValid() {
		return true
	}
	return have.Addr().Unmap() == want && (port == 0 || have.Port() == port)
}
