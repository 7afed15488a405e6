package ebpf

// Flow tests: WatchFlows, ListFlows and ExplainFlow against real traffic
// through a VIP in a netlab node (the dpEnv harness of dataplane_test.go),
// and the programs' flow events under BPF_PROG_TEST_RUN.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/internal/testkit/netlab"
)

// flRequestLine is what netlab's clients send per request.
const flRequestLine = "ping\n"

const flFIN = 0x01

// flWatch runs WatchFlows and records what it reports.
type flWatch struct {
	t      *testing.T
	mu     sync.Mutex
	events []dataplane.FlowEvent
	lost   uint64
	cancel context.CancelFunc
	done   chan error
}

// flWatchFlows starts WatchFlows on dp and returns once it is reading:
// every event after that is recorded. block, if set, runs inside emit
// before an event is recorded (to stall the reader). The watch stops when
// the test ends.
func flWatchFlows(t *testing.T, dp *Dataplane, block func(dataplane.FlowEvent)) *flWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &flWatch{t: t, cancel: cancel, done: make(chan error, 1)}
	go func() {
		w.done <- dp.WatchFlows(ctx, func(ev dataplane.FlowEvent) {
			if block != nil {
				block(ev)
			}
			w.mu.Lock()
			w.events = append(w.events, ev)
			w.mu.Unlock()
		}, func(n uint64) {
			w.mu.Lock()
			w.lost += n
			w.mu.Unlock()
		})
	}()
	// WatchFlows registers after it took its starting point.
	deadline := time.Now().Add(5 * time.Second)
	for dp.currentWatch() == nil {
		select {
		case err := <-w.done:
			t.Fatalf("WatchFlows returned at once: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("WatchFlows did not start")
		}
		time.Sleep(time.Millisecond)
	}
	t.Cleanup(w.stop)
	return w
}

// stop ends the watch; WatchFlows must return the context's error.
func (w *flWatch) stop() {
	w.cancel()
	select {
	case err := <-w.done:
		if !errors.Is(err, context.Canceled) {
			w.t.Errorf("WatchFlows returned %v, want context.Canceled", err)
		}
		w.done <- err // for a second stop
	case <-time.After(5 * time.Second):
		w.t.Error("WatchFlows did not return after its context ended")
	}
}

func (w *flWatch) snapshot() ([]dataplane.FlowEvent, uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.events), w.lost
}

// waitFor waits until ok holds for what was recorded, and returns it.
func (w *flWatch) waitFor(what string, timeout time.Duration, ok func([]dataplane.FlowEvent, uint64) bool) ([]dataplane.FlowEvent, uint64) {
	w.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		evs, lost := w.snapshot()
		if ok(evs, lost) {
			return evs, lost
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("after %v, still waiting for %s: %d events, %d lost:\n%s", timeout, what, len(evs), lost, flDump(evs))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func flCount(evs []dataplane.FlowEvent, typ dataplane.FlowEventType) int {
	n := 0
	for _, ev := range evs {
		if ev.Type == typ {
			n++
		}
	}
	return n
}

func flDump(evs []dataplane.FlowEvent) string {
	var s string
	for i, ev := range evs {
		if i == 40 {
			return s + fmt.Sprintf("... and %d more\n", len(evs)-i)
		}
		s += flString(ev) + "\n"
	}
	return s
}

func flString(ev dataplane.FlowEvent) string {
	f := ev.Flow
	s := fmt.Sprintf("%s id=%x %s %s -> %s -> %s", ev.Type, f.ID, f.Protocol, f.Client, f.VIP, f.Backend)
	if ev.Type == dataplane.FlowClosed {
		s += fmt.Sprintf(" %s orig=%d/%dB reply=%d/%dB after %v", f.CloseReason, f.OrigPackets, f.OrigBytes,
			f.ReplyPackets, f.ReplyBytes, f.Duration)
	}
	return s
}

// flReplyLine is what the echo server answered to the request of r.
func flReplyLine(r netlab.Reply) string { return r.Backend + " " + r.Peer.String() + "\n" }

// flBackend is the backend address of the echo pod that answered r.
func (e *dpEnv) flBackend(r netlab.Reply) netip.AddrPort {
	return netip.AddrPortFrom(e.pod(r.Backend).IPv4(), dpTargetPort)
}

// flCheckTuple checks that f is the flow of the request that got r.
func (e *dpEnv) flCheckTuple(what string, f dataplane.Flow, proto dataplane.Protocol, vip netip.Addr, r netlab.Reply) {
	e.t.Helper()
	if f.Protocol != proto || f.Client != r.Local || f.VIP != netip.AddrPortFrom(vip, 80) || f.Backend != e.flBackend(r) {
		e.t.Errorf("%s: flow %s %s -> %s -> %s, want %s %s -> %s:80 -> %s (%s answered)",
			what, f.Protocol, f.Client, f.VIP, f.Backend, proto, r.Local, vip, e.flBackend(r), r.Backend)
	}
}

// TestFlowsTCPConnections: each of N connections through a VIP (request,
// reply, close) is reported exactly once as NEW and once as CLOSED, with
// its tuples and the backend that answered, and counters that cover the
// payloads.
func TestFlowsTCPConnections(t *testing.T) {
	const n = 200
	e := newDPEnv(t, []string{"client", "be1", "be2", "be3"}, dpSmallMaps)
	svc := e.service("test/flows", dpVIPA, dataplane.TCP, dpReady("be1"), dpReady("be2"), dpReady("be3"))
	dp := e.open(nil)
	e.apply(dpState(1, nil, svc))
	w := flWatchFlows(t, dp, nil)

	begin := time.Now()
	byPort := map[uint16]netlab.Reply{}
	for i := range n {
		r, err := e.request(dpVIPA, dpReplyTimeout)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if _, dup := byPort[r.Local.Port()]; dup {
			t.Fatalf("request %d reused client port %d: the test cannot tell its flows apart", i, r.Local.Port())
		}
		byPort[r.Local.Port()] = r
	}
	evs, lost := w.waitFor(fmt.Sprintf("%d NEW and %d CLOSED events", n, n), 10*time.Second,
		func(evs []dataplane.FlowEvent, _ uint64) bool {
			return flCount(evs, dataplane.FlowNew) >= n && flCount(evs, dataplane.FlowClosed) >= n
		})
	end := time.Now()
	time.Sleep(200 * time.Millisecond) // room for duplicates to show up
	evs, lost = w.snapshot()
	if lost != 0 {
		t.Errorf("%d events lost", lost)
	}

	type pair struct{ opened, closed []dataplane.FlowEvent }
	byID := map[uint64]*pair{}
	for _, ev := range evs {
		p := byID[ev.Flow.ID]
		if p == nil {
			p = &pair{}
			byID[ev.Flow.ID] = p
		}
		if ev.Type == dataplane.FlowNew {
			p.opened = append(p.opened, ev)
		} else {
			p.closed = append(p.closed, ev)
		}
	}
	if len(byID) != n {
		t.Errorf("%d flow IDs in %d events, want %d", len(byID), len(evs), n)
	}
	seen := map[uint16]bool{}
	for id, p := range byID {
		if len(p.opened) != 1 || len(p.closed) != 1 {
			t.Errorf("flow %x: %d NEW and %d CLOSED events, want one each:\n%s", id, len(p.opened), len(p.closed),
				flDump(append(p.opened, p.closed...)))
			continue
		}
		opened, closed := p.opened[0], p.closed[0]
		r, ok := byPort[opened.Flow.Client.Port()]
		if !ok {
			t.Errorf("event of no request of ours: %s", flString(opened))
			continue
		}
		seen[r.Local.Port()] = true
		what := fmt.Sprintf("flow from %s (answered by %s)", r.Local, r.Backend)
		e.flCheckTuple(what+" NEW", opened.Flow, dataplane.TCP, dpVIPA, r)
		e.flCheckTuple(what+" CLOSED", closed.Flow, dataplane.TCP, dpVIPA, r)
		f := closed.Flow
		if f.CloseReason != dataplane.CloseFIN {
			t.Errorf("%s: closed by %q, want %q", what, f.CloseReason, dataplane.CloseFIN)
		}
		if f.OrigBytes < uint64(len(flRequestLine)) || f.ReplyBytes < uint64(len(flReplyLine(r))) || f.OrigPackets < 3 || f.ReplyPackets < 2 {
			t.Errorf("%s: counters orig %d packets %d bytes, reply %d packets %d bytes; want at least 3 packets and %d bytes, 2 packets and %d bytes",
				what, f.OrigPackets, f.OrigBytes, f.ReplyPackets, f.ReplyBytes, len(flRequestLine), len(flReplyLine(r)))
		}
		slack := 100 * time.Millisecond // the wall-to-monotonic offset is measured once
		for _, ev := range []dataplane.FlowEvent{opened, closed} {
			if ev.Time.Before(begin.Add(-slack)) || ev.Time.After(end.Add(slack)) {
				t.Errorf("%s: %s event at %v, outside the test's %v .. %v", what, ev.Type, ev.Time, begin, end)
			}
			if !ev.Flow.Start.Equal(opened.Time) {
				t.Errorf("%s: %s event says the flow started at %v, its NEW event is at %v", what, ev.Type, ev.Flow.Start, opened.Time)
			}
		}
		if f.Duration <= 0 || !closed.Time.Equal(f.Start.Add(f.Duration)) {
			t.Errorf("%s: duration %v from %v, closed at %v", what, f.Duration, f.Start, closed.Time)
		}
	}
	if len(seen) != n {
		t.Errorf("events for %d of the %d requests", len(seen), n)
	}
}

// TestFlowsUDP: a UDP flow is reported when it starts and when it times
// out (collected), and one whose backend leaves the service is closed as
// such when its next packet moves it, in the same breath as the new flow.
func TestFlowsUDP(t *testing.T) {
	e := newDPEnv(t, []string{"client", "be1", "be2"}, dpSmallMaps)
	e.cfg.GCInterval = 200 * time.Millisecond
	e.cfg.ConntrackTimeouts.Other = 2 * time.Second
	svc := e.service("test/udp", dpVIPA, dataplane.UDP, dpReady("be1"), dpReady("be2"))
	dp := e.open(nil)
	e.apply(dpState(1, nil, svc))
	w := flWatchFlows(t, dp, nil)
	udp := func(port uint16) netlab.Reply {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), dpReplyTimeout)
		defer cancel()
		r, err := e.pod("client").Request(ctx, "udp", dpVIPPort(dpVIPA), netlab.WithLocalPort(port))
		if err != nil {
			t.Fatalf("UDP request from port %d: %v", port, err)
		}
		return r
	}
	byClient := func(evs []dataplane.FlowEvent, client netip.AddrPort) []dataplane.FlowEvent {
		return slices.DeleteFunc(slices.Clone(evs), func(ev dataplane.FlowEvent) bool { return ev.Flow.Client != client })
	}

	// The backend leaves: the flow moves (quickly, well within its 2 s).
	first := udp(41000)
	gone := first.Backend
	stay := map[string]string{"be1": "be2", "be2": "be1"}[gone]
	svc2 := e.service("test/udp", dpVIPA, dataplane.UDP, dpReady(stay))
	svc2.Generation = 2
	e.apply(dpState(2, []string{"test/udp"}, svc2))
	second := udp(41000)
	if second.Backend != stay {
		t.Fatalf("after %s left, the flow from port 41000 went to %s, want %s", gone, second.Backend, stay)
	}
	evs, _ := w.waitFor("NEW, CLOSED (backend removed), NEW", 3*time.Second, func(evs []dataplane.FlowEvent, _ uint64) bool {
		return len(byClient(evs, first.Local)) >= 3
	})
	got := byClient(evs, first.Local)[:3]
	if got[0].Type != dataplane.FlowNew || got[1].Type != dataplane.FlowClosed || got[2].Type != dataplane.FlowNew {
		t.Fatalf("events of the moved flow:\n%s\nwant NEW, CLOSED, NEW", flDump(got))
	}
	e.flCheckTuple("first flow NEW", got[0].Flow, dataplane.UDP, dpVIPA, first)
	e.flCheckTuple("first flow CLOSED", got[1].Flow, dataplane.UDP, dpVIPA, first)
	e.flCheckTuple("second flow NEW", got[2].Flow, dataplane.UDP, dpVIPA, second)
	if got[1].Flow.ID != got[0].Flow.ID || got[2].Flow.ID == got[0].Flow.ID {
		t.Errorf("flow IDs %x, %x, %x: want the first two equal, the third new", got[0].Flow.ID, got[1].Flow.ID, got[2].Flow.ID)
	}
	if r := got[1].Flow.CloseReason; r != dataplane.CloseBackendRemoved {
		t.Errorf("moved flow closed by %q, want %q", r, dataplane.CloseBackendRemoved)
	}

	// A flow that just stops times out: 2 s after its last packet, and
	// the collector runs every 200 ms.
	r := udp(41001)
	evs, _ = w.waitFor("NEW and CLOSED (timeout)", 6*time.Second, func(evs []dataplane.FlowEvent, _ uint64) bool {
		return len(byClient(evs, r.Local)) >= 2
	})
	got = byClient(evs, r.Local)
	if len(got) != 2 || got[0].Type != dataplane.FlowNew || got[1].Type != dataplane.FlowClosed {
		t.Fatalf("events of the flow from %s:\n%s\nwant NEW, CLOSED", r.Local, flDump(got))
	}
	e.flCheckTuple("idle flow CLOSED", got[1].Flow, dataplane.UDP, dpVIPA, r)
	f := got[1].Flow
	if f.ID != got[0].Flow.ID || f.CloseReason != dataplane.CloseTimeout {
		t.Errorf("idle flow closed: %s, want the NEW event's ID %x and reason timeout", flString(got[1]), got[0].Flow.ID)
	}
	if f.Duration < 2*time.Second || f.Duration > 4*time.Second {
		t.Errorf("idle flow lasted %v, want 2 s (its lifetime) plus less than 2 s", f.Duration)
	}
	if f.OrigPackets != 1 || f.ReplyPackets != 1 || f.OrigBytes < uint64(len(flRequestLine)) || f.ReplyBytes < uint64(len(flReplyLine(r))) {
		t.Errorf("idle flow counters: %s; want one datagram each way, with the payloads", flString(got[1]))
	}
	if flows, err := dp.ListFlows(context.Background()); err != nil || slices.ContainsFunc(flows, func(f dataplane.Flow) bool { return f.Client == r.Local }) {
		t.Errorf("ListFlows after the timeout: %v (err %v), want the flow gone", flows, err)
	}
}

// TestFlowsList: a live connection is listed with its tuple, counters and
// TCP state (ESTABLISHED) under the ID of its NEW event, until it closes; a
// UDP flow is listed without a TCP state.
func TestFlowsList(t *testing.T) {
	e := newDPEnv(t, []string{"client", "be1", "be2"}, dpSmallMaps)
	svc := e.service("test/list", dpVIPA, dataplane.TCP, dpReady("be1"), dpReady("be2"))
	dns := e.service("test/dns", dpVIPB, dataplane.UDP, dpReady("be1"))
	dp := e.open(nil)
	e.apply(dpState(1, nil, svc, dns))
	w := flWatchFlows(t, dp, nil)

	ctx, cancel := context.WithTimeout(context.Background(), dpReplyTimeout)
	defer cancel()
	c, err := e.pod("client").Dial(ctx, "tcp", dpVIPPort(dpVIPA))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	var r netlab.Reply
	for i := range 3 {
		if r, err = c.Request(ctx); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	evs, _ := w.waitFor("the NEW event", 3*time.Second, func(evs []dataplane.FlowEvent, _ uint64) bool { return len(evs) > 0 })
	// The UDP flow lives for a minute (the default lifetime).
	ur, err := e.pod("client").Request(ctx, "udp", dpVIPPort(dpVIPB))
	if err != nil {
		t.Fatalf("UDP request: %v", err)
	}
	flows, err := dp.ListFlows(context.Background())
	if err != nil {
		t.Fatalf("ListFlows: %v", err)
	}
	if len(flows) != 2 {
		t.Fatalf("ListFlows: %d flows, want 2: %+v", len(flows), flows)
	}
	f, uf := flows[0], flows[1] // oldest first
	e.flCheckTuple("listed UDP flow", uf, dataplane.UDP, dpVIPB, ur)
	if uf.TCPState != dataplane.TCPStateUnknown {
		t.Errorf("listed UDP flow has TCP state %v, want none", uf.TCPState)
	}
	e.flCheckTuple("listed flow", f, dataplane.TCP, dpVIPA, r)
	if f.TCPState != dataplane.TCPEstablished || evs[0].Flow.TCPState != dataplane.TCPSynSent {
		t.Errorf("open connection: TCP state %v when listed, %v on its NEW event; want ESTABLISHED and SYN_SENT", f.TCPState, evs[0].Flow.TCPState)
	}
	if f.ID != evs[0].Flow.ID || !f.Start.Equal(evs[0].Flow.Start) {
		t.Errorf("listed flow ID %x started %v, its NEW event says %x at %v", f.ID, f.Start, evs[0].Flow.ID, evs[0].Flow.Start)
	}
	// SYN, ACK, 3 requests (and their ACKs); SYN-ACK, 3 replies.
	if f.OrigPackets < 5 || f.ReplyPackets < 4 || f.OrigBytes < 3*uint64(len(flRequestLine)) || f.ReplyBytes < 3*uint64(len(flReplyLine(r))) {
		t.Errorf("listed flow counters orig %d packets %d bytes, reply %d packets %d bytes: too few for 3 exchanges",
			f.OrigPackets, f.OrigBytes, f.ReplyPackets, f.ReplyBytes)
	}
	if f.CloseReason != "" || f.Duration != 0 {
		t.Errorf("live flow with close reason %q, duration %v", f.CloseReason, f.Duration)
	}

	c.Close()
	w.waitFor("the CLOSED event", 3*time.Second, func(evs []dataplane.FlowEvent, _ uint64) bool {
		return flCount(evs, dataplane.FlowClosed) == 1
	})
	if flows, err := dp.ListFlows(context.Background()); err != nil || len(flows) != 1 || flows[0].Protocol != dataplane.UDP {
		t.Errorf("ListFlows after the close: %+v (err %v), want the UDP flow only", flows, err)
	}
}

// TestFlowsIdleReaderWakes: a reader that found the ring empty sleeps
// until the next event (the programs ask the kernel to wake it), rather
// than finding the event at its next timed look: after an idle spell
// longer than flowPollInterval, a connection's NEW event reaches emit
// within a few milliseconds of the connection's answer.
func TestFlowsIdleReaderWakes(t *testing.T) {
	const rounds, prompt = 10, 25 * time.Millisecond
	e := newDPEnv(t, []string{"client", "be1"}, dpSmallMaps)
	dp := e.open(nil)
	e.apply(dpState(1, nil, e.service("test/idle", dpVIPA, dataplane.TCP, dpReady("be1"))))
	w := flWatchFlows(t, dp, nil)
	var delays []time.Duration
	for i := range rounds {
		time.Sleep(flowPollInterval + 50*time.Millisecond)
		r, err := e.request(dpVIPA, dpReplyTimeout)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		answered := time.Now()
		for {
			evs, _ := w.snapshot()
			if slices.ContainsFunc(evs, func(ev dataplane.FlowEvent) bool {
				return ev.Type == dataplane.FlowNew && ev.Flow.Client.Port() == r.Local.Port()
			}) {
				break
			}
			if time.Since(answered) > 5*time.Second {
				t.Fatalf("request %d: no NEW event after 5s", i)
			}
			time.Sleep(100 * time.Microsecond)
		}
		delays = append(delays, time.Since(answered))
	}
	late := 0
	for _, d := range delays {
		if d > prompt {
			late++
		}
	}
	// Found by a look every flowPollInterval, three in four would be late.
	if late > 2 {
		t.Errorf("%d of %d NEW events reached emit later than %v after an idle spell: %v", late, rounds, prompt, delays)
	}
}

// TestFlowsIdleTCPTimesOut: an open TCP connection that stays idle past
// its lifetime is closed by the collector as a timeout, in the state it
// was in (ESTABLISHED).
func TestFlowsIdleTCPTimesOut(t *testing.T) {
	e := newDPEnv(t, []string{"client", "be1"}, dpSmallMaps)
	e.cfg.GCInterval = 200 * time.Millisecond
	e.cfg.ConntrackTimeouts.TCPEstablished = 2 * time.Second
	svc := e.service("test/idle", dpVIPA, dataplane.TCP, dpReady("be1"))
	dp := e.open(nil)
	e.apply(dpState(1, nil, svc))
	w := flWatchFlows(t, dp, nil)

	ctx, cancel := context.WithTimeout(context.Background(), dpReplyTimeout)
	defer cancel()
	c, err := e.pod("client").Dial(ctx, "tcp", dpVIPPort(dpVIPA))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	r, err := c.Request(ctx)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	evs, _ := w.waitFor("the CLOSED event of the idle connection", 6*time.Second, func(evs []dataplane.FlowEvent, _ uint64) bool {
		return flCount(evs, dataplane.FlowClosed) > 0
	})
	i := slices.IndexFunc(evs, func(ev dataplane.FlowEvent) bool { return ev.Type == dataplane.FlowClosed })
	f := evs[i].Flow
	e.flCheckTuple("idle connection CLOSED", f, dataplane.TCP, dpVIPA, r)
	if f.CloseReason != dataplane.CloseTimeout || f.TCPState != dataplane.TCPEstablished {
		t.Errorf("idle connection closed by %q in TCP state %v, want timeout in ESTABLISHED", f.CloseReason, f.TCPState)
	}
}

// TestFlowsRingBufferFull: events that find the ring full while the reader
// is stalled are counted in the kernel and reported lost, exactly.
func TestFlowsRingBufferFull(t *testing.T) {
	const conns = 60 // 120 events; the smallest ring holds about 32
	sizes := dpSmallMaps
	sizes.Events = 4096
	e := newDPEnv(t, []string{"client", "be1"}, sizes)
	svc := e.service("test/drops", dpVIPA, dataplane.TCP, dpReady("be1"))
	dp := e.open(nil)
	e.apply(dpState(1, nil, svc))
	if got := dp.objs.VipdEvents.MaxEntries(); got != 4096 {
		t.Fatalf("ring of %d bytes, want 4096", got)
	}
	before, err := sumDrops(dp.objs.VipdEventDrops)
	if err != nil {
		t.Fatal(err)
	}

	stalled, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	w := flWatchFlows(t, dp, func(dataplane.FlowEvent) {
		once.Do(func() {
			close(stalled)
			<-release
		})
	})
	for i := range conns {
		if _, err := e.request(dpVIPA, dpReplyTimeout); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if i == 0 {
			select {
			case <-stalled:
			case <-time.After(3 * time.Second):
				t.Fatal("the reader got no event")
			}
		}
	}
	close(release)
	evs, lost := w.waitFor("every event delivered or reported lost", 5*time.Second, func(evs []dataplane.FlowEvent, lost uint64) bool {
		return uint64(len(evs))+lost >= 2*conns
	})
	time.Sleep(2 * flowPollInterval)
	evs, lost = w.snapshot()
	after, err := sumDrops(dp.objs.VipdEventDrops)
	if err != nil {
		t.Fatal(err)
	}
	dropped := after - before
	if dropped == 0 {
		t.Errorf("no events dropped: a 4096-byte ring held %d events", 2*conns)
	}
	if lost != dropped || uint64(len(evs))+lost != 2*conns {
		t.Errorf("%d events delivered and %d reported lost; the kernel dropped %d of %d", len(evs), lost, dropped, 2*conns)
	}
	t.Logf("%d events delivered, %d lost (a %d-byte ring)", len(evs), lost, dp.objs.VipdEvents.MaxEntries())

	// Without a stall, nothing is lost.
	for i := range 10 {
		if _, err := e.request(dpVIPA, dpReplyTimeout); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	w.waitFor("20 more events", 3*time.Second, func(more []dataplane.FlowEvent, l uint64) bool {
		return len(more) == len(evs)+20 && l == lost
	})
}

// TestFlowsExplainAffinity: with ClientIP affinity, ExplainFlow names the
// backend the client's connections went to, and the time its entry has left.
func TestFlowsExplainAffinity(t *testing.T) {
	e := newDPEnv(t, []string{"client", "be1", "be2", "be3"}, dpSmallMaps)
	svc := e.service("test/affinity", dpVIPA, dataplane.TCP, dpReady("be1"), dpReady("be2"), dpReady("be3"))
	svc.Affinity = dataplane.SessionAffinity{ClientIP: true, Timeout: 60 * time.Second}
	dp := e.open(nil)
	e.apply(dpState(1, nil, svc))
	client := e.pod("client").IPv4()
	q := dataplane.ExplainQuery{Protocol: dataplane.TCP, Client: netip.AddrPortFrom(client, 40000), VIP: netip.AddrPortFrom(dpVIPA, 80)}
	explain := func() dataplane.Explanation {
		t.Helper()
		ex, err := dp.ExplainFlow(context.Background(), q)
		if err != nil {
			t.Fatalf("ExplainFlow: %v", err)
		}
		return ex
	}
	if ex := explain(); ex != (dataplane.Explanation{}) {
		t.Errorf("before any connection: %+v, want nothing (random pick, no affinity)", ex)
	}

	r, err := e.request(dpVIPA, dpReplyTimeout)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	ex := explain()
	want := e.flBackend(r)
	if ex.AffinityBackend != want || ex.Pick != want {
		t.Errorf("after a connection to %s: %+v, want affinity and pick %s", r.Backend, ex, want)
	}
	if ex.AffinityRemaining <= 55*time.Second || ex.AffinityRemaining > 60*time.Second {
		t.Errorf("affinity entry has %v left, want just under 60 s", ex.AffinityRemaining)
	}
	for i := range 5 {
		r, err := e.request(dpVIPA, dpReplyTimeout)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if got := e.flBackend(r); got != ex.Pick {
			t.Errorf("connection %d went to %s, ExplainFlow said %s", i, got, ex.Pick)
		}
	}

	// Another client has no entry; another VIP nothing at all.
	q2 := q
	q2.Client = netip.AddrPortFrom(netip.MustParseAddr("198.18.250.1"), 40000)
	if ex, err := dp.ExplainFlow(context.Background(), q2); err != nil || ex != (dataplane.Explanation{}) {
		t.Errorf("another client: %+v (err %v), want nothing", ex, err)
	}
	q2 = q
	q2.VIP = netip.AddrPortFrom(dpVIPB, 80)
	if ex, err := dp.ExplainFlow(context.Background(), q2); err != nil || ex != (dataplane.Explanation{}) {
		t.Errorf("a VIP no service has: %+v (err %v), want nothing", ex, err)
	}
}

// TestFlowsExplainMaglev: for Maglev, ExplainFlow's pick for a client
// address and port is the backend a real connection from there gets.
func TestFlowsExplainMaglev(t *testing.T) {
	e := newDPEnv(t, []string{"client", "be1", "be2", "be3"}, dpSmallMaps)
	svc := e.service("test/maglev", dpVIPA, dataplane.TCP, dpReady("be1"), dpReady("be2"), dpReady("be3"))
	svc.LoadBalancing = dataplane.LoadBalancingMaglev
	dp := e.open(nil)
	e.apply(dpState(1, nil, svc))
	client := e.pod("client").IPv4()
	picked := map[netip.AddrPort]int{}
	for port := uint16(42000); port < 42016; port++ {
		ex, err := dp.ExplainFlow(context.Background(), dataplane.ExplainQuery{
			Protocol: dataplane.TCP, Client: netip.AddrPortFrom(client, port), VIP: netip.AddrPortFrom(dpVIPA, 80),
		})
		if err != nil {
			t.Fatalf("ExplainFlow: %v", err)
		}
		if ex.AffinityBackend.IsValid() {
			t.Errorf("port %d: affinity %s on a service without affinity", port, ex.AffinityBackend)
		}
		ctx, cancel := context.WithTimeout(context.Background(), dpReplyTimeout)
		r, err := e.pod("client").Request(ctx, "tcp", dpVIPPort(dpVIPA), netlab.WithLocalPort(port))
		cancel()
		if err != nil {
			t.Fatalf("request from port %d: %v", port, err)
		}
		if got := e.flBackend(r); got != ex.Pick {
			t.Errorf("connection from port %d went to %s (%s), ExplainFlow picked %s", port, got, r.Backend, ex.Pick)
		}
		picked[ex.Pick]++
	}
	if len(picked) < 2 {
		t.Errorf("16 client ports all picked %v: the test proves little", picked)
	}
}

// TestFlowsWatchOnce: one WatchFlows at a time; Close ends a running one.
func TestFlowsWatchOnce(t *testing.T) {
	e := newDPEnv(t, nil, dpSmallMaps)
	dp := e.open(nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- dp.WatchFlows(ctx, func(dataplane.FlowEvent) {}, func(uint64) {}) }()
	for dp.currentWatch() == nil {
		time.Sleep(time.Millisecond)
	}
	if err := dp.WatchFlows(ctx, func(dataplane.FlowEvent) {}, func(uint64) {}); !errors.Is(err, ErrWatchedAlready) {
		t.Errorf("a second WatchFlows returned %v, want ErrWatchedAlready", err)
	}
	e.close()
	select {
	case err := <-done:
		if err == nil || errors.Is(err, context.Canceled) {
			t.Errorf("WatchFlows returned %v after Close, want the dataplane's closing", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("WatchFlows still runs after Close")
	}
}

// ---- the programs' events, without a network ----

// flRing reads the flow events of a prEnv's programs.
type flRing struct {
	t  testing.TB
	rd *ringbuf.Reader
}

func flOpenRing(r *prEnv) *flRing {
	r.t.Helper()
	rd, err := ringbuf.NewReader(r.objs.VipdEvents)
	if err != nil {
		r.t.Fatalf("ring reader: %v", err)
	}
	r.t.Cleanup(func() { rd.Close() })
	return &flRing{t: r.t, rd: rd}
}

// next returns the events the programs sent since the last call.
func (f *flRing) next() []bpfFlowEvent {
	f.t.Helper()
	var out []bpfFlowEvent
	for {
		f.rd.SetDeadline(time.Now())
		rec, err := f.rd.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return out
		}
		if err != nil {
			f.t.Fatalf("read ring: %v", err)
		}
		var ev bpfFlowEvent
		if !decodeFlowEvent(rec.RawSample, &ev) {
			f.t.Fatalf("short event of %d bytes", len(rec.RawSample))
		}
		out = append(out, ev)
	}
}

// flWant checks an event's type, reason, tuple and backend.
func flWant(t *testing.T, ev bpfFlowEvent, typ, reason uint8, client, vip netip.AddrPort, proto uint8, be prBackend) {
	t.Helper()
	got := fmt.Sprintf("type %d reason %d %s -> %s -> %s proto %d backend %d", ev.Type, ev.Reason,
		netip.AddrPortFrom(fromWords(ev.Client.W), fromBE16(ev.ClientPort)),
		netip.AddrPortFrom(fromWords(ev.Vip.W), fromBE16(ev.VipPort)),
		netip.AddrPortFrom(fromWords(ev.Backend.W), fromBE16(ev.BackendPort)), ev.Proto, ev.BackendId)
	want := fmt.Sprintf("type %d reason %d %s -> %s -> %s proto %d backend %d", typ, reason, client, vip, be.addr, proto, be.id)
	if got != want {
		t.Errorf("event %s, want %s", got, want)
	}
	if ev.FlowId == 0 || ev.StartNs == 0 || ev.TimeNs < ev.StartNs {
		t.Errorf("event flow %x started %d at %d: want an ID and a start no later than the event", ev.FlowId, ev.StartNs, ev.TimeNs)
	}
}

func TestProgRunFlowEvents(t *testing.T) {
	r := newPREnv(t)
	fe := prFrontend{vip: prVIP4, proto: prTCP, id: 1}
	be := prBackends4[0]
	r.addService(fe, be)
	ring := flOpenRing(r)
	payload := []byte("hello")

	t.Run("tcp: NEW on SYN, one CLOSED on the first FIN", func(t *testing.T) {
		client := prWithPort(prClient4, 40100)
		syn := prTCPFrame(client, prVIP4, 1000, 0, prSYN, nil)
		r.run(r.objs.VipdFromPod, syn)
		evs := ring.next()
		if len(evs) != 1 {
			t.Fatalf("%d events after the SYN, want 1", len(evs))
		}
		flWant(t, evs[0], flowEvNew, 0, client, prVIP4, prTCP, be)
		if evs[0].StartNs != evs[0].TimeNs || evs[0].ReplyPackets != 0 {
			t.Errorf("NEW event: start %d, time %d, %d reply packets; want the start as time, no replies", evs[0].StartNs, evs[0].TimeNs, evs[0].ReplyPackets)
		}
		id := evs[0].FlowId
		fwd, _ := r.ct(client, prVIP4, prTCP, prDirForward)
		rev, _ := r.ct(be.addr, client, prTCP, prDirReply)
		if fwd.FlowId != id || rev.FlowId != id || fwd.StartNs != evs[0].StartNs || rev.StartNs != fwd.StartNs {
			t.Errorf("entries carry flow %x/%x started %d/%d; the event says %x at %d", fwd.FlowId, rev.FlowId, fwd.StartNs, rev.StartNs, id, evs[0].StartNs)
		}

		r.run(r.objs.VipdToPod, prTCPFrame(be.addr, client, 5000, 1001, prSYN|prACK, nil))
		r.run(r.objs.VipdFromPod, prTCPFrame(client, prVIP4, 1001, 5001, prACK|prPSH, payload))
		r.run(r.objs.VipdToPod, prTCPFrame(be.addr, client, 5001, 1006, prACK|prPSH, payload))
		if evs := ring.next(); len(evs) != 0 {
			t.Fatalf("%d events mid-flow, want none", len(evs))
		}
		// The backend closes first: the reply path reports it.
		finBack := prTCPFrame(be.addr, client, 5006, 1006, prACK|flFIN, nil)
		r.run(r.objs.VipdToPod, finBack)
		evs = ring.next()
		if len(evs) != 1 {
			t.Fatalf("%d events after the first FIN, want 1", len(evs))
		}
		ev := evs[0]
		flWant(t, ev, flowEvClosed, flowCloseFIN, client, prVIP4, prTCP, be)
		if ev.FlowId != id {
			t.Errorf("CLOSED event of flow %x, NEW was %x", ev.FlowId, id)
		}
		if ev.OrigPackets != 2 || ev.ReplyPackets != 3 {
			t.Errorf("CLOSED event counts %d packets out, %d back; want 2 and 3", ev.OrigPackets, ev.ReplyPackets)
		}
		minLen := uint64(prEthLen + 20 + 20)
		if ev.OrigBytes < 2*minLen+uint64(len(payload)) || ev.ReplyBytes < 3*minLen+uint64(len(payload)) {
			t.Errorf("CLOSED event counts %d bytes out, %d back: less than the frames", ev.OrigBytes, ev.ReplyBytes)
		}
		// The client's FIN, RST and retransmissions: nothing more.
		r.run(r.objs.VipdFromPod, prTCPFrame(client, prVIP4, 1006, 5007, prACK|flFIN, nil))
		r.run(r.objs.VipdToPod, finBack)
		r.run(r.objs.VipdFromPod, prTCPFrame(client, prVIP4, 1007, 0, prRST, nil))
		if evs := ring.next(); len(evs) != 0 {
			t.Errorf("%d more events after the flow closed, want none", len(evs))
		}
		// Reusing the port after the close is a new flow.
		r.run(r.objs.VipdFromPod, syn)
		evs = ring.next()
		if len(evs) != 1 || evs[0].Type != flowEvNew || evs[0].FlowId == id {
			t.Errorf("a new SYN after the close: %+v, want one NEW event of a new flow", evs)
		}
	})
	t.Run("tcp: RST from the client", func(t *testing.T) {
		client := prWithPort(prClient4, 40200)
		r.run(r.objs.VipdFromPod, prTCPFrame(client, prVIP4, 1000, 0, prSYN, nil))
		r.run(r.objs.VipdFromPod, prTCPFrame(client, prVIP4, 1001, 0, prRST, nil))
		evs := ring.next()
		if len(evs) != 2 {
			t.Fatalf("%d events, want NEW and CLOSED", len(evs))
		}
		flWant(t, evs[1], flowEvClosed, flowCloseRST, client, prVIP4, prTCP, be)
	})
	t.Run("tcp: an expired flow replaced by a SYN", func(t *testing.T) {
		client := prWithPort(prClient4, 40300)
		syn := prTCPFrame(client, prVIP4, 1000, 0, prSYN, nil)
		r.run(r.objs.VipdFromPod, syn)
		k := prCTKey(client, prVIP4, prTCP, prDirForward)
		fwd, _ := r.ct(client, prVIP4, prTCP, prDirForward)
		fwd.Expires = monotonicSeconds() - 5
		if err := r.objs.VipdCt.Put(&k, &fwd); err != nil {
			t.Fatal(err)
		}
		r.run(r.objs.VipdFromPod, syn)
		evs := ring.next()
		if len(evs) != 3 {
			t.Fatalf("%d events, want NEW, CLOSED (timeout), NEW", len(evs))
		}
		flWant(t, evs[1], flowEvClosed, flowCloseTimeout, client, prVIP4, prTCP, be)
		if evs[1].FlowId != evs[0].FlowId || evs[2].FlowId == evs[0].FlowId || evs[2].Type != flowEvNew {
			t.Errorf("events %+v: want the old flow closed and a new one", evs)
		}
	})
	t.Run("udp: a flow whose backend left moves", func(t *testing.T) {
		fe := prFrontend{vip: prWithPort(prVIP4, 53), proto: prUDP, id: 2}
		r.addService(fe, prBackends4...)
		in := prUDPFrame(prClient4, fe.vip, []byte("q"))
		_, out := r.run(r.objs.VipdFromPod, in)
		old := prBackendOf(t, out, prBackends4)
		rest := slices.DeleteFunc(slices.Clone(prBackends4), func(b prBackend) bool { return b.id == old })
		r.setSlots(fe, rest...)
		r.deleteMember(fe, old)
		_, out = r.run(r.objs.VipdFromPod, in)
		moved := prBackendOf(t, out, prBackends4)
		evs := ring.next()
		if len(evs) != 3 {
			t.Fatalf("%d events, want NEW, CLOSED (backend removed), NEW", len(evs))
		}
		byID := func(id uint32) prBackend {
			return prBackends4[slices.IndexFunc(prBackends4, func(b prBackend) bool { return b.id == id })]
		}
		flWant(t, evs[0], flowEvNew, 0, prClient4, fe.vip, prUDP, byID(old))
		flWant(t, evs[1], flowEvClosed, flowCloseBackendRemoved, prClient4, fe.vip, prUDP, byID(old))
		flWant(t, evs[2], flowEvNew, 0, prClient4, fe.vip, prUDP, byID(moved))
		if evs[1].OrigPackets != 1 {
			t.Errorf("the moved flow's CLOSED event counts %d packets, want 1", evs[1].OrigPackets)
		}
	})
}

// TestProgRunTCPState: the TCP state ListFlows and the flow events report
// follows a connection through the handshake, from the flags the programs
// record in the conntrack entries, and tcpStateOf reads the closing states
// from them too (ListFlows no longer shows a closing flow).
func TestProgRunTCPState(t *testing.T) {
	r := newPREnv(t)
	fe := prFrontend{vip: prVIP4, proto: prTCP, id: 1}
	be := prBackends4[0]
	r.addService(fe, be)
	ring := flOpenRing(r)
	dp := &Dataplane{objs: &r.objs}
	listed := func(client netip.AddrPort) dataplane.TCPState {
		t.Helper()
		flows, err := dp.ListFlows(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range flows {
			if f.Client == client {
				return f.TCPState
			}
		}
		t.Fatalf("ListFlows: no flow of %v in %+v", client, flows)
		return 0
	}
	entries := func(client netip.AddrPort) dataplane.TCPState {
		t.Helper()
		fwd, ok := r.ct(client, prVIP4, prTCP, prDirForward)
		rev, ok2 := r.ct(be.addr, client, prTCP, prDirReply)
		if !ok || !ok2 {
			t.Fatalf("conntrack entries of %v: forward %v, reply %v", client, ok, ok2)
		}
		return tcpStateOf(fwd.TcpFlags, rev.TcpFlags)
	}
	event := func(want uint8) dataplane.FlowEvent {
		t.Helper()
		evs := ring.next()
		if len(evs) != 1 || evs[0].Type != want {
			t.Fatalf("events %+v, want one of type %d", evs, want)
		}
		ev, ok := dp.flowEvent(&evs[0])
		if !ok {
			t.Fatalf("event %+v not decoded", evs[0])
		}
		return ev
	}
	from := func(client netip.AddrPort, seq, ack uint32, flags uint8) {
		r.run(r.objs.VipdFromPod, prTCPFrame(client, prVIP4, seq, ack, flags, nil))
	}
	to := func(client netip.AddrPort, seq, ack uint32, flags uint8) {
		r.run(r.objs.VipdToPod, prTCPFrame(be.addr, client, seq, ack, flags, nil))
	}
	expect := func(what string, got, want dataplane.TCPState) {
		t.Helper()
		if got != want {
			t.Errorf("%s: TCP state %v, want %v", what, got, want)
		}
	}

	client := prWithPort(prClient4, 40100)
	from(client, 1000, 0, prSYN)
	expect("NEW event", event(flowEvNew).Flow.TCPState, dataplane.TCPSynSent)
	expect("after the SYN", listed(client), dataplane.TCPSynSent)
	to(client, 5000, 1001, prSYN|prACK)
	expect("after the SYN-ACK", listed(client), dataplane.TCPSynRecv)
	from(client, 1001, 5001, prACK)
	expect("after the handshake", listed(client), dataplane.TCPEstablished)
	from(client, 1001, 5001, prACK|prPSH)
	to(client, 5001, 1001, prACK|prPSH)
	expect("after data both ways", listed(client), dataplane.TCPEstablished)
	to(client, 5001, 1001, prACK|flFIN)
	expect("CLOSED event on a FIN", event(flowEvClosed).Flow.TCPState, dataplane.TCPStateUnknown)
	expect("after the backend's FIN", entries(client), dataplane.TCPCloseWait)
	from(client, 1001, 5002, prACK|flFIN)
	expect("after both FINs", entries(client), dataplane.TCPTimeWait)

	client = prWithPort(prClient4, 40200)
	from(client, 1000, 0, prSYN)
	event(flowEvNew)
	to(client, 5000, 1001, prSYN|prACK)
	from(client, 1001, 5001, prACK)
	from(client, 1001, 5001, prACK|flFIN)
	event(flowEvClosed)
	expect("after the client's FIN", entries(client), dataplane.TCPFinWait)
	from(client, 1002, 5001, prRST)
	expect("after a RST", entries(client), dataplane.TCPClose)

	client = prWithPort(prClient4, 40300)
	from(client, 1000, 0, prSYN)
	event(flowEvNew)
	to(client, 0, 1001, prRST|prACK)
	expect("CLOSED event on a RST", event(flowEvClosed).Flow.TCPState, dataplane.TCPClose)
}

// TestTCPStateOf: the state of every combination of flags the entries of
// one flow can hold.
func TestTCPStateOf(t *testing.T) {
	const (
		syn, ack, fin, rst = tcpFlagSYN, tcpFlagACK, tcpFlagFIN, tcpFlagRST
	)
	for _, tc := range []struct {
		fwd, reply uint8
		want       dataplane.TCPState
	}{
		{syn, 0, dataplane.TCPSynSent},
		{syn, ack, dataplane.TCPSynSent}, // an ACK without SYN answers no SYN
		{syn, syn | ack, dataplane.TCPSynRecv},
		{syn | ack, syn | ack, dataplane.TCPEstablished},
		{syn | ack | fin, syn | ack, dataplane.TCPFinWait},
		{syn | ack, syn | ack | fin, dataplane.TCPCloseWait},
		{syn | ack | fin, syn | ack | fin, dataplane.TCPTimeWait},
		{syn | rst, 0, dataplane.TCPClose},
		{syn, rst | ack, dataplane.TCPClose},
		{syn | ack | fin | rst, syn | ack | fin, dataplane.TCPClose},
	} {
		if got := tcpStateOf(tc.fwd, tc.reply); got != tc.want {
			t.Errorf("tcpStateOf(forward %#02x, reply %#02x) = %v, want %v", tc.fwd, tc.reply, got, tc.want)
		}
	}
}

// TestProgRunConntrackTimeouts: the lifetimes come from vipd_config, with
// the built-in ones where it has none.
func TestProgRunConntrackTimeouts(t *testing.T) {
	r := newPREnv(t)
	fe := prFrontend{vip: prWithPort(prVIP4, 53), proto: prUDP, id: 1}
	r.addService(fe, prBackends4[0])
	expiresIn := func(client netip.AddrPort) uint32 {
		t.Helper()
		now := monotonicSeconds()
		r.run(r.objs.VipdFromPod, prUDPFrame(client, fe.vip, []byte("q")))
		e, ok := r.ct(client, fe.vip, prUDP, prDirForward)
		if !ok {
			t.Fatal("no conntrack entry")
		}
		return e.Expires - now
	}
	if d := expiresIn(prWithPort(prClient4, 40001)); d < 60 || d > 61 {
		t.Errorf("without a config, a UDP entry lives %d s, want 60", d)
	}
	if err := writeConfig(&r.objs.bpfMaps, configFor(0, ConntrackTimeouts{Other: 1500 * time.Millisecond}, DefaultSNATPorts)); err != nil {
		t.Fatal(err)
	}
	if d := expiresIn(prWithPort(prClient4, 40002)); d < 2 || d > 3 {
		t.Errorf("with a 1.5 s timeout, a UDP entry lives %d s, want 2 (rounded up)", d)
	}
}
