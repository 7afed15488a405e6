package iptables

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/ti-mo/conntrack"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/internal/testkit/netlab"
	"github.com/vipd/vipd/internal/testkit/syncbuf"
	"github.com/vipd/vipd/server/flowhub"
	"golang.org/x/sys/unix"
)

// These tests send real traffic through a VIP in netlab namespaces and check
// the flow source's events and dumps against what the clients and echo
// servers saw.

const (
	flowVIP     = "198.19.0.10"
	flowPort    = 80
	flowTarget  = 7000
	flowTimeout = 2 * time.Minute
)

// flowLab is a node with a client pod and backend pods web1..webN that run
// echo servers on flowTarget, and an iptables dataplane programmed with
// svcs, whose short conntrack timeouts make closed flows end within
// seconds.
type flowLab struct {
	lab    *netlab.Lab
	node   *netlab.Node
	client *netlab.Pod
	dp     *Dataplane
}

func newFlowLab(t *testing.T, backends int, svcs func(l *flowLab) []*dataplane.Service) *flowLab {
	t.Helper()
	pods := []string{"client"}
	for i := 1; i <= backends; i++ {
		pods = append(pods, fmt.Sprintf("web%d", i))
	}
	lab := netlab.New(t, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: pods}}})
	l := &flowLab{lab: lab, node: lab.Node(1), client: lab.Pod("client")}
	for _, p := range pods[1:] {
		if _, err := lab.Pod(p).StartEcho(p, flowTarget); err != nil {
			t.Fatal(err)
		}
	}
	// Per-namespace conntrack timeouts, so that closed and idle flows end
	// (and report their close) within seconds rather than minutes.
	for key, v := range map[string]string{
		"net.netfilter.nf_conntrack_tcp_timeout_time_wait": "1",
		"net.netfilter.nf_conntrack_tcp_timeout_close":     "1",
		"net.netfilter.nf_conntrack_udp_timeout":           "2",
		"net.netfilter.nf_conntrack_udp_timeout_stream":    "2",
	} {
		if err := l.node.SetSysctl(key, v); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dp, err := New(ctx, hclog.NewNullLogger(), Config{NetNS: l.node.Path(), Mode: ModeNFT, SetFlowSysctls: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	l.dp = dp
	for key, want := range map[string]string{
		"net.netfilter.nf_conntrack_acct":      "1",
		"net.netfilter.nf_conntrack_timestamp": "1",
		"net.netfilter.nf_conntrack_events":    "1",
	} {
		if got, err := l.node.Sysctl(key); err != nil || got != want {
			t.Fatalf("%s in the node after New: %q %v, want %s", key, got, err, want)
		}
	}
	if err := dp.Apply(ctx, state(svcs(l)...)); err != nil {
		t.Fatal(err)
	}
	return l
}

// web is a service on flowVIP:flowPort/proto with the given backend pods.
func (l *flowLab) web(proto dataplane.Protocol, pods ...string) *dataplane.Service {
	var bs []dataplane.Backend
	for _, p := range pods {
		bs = append(bs, dataplane.Backend{IP: l.lab.Pod(p).IPv4(), State: dataplane.BackendReady, Weight: 1})
	}
	return service("web", []string{flowVIP}, []dataplane.Port{port("", proto, flowPort, flowTarget)}, bs...)
}

// backendAddr is where the echo server called name listens.
func (l *flowLab) backendAddr(name string) netip.AddrPort {
	return netip.AddrPortFrom(l.lab.Pod(name).IPv4(), flowTarget)
}

// watch opens an event socket at once, so that no event after watch
// returns is missed, and reads it until the test ends.
func (l *flowLab) watch(t *testing.T, readBuffer int, emit func(dataplane.FlowEvent)) *flowRecorder {
	t.Helper()
	r := &flowRecorder{}
	s, err := l.dp.ct.dialFlowEvents(readBuffer)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- l.dp.readFlows(ctx, s, func(ev dataplane.FlowEvent) {
			if emit != nil {
				emit(ev)
			}
			r.add(ev)
		}, r.addLost)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != context.Canceled {
			t.Errorf("WatchFlows returned %v, want context.Canceled", err)
		}
		s.close()
	})
	return r
}

// flowRecorder keeps the events and losses a watcher reported.
type flowRecorder struct {
	mu     sync.Mutex
	events []dataplane.FlowEvent
	lost   uint64
}

func (r *flowRecorder) add(ev dataplane.FlowEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
}

func (r *flowRecorder) addLost(n uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lost += n
}

func (r *flowRecorder) snapshot() ([]dataplane.FlowEvent, uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]dataplane.FlowEvent(nil), r.events...), r.lost
}

// of returns the events of the flows from client, by type.
func (r *flowRecorder) of(client netip.AddrPort) (news, closes []dataplane.FlowEvent) {
	evs, _ := r.snapshot()
	for _, ev := range evs {
		if ev.Flow.Client != client {
			continue
		}
		if ev.Type == dataplane.FlowNew {
			news = append(news, ev)
		} else {
			closes = append(closes, ev)
		}
	}
	return news, closes
}

// waitFor polls cond until it holds or flowTimeout passes.
//
// The kernel destroys an expired conntrack entry, and sends its DESTROY
// event, when its garbage collector or a lookup or dump comes across it;
// the collector may take up to a minute to come round. So that tests take
// seconds, waitFor dumps the node's vipd entries every half second, which
// destroys the expired ones at once. That is the only part the test plays:
// the events still come from the kernel, with its reasons.
func (l *flowLab) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(flowTimeout)
	var nudged time.Time
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", flowTimeout, what)
		}
		if time.Since(nudged) > 500*time.Millisecond {
			if _, err := l.dp.ListFlows(context.Background()); err != nil {
				t.Fatal(err)
			}
			nudged = time.Now()
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// exchange sends one request line of size bytes over c and reads the echo
// server's reply line, returning the backend name and the reply's length.
func exchange(c net.Conn, size int) (string, int, error) {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(strings.Repeat("x", size-1) + "\n")); err != nil {
		return "", 0, err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", 0, err
	}
	backend, _, ok := strings.Cut(line, " ")
	if !ok {
		return "", 0, fmt.Errorf("malformed reply %q", line)
	}
	return backend, len(line), nil
}

type tcpResult struct {
	local    netip.AddrPort
	backend  string
	replyLen int
}

const requestSize = 3000

// connect makes one TCP connection to addr from the client pod, exchanges
// one request and reply, and closes it.
func (l *flowLab) connect(ctx context.Context, addr string) (tcpResult, error) {
	c, err := l.client.Dial(ctx, "tcp", addr)
	if err != nil {
		return tcpResult{}, err
	}
	defer c.Close()
	backend, n, err := exchange(c.Conn, requestSize)
	if err != nil {
		return tcpResult{}, err
	}
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	return tcpResult{netip.AddrPortFrom(local.Addr().Unmap(), local.Port()), backend, n}, nil
}

func TestFlowEventsTCP(t *testing.T) {
	l := newFlowLab(t, 3, func(l *flowLab) []*dataplane.Service {
		return []*dataplane.Service{l.web(dataplane.TCP, "web1", "web2", "web3")}
	})
	rec := l.watch(t, flowReadBuffer, nil)
	ctx, cancel := context.WithTimeout(context.Background(), flowTimeout)
	defer cancel()

	// A direct pod-to-pod connection through the same node: conntrack
	// tracks it, but it is not vipd's, so it must not be reported.
	direct, err := l.connect(ctx, l.backendAddr("web1").String())
	if err != nil || direct.backend != "web1" {
		t.Fatalf("direct connection: %+v %v", direct, err)
	}

	const n = 200
	results := make([]tcpResult, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			r, err := l.connect(ctx, fmt.Sprintf("%s:%d", flowVIP, flowPort))
			if err != nil {
				errs <- err
				return
			}
			results[i] = r
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	seen := map[string]int{}
	l.waitFor(t, fmt.Sprintf("%d closed flows", n), func() bool {
		evs, _ := rec.snapshot()
		closed := 0
		for _, ev := range evs {
			if ev.Type == dataplane.FlowClosed {
				closed++
			}
		}
		return closed >= n
	})

	vip := netip.AddrPortFrom(netip.MustParseAddr(flowVIP), flowPort)
	for _, r := range results {
		seen[r.backend]++
		news, closes := rec.of(r.local)
		if len(news) != 1 || len(closes) != 1 {
			t.Errorf("connection from %s: %d NEW and %d CLOSED events, want one each: %+v %+v", r.local, len(news), len(closes), news, closes)
			continue
		}
		nw, cl := news[0].Flow, closes[0].Flow
		want := dataplane.Flow{ID: nw.ID, Protocol: dataplane.TCP, Client: r.local, VIP: vip, Backend: l.backendAddr(r.backend)}
		for _, f := range []dataplane.Flow{nw, cl} {
			got := dataplane.Flow{ID: f.ID, Protocol: f.Protocol, Client: f.Client, VIP: f.VIP, Backend: f.Backend}
			if got != want {
				t.Errorf("connection from %s answered by %s: event flow %+v, want %+v", r.local, r.backend, got, want)
			}
		}
		if cl.OrigBytes < requestSize || cl.ReplyBytes < uint64(r.replyLen) || cl.OrigPackets == 0 || cl.ReplyPackets == 0 {
			t.Errorf("connection from %s: CLOSED counters %d/%d bytes, %d/%d packets; want at least %d/%d bytes",
				r.local, cl.OrigBytes, cl.ReplyBytes, cl.OrigPackets, cl.ReplyPackets, requestSize, r.replyLen)
		}
		if cl.CloseReason != dataplane.CloseFIN || cl.Duration <= 0 || cl.Start.IsZero() {
			t.Errorf("connection from %s: CLOSED reason %q, duration %s, start %s; want fin, a duration and a start", r.local, cl.CloseReason, cl.Duration, cl.Start)
		}
		// conntrack's state: the client's SYN, and TIME_WAIT, where the
		// entry ends after a FIN handshake.
		if nw.TCPState != dataplane.TCPSynSent || cl.TCPState != dataplane.TCPTimeWait {
			t.Errorf("connection from %s: TCP state %v on NEW and %v on CLOSED, want SYN_SENT and TIME_WAIT", r.local, nw.TCPState, cl.TCPState)
		}
		if closes[0].Time.Before(news[0].Time) {
			t.Errorf("connection from %s: CLOSED at %s before NEW at %s", r.local, closes[0].Time, news[0].Time)
		}
	}
	if len(seen) != 3 {
		t.Errorf("backends that answered: %v, want all three", seen)
	}
	evs, lost := rec.snapshot()
	if len(evs) != 2*n || lost != 0 {
		t.Errorf("%d events and %d lost, want %d and none", len(evs), lost, 2*n)
	}
	// By destination: a later connection through the VIP may reuse the
	// direct connection's client port.
	for _, ev := range evs {
		if ev.Flow.Client == direct.local && ev.Flow.VIP != vip {
			t.Errorf("the direct connection was reported: %+v", ev)
		}
	}
	t.Logf("%d connections, backends %v; first NEW %+v", n, seen, evs[0])
}

func TestFlowEventsUDPTimeout(t *testing.T) {
	l := newFlowLab(t, 1, func(l *flowLab) []*dataplane.Service {
		return []*dataplane.Service{l.web(dataplane.UDP, "web1")}
	})
	rec := l.watch(t, flowReadBuffer, nil)
	ctx, cancel := context.WithTimeout(context.Background(), flowTimeout)
	defer cancel()
	reply, err := l.client.Request(ctx, "udp", fmt.Sprintf("%s:%d", flowVIP, flowPort))
	if err != nil || reply.Backend != "web1" {
		t.Fatalf("UDP request through the VIP: %+v %v", reply, err)
	}
	l.waitFor(t, "the UDP flow's CLOSED event", func() bool {
		_, closes := rec.of(reply.Local)
		return len(closes) > 0
	})
	news, closes := rec.of(reply.Local)
	if len(news) != 1 || len(closes) != 1 {
		t.Fatalf("%d NEW and %d CLOSED events, want one each", len(news), len(closes))
	}
	cl := closes[0].Flow
	vip := netip.AddrPortFrom(netip.MustParseAddr(flowVIP), flowPort)
	if cl.Protocol != dataplane.UDP || cl.VIP != vip || cl.Backend != l.backendAddr("web1") || cl.ID != news[0].Flow.ID ||
		cl.CloseReason != dataplane.CloseTimeout || cl.OrigPackets != 1 || cl.ReplyPackets != 1 ||
		cl.TCPState != dataplane.TCPStateUnknown || news[0].Flow.TCPState != dataplane.TCPStateUnknown {
		t.Fatalf("CLOSED %+v; want UDP %s -> %s, closed by timeout after one packet each way, without a TCP state on it or its NEW", cl, vip, l.backendAddr("web1"))
	}
}

const flowVIP6 = "fd00:198:ff::10"

func TestListFlows(t *testing.T) {
	l := newFlowLab(t, 2, func(l *flowLab) []*dataplane.Service {
		web6 := service("web6", []string{flowVIP6}, tcp(flowPort, flowTarget),
			dataplane.Backend{IP: l.lab.Pod("web2").IPv6(), State: dataplane.BackendReady, Weight: 1})
		dns := l.web(dataplane.UDP, "web1")
		dns.Name = "dns"
		return []*dataplane.Service{l.web(dataplane.TCP, "web1", "web2"), web6, dns}
	})
	// The UDP flow must live until it is listed, however slow the machine.
	if err := l.node.SetSysctl("net.netfilter.nf_conntrack_udp_timeout", "60"); err != nil {
		t.Fatal(err)
	}
	rec := l.watch(t, flowReadBuffer, nil)
	ctx, cancel := context.WithTimeout(context.Background(), flowTimeout)
	defer cancel()
	c, err := l.client.Dial(ctx, "tcp", fmt.Sprintf("%s:%d", flowVIP, flowPort))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	reply, err := c.Request(ctx)
	if err != nil {
		t.Fatal(err)
	}
	direct, err := l.client.Dial(ctx, "tcp", l.backendAddr("web1").String())
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if _, err := direct.Request(ctx); err != nil {
		t.Fatal(err)
	}
	// The node tracks both connections; only the first is vipd's.
	out, err := l.node.Exec(ctx, "conntrack", "-L", "-p", "tcp", "--dport", fmt.Sprint(flowTarget))
	if err != nil || !strings.Contains(out, fmt.Sprintf("sport=%d ", direct.LocalAddr().(*net.TCPAddr).Port)) {
		t.Fatalf("conntrack -L does not show the direct connection: %v\n%s", err, out)
	}

	vip6 := netip.AddrPortFrom(netip.MustParseAddr(flowVIP6), flowPort)
	c6, err := l.client.Dial(ctx, "tcp", vip6.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c6.Close()
	reply6, err := c6.Request(ctx)
	if err != nil || reply6.Backend != "web2" {
		t.Fatalf("request through the IPv6 VIP: %+v %v", reply6, err)
	}

	udp, err := l.client.Request(ctx, "udp", fmt.Sprintf("%s:%d", flowVIP, flowPort))
	if err != nil || udp.Backend != "web1" {
		t.Fatalf("UDP request through the VIP: %+v %v", udp, err)
	}

	flows, err := l.dp.ListFlows(ctx)
	if err != nil {
		t.Fatal(err)
	}
	vip := netip.AddrPortFrom(netip.MustParseAddr(flowVIP), flowPort)
	// The TCP connections are open and idle: ESTABLISHED.
	want := map[netip.AddrPort]dataplane.Flow{
		reply.Local: {Protocol: dataplane.TCP, Client: reply.Local, VIP: vip, Backend: l.backendAddr(reply.Backend),
			TCPState: dataplane.TCPEstablished},
		reply6.Local: {Protocol: dataplane.TCP, Client: reply6.Local, VIP: vip6, Backend: netip.AddrPortFrom(l.lab.Pod("web2").IPv6(), flowTarget),
			TCPState: dataplane.TCPEstablished},
		udp.Local: {Protocol: dataplane.UDP, Client: udp.Local, VIP: vip, Backend: l.backendAddr("web1")},
	}
	if len(flows) != len(want) {
		t.Fatalf("ListFlows: %+v, want only the connections through the VIPs", flows)
	}
	for _, f := range flows {
		w := want[f.Client]
		w.ID = f.ID
		minOrig, minReply := uint64(3), uint64(2) // SYN, ACK, request; SYN-ACK, reply
		if f.Protocol == dataplane.UDP {
			minOrig, minReply = 1, 1
		}
		if got := (dataplane.Flow{ID: f.ID, Protocol: f.Protocol, Client: f.Client, VIP: f.VIP, Backend: f.Backend, TCPState: f.TCPState}); got != w ||
			f.Start.IsZero() || f.OrigPackets < minOrig || f.ReplyPackets < minReply || f.OrigBytes == 0 || f.CloseReason != "" {
			t.Errorf("ListFlows: %+v; want %+v with a start and counters so far", f, w)
		}
		// The same flow, with the same ID, was reported as new.
		l.waitFor(t, "the NEW event of "+f.Client.String(), func() bool {
			news, _ := rec.of(f.Client)
			return len(news) == 1 && news[0].Flow.ID == f.ID && news[0].Flow.Backend == f.Backend
		})
	}
}

// TestFlowFilterIsInTheKernel checks that events of connections vipd did
// not DNAT never reach the event socket: nothing is queued on it while the
// node tracks direct connections, and a connection through the VIP queues
// its event at once.
func TestFlowFilterIsInTheKernel(t *testing.T) {
	l := newFlowLab(t, 1, func(l *flowLab) []*dataplane.Service {
		return []*dataplane.Service{l.web(dataplane.TCP, "web1")}
	})
	s, err := l.dp.ct.dialFlowEvents(flowReadBuffer)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	queued := func() uint32 {
		mem, err := s.meminfo()
		if err != nil {
			t.Fatal(err)
		}
		return mem[unix.SK_MEMINFO_RMEM_ALLOC]
	}
	ctx, cancel := context.WithTimeout(context.Background(), flowTimeout)
	defer cancel()
	for range 20 {
		if _, err := l.connect(ctx, l.backendAddr("web1").String()); err != nil {
			t.Fatal(err)
		}
	}
	if q := queued(); q != 0 {
		t.Fatalf("%d bytes queued on the event socket after direct connections only", q)
	}
	if _, err := l.connect(ctx, fmt.Sprintf("%s:%d", flowVIP, flowPort)); err != nil {
		t.Fatal(err)
	}
	if q := queued(); q == 0 {
		t.Fatal("nothing queued on the event socket after a connection through the VIP")
	}
}

// TestFlowLostEvents stalls the reader of a socket with a tiny buffer: the
// events it reports and the ones it counts as lost add up exactly to the
// events the connections caused.
func TestFlowLostEvents(t *testing.T) {
	l := newFlowLab(t, 1, func(l *flowLab) []*dataplane.Service {
		return []*dataplane.Service{l.web(dataplane.TCP, "web1")}
	})
	release := make(chan struct{})
	var once sync.Once
	rec := l.watch(t, 4096, func(dataplane.FlowEvent) { <-release })
	defer once.Do(func() { close(release) })
	ctx, cancel := context.WithTimeout(context.Background(), flowTimeout)
	defer cancel()
	const n = 50
	for range n {
		if _, err := l.connect(ctx, fmt.Sprintf("%s:%d", flowVIP, flowPort)); err != nil {
			t.Fatal(err)
		}
	}
	// Every entry gone means every DESTROY event has been sent.
	l.waitFor(t, "the flows to end", func() bool {
		flows, err := l.dp.ListFlows(ctx)
		return err == nil && len(flows) == 0
	})
	once.Do(func() { close(release) })
	l.waitFor(t, "every event to be reported or counted lost", func() bool {
		evs, lost := rec.snapshot()
		return uint64(len(evs))+lost >= 2*n
	})
	time.Sleep(200 * time.Millisecond)
	evs, lost := rec.snapshot()
	if lost == 0 || uint64(len(evs))+lost != 2*n {
		t.Fatalf("%d events reported and %d lost; want some lost and %d in all", len(evs), lost, 2*n)
	}
	t.Logf("%d events reported, %d lost", len(evs), lost)
}

func TestFlowCloseReasons(t *testing.T) {
	l := newFlowLab(t, 2, func(l *flowLab) []*dataplane.Service {
		tcp := l.web(dataplane.TCP, "web1")
		udp := l.web(dataplane.UDP, "web1", "web2")
		udp.Name = "dns"
		return []*dataplane.Service{tcp, udp}
	})
	rec := l.watch(t, flowReadBuffer, nil)
	ctx, cancel := context.WithTimeout(context.Background(), flowTimeout)
	defer cancel()
	vip := fmt.Sprintf("%s:%d", flowVIP, flowPort)
	closeReason := func(client netip.AddrPort) string {
		t.Helper()
		var closes []dataplane.FlowEvent
		l.waitFor(t, "the CLOSED event of "+client.String(), func() bool {
			_, closes = rec.of(client)
			return len(closes) > 0
		})
		return closes[0].Flow.CloseReason
	}

	// A connection reset by the client.
	c, err := l.client.Dial(ctx, "tcp", vip)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Request(ctx); err != nil {
		t.Fatal(err)
	}
	c.Conn.(*net.TCPConn).SetLinger(0)
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	c.Close()
	if got := closeReason(local); got != dataplane.CloseRST {
		t.Errorf("reset connection: close reason %q, want rst", got)
	}
	if _, closes := rec.of(local); closes[0].Flow.TCPState != dataplane.TCPClose {
		t.Errorf("reset connection: TCP state %v on CLOSED, want CLOSE", closes[0].Flow.TCPState)
	}

	// An entry deleted by hand.
	c, err = l.client.Dial(ctx, "tcp", vip)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Request(ctx); err != nil {
		t.Fatal(err)
	}
	local = c.LocalAddr().(*net.TCPAddr).AddrPort()
	if out, err := l.node.Exec(ctx, "conntrack", "-D", "-p", "tcp", "--sport", fmt.Sprint(local.Port())); err != nil {
		t.Fatalf("conntrack -D: %v\n%s", err, out)
	}
	if got := closeReason(local); got != dataplane.CloseDeleted {
		t.Errorf("entry deleted with conntrack -D: close reason %q, want deleted", got)
	}

	// UDP flows whose backend vipd removes.
	var toWeb2 netip.AddrPort
	for range 100 {
		r, err := l.client.Request(ctx, "udp", vip)
		if err != nil {
			t.Fatal(err)
		}
		if r.Backend == "web2" {
			toWeb2 = r.Local
			break
		}
	}
	if !toWeb2.IsValid() {
		t.Fatal("no UDP request reached web2")
	}
	tcp := l.web(dataplane.TCP, "web1")
	udp := l.web(dataplane.UDP, "web1")
	udp.Name = "dns"
	if err := l.dp.Apply(ctx, state(tcp, udp)); err != nil {
		t.Fatal(err)
	}
	if got := closeReason(toWeb2); got != dataplane.CloseBackendRemoved {
		t.Errorf("UDP flow to a removed backend: close reason %q, want backend_removed", got)
	}
}

func TestExplainAffinity(t *testing.T) {
	const affinity = 30 * time.Second
	l := newFlowLab(t, 3, func(l *flowLab) []*dataplane.Service {
		svc := l.web(dataplane.TCP, "web1", "web2", "web3")
		svc.Affinity = dataplane.SessionAffinity{ClientIP: true, Timeout: affinity}
		svc6 := service("web6", []string{flowVIP6}, tcp(flowPort, flowTarget))
		for _, p := range []string{"web1", "web2", "web3"} {
			svc6.Backends = append(svc6.Backends, dataplane.Backend{IP: l.lab.Pod(p).IPv6(), State: dataplane.BackendReady, Weight: 1})
		}
		svc6.Affinity = svc.Affinity
		return []*dataplane.Service{svc, svc6}
	})
	ctx, cancel := context.WithTimeout(context.Background(), flowTimeout)
	defer cancel()
	vip := netip.AddrPortFrom(netip.MustParseAddr(flowVIP), flowPort)
	q := dataplane.ExplainQuery{Protocol: dataplane.TCP, Client: netip.AddrPortFrom(l.client.IPv4(), 0), VIP: vip}
	if e, err := l.dp.ExplainFlow(ctx, q); err != nil || e != (dataplane.Explanation{}) {
		t.Fatalf("before any connection: %+v %v, want nothing", e, err)
	}
	r, err := l.client.Request(ctx, "tcp", vip.String())
	if err != nil {
		t.Fatal(err)
	}
	e, err := l.dp.ExplainFlow(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	want := l.backendAddr(r.Backend)
	if e.AffinityBackend != want || e.Pick != want || e.AffinityRemaining <= affinity-5*time.Second || e.AffinityRemaining > affinity {
		t.Fatalf("after a connection answered by %s: %+v, want affinity to %s with about %s left", r.Backend, e, want, affinity)
	}
	t.Logf("after a connection answered by %s: %+v", r.Backend, e)
	// What Explain says is what the next connections get.
	for range 5 {
		r, err := l.client.Request(ctx, "tcp", vip.String())
		if err != nil || l.backendAddr(r.Backend) != e.Pick {
			t.Fatalf("next connection: %+v %v, want %s", r, err, e.Pick)
		}
	}
	// The same over IPv6, where xt_recent spells addresses in full.
	vip6 := netip.AddrPortFrom(netip.MustParseAddr(flowVIP6), flowPort)
	r6, err := l.client.Request(ctx, "tcp", vip6.String())
	if err != nil {
		t.Fatal(err)
	}
	e6, err := l.dp.ExplainFlow(ctx, dataplane.ExplainQuery{Protocol: dataplane.TCP, Client: r6.Local, VIP: vip6})
	if want := netip.AddrPortFrom(l.lab.Pod(r6.Backend).IPv6(), flowTarget); err != nil || e6.Pick != want || e6.AffinityRemaining <= 0 {
		t.Fatalf("IPv6, after a connection answered by %s: %+v %v, want affinity to %s", r6.Backend, e6, err, want)
	}
	// Another client, a port without affinity and another VIP have no entry.
	for _, q := range []dataplane.ExplainQuery{
		{Protocol: dataplane.TCP, Client: netip.AddrPortFrom(netip.MustParseAddr("198.18.1.99"), 0), VIP: vip},
		{Protocol: dataplane.UDP, Client: q.Client, VIP: vip},
		{Protocol: dataplane.TCP, Client: q.Client, VIP: netip.AddrPortFrom(netip.MustParseAddr("198.19.0.99"), flowPort)},
	} {
		if e, err := l.dp.ExplainFlow(ctx, q); err != nil || e != (dataplane.Explanation{}) {
			t.Errorf("%+v: %+v %v, want nothing", q, e, err)
		}
	}
}

func TestLastSeen(t *testing.T) {
	list := []byte("src=198.18.1.10 ttl: 64 last_seen: 4298186797 oldest_pkt: 2 4298186700, 4298186797\n" +
		"src=fd00:0198:0001:0000:0000:0000:0000:000a ttl: 64 last_seen: 4298186800 oldest_pkt: 1 4298186800\n")
	for addr, want := range map[string]uint64{"198.18.1.10": 4298186797, "fd00:198:1::a": 4298186800, "198.18.1.11": 0} {
		got, ok := lastSeen(list, netip.MustParseAddr(addr))
		if got != want || ok != (want != 0) {
			t.Errorf("lastSeen(%s) = %d, %v; want %d", addr, got, ok, want)
		}
	}
}

// TestFlowClosedAfterWatchStarts checks that a connection opened while
// nothing watched still reports its close (nf_conntrack_events=1).
func TestFlowClosedAfterWatchStarts(t *testing.T) {
	l := newFlowLab(t, 1, func(l *flowLab) []*dataplane.Service {
		return []*dataplane.Service{l.web(dataplane.TCP, "web1")}
	})
	ctx, cancel := context.WithTimeout(context.Background(), flowTimeout)
	defer cancel()
	c, err := l.client.Dial(ctx, "tcp", fmt.Sprintf("%s:%d", flowVIP, flowPort))
	if err != nil {
		t.Fatal(err)
	}
	reply, err := c.Request(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rec := l.watch(t, flowReadBuffer, nil)
	c.Close()
	var closes []dataplane.FlowEvent
	l.waitFor(t, "the CLOSED event", func() bool {
		_, closes = rec.of(reply.Local)
		return len(closes) > 0
	})
	if f := closes[0].Flow; f.Backend != l.backendAddr("web1") || f.CloseReason != dataplane.CloseFIN || f.OrigBytes == 0 {
		t.Fatalf("CLOSED %+v, want a FIN close to web1 with counters", f)
	}
}

// TestFlowSysctlsOnlyWhenAsked: without Config.SetFlowSysctls (vipd's
// --set-sysctls), opening the dataplane and applying leave the conntrack
// accounting, timestamp and event sysctls as they were, so that the node
// check's warning about them is true; with it, they are turned on.
func TestFlowSysctlsOnlyWhenAsked(t *testing.T) {
	netlab.RequireRoot(t)
	node := netlab.New(t, netlab.Spec{}).Node(1)
	want := map[string]string{
		"net.netfilter.nf_conntrack_acct":      "0",
		"net.netfilter.nf_conntrack_timestamp": "0",
		"net.netfilter.nf_conntrack_events":    "2",
	}
	for key, v := range want {
		if err := node.SetSysctl(key, v); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, set := range []bool{false, true} {
		var log syncbuf.Buffer
		dp, err := New(ctx, hclog.New(&hclog.LoggerOptions{Output: &log}), Config{NetNS: node.Path(), Mode: ModeNFT, SetFlowSysctls: set})
		if err != nil {
			t.Fatal(err)
		}
		if err := dp.Apply(ctx, state(service("web", []string{flowVIP}, []dataplane.Port{port("", dataplane.TCP, flowPort, flowTarget)}))); err != nil {
			t.Fatal(err)
		}
		dp.Close()
		if logged := strings.Contains(log.String(), "--set-sysctls: set sysctl: sysctl=\"/proc/sys/net/netfilter/nf_conntrack_events: 2 -> 1\""); logged != set {
			t.Errorf("SetFlowSysctls %v: logged the events sysctl set: %v:\n%s", set, logged, log.String())
		}
		for key, v := range want {
			if set {
				v = "1"
			}
			if got, err := node.Sysctl(key); err != nil || got != v {
				t.Errorf("SetFlowSysctls %v: %s is %q (%v) after New and Apply, want %s", set, key, got, err, v)
			}
		}
	}
}

// flowCounter is a flowhub.Observer that counts the events the hub read
// and the kernel's losses.
type flowCounter struct {
	mu                sync.Mutex
	news, closes      int
	lostKernel, other uint64
}

func (c *flowCounter) Flow(_ string, t dataplane.FlowEventType) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch t {
	case dataplane.FlowNew:
		c.news++
	case dataplane.FlowClosed:
		c.closes++
	}
}

func (c *flowCounter) Lost(source string, n uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if source == flowhub.LostKernel {
		c.lostKernel += n
	} else {
		c.other += n
	}
}

func (c *flowCounter) counts() (news, closes int, lostKernel, other uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.news, c.closes, c.lostKernel, c.other
}

// TestFlowDestroyBurstFitsHubBuffer has the kernel destroy, at once,
// flowDestroyBurst expired vipd entries, as a dump or a garbage collection
// pass does with the entries of the connections that closed during the
// last seconds, while a WatchFlows subscriber of a hub with the default
// buffer reads none of their CLOSED events until the burst is over. The
// reader takes a burst from the socket much faster than a gRPC stream
// sends it on, so the subscriber's buffer, not the socket's, has to hold
// it: with a default of 4096 events, vipd-bench lost thousands of CLOSED
// events at 8,500 connections per second, all on the subscriber's side.
func TestFlowDestroyBurstFitsHubBuffer(t *testing.T) {
	// The CLOSED events of about 3 s at the highest rate vipd-bench makes.
	const flowDestroyBurst = 30_000
	l := newFlowLab(t, 1, func(l *flowLab) []*dataplane.Service {
		return []*dataplane.Service{l.web(dataplane.TCP, "web1")}
	})
	ctx, cancel := context.WithTimeout(context.Background(), flowTimeout)
	defer cancel()
	obs := &flowCounter{}
	hub := flowhub.New(hclog.NewNullLogger(), l.dp, flowhub.WithObserver(obs))
	ran := make(chan error, 1)
	go func() { ran <- hub.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-ran
	})
	sub, err := hub.Subscribe(flowhub.Filter{Types: []dataplane.FlowEventType{dataplane.FlowClosed}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()

	ct, err := conntrack.Dial(l.dp.ct.netlinkConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer ct.Close()
	// Entries of UDP flows from 198.18.200.0/24 to the VIP, marked as the
	// SVC chains mark them, which expire a second after they are made.
	vip := netip.MustParseAddr(flowVIP)
	entry := func(i int) conntrack.Flow {
		client := netip.AddrFrom4([4]byte{198, 18, 200, byte(i / 60000)})
		return conntrack.NewFlow(unix.IPPROTO_UDP, 0, client, vip, uint16(1024+i%60000), flowPort, 1, FlowMark)
	}
	// The hub reads the socket once a probe entry's NEW event comes. Every
	// probe's DESTROY event comes too: with nf_conntrack_events at 1, an
	// entry made before the socket listened reports its end all the same.
	probes := 0
	for news := 0; news == 0; news, _, _, _ = obs.counts() {
		if ctx.Err() != nil {
			t.Fatal("the hub read no NEW event of a probe entry")
		}
		if err := ct.Create(entry(flowDestroyBurst + probes)); err != nil {
			t.Fatal(err)
		}
		probes++
		time.Sleep(100 * time.Millisecond)
	}
	for i := range flowDestroyBurst {
		if err := ct.Create(entry(i)); err != nil {
			t.Fatalf("create entry %d: %v", i, err)
		}
	}
	want := probes + flowDestroyBurst
	l.waitFor(t, "every entry's CLOSED event to reach the hub", func() bool {
		_, closes, lostKernel, _ := obs.counts()
		return closes+int(lostKernel) >= want
	})
	// The kernel may drop some of the burst when the reader is starved of
	// CPU; what the hub read must reach the subscriber all the same, and
	// enough of it for the old buffer of 4096 events to overflow.
	_, hubCloses, lostKernel, _ := obs.counts()
	if hubCloses < 2*4096 {
		t.Fatalf("the kernel dropped %d of %d events: the hub read too few (%d) to test its buffer", lostKernel, want, hubCloses)
	}

	var closes int
	lostBySource := map[string]uint64{}
	for closes+int(lostBySource[flowhub.LostKernel]+lostBySource[flowhub.LostSubscriber]) < want {
		m, err := sub.Next(ctx)
		if err != nil {
			t.Fatalf("after %d CLOSED events and %v lost: %v", closes, lostBySource, err)
		}
		if m.Lost != nil {
			lostBySource[m.Lost.Source] += m.Lost.Count
			continue
		}
		closes++
	}
	if _, _, _, hubLost := obs.counts(); closes != hubCloses || lostBySource[flowhub.LostSubscriber] != 0 || hubLost != 0 {
		t.Fatalf("the subscriber got %d of the %d CLOSED events the hub read, and lost %d of them itself (buffer %d events)",
			closes, hubCloses, lostBySource[flowhub.LostSubscriber], hub.Buffer())
	}
}
