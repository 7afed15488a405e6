package flowhub

import (
	"net/netip"
	"time"

	"github.com/vipd/vipd/dataplane"
)

// HealthTransition is the event type of a backend's health-check
// transition (see PublishHealth): the hub's own, beside the dataplane's
// flow event types, and outside their range. Filter.Types selects it like
// any other type.
const HealthTransition dataplane.FlowEventType = 0x80

// HealthState is a backend's health as health checks see it.
type HealthState uint8

// Health states.
const (
	HealthUnknown HealthState = iota
	HealthPassing
	HealthFailing
)

func (s HealthState) String() string {
	switch s {
	case HealthPassing:
		return "passing"
	case HealthFailing:
		return "failing"
	}
	return "unknown"
}

// Health is a backend's health after a transition.
type Health struct {
	State HealthState
	// Since is when the backend entered State: the transition's time.
	Since time.Time
	// LastError is the last failed check's error; Consecutive is how many
	// checks in a row had the last check's result.
	LastError   string
	Consecutive uint32
	// Detail says it in words, as explain does.
	Detail string
}

// PublishHealth hands a backend's health transition to the subscribers
// whose filter selects it: Type HealthTransition, Time the transition's,
// Flow.Service service and Flow.Backend the probed address and port, with
// no VIP, client or protocol, so that a filter on any of those never
// selects it. It never blocks: a full buffer counts the event as lost, as
// for flow events. It may be called from any goroutine, before Run too.
func (h *Hub) PublishHealth(service string, backend netip.AddrPort, health Health) {
	e := Event{Type: HealthTransition, Time: health.Since, Health: &health,
		Flow: Flow{Service: service, Flow: dataplane.Flow{Backend: backend}}}
	h.publish(&e)
}
