package dataplane

import (
	"context"
	"net/netip"
	"time"
)

// FlowSource is implemented by dataplanes that report the connections
// through VIPs, from the kernel's own connection tracking: conntrack
// netlink for iptables, the conntrack map and a ring buffer for eBPF. The
// daemon never synthesizes a flow.
//
// A Flow knows addresses, not services: the server maps a flow's VIP,
// port and protocol to the service that claims them.
type FlowSource interface {
	// WatchFlows reads flow events until ctx ends, calling emit for each
	// (from one goroutine, in the order the kernel reported them) and lost
	// with the number of events the kernel dropped before they could be
	// read (a ring buffer or netlink overrun). emit must not block for
	// long: the reader falls behind the kernel while it does. WatchFlows
	// returns ctx's error, or an error if the source cannot be read.
	WatchFlows(ctx context.Context, emit func(FlowEvent), lost func(count uint64)) error
	// ListFlows returns the flows through any VIP that are live now,
	// with their counters so far and, for TCP, their state.
	ListFlows(ctx context.Context) ([]Flow, error)
}

// FlowEventType says what happened to a flow.
type FlowEventType uint8

// Flow event types.
const (
	// FlowNew is the first packet of a flow through a VIP.
	FlowNew FlowEventType = iota + 1
	// FlowClosed is the end of a flow: FIN or RST seen and its conntrack
	// entry gone, or its entry timed out or was deleted.
	FlowClosed
)

func (t FlowEventType) String() string {
	switch t {
	case FlowNew:
		return "new"
	case FlowClosed:
		return "closed"
	}
	return "unknown"
}

// FlowEvent is one event of one flow.
type FlowEvent struct {
	Type FlowEventType
	// Time is when the kernel reported the event.
	Time time.Time
	Flow Flow
}

// Close reasons of a FlowClosed event.
const (
	CloseFIN            = "fin"
	CloseRST            = "rst"
	CloseTimeout        = "timeout"
	CloseBackendRemoved = "backend_removed"
	CloseServiceRemoved = "service_removed"
	CloseDeleted        = "deleted" // removed by someone else (conntrack -D, a flush)
)

// Flow is one connection (or UDP/SCTP association) through a VIP.
type Flow struct {
	// ID is the same in a flow's NEW and CLOSED events and in ListFlows
	// while it lives. It is unique among live flows of one dataplane.
	ID       uint64
	Protocol Protocol
	// Client is the client's address as the backend sees it (preserved).
	Client netip.AddrPort
	// VIP is the service address and port the client connected to.
	VIP netip.AddrPort
	// Backend is the backend address and target port chosen for the flow.
	Backend netip.AddrPort
	// Start is when the flow began, where the kernel records it.
	Start time.Time
	// Counters: Orig* from the client towards the backend, Reply* back.
	// Zero where the kernel does not count them.
	OrigPackets, OrigBytes   uint64
	ReplyPackets, ReplyBytes uint64
	// Duration is set on close: from the first packet to the close.
	Duration time.Duration
	// CloseReason is set on close: one of the Close* constants.
	CloseReason string
	// TCPState is a TCP flow's conntrack state where the dataplane knows
	// it, always in ListFlows; TCPStateUnknown otherwise and for other
	// protocols.
	TCPState TCPState
}

// TCPState is the state of a tracked TCP connection, with the names and
// meanings of the kernel's conntrack (enum tcp_conntrack), which both
// dataplanes can report.
type TCPState uint8

// TCP conntrack states.
const (
	TCPStateUnknown TCPState = iota
	// TCPSynSent: the client's SYN was seen, no answer yet.
	TCPSynSent
	// TCPSynRecv: the backend's SYN-ACK was seen, the client's ACK not yet.
	TCPSynRecv
	// TCPEstablished: the handshake completed, no FIN or RST since.
	TCPEstablished
	// TCPFinWait: the client sent a FIN.
	TCPFinWait
	// TCPCloseWait: the backend sent a FIN.
	TCPCloseWait
	// TCPLastAck: both sent a FIN; the last one is not acknowledged.
	TCPLastAck
	// TCPTimeWait: both FINs were acknowledged.
	TCPTimeWait
	// TCPClose: a RST was seen.
	TCPClose
)

// String is the state as conntrack -L prints it: ESTABLISHED, TIME_WAIT.
func (s TCPState) String() string {
	switch s {
	case TCPSynSent:
		return "SYN_SENT"
	case TCPSynRecv:
		return "SYN_RECV"
	case TCPEstablished:
		return "ESTABLISHED"
	case TCPFinWait:
		return "FIN_WAIT"
	case TCPCloseWait:
		return "CLOSE_WAIT"
	case TCPLastAck:
		return "LAST_ACK"
	case TCPTimeWait:
		return "TIME_WAIT"
	case TCPClose:
		return "CLOSE"
	}
	return "unknown"
}

// Explainer is implemented by dataplanes that can say, for one client,
// what their kernel state holds that decides its next connection to a
// frontend: a session-affinity entry, or the backend a deterministic
// algorithm (Maglev) would pick.
type Explainer interface {
	ExplainFlow(ctx context.Context, q ExplainQuery) (Explanation, error)
}

// ExplainQuery names a would-be connection.
type ExplainQuery struct {
	Protocol Protocol
	Client   netip.AddrPort
	VIP      netip.AddrPort
}

// Explanation is what a dataplane's kernel state says about an
// ExplainQuery. Zero fields mean "nothing of the kind".
type Explanation struct {
	// AffinityBackend is the backend a live session-affinity entry pins
	// the client to, and AffinityRemaining how long that entry has left.
	AffinityBackend   netip.AddrPort
	AffinityRemaining time.Duration
	// Pick is the backend the connection would get when that is
	// deterministic (affinity, or Maglev for this exact 5-tuple).
	Pick netip.AddrPort
}
