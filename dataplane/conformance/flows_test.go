package conformance

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/testkit/netlab"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

const (
	// flowWait bounds the wait for the flow events of traffic that has been
	// made: for iptables a TCP close is reported only once the kernel
	// destroys the entry, after the (shortened) TIME_WAIT.
	flowWait = 60 * time.Second
	// reapEvery is how often a wait for CLOSED events lists the flows: a
	// conntrack dump makes the kernel destroy the expired entries it
	// passes, which the garbage collector might otherwise leave for a while.
	reapEvery = 500 * time.Millisecond
	// requestBytes is the payload of a netlab request ("ping\n").
	requestBytes = 5
)

// shortConntrackTimeouts make the kernel's conntrack report closes within
// seconds rather than minutes (TIME_WAIT is 120 s by default). They are set
// in node1's namespace only, which is the env's own.
var shortConntrackTimeouts = []struct{ key, value string }{
	{"net.netfilter.nf_conntrack_tcp_timeout_time_wait", "1"},
	{"net.netfilter.nf_conntrack_tcp_timeout_close_wait", "1"},
	{"net.netfilter.nf_conntrack_tcp_timeout_fin_wait", "1"},
	{"net.netfilter.nf_conntrack_tcp_timeout_last_ack", "1"},
	{"net.netfilter.nf_conntrack_tcp_timeout_close", "1"},
	{"net.netfilter.nf_conntrack_udp_timeout", "2"},
	{"net.netfilter.nf_conntrack_udp_timeout_stream", "2"},
}

// TestFlows checks FlowService and StatusService.Explain against every
// dataplane with real traffic: each subtest, named
// <dataplane>/<scenario>, runs a fresh env of its own, in parallel with
// the others.
func TestFlows(t *testing.T) {
	netlab.RequireRoot(t)
	start := time.Now()
	t.Cleanup(func() { t.Logf("TestFlows took %v", time.Since(start).Round(time.Millisecond)) })
	for _, dp := range dataplanes() {
		t.Run(dp, func(t *testing.T) {
			for _, sc := range flowScenarios() {
				t.Run(sc.name, func(t *testing.T) {
					t.Parallel()
					sc.run(t, dp)
				})
			}
		})
	}
}

type flowScenario struct {
	name string
	run  func(t *testing.T, dp string)
}

func flowScenarios() []flowScenario {
	return []flowScenario{
		{"tcp-200-two-subscribers", flowsTCP},
		{"udp-new-and-timeout", flowsUDP},
		{"include-existing-and-list", flowsExisting},
		{"stalled-subscriber-loses-exactly", flowsStalledSubscriber},
		{"explain-affinity", explainAffinity},
		{"explain-maglev", explainMaglev},
		{"metrics", flowMetrics},
	}
}

// ---- scenarios ----

// N TCP connections through a VIP each give every subscriber exactly one
// NEW and one CLOSED event, with the tuples of the connection the client
// made and the backend that answered, and the bytes it carried. Filters
// select the right streams' events.
func flowsTCP(t *testing.T, dp string) {
	const n = 200
	e := newEnv(t, dp, "flows/tcp-200-two-subscribers")
	e.shortenConntrackTimeouts()
	vip := ap(ipv4.vip(10), 80)
	e.upsert(e.allThree(ipv4))

	bySvc := &vipdv1.WatchFlowsRequest{Filter: &vipdv1.FlowFilter{Service: svcName}}
	s1 := e.watch("stream 1 (service filter)", bySvc)
	s2 := e.watch("stream 2 (service filter)", bySvc)
	s3 := e.watch("stream 3 (VIP:port, protocol and client CIDR filter)", &vipdv1.WatchFlowsRequest{Filter: &vipdv1.FlowFilter{
		Vip: vip.String(), Protocol: vipdv1.Protocol_PROTOCOL_TCP, Client: e.lab.Node(1).PodCIDRv4().String(),
	}})
	s4 := e.watch("stream 4 (client2 only)", &vipdv1.WatchFlowsRequest{Filter: &vipdv1.FlowFilter{
		Service: svcName, Client: e.client2.v4.String(),
	}})
	e.syncWatches("tcp", vip, s1, s2, s3, s4)

	conns := e.flowConns(e.client, "tcp", vip, n, 0)
	streams := []*flowWatch{s1, s2, s3}
	e.waitFlows(fmt.Sprintf("NEW and CLOSED of %d TCP connections from client", n), streams, func(w *flowWatch) string {
		return missingFlowEvents(w.msgs(), conns, true)
	})
	for _, w := range streams {
		e.checkConnFlows(w, vip, "tcp", conns, true)
	}
	if got := flowsFrom(s4.msgs(), e.client.v4); len(got) > 0 {
		e.errorf("%s: got %d events of client %v, want none: %v", s4.name, len(got), e.client.v4, fmtEvents(got[:min(len(got), 5)]))
	}
}

// A UDP request shows a NEW event and a live flow, which later closes on
// timeout.
func flowsUDP(t *testing.T, dp string) {
	var args []string
	if dp == "ebpf" {
		args = []string{"--bpf-ct-timeout-other=2s", "--bpf-ct-gc-interval=500ms"}
	}
	e := newEnv(t, dp, "flows/udp-new-and-timeout", args...)
	e.shortenConntrackTimeouts()
	vip := ap(ipv4.vip(10), 80)
	e.upsert(e.allThree(ipv4, tcpPort(80, 8080), udpPort(80, 8080)))
	w := e.watch("UDP stream", &vipdv1.WatchFlowsRequest{Filter: &vipdv1.FlowFilter{Service: svcName, Protocol: vipdv1.Protocol_PROTOCOL_UDP}})
	e.syncWatches("udp", vip, w)

	conns := e.flowConns(e.client, "udp", vip, 1, 0)
	c := conns[0]
	e.waitFlows("NEW of a UDP request from client", []*flowWatch{w}, func(w *flowWatch) string {
		return missingFlowEvents(w.msgs(), conns, false)
	})
	newEv := eventsOf(w.msgs(), c.client)[0]
	e.checkFlowEvent(w.name, newEv, vipdv1.FlowEventType_FLOW_EVENT_TYPE_NEW, vip, "udp", c)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := e.api.ListFlows(ctx, &vipdv1.FlowFilter{Service: svcName, Protocol: vipdv1.Protocol_PROTOCOL_UDP, Client: e.client.v4.String()}, 0)
	if err != nil {
		e.fatalf("ListFlows: %v", err)
	}
	listed := ofClient(list.GetFlows(), c.client)
	if len(listed) != 1 {
		e.fatalf("ListFlows of UDP flows from client: want the flow of %v once, got %d of it among %s", c.client, len(listed), fmtEvents(list.GetFlows()))
	}
	e.checkFlowEvent("ListFlows", listed[0], vipdv1.FlowEventType_FLOW_EVENT_TYPE_EXISTING, vip, "udp", c)
	if st := listed[0].GetTcpState(); st != vipdv1.TcpState_TCP_STATE_UNSPECIFIED {
		e.errorf("ListFlows: the UDP flow of %v has tcp_state %v, want none", c.client, st)
	}
	if listed[0].GetFlowId() != newEv.GetFlowId() {
		e.errorf("ListFlows: the UDP flow of %v has flow_id %d, its NEW event %d", c.client, listed[0].GetFlowId(), newEv.GetFlowId())
	}

	e.waitFlows("CLOSED (timeout) of the UDP request from client", []*flowWatch{w}, func(w *flowWatch) string {
		return missingFlowEvents(w.msgs(), conns, true)
	})
	closed := eventsOf(w.msgs(), c.client)[1]
	e.checkFlowEvent(w.name, closed, vipdv1.FlowEventType_FLOW_EVENT_TYPE_CLOSED, vip, "udp", c)
	if closed.GetCloseReason() != "timeout" {
		e.errorf("%s: UDP flow %v closed with reason %q, want \"timeout\"", w.name, c.client, closed.GetCloseReason())
	}
	if closed.GetFlowId() != newEv.GetFlowId() {
		e.errorf("%s: UDP flow %v: CLOSED has flow_id %d, NEW %d", w.name, c.client, closed.GetFlowId(), newEv.GetFlowId())
	}
}

// A connection that is open when a stream starts comes first as EXISTING
// with include_existing, and ListFlows shows it, with the flow_id of its
// NEW event, its counters so far and its TCP state, ESTABLISHED; filters
// on the backend select it.
func flowsExisting(t *testing.T, dp string) {
	e := newEnv(t, dp, "flows/include-existing-and-list")
	e.shortenConntrackTimeouts()
	vip := ap(ipv4.vip(10), 80)
	e.upsert(e.allThree(ipv4))
	bySvc := &vipdv1.FlowFilter{Service: svcName}
	before := e.watch("stream opened before the connection", &vipdv1.WatchFlowsRequest{Filter: bySvc})
	e.syncWatches("tcp", vip, before)

	conn := e.dial(e.client, "tcp", vip)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := conn.Request(ctx)
	if err != nil {
		e.fatalf("request on a connection to %v from client: %v", vip, err)
	}
	c := e.flowConnOf(r)
	conns := []flowConn{c}
	e.waitFlows("NEW of the long-lived connection", []*flowWatch{before}, func(w *flowWatch) string {
		return missingFlowEvents(w.msgs(), conns, false)
	})
	id := eventsOf(before.msgs(), c.client)[0].GetFlowId()

	after := e.watch("stream with include_existing", &vipdv1.WatchFlowsRequest{Filter: bySvc, IncludeExisting: true})
	e.waitFor("EXISTING of the long-lived connection", []*flowWatch{after}, func(w *flowWatch) string {
		if len(eventsOf(w.msgs(), c.client)) == 0 {
			return fmt.Sprintf("no event of %v", c.client)
		}
		return ""
	})
	if evs := eventsOf(after.msgs(), c.client); len(evs) != 1 {
		e.errorf("%s: want one event of %v (EXISTING), got %s", after.name, c.client, fmtEvents(evs))
	} else {
		e.checkFlowEvent(after.name, evs[0], vipdv1.FlowEventType_FLOW_EVENT_TYPE_EXISTING, vip, "tcp", c)
		if st := evs[0].GetTcpState(); st != vipdv1.TcpState_TCP_STATE_ESTABLISHED {
			e.errorf("%s: EXISTING of the open connection of %v has tcp_state %v, want ESTABLISHED", after.name, c.client, st)
		}
		if evs[0].GetFlowId() != id {
			e.errorf("%s: EXISTING of %v has flow_id %d, its NEW %d", after.name, c.client, evs[0].GetFlowId(), id)
		}
	}

	list := func(f *vipdv1.FlowFilter) []*vipdv1.FlowEvent {
		e.t.Helper()
		resp, err := e.api.ListFlows(ctx, f, 0)
		if err != nil {
			e.fatalf("ListFlows %v: %v", f, err)
		}
		return ofClient(resp.GetFlows(), c.client)
	}
	if evs := list(bySvc); len(evs) != 1 {
		e.errorf("ListFlows {service %s}: want the flow of %v once, got %s", svcName, c.client, fmtEvents(evs))
	} else {
		e.checkFlowEvent("ListFlows", evs[0], vipdv1.FlowEventType_FLOW_EVENT_TYPE_EXISTING, vip, "tcp", c)
		if st := evs[0].GetTcpState(); st != vipdv1.TcpState_TCP_STATE_ESTABLISHED {
			e.errorf("ListFlows: the open connection of %v has tcp_state %v, want ESTABLISHED", c.client, st)
		}
		if evs[0].GetFlowId() != id {
			e.errorf("ListFlows: the flow of %v has flow_id %d, its NEW %d", c.client, evs[0].GetFlowId(), id)
		}
	}
	for _, h := range []host{e.be1, e.be2, e.be3} {
		f := &vipdv1.FlowFilter{Backend: ap(h.v4, 8080).String(), Client: e.client.v4.String() + "/32"}
		got, want := len(list(f)), 0
		if h.v4 == c.backend.Addr() {
			want = 1
		}
		if got != want {
			e.errorf("ListFlows {backend %s, client %s}: %d flows of %v, want %d (it went to %v)", f.Backend, f.Client, got, c.client, want, c.backend)
		}
	}

	conn.Close()
	e.waitFlows("CLOSED of the long-lived connection", []*flowWatch{before, after}, func(w *flowWatch) string {
		for _, ev := range eventsOf(w.msgs(), c.client) {
			if ev.GetType() == vipdv1.FlowEventType_FLOW_EVENT_TYPE_CLOSED {
				return ""
			}
		}
		return fmt.Sprintf("no CLOSED of %v", c.client)
	})
	for _, w := range []*flowWatch{before, after} {
		evs := eventsOf(w.msgs(), c.client)
		ev := evs[len(evs)-1]
		e.checkFlowEvent(w.name, ev, vipdv1.FlowEventType_FLOW_EVENT_TYPE_CLOSED, vip, "tcp", c)
		if ev.GetFlowId() != id {
			e.errorf("%s: CLOSED of %v has flow_id %d, its NEW %d", w.name, c.client, ev.GetFlowId(), id)
		}
		e.expectNoLoss(w)
	}
}

// A stream that is not read while its buffer (--flow-buffer) overflows is
// told exactly how many events it missed; another stream, read at once,
// misses nothing.
//
// Both streams take NEW events only, which come at the pace of the
// connections. (CLOSED events come in bursts for iptables, as a conntrack
// dump or garbage collection destroys hundreds of expired entries at once:
// more than a 64-event buffer takes, however fast its stream is read.) And
// vipd's buffer is not all that stands between the kernel and a stalled
// reader: the stream's gRPC flow-control window (64 KiB, fixed here) and
// vipd's gRPC write quota for it (64 KiB) hold over a thousand more NEW
// events. So the test makes well over that many connections, paced so
// that B keeps up with a buffer of 64 on a busy machine.
func flowsStalledSubscriber(t *testing.T, dp string) {
	const (
		buffer = 64
		n      = 2500
		rate   = 500 // connections per second, at most
	)
	e := newEnv(t, dp, "flows/stalled-subscriber-loses-exactly", "--flow-buffer", strconv.Itoa(buffer))
	vip := ap(ipv4.vip(10), 80)
	e.upsert(e.allThree(ipv4))

	// A gets a connection of its own with fixed 64 KiB windows, so that
	// what it holds unread does not depend on gRPC's bandwidth estimate.
	slow, err := client.New("unix://"+e.vipd.socket, client.WithDialOptions(
		grpc.WithInitialWindowSize(1<<16), grpc.WithInitialConnWindowSize(1<<16)))
	if err != nil {
		e.fatalf("vipd client: %v", err)
	}
	t.Cleanup(func() { slow.Close() })
	req := &vipdv1.WatchFlowsRequest{
		Filter: &vipdv1.FlowFilter{Service: svcName},
		Types:  []vipdv1.FlowEventType{vipdv1.FlowEventType_FLOW_EVENT_TYPE_NEW},
	}
	a := e.watchOn(slow, "stalled stream A", req)
	b := e.watch("stream B", req)
	// The window both are compared over starts after a probe's NEW event.
	e.syncWatches("tcp", vip, a, b)
	a.pause()

	start := time.Now()
	conns := e.flowConns(e.client, "tcp", vip, n, rate)
	e.logf("%d connections in %v", n, time.Since(start).Round(time.Millisecond))
	e.waitFor(fmt.Sprintf("stream B: NEW of %d connections", n), []*flowWatch{b}, func(w *flowWatch) string {
		if l := w.tally(); l.lostSubscriber > 0 || l.lostKernel > 0 {
			return "" // reported below
		}
		return missingFlowEvents(w.msgs(), conns, false)
	})
	e.settle(b, 300*time.Millisecond, false)
	bs := b.tally()
	if bs.lostSubscriber > 0 || bs.lostKernel > 0 {
		e.errorf("stream B, read at once: lost %d events in its buffer and %d in the kernel, want none (buffer %d, %d connections at up to %d/s)",
			bs.lostSubscriber, bs.lostKernel, buffer, n, rate)
	}
	e.checkConnFlows(b, vip, "tcp", conns, false)

	a.resume()
	var as flowTally
	deadline := time.Now().Add(20 * time.Second)
	for {
		as = a.tally()
		if as.flows+int(as.lostSubscriber) >= bs.flows+int(bs.lostSubscriber) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Whatever else A is going to get is already on its way.
	time.Sleep(300 * time.Millisecond)
	as = a.tally()
	e.logf("stalled stream A: %d events delivered + %d reported lost (in %d LostEvents); stream B: %d delivered + %d lost",
		as.flows, as.lostSubscriber, as.lostMsgs, bs.flows, bs.lostSubscriber)
	if as.lostSubscriber == 0 {
		e.fatalf("stalled stream A lost nothing: all %d events fit vipd's buffer of %d and gRPC's windows; make more than %d connections",
			as.flows, buffer, n)
	}
	// Exact: the events A got and was told it lost are all that happened,
	// which is what B got (and B's own losses, should there be any).
	if as.flows+int(as.lostSubscriber) != bs.flows+int(bs.lostSubscriber) {
		e.errorf("stalled stream A: %d events delivered + %d reported lost = %d, want exactly the %d events that stream B got (+ %d it lost)",
			as.flows, as.lostSubscriber, as.flows+int(as.lostSubscriber), bs.flows, bs.lostSubscriber)
	}
	if as.lostKernel != bs.lostKernel {
		e.errorf("stream A was told of %d events lost in the kernel, stream B of %d: want the same", as.lostKernel, bs.lostKernel)
	}
	// What A did get is in B's order, nothing made up.
	if bs.lostSubscriber == 0 {
		if i, ok := isSubsequence(a.window(), b.window()); !ok {
			e.errorf("stalled stream A's event %d (%s) is not among stream B's events in order", i, fmtEvent(a.window()[i]))
		}
	}
}

// Explain reports the client's session-affinity entry: the backend a real
// connection got, with time left, and predicts the next connection.
func explainAffinity(t *testing.T, dp string) {
	const timeout = 60 // seconds
	e := newEnv(t, dp, "flows/explain-affinity")
	vip := ap(ipv4.vip(10), 80)
	svc := e.allThree(ipv4)
	svc.SessionAffinity = &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP, TimeoutSeconds: timeout}
	e.upsert(svc)
	explain := func(h host) *vipdv1.ExplainResponse {
		e.t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := e.api.Explain(ctx, &vipdv1.ExplainRequest{ClientIp: h.v4.String(), Vip: vip.Addr().String(), Port: uint32(vip.Port()), Protocol: vipdv1.Protocol_PROTOCOL_TCP})
		if err != nil {
			e.fatalf("Explain %s -> %v: %v", h.name, vip, err)
		}
		return resp
	}
	if resp := explain(e.client); resp.GetAffinity().GetPresent() {
		e.errorf("Explain client -> %v before any connection: want no affinity entry, got %v", vip, resp.GetAffinity())
	}

	r, err := request(e.client, "tcp", vip, replyDeadline)
	if err != nil {
		e.fatalf("TCP %v from client: %v", vip, err)
	}
	got := e.flowConnOf(r).backend
	resp := explain(e.client)
	aff := resp.GetAffinity()
	switch {
	case resp.GetService() != svcName || resp.GetPort().GetPort() != uint32(vip.Port()):
		e.errorf("Explain client -> %v: service %q port %d, want %q port %d", vip, resp.GetService(), resp.GetPort().GetPort(), svcName, vip.Port())
	case !aff.GetPresent():
		e.errorf("Explain client -> %v after a connection answered by %v: no affinity entry (summary: %s)", vip, got, resp.GetSummary())
	case endpointOf(aff.GetBackend()) != got:
		e.errorf("Explain client -> %v: affinity backend %v, but the connection was answered by %v", vip, endpointOf(aff.GetBackend()), got)
	case aff.GetRemaining().AsDuration() <= 0 || aff.GetRemaining().AsDuration() > timeout*time.Second:
		e.errorf("Explain client -> %v: affinity remaining %v, want in (0, %ds]", vip, aff.GetRemaining().AsDuration(), timeout)
	case endpointOf(resp.GetWouldPick()) != got:
		e.errorf("Explain client -> %v: would pick %v, want the affinity backend %v", vip, endpointOf(resp.GetWouldPick()), got)
	}
	// And the prediction holds.
	for i := range 10 {
		r, err := request(e.client, "tcp", vip, replyDeadline)
		if err != nil {
			e.fatalf("TCP %v from client: %v", vip, err)
		}
		if b := e.flowConnOf(r).backend; b != got {
			e.fatalf("TCP %v from client: connection %d went to %v, but Explain said %v (affinity)", vip, i+2, b, got)
		}
	}
	if resp := explain(e.client2); resp.GetAffinity().GetPresent() {
		e.errorf("Explain client2 -> %v, which never connected: want no affinity entry, got %v", vip, resp.GetAffinity())
	}
}

// For Maglev, Explain with the exact client port predicts the backend of a
// real connection from that port.
func explainMaglev(t *testing.T, dp string) {
	e := newEnv(t, dp, "flows/explain-maglev")
	e.requireLoadBalancing(vipdv1.LoadBalancing_LOAD_BALANCING_MAGLEV)
	vip := ap(ipv4.vip(10), 80)
	svc := e.allThree(ipv4)
	svc.LoadBalancing = vipdv1.LoadBalancing_LOAD_BALANCING_MAGLEV
	e.upsert(svc)
	counts := map[string]int{}
	for i := range 8 {
		// Below the namespace's ephemeral range, so no other socket has it.
		port := uint16(20000 + 997*i)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := e.api.Explain(ctx, &vipdv1.ExplainRequest{ClientIp: e.client.v4.String(), ClientPort: uint32(port),
			Vip: vip.Addr().String(), Port: uint32(vip.Port()), Protocol: vipdv1.Protocol_PROTOCOL_TCP})
		cancel()
		if err != nil {
			e.fatalf("Explain client:%d -> %v: %v", port, vip, err)
		}
		want := endpointOf(resp.GetWouldPick())
		if !want.IsValid() {
			e.fatalf("Explain client:%d -> %v (Maglev): no would_pick (summary: %s)", port, vip, resp.GetSummary())
		}
		r, err := request(e.client, "tcp", vip, replyDeadline, netlab.WithLocalPort(port))
		if err != nil {
			e.fatalf("TCP %v from client port %d: %v", vip, port, err)
		}
		c := e.flowConnOf(r)
		if c.client.Port() != port {
			e.fatalf("TCP %v: asked for client port %d, the connection used %v", vip, port, c.client)
		}
		if c.backend != want {
			e.errorf("Maglev: Explain client:%d -> %v predicted %v, the connection from that port got %v", port, vip, want, c.backend)
		}
		counts[c.echo]++
	}
	e.logf("Maglev picks of 8 client ports, each as Explain predicted: %s", fmtCounts(counts))
}

// The metrics endpoint counts the flows of real traffic and the services.
//
// vipd runs in the machine's namespace and programs node1's from there, so
// its metrics listener is on the machine's loopback, at a port that was
// free: the scrape is the one exchange of this package outside netlab
// namespaces, and no traffic of the dataplane's.
func flowMetrics(t *testing.T, dp string) {
	const n = 20
	addr := freeLocalAddr(t)
	e := newEnv(t, dp, "flows/metrics", "--metrics-addr", addr)
	e.shortenConntrackTimeouts()
	vip := ap(ipv4.vip(10), 80)
	e.upsert(e.allThree(ipv4))
	if code, body := httpGet(e, "http://"+addr+"/readyz"); code != http.StatusOK {
		e.fatalf("GET /readyz: %d %q, want 200", code, body)
	}

	e.flowConns(e.client, "tcp", vip, n, 0)
	newSel := map[string]string{"service": svcName, "event": "new"}
	closedSel := map[string]string{"service": svcName, "event": "closed"}
	var samples []sample
	deadline := time.Now().Add(flowWait)
	for {
		samples = e.scrape(addr)
		nNew, _ := sampleValue(samples, "vipd_flows_total", newSel)
		nClosed, _ := sampleValue(samples, "vipd_flows_total", closedSel)
		if nNew >= n && nClosed >= n {
			break
		}
		if time.Now().After(deadline) {
			e.fatalf("after %v, vipd_flows_total counts %v new and %v closed flows of %s, want %d of each\n%s",
				flowWait, nNew, nClosed, svcName, n, grepSamples(samples, "vipd_flows_total", "vipd_active_flows", "vipd_flow_events_lost_total"))
		}
		e.reapFlows()
		time.Sleep(reapEvery)
	}
	// Nothing else made traffic through the VIP: exactly n of each.
	for _, c := range []struct {
		name string
		sel  map[string]string
		want float64
	}{
		{"vipd_flows_total", newSel, n},
		{"vipd_flows_total", closedSel, n},
		{"vipd_active_flows", map[string]string{"service": svcName}, 0},
		{"vipd_services", nil, 1},
		{"vipd_backends", nil, 3},
	} {
		if got, ok := sampleValue(samples, c.name, c.sel); !ok || got != c.want {
			e.errorf("%s%v = %v (present %v), want %v", c.name, c.sel, got, ok, c.want)
		}
	}
	for _, s := range samples {
		if s.name == "vipd_flow_events_lost_total" && s.value != 0 {
			e.errorf("%s%v = %v, want 0: nobody was slow", s.name, s.labels, s.value)
		}
	}
	if _, ok := sampleValue(samples, "vipd_build_info", nil); !ok {
		e.errorf("no vipd_build_info in /metrics")
	}
	if code, body := httpGet(e, "http://"+addr+"/healthz"); code != http.StatusOK {
		e.errorf("GET /healthz: %d %q, want 200", code, body)
	}
}

// ---- traffic and its flows ----

// shortenConntrackTimeouts makes the iptables dataplane report closes
// within seconds: it reports a close when the kernel destroys the entry.
// The eBPF dataplane reports a TCP close at the first FIN or RST.
func (e *env) shortenConntrackTimeouts() {
	e.t.Helper()
	if e.dp != "iptables" {
		return
	}
	for _, s := range shortConntrackTimeouts {
		if err := e.node1.SetSysctl(s.key, s.value); err != nil {
			e.fatalf("%v", err)
		}
	}
}

// flowConn is one connection (or UDP request) the test made, as the client
// and the echo server saw it.
type flowConn struct {
	client   netip.AddrPort // the client socket
	echo     string         // the echo server that answered
	backend  netip.AddrPort // that server's address and port
	received int            // reply payload bytes
}

// flowConnOf returns the connection of reply r; its backend must be one of
// the env's IPv4 echo servers.
func (e *env) flowConnOf(r netlab.Reply) flowConn {
	e.t.Helper()
	c := flowConn{client: r.Local, echo: r.Backend, received: len(r.Backend) + 1 + len(r.Peer.String()) + 1}
	for _, h := range []host{e.be1, e.be2, e.be3, e.be4} {
		for _, p := range echoPorts {
			if h.echo(p) == r.Backend {
				c.backend = ap(h.v4, p)
			}
		}
	}
	if !c.backend.IsValid() {
		e.fatalf("reply from unknown echo server %q", r.Backend)
	}
	return c
}

// flowConns makes n requests from h to vip over proto ("tcp" or "udp"),
// one after the other, at most rate a second (0: as fast as they go), and
// returns them in order. Each must be answered.
func (e *env) flowConns(h host, proto string, vip netip.AddrPort, n, rate int) []flowConn {
	e.t.Helper()
	conns := make([]flowConn, 0, n)
	start := time.Now()
	for i := range n {
		if rate > 0 {
			time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))))
		}
		r, err := request(h, proto, vip, replyDeadline)
		if err != nil {
			e.fatalf("%s %v from %s: request %d of %d: %v", upper(proto), vip, h.name, i+1, n, err)
		}
		if r.Local.Addr() != h.v4 {
			e.fatalf("%s %v from %s: the client socket is %v, want an address of %v", upper(proto), vip, h.name, r.Local, h.v4)
		}
		conns = append(conns, e.flowConnOf(r))
	}
	return conns
}

// reapFlows lists every flow, which for iptables makes the kernel destroy
// the expired conntrack entries the dump passes (and report their closes).
func (e *env) reapFlows() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.api.ListFlows(ctx, nil, 0); err != nil {
		e.logf("ListFlows (to reap expired flows): %v", err)
	}
}

// eventsOf returns the flow events of client in msgs, in order.
func eventsOf(msgs []*vipdv1.WatchFlowsResponse, client netip.AddrPort) []*vipdv1.FlowEvent {
	var evs []*vipdv1.FlowEvent
	for _, m := range msgs {
		if ev := m.GetFlow(); ev != nil {
			evs = append(evs, ev)
		}
	}
	return ofClient(evs, client)
}

// ofClient returns the events of client, in order.
func ofClient(evs []*vipdv1.FlowEvent, client netip.AddrPort) []*vipdv1.FlowEvent {
	var out []*vipdv1.FlowEvent
	for _, ev := range evs {
		if endpointOf(ev.GetClient()) == client {
			out = append(out, ev)
		}
	}
	return out
}

// flowsFrom returns the flow events whose client address is a.
func flowsFrom(msgs []*vipdv1.WatchFlowsResponse, a netip.Addr) []*vipdv1.FlowEvent {
	var out []*vipdv1.FlowEvent
	for _, m := range msgs {
		if ev := m.GetFlow(); ev != nil && endpointOf(ev.GetClient()).Addr() == a {
			out = append(out, ev)
		}
	}
	return out
}

// missingFlowEvents says which of conns lack a NEW event in msgs (and,
// with closed, a CLOSED one), or "" when none does.
func missingFlowEvents(msgs []*vipdv1.WatchFlowsResponse, conns []flowConn, closed bool) string {
	have := map[netip.AddrPort][2]int{}
	for _, m := range msgs {
		ev := m.GetFlow()
		if ev == nil {
			continue
		}
		c := have[endpointOf(ev.GetClient())]
		switch ev.GetType() {
		case vipdv1.FlowEventType_FLOW_EVENT_TYPE_NEW:
			c[0]++
		case vipdv1.FlowEventType_FLOW_EVENT_TYPE_CLOSED:
			c[1]++
		}
		have[endpointOf(ev.GetClient())] = c
	}
	var noNew, noClosed []string
	for _, c := range conns {
		if have[c.client][0] == 0 {
			noNew = append(noNew, c.client.String())
		}
		if closed && have[c.client][1] == 0 {
			noClosed = append(noClosed, c.client.String())
		}
	}
	if len(noNew) == 0 && len(noClosed) == 0 {
		return ""
	}
	return fmt.Sprintf("%d of %d flows without NEW %s, %d without CLOSED %s",
		len(noNew), len(conns), fmtFew(noNew), len(noClosed), fmtFew(noClosed))
}

func fmtFew(s []string) string {
	if len(s) > 8 {
		return fmt.Sprintf("%v... (%d more)", s[:8], len(s)-8)
	}
	return fmt.Sprint(s)
}

// checkConnFlows requires w to hold, for each of conns, exactly one NEW
// event and, with closed, one CLOSED event after it, with the same flow_id
// and the connection's tuples; and no other event of the client, nor any
// loss.
func (e *env) checkConnFlows(w *flowWatch, vip netip.AddrPort, proto string, conns []flowConn, closed bool) {
	e.t.Helper()
	msgs := w.msgs()
	e.expectNoLoss(w)
	client := conns[0].client.Addr()
	byClient := map[netip.AddrPort][]*vipdv1.FlowEvent{}
	for _, ev := range flowsFrom(msgs, client) {
		k := endpointOf(ev.GetClient())
		byClient[k] = append(byClient[k], ev)
	}
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	ids := map[uint64]netip.AddrPort{}
	for _, c := range conns {
		evs := byClient[c.client]
		delete(byClient, c.client)
		if !closed {
			if len(evs) != 1 || evs[0].GetType() != vipdv1.FlowEventType_FLOW_EVENT_TYPE_NEW {
				bad("%v: want one NEW, got %s", c.client, fmtEvents(evs))
				continue
			}
		} else {
			if len(evs) != 2 || evs[0].GetType() != vipdv1.FlowEventType_FLOW_EVENT_TYPE_NEW ||
				evs[1].GetType() != vipdv1.FlowEventType_FLOW_EVENT_TYPE_CLOSED {
				bad("%v: want NEW then CLOSED, got %s", c.client, fmtEvents(evs))
				continue
			}
			if evs[0].GetFlowId() != evs[1].GetFlowId() {
				bad("%v: NEW has flow_id %d, CLOSED %d", c.client, evs[0].GetFlowId(), evs[1].GetFlowId())
			}
			if r := evs[1].GetCloseReason(); proto == "tcp" && r != "fin" {
				bad("%v: close reason %q, want \"fin\" (the client closed after the reply)", c.client, r)
			}
		}
		if other, ok := ids[evs[0].GetFlowId()]; ok {
			bad("%v and %v: both flow_id %d", other, c.client, evs[0].GetFlowId())
		}
		ids[evs[0].GetFlowId()] = c.client
		for _, ev := range evs {
			if p := flowEventProblem(ev, ev.GetType(), vip, proto, c); p != "" {
				bad("%v: %s", c.client, p)
			}
		}
	}
	for k, evs := range byClient {
		bad("%v: events of a connection the test did not make: %s", k, fmtEvents(evs))
	}
	if len(problems) > 0 {
		slices.Sort(problems)
		e.errorf("%s: %d problems with the flow events of %d %s connections from %v:\n  %s",
			w.name, len(problems), len(conns), upper(proto), client, head(strings.Join(problems, "\n  "), 20))
	}
}

// checkFlowEvent requires ev to be an event of type t of connection c to
// vip over proto.
func (e *env) checkFlowEvent(what string, ev *vipdv1.FlowEvent, t vipdv1.FlowEventType, vip netip.AddrPort, proto string, c flowConn) {
	e.t.Helper()
	if p := flowEventProblem(ev, t, vip, proto, c); p != "" {
		e.errorf("%s: %s", what, p)
	}
}

// flowEventProblem says what is wrong with ev as an event of type t of
// connection c to vip over proto, or "" when nothing is. Counters are
// checked on CLOSED and EXISTING events: at least the payload each way.
func flowEventProblem(ev *vipdv1.FlowEvent, t vipdv1.FlowEventType, vip netip.AddrPort, proto string, c flowConn) string {
	var p []string
	if ev.GetType() != t {
		p = append(p, fmt.Sprintf("type %v, want %v", ev.GetType(), t))
	}
	if got := endpointOf(ev.GetClient()); got != c.client {
		p = append(p, fmt.Sprintf("client %v, want %v", got, c.client))
	}
	if got := endpointOf(ev.GetVip()); got != vip {
		p = append(p, fmt.Sprintf("vip %v, want %v", got, vip))
	}
	if got := endpointOf(ev.GetBackend()); got != c.backend {
		p = append(p, fmt.Sprintf("backend %v, want %v (%s answered)", got, c.backend, c.echo))
	}
	if ev.GetService() != svcName || ev.GetPortName() != proto {
		p = append(p, fmt.Sprintf("service %q port %q, want %q port %q", ev.GetService(), ev.GetPortName(), svcName, proto))
	}
	if want := protocolOf(proto); ev.GetProtocol() != want {
		p = append(p, fmt.Sprintf("protocol %v, want %v", ev.GetProtocol(), want))
	}
	if ev.GetFlowId() == 0 {
		p = append(p, "flow_id 0")
	}
	if ev.GetTime() == nil {
		p = append(p, "no time")
	}
	if t == vipdv1.FlowEventType_FLOW_EVENT_TYPE_CLOSED || t == vipdv1.FlowEventType_FLOW_EVENT_TYPE_EXISTING {
		if ev.GetBytesToBackend() < requestBytes || ev.GetPacketsToBackend() == 0 {
			p = append(p, fmt.Sprintf("%d bytes in %d packets to the backend, want at least the %d-byte request",
				ev.GetBytesToBackend(), ev.GetPacketsToBackend(), requestBytes))
		}
		if ev.GetBytesToClient() < uint64(c.received) || ev.GetPacketsToClient() == 0 {
			p = append(p, fmt.Sprintf("%d bytes in %d packets to the client, want at least the %d-byte reply",
				ev.GetBytesToClient(), ev.GetPacketsToClient(), c.received))
		}
	}
	if t == vipdv1.FlowEventType_FLOW_EVENT_TYPE_CLOSED && ev.GetDuration().AsDuration() <= 0 {
		p = append(p, fmt.Sprintf("duration %v, want > 0", ev.GetDuration().AsDuration()))
	}
	if len(p) == 0 {
		return ""
	}
	return strings.Join(p, "; ") + " (event: " + fmtEvent(ev) + ")"
}

func protocolOf(proto string) vipdv1.Protocol {
	switch proto {
	case "udp":
		return vipdv1.Protocol_PROTOCOL_UDP
	case "sctp":
		return vipdv1.Protocol_PROTOCOL_SCTP
	}
	return vipdv1.Protocol_PROTOCOL_TCP
}

func endpointOf(ep *vipdv1.Endpoint) netip.AddrPort {
	a, err := netip.ParseAddr(ep.GetIp())
	if err != nil {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(a.Unmap(), uint16(ep.GetPort()))
}

func fmtEvent(ev *vipdv1.FlowEvent) string {
	s := fmt.Sprintf("%s #%d %s %v -> %v -> %v (%s:%s)",
		strings.TrimPrefix(ev.GetType().String(), "FLOW_EVENT_TYPE_"), ev.GetFlowId(),
		strings.TrimPrefix(ev.GetProtocol().String(), "PROTOCOL_"),
		endpointOf(ev.GetClient()), endpointOf(ev.GetVip()), endpointOf(ev.GetBackend()), ev.GetService(), ev.GetPortName())
	if ev.GetType() != vipdv1.FlowEventType_FLOW_EVENT_TYPE_NEW {
		s += fmt.Sprintf(" %s %dp/%dB to backend %dp/%dB to client %v",
			ev.GetCloseReason(), ev.GetPacketsToBackend(), ev.GetBytesToBackend(), ev.GetPacketsToClient(), ev.GetBytesToClient(),
			ev.GetDuration().AsDuration())
	}
	return s
}

func fmtEvents(evs []*vipdv1.FlowEvent) string {
	if len(evs) == 0 {
		return "[]"
	}
	var parts []string
	for _, ev := range evs {
		parts = append(parts, fmtEvent(ev))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// isSubsequence reports whether the flow events of sub appear in all in
// the same order; if not, it returns the index in sub of the first that
// does not. Events compare by type and flow (flow_id and client).
func isSubsequence(sub, all []*vipdv1.FlowEvent) (int, bool) {
	j := 0
	for i, ev := range sub {
		for j < len(all) && !(all[j].GetType() == ev.GetType() && all[j].GetFlowId() == ev.GetFlowId() &&
			endpointOf(all[j].GetClient()) == endpointOf(ev.GetClient())) {
			j++
		}
		if j == len(all) {
			return i, false
		}
		j++
	}
	return 0, true
}

// ---- streams ----

// flowWatch is an open WatchFlows stream, read into memory by a goroutine
// of its own unless paused.
type flowWatch struct {
	name string

	mu     sync.Mutex
	cond   *sync.Cond
	paused bool
	all    []*vipdv1.WatchFlowsResponse
	err    error // why Recv ended
	// mark is where the stream's comparable part starts: after the
	// probe's NEW event (see syncWatches).
	mark int
}

// watch opens a stream on the env's client; it ends with the scenario.
func (e *env) watch(name string, req *vipdv1.WatchFlowsRequest) *flowWatch {
	e.t.Helper()
	return e.watchOn(e.api, name, req)
}

// watchOn opens a stream on api.
func (e *env) watchOn(api *client.Client, name string, req *vipdv1.WatchFlowsRequest) *flowWatch {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := api.WatchFlows(ctx, req)
	if err != nil {
		cancel()
		e.fatalf("WatchFlows (%s) %v: %v", name, req, err)
	}
	w := &flowWatch{name: name}
	w.cond = sync.NewCond(&w.mu)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			w.mu.Lock()
			for w.paused {
				w.cond.Wait()
			}
			w.mu.Unlock()
			m, err := stream.Recv()
			w.mu.Lock()
			if err != nil {
				w.err = err
				w.mu.Unlock()
				return
			}
			w.all = append(w.all, m)
			w.mu.Unlock()
		}
	}()
	e.t.Cleanup(func() {
		cancel()
		w.resume()
		<-done
	})
	return w
}

// pause stops reading the stream, after the Recv in progress if any.
func (w *flowWatch) pause() {
	w.mu.Lock()
	w.paused = true
	w.mu.Unlock()
}

func (w *flowWatch) resume() {
	w.mu.Lock()
	w.paused = false
	w.cond.Broadcast()
	w.mu.Unlock()
}

// msgs returns what the stream got so far.
func (w *flowWatch) msgs() []*vipdv1.WatchFlowsResponse {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.all)
}

// failure returns the error that ended the stream, if any.
func (w *flowWatch) failure() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil || errors.Is(w.err, io.EOF) {
		return w.err
	}
	return fmt.Errorf("%s ended: %w", w.name, w.err)
}

// window returns the flow events after the mark.
func (w *flowWatch) window() []*vipdv1.FlowEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	var evs []*vipdv1.FlowEvent
	for _, m := range w.all[w.mark:] {
		if ev := m.GetFlow(); ev != nil {
			evs = append(evs, ev)
		}
	}
	return evs
}

// flowTally counts a stream's messages after its mark.
type flowTally struct {
	flows, lostMsgs            int
	lostSubscriber, lostKernel uint64
}

func (w *flowWatch) tally() flowTally {
	w.mu.Lock()
	defer w.mu.Unlock()
	var t flowTally
	for _, m := range w.all[w.mark:] {
		if l := m.GetLost(); l != nil {
			t.lostMsgs++
			if l.GetSource() == vipdv1.LostEventsSource_LOST_EVENTS_SOURCE_KERNEL {
				t.lostKernel += l.GetCount()
			} else {
				t.lostSubscriber += l.GetCount()
			}
			continue
		}
		t.flows++
	}
	return t
}

// expectNoLoss fails the scenario if w was told of lost events.
func (e *env) expectNoLoss(w *flowWatch) {
	e.t.Helper()
	for _, m := range w.msgs() {
		if l := m.GetLost(); l != nil {
			e.errorf("%s: LostEvents %v (count %d), want none", w.name, l.GetSource(), l.GetCount())
		}
	}
}

// syncWatches makes requests from client2 to vip over proto until one
// request's NEW event reaches every stream in ws. A stream that has it was
// subscribed before it happened (which WatchFlows returning does not
// promise), so it gets every event after it: each stream's mark is set
// there. Scenarios tell the probes apart by their client, client2.
func (e *env) syncWatches(proto string, vip netip.AddrPort, ws ...*flowWatch) {
	e.t.Helper()
	const (
		probeWait = 250 * time.Millisecond
		syncWait  = 15 * time.Second
	)
	newOf := func(w *flowWatch, client netip.AddrPort) int {
		w.mu.Lock()
		defer w.mu.Unlock()
		for i, m := range w.all {
			if ev := m.GetFlow(); ev.GetType() == vipdv1.FlowEventType_FLOW_EVENT_TYPE_NEW && endpointOf(ev.GetClient()) == client {
				return i
			}
		}
		return -1
	}
	deadline := time.Now().Add(syncWait)
	for probes := 1; ; probes++ {
		r, err := request(e.client2, proto, vip, replyDeadline)
		if err != nil {
			e.fatalf("probe %s %v from client2: %v", upper(proto), vip, err)
		}
		for end := time.Now().Add(probeWait); ; {
			var missing []string
			for _, w := range ws {
				if err := w.failure(); err != nil {
					e.fatalf("syncing the streams: %v", err)
				}
				if newOf(w, r.Local) < 0 {
					missing = append(missing, w.name)
				}
			}
			if len(missing) == 0 {
				for _, w := range ws {
					i := newOf(w, r.Local)
					w.mu.Lock()
					w.mark = i + 1
					w.mu.Unlock()
				}
				return
			}
			if time.Now().After(deadline) {
				e.fatalf("after %d probes %s %v from client2 in %v, streams %v never got the NEW event of one (the last from %v)\nlive flows through the VIPs: %s",
					probes, upper(proto), vip, syncWait, missing, r.Local, e.liveFlows())
			}
			if time.Now().After(end) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// waitFlows waits until missing returns "" for every stream, listing the
// flows every reapEvery (see reapFlows), for up to flowWait. On timeout it
// fails the scenario with what each stream misses and the live flows.
func (e *env) waitFlows(what string, ws []*flowWatch, missing func(*flowWatch) string) {
	e.t.Helper()
	e.waitUntil(what, ws, missing, true)
}

// waitFor is waitFlows without listing flows, for events that need no
// reaping.
func (e *env) waitFor(what string, ws []*flowWatch, missing func(*flowWatch) string) {
	e.t.Helper()
	e.waitUntil(what, ws, missing, false)
}

func (e *env) waitUntil(what string, ws []*flowWatch, missing func(*flowWatch) string, reap bool) {
	e.t.Helper()
	start := time.Now()
	deadline := start.Add(flowWait)
	nextReap := start.Add(reapEvery)
	for {
		var left []string
		for _, w := range ws {
			if err := w.failure(); err != nil {
				e.fatalf("waiting for %s: %v", what, err)
			}
			if m := missing(w); m != "" {
				left = append(left, w.name+": "+m)
			}
		}
		if len(left) == 0 {
			e.logf("%s: took %v", what, time.Since(start).Round(time.Millisecond))
			return
		}
		now := time.Now()
		if now.After(deadline) {
			e.fatalf("waiting for %s: still missing after %v:\n  %s\nlive flows through the VIPs: %s",
				what, flowWait, strings.Join(left, "\n  "), e.liveFlows())
		}
		if reap && now.After(nextReap) {
			e.reapFlows()
			nextReap = time.Now().Add(reapEvery)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// settle waits until w's message count has not changed for quiet (with
// reap, listing flows meanwhile, so that expired ones close), and returns
// it.
func (e *env) settle(w *flowWatch, quiet time.Duration, reap bool) int {
	e.t.Helper()
	deadline := time.Now().Add(flowWait)
	n, since := len(w.msgs()), time.Now()
	for time.Since(since) < quiet {
		if time.Now().After(deadline) {
			e.fatalf("%s: still getting events after %v", w.name, flowWait)
		}
		if reap {
			e.reapFlows()
		}
		time.Sleep(100 * time.Millisecond)
		if m := len(w.msgs()); m != n {
			n, since = m, time.Now()
		}
	}
	return n
}

// liveFlows describes what ListFlows returns now, for failure messages.
func (e *env) liveFlows() string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := e.api.ListFlows(ctx, nil, 50)
	if err != nil {
		return err.Error()
	}
	s := fmt.Sprintf("%d flows", len(resp.GetFlows()))
	if resp.GetTruncated() {
		s += " (truncated)"
	}
	if len(resp.GetFlows()) > 0 {
		s += ":\n  " + strings.Join(strings.Split(strings.TrimPrefix(fmtEvents(resp.GetFlows()), "["), ", "), "\n  ")
	}
	return s
}

// ---- metrics ----

// freeLocalAddr returns a 127.0.0.1 address whose port was free a moment
// ago.
func freeLocalAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func httpGet(e *env, url string) (int, string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		e.fatalf("%v", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, strings.TrimSpace(string(body))
}

// sample is one line of the Prometheus text format.
type sample struct {
	name   string
	labels map[string]string
	value  float64
	line   string
}

var labelRE = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)

// scrape reads /metrics at addr.
func (e *env) scrape(addr string) []sample {
	e.t.Helper()
	code, body := httpGet(e, "http://"+addr+"/metrics")
	if code != http.StatusOK {
		e.fatalf("GET /metrics: %d %q", code, head(body, 5))
	}
	var out []sample
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s := sample{labels: map[string]string{}, line: line}
		series, val, ok := strings.Cut(line, " ")
		if i := strings.LastIndex(line, "} "); i >= 0 {
			series, val, ok = line[:i+1], line[i+2:], true
		}
		if !ok {
			continue
		}
		val, _, _ = strings.Cut(val, " ") // a timestamp may follow
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			continue
		}
		s.value = v
		name, labels, _ := strings.Cut(series, "{")
		s.name = name
		for _, m := range labelRE.FindAllStringSubmatch(labels, -1) {
			s.labels[m[1]] = m[2]
		}
		out = append(out, s)
	}
	return out
}

// sampleValue returns the value of the sample of name whose labels include
// sel.
func sampleValue(samples []sample, name string, sel map[string]string) (float64, bool) {
	for _, s := range samples {
		if s.name != name {
			continue
		}
		match := true
		for k, v := range sel {
			if s.labels[k] != v {
				match = false
			}
		}
		if match {
			return s.value, true
		}
	}
	return 0, false
}

// grepSamples returns the lines of the samples with these names.
func grepSamples(samples []sample, names ...string) string {
	var lines []string
	for _, s := range samples {
		if slices.Contains(names, s.name) {
			lines = append(lines, s.line)
		}
	}
	if len(lines) == 0 {
		return fmt.Sprintf("(no %v samples)", names)
	}
	return strings.Join(lines, "\n")
}
