package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/internal/testkit/testserver"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/flowhub"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// flowEnv is a test vipd with services default/web (198.19.0.10:80/TCP,
// port http → 8080) and kube-system/dns (198.19.0.53:53/UDP), reachable
// over a bufconn, whose connections buffer little.
type flowEnv struct {
	srv    *testserver.Server
	bufnet *bufconn.Listener
	flows  vipdv1.FlowServiceClient
	status vipdv1.StatusServiceClient
	lb     vipdv1.LoadBalancerServiceClient
}

var (
	t0      = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	webVIP  = netip.MustParseAddrPort("198.19.0.10:80")
	dnsVIP  = netip.MustParseAddrPort("198.19.0.53:53")
	webBE   = netip.MustParseAddrPort("198.18.1.10:8080")
	dnsBE   = netip.MustParseAddrPort("198.18.2.10:53")
	clients = netip.MustParsePrefix("10.0.0.0/16")
)

func startFlows(t *testing.T, opts ...testserver.Option) *flowEnv {
	t.Helper()
	bufnet := bufconn.Listen(16 << 10)
	srv := testserver.Start(t, append(opts, testserver.WithListener(bufnet))...)
	env := &flowEnv{srv: srv, bufnet: bufnet}
	conn := env.dial(t)
	env.flows = vipdv1.NewFlowServiceClient(conn)
	env.status = vipdv1.NewStatusServiceClient(conn)
	env.lb = vipdv1.NewLoadBalancerServiceClient(conn)
	for _, svc := range []*vipdv1.Service{
		{Name: "default/web", Vips: []string{webVIP.Addr().String()}, Ports: []*vipdv1.Port{{Name: "http", Port: 80, TargetPort: 8080}},
			Backends: []*vipdv1.Backend{{Ip: webBE.Addr().String()}}},
		{Name: "kube-system/dns", Vips: []string{dnsVIP.Addr().String()}, Ports: []*vipdv1.Port{{Port: 53, Protocol: vipdv1.Protocol_PROTOCOL_UDP}},
			Backends: []*vipdv1.Backend{{Ip: dnsBE.Addr().String()}}},
	} {
		if _, err := env.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: svc}); err != nil {
			t.Fatal(err)
		}
	}
	return env
}

// dial opens a connection of its own, with fixed 64 KiB flow-control
// windows (no BDP growth), so that a stream that is not read stops the
// server's sends soon.
func (env *flowEnv) dial(t *testing.T) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return env.bufnet.DialContext(ctx) }),
		grpc.WithInitialWindowSize(64<<10),
		grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// watch opens a WatchFlows stream on client and waits until vipd has
// subscribed it, so that no event emitted after watch returns is missed.
func (env *flowEnv) watch(t *testing.T, client vipdv1.FlowServiceClient, req *vipdv1.WatchFlowsRequest) vipdv1.FlowService_WatchFlowsClient {
	t.Helper()
	before := env.srv.Flows().Subscribers()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := client.WatchFlows(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for env.srv.Flows().Subscribers() == before {
		if time.Now().After(deadline) {
			t.Fatalf("WatchFlows%v did not subscribe", req)
		}
		time.Sleep(time.Millisecond)
	}
	return stream
}

// webFlow is flow id from client 10.0.<id/250>.<id%250+1> through default/web.
func webFlow(id uint64) dataplane.Flow {
	return dataplane.Flow{
		ID: id, Protocol: dataplane.TCP,
		Client:  netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(id / 250), byte(id%250 + 1)}), 40000),
		VIP:     webVIP,
		Backend: webBE,
		Start:   t0,
	}
}

func dnsFlow(id uint64) dataplane.Flow {
	return dataplane.Flow{
		ID: id, Protocol: dataplane.UDP,
		Client:  netip.MustParseAddrPort("10.1.0.1:5353"),
		VIP:     dnsVIP,
		Backend: dnsBE,
		Start:   t0.Add(time.Second),
	}
}

// recv reads the next message of stream.
func recv(t *testing.T, stream vipdv1.FlowService_WatchFlowsClient) *vipdv1.WatchFlowsResponse {
	t.Helper()
	m, err := stream.Recv()
	if err != nil {
		t.Fatalf("Recv: %v", err)
	}
	return m
}

// describe is m in short: "NEW 3", "CLOSED 3", "EXISTING 3", "LOST SUBSCRIBER 6".
func describe(m *vipdv1.WatchFlowsResponse) string {
	if l := m.GetLost(); l != nil {
		return fmt.Sprintf("LOST %s %d", l.GetSource().String()[len("LOST_EVENTS_SOURCE_"):], l.GetCount())
	}
	return fmt.Sprintf("%s %d", m.GetFlow().GetType().String()[len("FLOW_EVENT_TYPE_"):], m.GetFlow().GetFlowId())
}

func TestWatchFlowsEverySubscriberGetsEveryEvent(t *testing.T) {
	env := startFlows(t)
	a := env.watch(t, env.flows, &vipdv1.WatchFlowsRequest{})
	b := env.watch(t, vipdv1.NewFlowServiceClient(env.dial(t)), &vipdv1.WatchFlowsRequest{})

	closed := webFlow(7)
	closed.OrigPackets, closed.OrigBytes, closed.ReplyPackets, closed.ReplyBytes = 5, 300, 4, 2000
	closed.Duration = 1500 * time.Millisecond
	closed.CloseReason = dataplane.CloseFIN
	const n = 200
	for id := range uint64(n) {
		env.srv.Dataplane().Emit(dataplane.FlowEvent{Type: dataplane.FlowNew, Time: t0, Flow: webFlow(id)})
	}
	env.srv.Dataplane().Emit(dataplane.FlowEvent{Type: dataplane.FlowClosed, Time: t0.Add(2 * time.Second), Flow: closed})

	wantNew := &vipdv1.FlowEvent{
		Type: vipdv1.FlowEventType_FLOW_EVENT_TYPE_NEW, Time: timestamppb.New(t0), Start: timestamppb.New(t0),
		Service: "default/web", PortName: "http", Protocol: vipdv1.Protocol_PROTOCOL_TCP,
		Client:  &vipdv1.Endpoint{Ip: "10.0.0.8", Port: 40000},
		Vip:     &vipdv1.Endpoint{Ip: "198.19.0.10", Port: 80},
		Backend: &vipdv1.Endpoint{Ip: "198.18.1.10", Port: 8080},
		FlowId:  7,
	}
	wantClosed := &vipdv1.FlowEvent{
		Type: vipdv1.FlowEventType_FLOW_EVENT_TYPE_CLOSED, Time: timestamppb.New(t0.Add(2 * time.Second)), Start: timestamppb.New(t0),
		Service: "default/web", PortName: "http", Protocol: vipdv1.Protocol_PROTOCOL_TCP,
		Client:           &vipdv1.Endpoint{Ip: "10.0.0.8", Port: 40000},
		Vip:              &vipdv1.Endpoint{Ip: "198.19.0.10", Port: 80},
		Backend:          &vipdv1.Endpoint{Ip: "198.18.1.10", Port: 8080},
		PacketsToBackend: 5, BytesToBackend: 300, PacketsToClient: 4, BytesToClient: 2000,
		Duration: durationpb.New(1500 * time.Millisecond), CloseReason: "fin", FlowId: 7,
	}
	for name, stream := range map[string]vipdv1.FlowService_WatchFlowsClient{"a": a, "b": b} {
		for id := range uint64(n) {
			m := recv(t, stream)
			if got := describe(m); got != fmt.Sprintf("NEW %d", id) {
				t.Fatalf("%s: event %d is %s", name, id, got)
			}
			if id == 7 {
				if diff := cmp.Diff(wantNew, m.GetFlow(), protocmp.Transform()); diff != "" {
					t.Errorf("%s: NEW event (-want +got):\n%s", name, diff)
				}
			}
		}
		if diff := cmp.Diff(wantClosed, recv(t, stream).GetFlow(), protocmp.Transform()); diff != "" {
			t.Errorf("%s: CLOSED event (-want +got):\n%s", name, diff)
		}
	}
}

// TestWatchFlowsStalledSubscriber stalls one stream, by not reading it,
// while another keeps up. The stalled one must be told exactly how many
// events it missed, where it missed them; the other must miss nothing.
func TestWatchFlowsStalledSubscriber(t *testing.T) {
	const buffer, batch, total = 64, 32, 160 * 32
	env := startFlows(t, testserver.WithFlowBuffer(buffer))
	stalled := env.watch(t, vipdv1.NewFlowServiceClient(env.dial(t)), &vipdv1.WatchFlowsRequest{})
	fast := env.watch(t, vipdv1.NewFlowServiceClient(env.dial(t)), &vipdv1.WatchFlowsRequest{})

	// Emit in batches smaller than the buffer, reading each batch from
	// the fast stream before the next: it never falls a buffer behind.
	for first := uint64(0); first < total; first += batch {
		for id := first; id < first+batch; id++ {
			env.srv.Dataplane().Emit(dataplane.FlowEvent{Type: dataplane.FlowNew, Time: t0, Flow: webFlow(id)})
		}
		for id := first; id < first+batch; id++ {
			if got, want := describe(recv(t, fast)), fmt.Sprintf("NEW %d", id); got != want {
				t.Fatalf("fast stream: got %s, want %s", got, want)
			}
		}
	}
	env.srv.Dataplane().Emit(dataplane.FlowEvent{Type: dataplane.FlowNew, Time: t0, Flow: webFlow(total)})
	if got := describe(recv(t, fast)); got != fmt.Sprintf("NEW %d", total) {
		t.Fatalf("fast stream: got %s after the last batch", got)
	}

	// Every event the stalled stream missed is counted in a LostEvents
	// right where the gap is. The last event was lost too (the stream was
	// still stalled): its loss is reported once the buffer is drained.
	var received, lost, reports, pending uint64
	last := int64(-1)
	for received+lost < total+1 {
		m := recv(t, stalled)
		if l := m.GetLost(); l != nil {
			if l.GetSource() != vipdv1.LostEventsSource_LOST_EVENTS_SOURCE_SUBSCRIBER {
				t.Fatalf("lost events of source %v", l.GetSource())
			}
			pending += l.GetCount()
			lost += l.GetCount()
			reports++
			continue
		}
		id := int64(m.GetFlow().GetFlowId())
		if gap := uint64(id - last - 1); gap != pending {
			t.Fatalf("event %d follows event %d, with %d events reported lost in between", id, last, pending)
		}
		pending = 0
		last = id
		received++
	}
	if lost == 0 || received+lost != total+1 || uint64(total-last) != pending {
		t.Errorf("the stalled stream received %d events, up to %d, and was told of %d lost, %d after the last; want some lost, %d in all",
			received, last, lost, pending, total+1)
	}
	t.Logf("stalled stream: %d received, %d lost in %d reports", received, lost, reports)

	// Caught up, it misses nothing more.
	env.srv.Dataplane().Emit(dataplane.FlowEvent{Type: dataplane.FlowNew, Time: t0, Flow: webFlow(total + 1)})
	if got, want := describe(recv(t, stalled)), fmt.Sprintf("NEW %d", total+1); got != want {
		t.Errorf("the stalled stream, caught up: got %s, want %s", got, want)
	}
}

func TestWatchFlowsKernelLosses(t *testing.T) {
	env := startFlows(t)
	a := env.watch(t, env.flows, &vipdv1.WatchFlowsRequest{})
	b := env.watch(t, env.flows, &vipdv1.WatchFlowsRequest{Filter: &vipdv1.FlowFilter{Service: "kube-system/dns"}})
	dp := env.srv.Dataplane()
	dp.Emit(dataplane.FlowEvent{Type: dataplane.FlowNew, Flow: webFlow(1)})
	dp.Lose(12)
	dp.Emit(dataplane.FlowEvent{Type: dataplane.FlowNew, Flow: dnsFlow(2)})
	dp.Lose(1)
	for name, tc := range map[string]struct {
		stream vipdv1.FlowService_WatchFlowsClient
		want   []string
	}{
		"unfiltered": {a, []string{"NEW 1", "LOST KERNEL 12", "NEW 2", "LOST KERNEL 1"}},
		"dns only":   {b, []string{"LOST KERNEL 12", "NEW 2", "LOST KERNEL 1"}},
	} {
		var got []string
		for range tc.want {
			got = append(got, describe(recv(t, tc.stream)))
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", name, diff)
		}
	}
}

// flowSet is the flows the filter tests run over: web flows 1-3 from
// 10.0.0.2-4, and dns flow 4 from 10.1.0.1.
func flowSet() []dataplane.Flow {
	f4 := dnsFlow(4)
	return []dataplane.Flow{webFlow(1), webFlow(2), webFlow(3), f4}
}

var filterCases = []struct {
	name   string
	filter *vipdv1.FlowFilter
	want   []uint64
}{
	{"none", nil, []uint64{1, 2, 3, 4}},
	{"service", &vipdv1.FlowFilter{Service: "kube-system/dns"}, []uint64{4}},
	{"unknown service", &vipdv1.FlowFilter{Service: "default/nothing"}, nil},
	{"vip", &vipdv1.FlowFilter{Vip: "198.19.0.10"}, []uint64{1, 2, 3}},
	{"vip and port", &vipdv1.FlowFilter{Vip: "198.19.0.53:53"}, []uint64{4}},
	{"vip, other port", &vipdv1.FlowFilter{Vip: "198.19.0.53:54"}, nil},
	{"backend", &vipdv1.FlowFilter{Backend: "198.18.1.10"}, []uint64{1, 2, 3}},
	{"backend and port", &vipdv1.FlowFilter{Backend: "198.18.1.10:8080"}, []uint64{1, 2, 3}},
	{"backend, other port", &vipdv1.FlowFilter{Backend: "198.18.1.10:80"}, nil},
	{"client ip", &vipdv1.FlowFilter{Client: "10.0.0.3"}, []uint64{2}},
	{"client cidr", &vipdv1.FlowFilter{Client: "10.0.0.0/24"}, []uint64{1, 2, 3}},
	{"client cidr, not masked", &vipdv1.FlowFilter{Client: "10.1.2.3/16"}, []uint64{4}},
	{"protocol", &vipdv1.FlowFilter{Protocol: vipdv1.Protocol_PROTOCOL_UDP}, []uint64{4}},
	{"protocol without flows", &vipdv1.FlowFilter{Protocol: vipdv1.Protocol_PROTOCOL_SCTP}, nil},
	{"fields are ANDed", &vipdv1.FlowFilter{Service: "default/web", Client: "10.0.0.4", Protocol: vipdv1.Protocol_PROTOCOL_TCP}, []uint64{3}},
	{"fields are ANDed, no match", &vipdv1.FlowFilter{Service: "default/web", Protocol: vipdv1.Protocol_PROTOCOL_UDP}, nil},
}

func TestListFlowsFilters(t *testing.T) {
	env := startFlows(t)
	env.srv.Dataplane().SetFlows(flowSet(), nil)
	for _, tc := range filterCases {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := env.flows.ListFlows(ctxT(t), &vipdv1.ListFlowsRequest{Filter: tc.filter})
			if err != nil {
				t.Fatal(err)
			}
			var got []uint64
			for _, f := range resp.GetFlows() {
				if f.GetType() != vipdv1.FlowEventType_FLOW_EVENT_TYPE_EXISTING {
					t.Errorf("flow %d has type %v", f.GetFlowId(), f.GetType())
				}
				got = append(got, f.GetFlowId())
			}
			if diff := cmp.Diff(tc.want, got); diff != "" || resp.GetTruncated() {
				t.Errorf("truncated %v; flows (-want +got):\n%s", resp.GetTruncated(), diff)
			}
		})
	}
}

func TestWatchFlowsFilters(t *testing.T) {
	env := startFlows(t)
	streams := make([]vipdv1.FlowService_WatchFlowsClient, len(filterCases))
	for i, tc := range filterCases {
		streams[i] = env.watch(t, env.flows, &vipdv1.WatchFlowsRequest{Filter: tc.filter})
	}
	closedOnly := env.watch(t, env.flows, &vipdv1.WatchFlowsRequest{Types: []vipdv1.FlowEventType{vipdv1.FlowEventType_FLOW_EVENT_TYPE_CLOSED}})
	for _, f := range flowSet() {
		env.srv.Dataplane().Emit(dataplane.FlowEvent{Type: dataplane.FlowNew, Flow: f})
		env.srv.Dataplane().Emit(dataplane.FlowEvent{Type: dataplane.FlowClosed, Flow: f})
	}
	// A kernel loss marks the end of the events on every stream.
	env.srv.Dataplane().Lose(1)
	readAll := func(stream vipdv1.FlowService_WatchFlowsClient) []string {
		var got []string
		for {
			m := recv(t, stream)
			if m.GetLost() != nil {
				return got
			}
			got = append(got, describe(m))
		}
	}
	for i, tc := range filterCases {
		var want []string
		for _, id := range tc.want {
			want = append(want, fmt.Sprintf("NEW %d", id), fmt.Sprintf("CLOSED %d", id))
		}
		if diff := cmp.Diff(want, readAll(streams[i])); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
	if diff := cmp.Diff([]string{"CLOSED 1", "CLOSED 2", "CLOSED 3", "CLOSED 4"}, readAll(closedOnly)); diff != "" {
		t.Errorf("CLOSED only (-want +got):\n%s", diff)
	}
}

func TestWatchFlowsIncludeExisting(t *testing.T) {
	env := startFlows(t)
	live := webFlow(1)
	live.OrigPackets, live.OrigBytes, live.ReplyPackets, live.ReplyBytes = 3, 180, 2, 900
	env.srv.Dataplane().SetFlows([]dataplane.Flow{dnsFlow(2), live}, nil)

	stream := env.watch(t, env.flows, &vipdv1.WatchFlowsRequest{IncludeExisting: true, Filter: &vipdv1.FlowFilter{Service: "default/web"}})
	first := recv(t, stream).GetFlow()
	if first.GetType() != vipdv1.FlowEventType_FLOW_EVENT_TYPE_EXISTING || first.GetFlowId() != 1 {
		t.Fatalf("first event %v, want EXISTING flow 1", first)
	}
	if first.GetPacketsToBackend() != 3 || first.GetBytesToBackend() != 180 || first.GetPacketsToClient() != 2 || first.GetBytesToClient() != 900 ||
		first.GetService() != "default/web" || first.GetPortName() != "http" {
		t.Errorf("EXISTING event %v lacks the counters so far or the service", first)
	}
	if age := first.GetDuration().AsDuration(); age < time.Since(t0)-time.Minute {
		t.Errorf("EXISTING event has duration %v, want the flow's age", age)
	}
	env.srv.Dataplane().Emit(dataplane.FlowEvent{Type: dataplane.FlowNew, Flow: webFlow(3)})
	if got := describe(recv(t, stream)); got != "NEW 3" {
		t.Errorf("after the existing flows: %s, want NEW 3", got)
	}

	// EXISTING as the only type lists, and ends the stream.
	only, err := env.flows.WatchFlows(ctxT(t), &vipdv1.WatchFlowsRequest{Types: []vipdv1.FlowEventType{vipdv1.FlowEventType_FLOW_EVENT_TYPE_EXISTING}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for {
		m, err := only.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, describe(m))
	}
	if diff := cmp.Diff([]string{"EXISTING 1", "EXISTING 2"}, got); diff != "" {
		t.Errorf("types [EXISTING] (-want +got):\n%s", diff)
	}
}

// TestFlowEventsCarryTCPState: each TCP state a dataplane reports reaches
// the API under conntrack's name, on EXISTING and on live events; a UDP
// flow has none.
func TestFlowEventsCarryTCPState(t *testing.T) {
	env := startFlows(t)
	var (
		set  []dataplane.Flow
		want = map[uint64]string{}
	)
	for s := dataplane.TCPSynSent; s <= dataplane.TCPClose; s++ {
		f := webFlow(uint64(s))
		f.TCPState = s
		set = append(set, f)
		want[f.ID] = "TCP_STATE_" + s.String()
	}
	udp := dnsFlow(100)
	set = append(set, udp)
	want[udp.ID] = "TCP_STATE_UNSPECIFIED"
	env.srv.Dataplane().SetFlows(set, nil)

	resp, err := env.flows.ListFlows(ctxT(t), &vipdv1.ListFlowsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[uint64]string{}
	for _, f := range resp.GetFlows() {
		got[f.GetFlowId()] = f.GetTcpState().String()
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ListFlows: tcp_state by flow_id (-want +got):\n%s", diff)
	}

	stream := env.watch(t, env.flows, &vipdv1.WatchFlowsRequest{})
	closed := webFlow(1)
	closed.TCPState = dataplane.TCPTimeWait
	closed.CloseReason = dataplane.CloseFIN
	env.srv.Dataplane().Emit(dataplane.FlowEvent{Type: dataplane.FlowClosed, Flow: closed})
	if ev := recv(t, stream).GetFlow(); ev.GetTcpState() != vipdv1.TcpState_TCP_STATE_TIME_WAIT {
		t.Errorf("CLOSED event of a flow in TIME_WAIT: tcp_state %v", ev.GetTcpState())
	}
}

func TestListFlowsLimit(t *testing.T) {
	env := startFlows(t)
	var live []dataplane.Flow
	for id := uint64(10); id > 0; id-- {
		f := webFlow(id)
		f.Start = t0.Add(time.Duration(id) * time.Second)
		live = append(live, f)
	}
	env.srv.Dataplane().SetFlows(live, nil)
	for _, tc := range []struct {
		limit     uint32
		filter    *vipdv1.FlowFilter
		want      []uint64
		truncated bool
	}{
		{0, nil, []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, false},
		{3, nil, []uint64{1, 2, 3}, true},
		{10, nil, []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, false},
		{2, &vipdv1.FlowFilter{Client: "10.0.0.5/32"}, []uint64{4}, false},
	} {
		resp, err := env.flows.ListFlows(ctxT(t), &vipdv1.ListFlowsRequest{Filter: tc.filter, Limit: tc.limit})
		if err != nil {
			t.Fatal(err)
		}
		var got []uint64
		for _, f := range resp.GetFlows() {
			got = append(got, f.GetFlowId())
		}
		if diff := cmp.Diff(tc.want, got); diff != "" || resp.GetTruncated() != tc.truncated {
			t.Errorf("limit %d, filter %v: truncated %v, want %v; flows (-want +got):\n%s", tc.limit, tc.filter, resp.GetTruncated(), tc.truncated, diff)
		}
	}

	env.srv.Dataplane().SetFlows(nil, errors.New("conntrack dump: operation not permitted"))
	_, err := env.flows.ListFlows(ctxT(t), &vipdv1.ListFlowsRequest{})
	wantCode(t, err, codes.Unavailable, "operation not permitted")
}

func TestFlowRequestsInvalid(t *testing.T) {
	env := startFlows(t)
	bad := &vipdv1.FlowFilter{Service: "Web!", Vip: "198.19.0.300", Backend: "198.18.1.10:0", Client: "10.0.0.0/33", Protocol: 9}
	want := []string{"filter.backend", "filter.client", "filter.protocol", "filter.service", "filter.vip"}

	_, err := env.flows.ListFlows(ctxT(t), &vipdv1.ListFlowsRequest{Filter: bad})
	wantCode(t, err, codes.InvalidArgument)
	if diff := cmp.Diff(want, fieldsOf(err)); diff != "" {
		t.Errorf("ListFlows violations (-want +got):\n%s", diff)
	}

	stream, err := env.flows.WatchFlows(ctxT(t), &vipdv1.WatchFlowsRequest{Filter: bad, Types: []vipdv1.FlowEventType{0, 2, 7}})
	if err == nil {
		_, err = stream.Recv()
	}
	wantCode(t, err, codes.InvalidArgument)
	if diff := cmp.Diff(append(want, "types[0]", "types[2]"), fieldsOf(err)); diff != "" {
		t.Errorf("WatchFlows violations (-want +got):\n%s", diff)
	}
}

func TestFlowsUnimplementedWithoutSource(t *testing.T) {
	env := startFlows(t, testserver.WithoutFlows())
	_, err := env.flows.ListFlows(ctxT(t), &vipdv1.ListFlowsRequest{})
	wantCode(t, err, codes.Unimplemented, "the fake dataplane does not report flows")
	stream, err := env.flows.WatchFlows(ctxT(t), &vipdv1.WatchFlowsRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	wantCode(t, err, codes.Unimplemented)
}

func TestWatchFlowsEndsWhenVipdStops(t *testing.T) {
	env := startFlows(t)
	stream := env.watch(t, env.flows, &vipdv1.WatchFlowsRequest{})
	start := time.Now()
	if err := env.srv.Close(); err != nil {
		t.Fatal(err)
	}
	// The stream did not hold up the graceful stop.
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Errorf("Close took %v with a stream open", d)
	}
	_, err := stream.Recv()
	if status.Code(err) != codes.Unavailable {
		t.Errorf("Recv after vipd stopped: %v, want Unavailable", err)
	}
}

func TestWatchFlowsSourceFailure(t *testing.T) {
	env := startFlows(t)
	stream := env.watch(t, env.flows, &vipdv1.WatchFlowsRequest{})
	env.srv.Dataplane().FailWatch(errors.New("netlink receive: no buffer space available"))
	_, err := stream.Recv()
	wantCode(t, err, codes.Unavailable, "no buffer space available", "events may have been missed")
}

// upsertForExplain upserts svc as default/web on 198.19.0.10 and
// fd00:96::10, with ports http 80/TCP→8080 and dns 53/UDP unless svc has
// ports.
func upsertForExplain(t *testing.T, env *flowEnv, svc *vipdv1.Service) {
	t.Helper()
	svc.Name = "default/web"
	svc.Vips = []string{"198.19.0.10", "fd00:96::10"}
	if svc.Ports == nil {
		svc.Ports = []*vipdv1.Port{{Name: "http", Port: 80, TargetPort: 8080}, {Name: "dns", Port: 53, Protocol: vipdv1.Protocol_PROTOCOL_UDP}}
	}
	if _, err := env.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: svc}); err != nil {
		t.Fatal(err)
	}
}

func probabilities(resp *vipdv1.ExplainResponse) map[string]float64 {
	p := map[string]float64{}
	for _, b := range resp.GetBackends() {
		p[b.GetIp()] = b.GetProbability()
	}
	return p
}

func TestExplainRandomWeights(t *testing.T) {
	env := startFlows(t)
	upsertForExplain(t, env, &vipdv1.Service{Backends: []*vipdv1.Backend{
		{Ip: "198.18.1.1", Weight: 1}, {Ip: "198.18.1.2", Weight: 2}, {Ip: "198.18.1.3", Weight: 3, Ports: map[string]uint32{"http": 9090}},
		{Ip: "fd00::1", Weight: 5},
	}})
	resp, err := env.status.Explain(ctxT(t), &vipdv1.ExplainRequest{ClientIp: "10.0.0.9", ClientPort: 43512, Vip: "198.19.0.10", Port: 80})
	if err != nil {
		t.Fatal(err)
	}
	want := &vipdv1.ExplainResponse{
		Service:               "default/web",
		Port:                  &vipdv1.Port{Name: "http", Protocol: vipdv1.Protocol_PROTOCOL_TCP, Port: 80, TargetPort: 8080},
		LoadBalancing:         vipdv1.LoadBalancing_LOAD_BALANCING_RANDOM,
		SessionAffinity:       &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_NONE},
		InternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
		Backends: []*vipdv1.ExplainedBackend{
			{Ip: "198.18.1.1", TargetPort: 8080, State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 1, Eligible: true, Probability: 1.0 / 6},
			{Ip: "198.18.1.2", TargetPort: 8080, State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 2, Eligible: true, Probability: 2.0 / 6},
			{Ip: "198.18.1.3", TargetPort: 9090, State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 3, Eligible: true, Probability: 3.0 / 6},
			{Ip: "fd00::1", TargetPort: 8080, State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 5, IneligibleReason: "an IPv6 backend cannot serve an IPv4 VIP"},
		},
		Affinity: &vipdv1.ExplainedAffinity{},
		Summary: "198.19.0.10:80/TCP is service default/web port http; 3 of 4 backends are eligible for a new connection. " +
			"A backend is picked at random, in proportion to the weights: 198.18.1.1 16.7%, 198.18.1.2 33.3%, 198.18.1.3 50.0%.",
	}
	if diff := cmp.Diff(want, resp, protocmp.Transform(), protocmp.SortRepeatedFields(&vipdv1.ExplainResponse{}, "backends")); diff != "" {
		t.Errorf("Explain (-want +got):\n%s", diff)
	}
	wantQuery := dataplane.ExplainQuery{Protocol: dataplane.TCP, Client: netip.MustParseAddrPort("10.0.0.9:43512"), VIP: netip.MustParseAddrPort("198.19.0.10:80")}
	if q := env.srv.Dataplane().ExplainQueries(); len(q) != 1 || q[0] != wantQuery {
		t.Errorf("the dataplane was asked %v, want %v", q, wantQuery)
	}

	// The IPv6 VIP has one eligible backend, which is the pick.
	resp, err = env.status.Explain(ctxT(t), &vipdv1.ExplainRequest{ClientIp: "fd00::9", Vip: "fd00:96::10", Port: 53, Protocol: vipdv1.Protocol_PROTOCOL_UDP})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]float64{"198.18.1.1": 0, "198.18.1.2": 0, "198.18.1.3": 0, "fd00::1": 1}, probabilities(resp)); diff != "" {
		t.Errorf("IPv6 probabilities (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(&vipdv1.Endpoint{Ip: "fd00::1", Port: 53}, resp.GetWouldPick(), protocmp.Transform()); diff != "" {
		t.Errorf("IPv6 would_pick (-want +got):\n%s", diff)
	}
}

func TestExplainEligibility(t *testing.T) {
	env := startFlows(t)
	ready, terminating, notServing := vipdv1.BackendState_BACKEND_STATE_READY, vipdv1.BackendState_BACKEND_STATE_TERMINATING, vipdv1.BackendState_BACKEND_STATE_NOT_SERVING
	req := &vipdv1.ExplainRequest{ClientIp: "10.0.0.9", Vip: "198.19.0.10", Port: 80, Protocol: vipdv1.Protocol_PROTOCOL_TCP}
	type backend struct {
		eligible bool
		p        float64
		reason   string
	}
	for _, tc := range []struct {
		name    string
		svc     *vipdv1.Service
		want    map[string]backend
		summary string
	}{
		{
			name: "ready backends go first",
			svc: &vipdv1.Service{Backends: []*vipdv1.Backend{
				{Ip: "198.18.1.1", State: ready}, {Ip: "198.18.1.2", State: terminating}, {Ip: "198.18.1.3", State: notServing},
			}},
			want: map[string]backend{
				"198.18.1.1": {true, 1, ""},
				"198.18.1.2": {false, 0, "terminating, and ready backends are left"},
				"198.18.1.3": {false, 0, "not serving"},
			},
			summary: "It would go to 198.18.1.1:8080.",
		},
		{
			name: "terminating backends when no ready one is left",
			svc: &vipdv1.Service{Backends: []*vipdv1.Backend{
				{Ip: "198.18.1.2", State: terminating}, {Ip: "198.18.1.3", State: notServing}, {Ip: "198.18.1.4", State: terminating, Weight: 3},
			}},
			want: map[string]backend{
				"198.18.1.2": {true, 0.25, ""},
				"198.18.1.3": {false, 0, "not serving"},
				"198.18.1.4": {true, 0.75, ""},
			},
			summary: "198.18.1.2 25.0%, 198.18.1.4 75.0%.",
		},
		{
			name: "internal traffic policy local",
			svc: &vipdv1.Service{InternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL, Backends: []*vipdv1.Backend{
				{Ip: "198.18.1.1"}, {Ip: "198.18.1.2", NodeLocal: true},
			}},
			want: map[string]backend{
				"198.18.1.1": {false, 0, "not node-local, and the internal traffic policy is local"},
				"198.18.1.2": {true, 1, ""},
			},
			summary: "1 of 2 backends are eligible",
		},
		{
			name: "none eligible",
			svc:  &vipdv1.Service{Backends: []*vipdv1.Backend{{Ip: "198.18.1.3", State: notServing}}},
			want: map[string]backend{
				"198.18.1.3": {false, 0, "not serving"},
			},
			summary: "The connection is refused with a TCP reset.",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			upsertForExplain(t, env, tc.svc)
			resp, err := env.status.Explain(ctxT(t), req)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]backend{}
			for _, b := range resp.GetBackends() {
				got[b.GetIp()] = backend{b.GetEligible(), b.GetProbability(), b.GetIneligibleReason()}
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(backend{})); diff != "" {
				t.Errorf("backends (-want +got):\n%s", diff)
			}
			if !strings.Contains(resp.GetSummary(), tc.summary) {
				t.Errorf("summary %q does not say %q", resp.GetSummary(), tc.summary)
			}
		})
	}
}

func TestExplainDataplaneAnswers(t *testing.T) {
	env := startFlows(t)
	dp := env.srv.Dataplane()
	backends := []*vipdv1.Backend{{Ip: "198.18.1.1"}, {Ip: "198.18.1.2"}, {Ip: "198.18.1.3", State: vipdv1.BackendState_BACKEND_STATE_NOT_SERVING}}
	req := &vipdv1.ExplainRequest{ClientIp: "10.0.0.9", ClientPort: 43512, Vip: "198.19.0.10", Port: 80}

	t.Run("affinity", func(t *testing.T) {
		upsertForExplain(t, env, &vipdv1.Service{Backends: backends,
			SessionAffinity: &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP, TimeoutSeconds: 600}})
		dp.SetExplain(func(q dataplane.ExplainQuery) (dataplane.Explanation, error) {
			be := netip.MustParseAddrPort("198.18.1.2:8080")
			return dataplane.Explanation{AffinityBackend: be, AffinityRemaining: 299 * time.Second, Pick: be}, nil
		})
		resp, err := env.status.Explain(ctxT(t), req)
		if err != nil {
			t.Fatal(err)
		}
		wantAffinity := &vipdv1.ExplainedAffinity{Present: true, Backend: &vipdv1.Endpoint{Ip: "198.18.1.2", Port: 8080}, Remaining: durationpb.New(299 * time.Second)}
		if diff := cmp.Diff(wantAffinity, resp.GetAffinity(), protocmp.Transform()); diff != "" {
			t.Errorf("affinity (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(&vipdv1.Endpoint{Ip: "198.18.1.2", Port: 8080}, resp.GetWouldPick(), protocmp.Transform()); diff != "" {
			t.Errorf("would_pick (-want +got):\n%s", diff)
		}
		if s := "Session affinity pins 10.0.0.9 to 198.18.1.2:8080 for 4m59s more. It would go to 198.18.1.2:8080."; !strings.Contains(resp.GetSummary(), s) {
			t.Errorf("summary %q does not say %q", resp.GetSummary(), s)
		}
	})

	t.Run("affinity to an ineligible backend", func(t *testing.T) {
		dp.SetExplain(func(q dataplane.ExplainQuery) (dataplane.Explanation, error) {
			return dataplane.Explanation{AffinityBackend: netip.MustParseAddrPort("198.18.1.3:8080"), AffinityRemaining: time.Minute}, nil
		})
		resp, err := env.status.Explain(ctxT(t), req)
		if err != nil {
			t.Fatal(err)
		}
		if !resp.GetAffinity().GetPresent() || resp.GetWouldPick() != nil {
			t.Errorf("affinity %v, would_pick %v; want the entry shown and no pick", resp.GetAffinity(), resp.GetWouldPick())
		}
		if s := "but that backend is not eligible, so the entry is ignored"; !strings.Contains(resp.GetSummary(), s) {
			t.Errorf("summary %q does not say %q", resp.GetSummary(), s)
		}
	})

	t.Run("maglev", func(t *testing.T) {
		upsertForExplain(t, env, &vipdv1.Service{Backends: backends, LoadBalancing: vipdv1.LoadBalancing_LOAD_BALANCING_MAGLEV})
		dp.SetExplain(func(q dataplane.ExplainQuery) (dataplane.Explanation, error) {
			if q.Client.Port() == 0 {
				return dataplane.Explanation{}, nil
			}
			return dataplane.Explanation{Pick: netip.MustParseAddrPort("198.18.1.1:8080")}, nil
		})
		resp, err := env.status.Explain(ctxT(t), req)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(&vipdv1.Endpoint{Ip: "198.18.1.1", Port: 8080}, resp.GetWouldPick(), protocmp.Transform()); diff != "" {
			t.Errorf("would_pick (-want +got):\n%s", diff)
		}
		for _, b := range resp.GetBackends() {
			if b.GetProbability() != 0 {
				t.Errorf("backend %s has probability %v with Maglev", b.GetIp(), b.GetProbability())
			}
		}
		noPort := &vipdv1.ExplainRequest{ClientIp: "10.0.0.9", Vip: "198.19.0.10", Port: 80}
		resp, err = env.status.Explain(ctxT(t), noPort)
		if err != nil {
			t.Fatal(err)
		}
		if s := "give the client port"; resp.GetWouldPick() != nil || !strings.Contains(resp.GetSummary(), s) {
			t.Errorf("without a client port: would_pick %v, summary %q; want none, and a summary that says %q", resp.GetWouldPick(), resp.GetSummary(), s)
		}
	})

	t.Run("dataplane error", func(t *testing.T) {
		dp.SetExplain(func(dataplane.ExplainQuery) (dataplane.Explanation, error) {
			return dataplane.Explanation{}, errors.New("lookup vipd_affinity: bad file descriptor")
		})
		_, err := env.status.Explain(ctxT(t), req)
		wantCode(t, err, codes.Unavailable, "bad file descriptor")
	})
}

func TestExplainWithoutExplainer(t *testing.T) {
	env := startFlows(t, testserver.WithoutFlows())
	upsertForExplain(t, env, &vipdv1.Service{Backends: []*vipdv1.Backend{{Ip: "198.18.1.1"}, {Ip: "198.18.1.2"}},
		LoadBalancing: vipdv1.LoadBalancing_LOAD_BALANCING_MAGLEV})
	resp, err := env.status.Explain(ctxT(t), &vipdv1.ExplainRequest{ClientIp: "10.0.0.9", ClientPort: 1234, Vip: "198.19.0.10", Port: 80})
	if err != nil {
		t.Fatal(err)
	}
	if s := "this dataplane cannot tell which backend it would get"; resp.GetWouldPick() != nil || !strings.Contains(resp.GetSummary(), s) {
		t.Errorf("would_pick %v, summary %q; want none, and a summary that says %q", resp.GetWouldPick(), resp.GetSummary(), s)
	}
}

func TestExplainErrors(t *testing.T) {
	env := startFlows(t)
	for _, tc := range []struct {
		name   string
		req    *vipdv1.ExplainRequest
		code   codes.Code
		fields []string
		msg    string
	}{
		{"no service on the vip", &vipdv1.ExplainRequest{ClientIp: "10.0.0.9", Vip: "198.19.0.11", Port: 80}, codes.NotFound, nil, "no service claims 198.19.0.11:80/TCP"},
		{"no service on the port", &vipdv1.ExplainRequest{ClientIp: "10.0.0.9", Vip: "198.19.0.10", Port: 81}, codes.NotFound, nil, "198.19.0.10:81/TCP"},
		{"no service on the protocol", &vipdv1.ExplainRequest{ClientIp: "10.0.0.9", Vip: "198.19.0.10", Port: 80, Protocol: vipdv1.Protocol_PROTOCOL_UDP}, codes.NotFound, nil, "198.19.0.10:80/UDP"},
		{"empty", &vipdv1.ExplainRequest{}, codes.InvalidArgument, []string{"client_ip", "port", "vip"}, ""},
		{"bad values", &vipdv1.ExplainRequest{ClientIp: "10.0.0.300", ClientPort: 70000, Vip: "web", Port: 65536, Protocol: 9},
			codes.InvalidArgument, []string{"client_ip", "client_port", "port", "protocol", "vip"}, ""},
		{"families differ", &vipdv1.ExplainRequest{ClientIp: "fd00::9", Vip: "198.19.0.10", Port: 80}, codes.InvalidArgument, []string{"client_ip"}, "fd00::9 is IPv6 but vip 198.19.0.10 is IPv4"},
		{"zone", &vipdv1.ExplainRequest{ClientIp: "fe80::1%eth0", Vip: "fd00::10", Port: 80}, codes.InvalidArgument, []string{"client_ip"}, "zone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := env.status.Explain(ctxT(t), tc.req)
			wantCode(t, err, tc.code, tc.msg)
			if diff := cmp.Diff(tc.fields, fieldsOf(err)); diff != "" {
				t.Errorf("violations (-want +got):\n%s", diff)
			}
		})
	}
}

// TestWatchFlowsHealthEvents: a backend's health transition, published on
// the flow hub as the prober does, reaches the WatchFlows streams whose
// types and filter select it (types empty or with HEALTH; filter service
// or backend, with or without its probed port) as a FLOW_EVENT_TYPE_HEALTH
// event with time, service, backend and health only, and no stream whose
// types leave it out or whose filter sets a VIP, client or protocol.
func TestWatchFlowsHealthEvents(t *testing.T) {
	env := startFlows(t)
	types := func(ts ...vipdv1.FlowEventType) []vipdv1.FlowEventType { return ts }
	const (
		health   = vipdv1.FlowEventType_FLOW_EVENT_TYPE_HEALTH
		newT     = vipdv1.FlowEventType_FLOW_EVENT_TYPE_NEW
		closed   = vipdv1.FlowEventType_FLOW_EVENT_TYPE_CLOSED
		existing = vipdv1.FlowEventType_FLOW_EVENT_TYPE_EXISTING
	)
	cases := []struct {
		name  string
		req   *vipdv1.WatchFlowsRequest
		wants []string
	}{
		{"all", &vipdv1.WatchFlowsRequest{}, []string{"HEALTH", "NEW 1"}},
		{"types HEALTH", &vipdv1.WatchFlowsRequest{Types: types(health)}, []string{"HEALTH"}},
		{"types HEALTH CLOSED", &vipdv1.WatchFlowsRequest{Types: types(closed, health)}, []string{"HEALTH"}},
		{"types HEALTH NEW", &vipdv1.WatchFlowsRequest{Types: types(health, newT)}, []string{"HEALTH", "NEW 1"}},
		{"types EXISTING HEALTH", &vipdv1.WatchFlowsRequest{Types: types(existing, health)}, []string{"HEALTH"}},
		{"types NEW", &vipdv1.WatchFlowsRequest{Types: types(newT)}, []string{"NEW 1"}},
		{"service", &vipdv1.WatchFlowsRequest{Filter: &vipdv1.FlowFilter{Service: "default/web"}}, []string{"HEALTH", "NEW 1"}},
		{"other service", &vipdv1.WatchFlowsRequest{Filter: &vipdv1.FlowFilter{Service: "kube-system/dns"}}, nil},
		{"backend", &vipdv1.WatchFlowsRequest{Filter: &vipdv1.FlowFilter{Backend: "198.18.1.10"}}, []string{"HEALTH", "NEW 1"}},
		{"backend and port", &vipdv1.WatchFlowsRequest{Filter: &vipdv1.FlowFilter{Backend: "198.18.1.10:8080"}}, []string{"HEALTH", "NEW 1"}},
		{"backend, other port", &vipdv1.WatchFlowsRequest{Filter: &vipdv1.FlowFilter{Backend: "198.18.1.10:9090"}}, nil},
		{"service and vip", &vipdv1.WatchFlowsRequest{Filter: &vipdv1.FlowFilter{Service: "default/web", Vip: "198.19.0.10"}}, []string{"NEW 1"}},
		{"client", &vipdv1.WatchFlowsRequest{Filter: &vipdv1.FlowFilter{Client: "10.0.0.0/16"}}, []string{"NEW 1"}},
		{"protocol", &vipdv1.WatchFlowsRequest{Filter: &vipdv1.FlowFilter{Protocol: vipdv1.Protocol_PROTOCOL_TCP}}, []string{"NEW 1"}},
	}
	streams := make([]vipdv1.FlowService_WatchFlowsClient, len(cases))
	for i, tc := range cases {
		streams[i] = env.watch(t, env.flows, tc.req)
	}
	since := t0.Add(3 * time.Second)
	env.srv.Flows().PublishHealth("default/web", webBE, flowhub.Health{State: flowhub.HealthFailing, Since: since,
		LastError: "connection refused", Consecutive: 3, Detail: "failing health check (connection refused, 3 in a row)"})
	env.srv.Dataplane().Emit(dataplane.FlowEvent{Type: dataplane.FlowNew, Time: t0, Flow: webFlow(1)})
	// A kernel loss marks the end of the events on every stream.
	env.srv.Dataplane().Lose(1)
	wantHealth := &vipdv1.FlowEvent{
		Type: vipdv1.FlowEventType_FLOW_EVENT_TYPE_HEALTH, Time: timestamppb.New(since), Service: "default/web",
		Backend: &vipdv1.Endpoint{Ip: "198.18.1.10", Port: 8080},
		Health: &vipdv1.BackendHealth{Ip: "198.18.1.10", State: vipdv1.HealthState_HEALTH_STATE_FAILING, SinceUnixMs: since.UnixMilli(),
			LastError: "connection refused", Consecutive: 3, Detail: "failing health check (connection refused, 3 in a row)"},
	}
	for i, tc := range cases {
		var got []string
		for {
			m := recv(t, streams[i])
			if m.GetLost() != nil {
				break
			}
			if m.GetFlow().GetType() == vipdv1.FlowEventType_FLOW_EVENT_TYPE_HEALTH {
				if diff := cmp.Diff(wantHealth, m.GetFlow(), protocmp.Transform()); diff != "" {
					t.Errorf("%s: HEALTH event (-want +got):\n%s", tc.name, diff)
				}
				got = append(got, "HEALTH")
				continue
			}
			got = append(got, describe(m))
		}
		if diff := cmp.Diff(tc.wants, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
}
