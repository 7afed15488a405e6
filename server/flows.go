package server

import (
	"context"
	"errors"
	"net/netip"
	"time"

	"github.com/vipd/vipd/dataplane"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/flowhub"
	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// MaxListFlows bounds the flows one ListFlows returns: a limit of 0, or
// above it, means this many.
const MaxListFlows = 100_000

// FlowResolver returns the resolver a flowhub.Hub needs: it maps a flow to
// the service port that claims its VIP, port and protocol in the snapshot
// that snapshot returns when the flow is resolved, such as
// reconcile.Reconciler.Snapshot.
func FlowResolver(snapshot func() *store.Snapshot) flowhub.Resolver {
	return func(p dataplane.Protocol, vip netip.AddrPort) (string, string, bool) {
		e, port, ok := claimant(snapshot(), p, vip)
		if !ok {
			return "", "", false
		}
		return e.Name(), port.Name, true
	}
}

// claimant returns the service and port that claim vip/p in snap.
func claimant(snap *store.Snapshot, p dataplane.Protocol, vip netip.AddrPort) (*store.Entry, dataplane.Port, bool) {
	name, ok := snap.Holder(store.Claim{VIP: vip.Addr().Unmap(), Protocol: p, Port: vip.Port()})
	if !ok {
		return nil, dataplane.Port{}, false
	}
	e, ok := snap.Get(name)
	if !ok {
		return nil, dataplane.Port{}, false
	}
	for _, port := range e.Dataplane.Ports {
		if port.Protocol == p && port.Port == vip.Port() {
			return e, port, true
		}
	}
	return nil, dataplane.Port{}, false
}

// noFlows is the answer of the flow calls when the dataplane reports no flows.
func (a *API) noFlows() error {
	return status.Errorf(codes.Unimplemented, "the %s dataplane does not report flows", a.dataplane)
}

// flowStatus turns an error from the flow hub into a status.
func flowStatus(err error) error {
	var srcErr *flowhub.SourceError
	switch {
	case errors.As(err, &srcErr):
		return status.Errorf(codes.Unavailable, "%v; events may have been missed, watch again", err)
	case errors.Is(err, flowhub.ErrStopped):
		return status.Error(codes.Unavailable, "flow events stopped: vipd is shutting down or cannot read them")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return toStatus(err)
	}
	return status.Error(codes.Unavailable, err.Error())
}

// WatchFlows implements vipdv1.FlowServiceServer.
func (a *API) WatchFlows(req *vipdv1.WatchFlowsRequest, stream grpc.ServerStreamingServer[vipdv1.WatchFlowsResponse]) error {
	if a.flows == nil {
		return a.noFlows()
	}
	f, v := validation.FlowFilter(req.Filter, "filter")
	live, existing, watch, vt := validation.FlowTypes(req.Types, "types")
	if v = append(v, vt...); len(v) > 0 {
		return toStatus(v)
	}
	f.Types = live
	existing = existing || req.IncludeExisting
	ctx := stream.Context()

	var sub *flowhub.Subscription
	if watch {
		// Subscribe before listing, so that no event falls between the
		// listing and the stream. A flow that begins or ends during the
		// listing may so be both EXISTING and NEW or CLOSED; the API says so.
		var err error
		if sub, err = a.flows.Subscribe(f); err != nil {
			return flowStatus(err)
		}
		defer sub.Close()
		// Headers now tell the client that it is subscribed: every event
		// from here on reaches it (client.WatchFlows waits for them).
		if err := stream.SendHeader(nil); err != nil {
			return err
		}
	}
	if existing {
		list, _, err := a.flows.List(ctx, f, 0)
		if err != nil {
			return flowStatus(err)
		}
		now := time.Now()
		for i := range list {
			ev := flowEvent(vipdv1.FlowEventType_FLOW_EVENT_TYPE_EXISTING, now, &list[i])
			if err := stream.Send(&vipdv1.WatchFlowsResponse{Event: &vipdv1.WatchFlowsResponse_Flow{Flow: ev}}); err != nil {
				return err
			}
		}
	}
	if sub == nil {
		return nil
	}
	for {
		m, err := sub.Next(ctx)
		if err != nil {
			return flowStatus(err)
		}
		if err := stream.Send(watchResponse(&m)); err != nil {
			return err
		}
	}
}

// ListFlows implements vipdv1.FlowServiceServer.
func (a *API) ListFlows(ctx context.Context, req *vipdv1.ListFlowsRequest) (*vipdv1.ListFlowsResponse, error) {
	if a.flows == nil {
		return nil, a.noFlows()
	}
	f, v := validation.FlowFilter(req.Filter, "filter")
	if len(v) > 0 {
		return nil, toStatus(v)
	}
	limit := int(req.Limit)
	if limit == 0 || limit > MaxListFlows {
		limit = MaxListFlows
	}
	list, truncated, err := a.flows.List(ctx, f, limit)
	if err != nil {
		return nil, flowStatus(err)
	}
	resp := &vipdv1.ListFlowsResponse{Flows: make([]*vipdv1.FlowEvent, len(list)), Truncated: truncated}
	now := time.Now()
	for i := range list {
		resp.Flows[i] = flowEvent(vipdv1.FlowEventType_FLOW_EVENT_TYPE_EXISTING, now, &list[i])
	}
	return resp, nil
}

func watchResponse(m *flowhub.Message) *vipdv1.WatchFlowsResponse {
	if m.Lost != nil {
		src := vipdv1.LostEventsSource_LOST_EVENTS_SOURCE_SUBSCRIBER
		if m.Lost.Source == flowhub.LostKernel {
			src = vipdv1.LostEventsSource_LOST_EVENTS_SOURCE_KERNEL
		}
		return &vipdv1.WatchFlowsResponse{Event: &vipdv1.WatchFlowsResponse_Lost{Lost: &vipdv1.LostEvents{Count: m.Lost.Count, Source: src}}}
	}
	t := vipdv1.FlowEventType_FLOW_EVENT_TYPE_UNSPECIFIED
	switch m.Event.Type {
	case dataplane.FlowNew:
		t = vipdv1.FlowEventType_FLOW_EVENT_TYPE_NEW
	case dataplane.FlowClosed:
		t = vipdv1.FlowEventType_FLOW_EVENT_TYPE_CLOSED
	case flowhub.HealthTransition:
		return &vipdv1.WatchFlowsResponse{Event: &vipdv1.WatchFlowsResponse_Flow{Flow: healthEvent(&m.Event)}}
	}
	return &vipdv1.WatchFlowsResponse{Event: &vipdv1.WatchFlowsResponse_Flow{Flow: flowEvent(t, m.Event.Time, &m.Event.Flow)}}
}

// healthEvent is a health transition as a FLOW_EVENT_TYPE_HEALTH event:
// time, service, backend and health, nothing else.
func healthEvent(e *flowhub.Event) *vipdv1.FlowEvent {
	h := e.Health
	if h == nil {
		h = &flowhub.Health{}
	}
	ev := &vipdv1.FlowEvent{
		Type:    vipdv1.FlowEventType_FLOW_EVENT_TYPE_HEALTH,
		Service: e.Flow.Service,
		Backend: endpoint(e.Flow.Backend),
		Health: &vipdv1.BackendHealth{
			Ip:          e.Flow.Backend.Addr().Unmap().String(),
			State:       healthStateToProto[h.State],
			SinceUnixMs: h.Since.UnixMilli(),
			LastError:   h.LastError,
			Consecutive: h.Consecutive,
			Detail:      h.Detail,
		},
	}
	if !e.Time.IsZero() {
		ev.Time = timestamppb.New(e.Time)
	}
	return ev
}

var healthStateToProto = map[flowhub.HealthState]vipdv1.HealthState{
	flowhub.HealthUnknown: vipdv1.HealthState_HEALTH_STATE_UNKNOWN,
	flowhub.HealthPassing: vipdv1.HealthState_HEALTH_STATE_PASSING,
	flowhub.HealthFailing: vipdv1.HealthState_HEALTH_STATE_FAILING,
}

// flowEvent is f as an event of type t at time at. An EXISTING flow's
// duration is its age at that time.
func flowEvent(t vipdv1.FlowEventType, at time.Time, f *flowhub.Flow) *vipdv1.FlowEvent {
	ev := &vipdv1.FlowEvent{
		Type:     t,
		Service:  f.Service,
		PortName: f.PortName,
		Protocol: protocolToProto[f.Protocol],
		Client:   endpoint(f.Client),
		Vip:      endpoint(f.VIP),
		Backend:  endpoint(f.Backend),
		FlowId:   f.ID,
		TcpState: tcpStateToProto[f.TCPState],
	}
	if !at.IsZero() {
		ev.Time = timestamppb.New(at)
	}
	if !f.Start.IsZero() {
		ev.Start = timestamppb.New(f.Start)
	}
	switch t {
	case vipdv1.FlowEventType_FLOW_EVENT_TYPE_CLOSED:
		ev.Duration = durationpb.New(f.Duration)
		ev.CloseReason = f.CloseReason
	case vipdv1.FlowEventType_FLOW_EVENT_TYPE_EXISTING:
		if !f.Start.IsZero() && at.After(f.Start) {
			ev.Duration = durationpb.New(at.Sub(f.Start))
		}
	default:
		return ev
	}
	ev.PacketsToBackend, ev.BytesToBackend = f.OrigPackets, f.OrigBytes
	ev.PacketsToClient, ev.BytesToClient = f.ReplyPackets, f.ReplyBytes
	return ev
}

// tcpStateToProto maps the dataplane's TCP states to the API's; any other
// is TCP_STATE_UNSPECIFIED.
var tcpStateToProto = map[dataplane.TCPState]vipdv1.TcpState{
	dataplane.TCPSynSent:     vipdv1.TcpState_TCP_STATE_SYN_SENT,
	dataplane.TCPSynRecv:     vipdv1.TcpState_TCP_STATE_SYN_RECV,
	dataplane.TCPEstablished: vipdv1.TcpState_TCP_STATE_ESTABLISHED,
	dataplane.TCPFinWait:     vipdv1.TcpState_TCP_STATE_FIN_WAIT,
	dataplane.TCPCloseWait:   vipdv1.TcpState_TCP_STATE_CLOSE_WAIT,
	dataplane.TCPLastAck:     vipdv1.TcpState_TCP_STATE_LAST_ACK,
	dataplane.TCPTimeWait:    vipdv1.TcpState_TCP_STATE_TIME_WAIT,
	dataplane.TCPClose:       vipdv1.TcpState_TCP_STATE_CLOSE,
}

// endpoint is ap as an Endpoint, or nil when ap is unset.
func endpoint(ap netip.AddrPort) *vipdv1.Endpoint {
	if !ap.Addr().IsValid() {
		return nil
	}
	return &vipdv1.Endpoint{Ip: ap.Addr().Unmap().String(), Port: uint32(ap.Port())}
}
