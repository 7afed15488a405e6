package flowhub_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/fake"
	"github.com/vipd/vipd/server/flowhub"
)

var (
	vipWeb  = netip.MustParseAddrPort("10.96.0.10:80")
	vipDNS  = netip.MustParseAddrPort("10.96.0.53:53")
	vipNone = netip.MustParseAddrPort("10.96.0.99:80")
	t0      = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
)

// resolver knows default/web:http on vipWeb/TCP and kube-system/dns on
// vipDNS/UDP, until forget is called.
type resolver struct {
	mu     sync.Mutex
	forgot bool
}

func (r *resolver) resolve(p dataplane.Protocol, vip netip.AddrPort) (string, string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.forgot:
	case p == dataplane.TCP && vip == vipWeb:
		return "default/web", "http", true
	case p == dataplane.UDP && vip == vipDNS:
		return "kube-system/dns", "", true
	}
	return "", "", false
}

func (r *resolver) forget() {
	r.mu.Lock()
	r.forgot = true
	r.mu.Unlock()
}

// observer counts what a hub reports to it.
type observer struct {
	mu    sync.Mutex
	flows map[string]int
	lost  map[string]uint64
}

func (o *observer) Flow(svc string, t dataplane.FlowEventType) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.flows[svc+" "+t.String()]++
}

func (o *observer) Lost(src string, n uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.lost[src] += n
}

func newObserver() *observer {
	return &observer{flows: map[string]int{}, lost: map[string]uint64{}}
}

// run starts a hub over a new fake and stops it at the end of the test.
func run(t *testing.T, opts ...flowhub.Option) (*flowhub.Hub, *fake.Dataplane) {
	t.Helper()
	dp := fake.New()
	h := flowhub.New(hclog.NewNullLogger(), dp, opts...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v, want context.Canceled", err)
		}
	})
	return h, dp
}

func subscribe(t *testing.T, h *flowhub.Hub, f flowhub.Filter) *flowhub.Subscription {
	t.Helper()
	s, err := h.Subscribe(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// flow is flow number id from client 10.0.0.<id%200+1> to vip, sent to
// backend 10.0.1.1:8080.
func flow(id uint64, p dataplane.Protocol, vip netip.AddrPort) dataplane.Flow {
	return dataplane.Flow{
		ID: id, Protocol: p,
		Client:  netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(id%200 + 1)}), uint16(40000+id%20000)),
		VIP:     vip,
		Backend: netip.MustParseAddrPort("10.0.1.1:8080"),
		Start:   t0.Add(time.Duration(id) * time.Millisecond),
	}
}

func newEvent(id uint64) dataplane.FlowEvent {
	f := flow(id, dataplane.TCP, vipWeb)
	return dataplane.FlowEvent{Type: dataplane.FlowNew, Time: f.Start, Flow: f}
}

// item is a Message in a form that is easy to compare: "new 3" or "lost subscriber 6".
func item(m flowhub.Message) string {
	if m.Lost != nil {
		return fmt.Sprintf("lost %s %d", m.Lost.Source, m.Lost.Count)
	}
	return fmt.Sprintf("%s %d", m.Event.Type, m.Event.Flow.ID)
}

// next reads n messages from s.
func next(t *testing.T, s *flowhub.Subscription, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var got []string
	for range n {
		m, err := s.Next(ctx)
		if err != nil {
			t.Fatalf("Next after %v: %v", got, err)
		}
		got = append(got, item(m))
	}
	return got
}

// idle checks that s has nothing to deliver.
func idle(t *testing.T, s *flowhub.Subscription) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if m, err := s.Next(ctx); err == nil {
		t.Errorf("unexpected message %s", item(m))
	}
}

func news(ids ...uint64) []string {
	var s []string
	for _, id := range ids {
		s = append(s, fmt.Sprintf("new %d", id))
	}
	return s
}

func TestEverySubscriberGetsEveryEvent(t *testing.T) {
	h, dp := run(t)
	a := subscribe(t, h, flowhub.Filter{})
	b := subscribe(t, h, flowhub.Filter{})
	for id := range uint64(100) {
		dp.Emit(newEvent(id))
	}
	var want []string
	for id := range uint64(100) {
		want = append(want, fmt.Sprintf("new %d", id))
	}
	for _, s := range []*flowhub.Subscription{a, b} {
		if diff := cmp.Diff(want, next(t, s, 100)); diff != "" {
			t.Errorf("events (-want +got):\n%s", diff)
		}
		idle(t, s)
	}
}

func TestSlowSubscriberLosesExactly(t *testing.T) {
	obs := newObserver()
	h, dp := run(t, flowhub.WithBuffer(4), flowhub.WithObserver(obs))
	slow := subscribe(t, h, flowhub.Filter{})
	fast := subscribe(t, h, flowhub.Filter{})

	var fastGot []string
	for id := range uint64(10) {
		dp.Emit(newEvent(id))
		fastGot = append(fastGot, next(t, fast, 1)...)
	}
	// slow holds 0-3 and has missed 4-9. Reading two makes room for 10,
	// which comes after the loss.
	if diff := cmp.Diff(news(0, 1), next(t, slow, 2)); diff != "" {
		t.Errorf("slow (-want +got):\n%s", diff)
	}
	dp.Emit(newEvent(10))
	fastGot = append(fastGot, next(t, fast, 1)...)
	want := append(news(2, 3), "lost subscriber 6", "new 10")
	if diff := cmp.Diff(want, next(t, slow, 4)); diff != "" {
		t.Errorf("slow (-want +got):\n%s", diff)
	}
	idle(t, slow)
	if diff := cmp.Diff(news(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10), fastGot); diff != "" {
		t.Errorf("fast subscriber (-want +got):\n%s", diff)
	}

	// A loss with nothing after it is reported once the buffer is drained.
	for id := uint64(11); id < 17; id++ {
		dp.Emit(newEvent(id))
		next(t, fast, 1)
	}
	want = append(news(11, 12, 13, 14), "lost subscriber 2")
	if diff := cmp.Diff(want, next(t, slow, 5)); diff != "" {
		t.Errorf("slow (-want +got):\n%s", diff)
	}
	idle(t, slow)
	if got := obs.lost[flowhub.LostSubscriber]; got != 8 {
		t.Errorf("observer saw %d subscriber losses, want 8", got)
	}
}

func TestBufferGrows(t *testing.T) {
	h, dp := run(t, flowhub.WithBuffer(300))
	s := subscribe(t, h, flowhub.Filter{})
	var want []string
	// Reading some first moves the ring's head, so that it grows wrapped.
	for id := range uint64(40) {
		dp.Emit(newEvent(id))
	}
	next(t, s, 30)
	for id := uint64(40); id < 400; id++ {
		dp.Emit(newEvent(id))
	}
	for id := uint64(30); id < 330; id++ {
		want = append(want, fmt.Sprintf("new %d", id))
	}
	want = append(want, "lost subscriber 70")
	if diff := cmp.Diff(want, next(t, s, len(want))); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestKernelLosses(t *testing.T) {
	obs := newObserver()
	h, dp := run(t, flowhub.WithBuffer(2), flowhub.WithObserver(obs))
	a := subscribe(t, h, flowhub.Filter{})
	b := subscribe(t, h, flowhub.Filter{Protocol: dataplane.UDP})
	dp.Emit(newEvent(1))
	dp.Lose(5)
	dp.Emit(newEvent(2))
	dp.Emit(newEvent(3))
	dp.Lose(7)
	// Every subscriber hears of every kernel loss, where it happened, even
	// one whose filter nothing matched, and one that also lost events
	// itself (at the same point, kernel losses are reported first).
	if diff := cmp.Diff([]string{"new 1", "lost kernel 5", "new 2", "lost kernel 7", "lost subscriber 1"}, next(t, a, 5)); diff != "" {
		t.Errorf("a (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"lost kernel 12"}, next(t, b, 1)); diff != "" {
		t.Errorf("b (-want +got):\n%s", diff)
	}
	idle(t, a)
	idle(t, b)
	if diff := cmp.Diff(map[string]uint64{flowhub.LostKernel: 12, flowhub.LostSubscriber: 1}, obs.lost); diff != "" {
		t.Errorf("observer (-want +got):\n%s", diff)
	}
}

func TestFilter(t *testing.T) {
	web := flowhub.Flow{Flow: flow(1, dataplane.TCP, vipWeb), Service: "default/web", PortName: "http"}
	for _, tc := range []struct {
		name   string
		filter flowhub.Filter
		match  bool
	}{
		{"empty", flowhub.Filter{}, true},
		{"service", flowhub.Filter{Service: "default/web"}, true},
		{"other service", flowhub.Filter{Service: "default/api"}, false},
		{"vip", flowhub.Filter{VIP: vipWeb.Addr()}, true},
		{"vip and port", flowhub.Filter{VIP: vipWeb.Addr(), VIPPort: 80}, true},
		{"vip, other port", flowhub.Filter{VIP: vipWeb.Addr(), VIPPort: 443}, false},
		{"other vip", flowhub.Filter{VIP: vipDNS.Addr()}, false},
		{"backend", flowhub.Filter{Backend: netip.MustParseAddr("10.0.1.1")}, true},
		{"backend and port", flowhub.Filter{Backend: netip.MustParseAddr("10.0.1.1"), BackendPort: 8080}, true},
		{"backend, other port", flowhub.Filter{Backend: netip.MustParseAddr("10.0.1.1"), BackendPort: 80}, false},
		{"other backend", flowhub.Filter{Backend: netip.MustParseAddr("10.0.1.2")}, false},
		{"client", flowhub.Filter{Client: netip.MustParsePrefix("10.0.0.2/32")}, true},
		{"client cidr", flowhub.Filter{Client: netip.MustParsePrefix("10.0.0.0/24")}, true},
		{"other client", flowhub.Filter{Client: netip.MustParsePrefix("10.0.0.3/32")}, false},
		{"other client cidr", flowhub.Filter{Client: netip.MustParsePrefix("10.1.0.0/16")}, false},
		{"ipv6 client cidr", flowhub.Filter{Client: netip.MustParsePrefix("fd00::/8")}, false},
		{"protocol", flowhub.Filter{Protocol: dataplane.TCP}, true},
		{"other protocol", flowhub.Filter{Protocol: dataplane.UDP}, false},
		{"all fields", flowhub.Filter{Service: "default/web", VIP: vipWeb.Addr(), Backend: netip.MustParseAddr("10.0.1.1"),
			Client: netip.MustParsePrefix("10.0.0.0/8"), Protocol: dataplane.TCP}, true},
		{"all fields but one", flowhub.Filter{Service: "default/web", VIP: vipWeb.Addr(), Backend: netip.MustParseAddr("10.0.1.1"),
			Client: netip.MustParsePrefix("10.0.0.0/8"), Protocol: dataplane.SCTP}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.filter.Match(&web); got != tc.match {
				t.Errorf("Match = %v, want %v", got, tc.match)
			}
		})
	}

	// An IPv4-mapped address in a flow matches its IPv4 form.
	mapped := web
	mapped.Client = netip.AddrPortFrom(netip.AddrFrom16(web.Client.Addr().As16()), 1)
	mapped.VIP = netip.AddrPortFrom(netip.AddrFrom16(web.VIP.Addr().As16()), 80)
	f := flowhub.Filter{Client: netip.MustParsePrefix("10.0.0.0/24"), VIP: vipWeb.Addr()}
	if !f.Match(&mapped) {
		t.Errorf("a flow with IPv4-mapped addresses does not match %+v", f)
	}

	ev := flowhub.Event{Type: dataplane.FlowClosed, Flow: web}
	if f := (flowhub.Filter{Types: []dataplane.FlowEventType{dataplane.FlowNew}}); f.MatchEvent(&ev) {
		t.Errorf("a CLOSED event matches a filter for NEW events")
	}
	if f := (flowhub.Filter{Types: []dataplane.FlowEventType{dataplane.FlowNew, dataplane.FlowClosed}}); !f.MatchEvent(&ev) {
		t.Errorf("a CLOSED event does not match a filter for NEW and CLOSED events")
	}
}

func TestSubscriptionFilters(t *testing.T) {
	r := &resolver{}
	h, dp := run(t, flowhub.WithResolver(r.resolve))
	web := subscribe(t, h, flowhub.Filter{Service: "default/web"})
	udp := subscribe(t, h, flowhub.Filter{Protocol: dataplane.UDP, Types: []dataplane.FlowEventType{dataplane.FlowClosed}})

	dns := flow(2, dataplane.UDP, vipDNS)
	dp.Emit(newEvent(1))
	dp.Emit(dataplane.FlowEvent{Type: dataplane.FlowNew, Flow: dns})
	dp.Emit(dataplane.FlowEvent{Type: dataplane.FlowClosed, Flow: dns})
	dp.Emit(dataplane.FlowEvent{Type: dataplane.FlowClosed, Flow: flow(1, dataplane.TCP, vipWeb)})
	if diff := cmp.Diff([]string{"new 1", "closed 1"}, next(t, web, 2)); diff != "" {
		t.Errorf("web (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"closed 2"}, next(t, udp, 1)); diff != "" {
		t.Errorf("udp (-want +got):\n%s", diff)
	}
	idle(t, web)
	idle(t, udp)
}

func TestResolve(t *testing.T) {
	r := &resolver{}
	obs := newObserver()
	h, dp := run(t, flowhub.WithResolver(r.resolve), flowhub.WithObserver(obs))
	s := subscribe(t, h, flowhub.Filter{})
	ctx := context.Background()

	dp.Emit(newEvent(1))
	dp.Emit(dataplane.FlowEvent{Type: dataplane.FlowNew, Flow: flow(2, dataplane.TCP, vipNone)})
	dp.SetFlows([]dataplane.Flow{flow(1, dataplane.TCP, vipWeb), flow(3, dataplane.TCP, vipWeb)}, nil)
	// The service goes away: the flow that began under it keeps its name,
	// in listings and in its CLOSED event; others no longer resolve.
	r.forget()
	list, _, err := h.List(ctx, flowhub.Filter{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := map[uint64]string{}
	for _, f := range list {
		got[f.ID] = f.Service + ":" + f.PortName
	}
	if diff := cmp.Diff(map[uint64]string{1: "default/web:http", 3: ":"}, got); diff != "" {
		t.Errorf("listed services (-want +got):\n%s", diff)
	}
	closed := flow(1, dataplane.TCP, vipWeb)
	closed.CloseReason = dataplane.CloseServiceRemoved
	dp.Emit(dataplane.FlowEvent{Type: dataplane.FlowClosed, Flow: closed})
	// Once closed, the flow is forgotten.
	dp.Emit(dataplane.FlowEvent{Type: dataplane.FlowClosed, Flow: closed})

	var services []string
	for range 4 {
		m, err := s.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		services = append(services, fmt.Sprintf("%s %d %s:%s", m.Event.Type, m.Event.Flow.ID, m.Event.Flow.Service, m.Event.Flow.PortName))
	}
	want := []string{"new 1 default/web:http", "new 2 :", "closed 1 default/web:http", "closed 1 :"}
	if diff := cmp.Diff(want, services); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	wantObs := map[string]int{"default/web new": 1, " new": 1, "default/web closed": 1, " closed": 1}
	if diff := cmp.Diff(wantObs, obs.flows); diff != "" {
		t.Errorf("observer (-want +got):\n%s", diff)
	}
}

func TestList(t *testing.T) {
	r := &resolver{}
	h, dp := run(t, flowhub.WithResolver(r.resolve))
	ctx := context.Background()
	var live []dataplane.Flow
	for id := uint64(10); id > 0; id-- {
		vip, p := vipWeb, dataplane.TCP
		if id%2 == 0 {
			vip, p = vipDNS, dataplane.UDP
		}
		live = append(live, flow(id, p, vip))
	}
	dp.SetFlows(live, nil)

	ids := func(fs []flowhub.Flow) []uint64 {
		var res []uint64
		for _, f := range fs {
			res = append(res, f.ID)
		}
		return res
	}
	for _, tc := range []struct {
		name      string
		filter    flowhub.Filter
		limit     int
		want      []uint64
		truncated bool
	}{
		{"all, oldest first", flowhub.Filter{}, 0, []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, false},
		{"service", flowhub.Filter{Service: "kube-system/dns"}, 0, []uint64{2, 4, 6, 8, 10}, false},
		{"limit", flowhub.Filter{Protocol: dataplane.TCP}, 3, []uint64{1, 3, 5}, true},
		{"limit not reached", flowhub.Filter{Protocol: dataplane.TCP}, 5, []uint64{1, 3, 5, 7, 9}, false},
		{"types are ignored", flowhub.Filter{Types: []dataplane.FlowEventType{dataplane.FlowClosed}}, 1, []uint64{1}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, truncated, err := h.List(ctx, tc.filter, tc.limit)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, ids(got)); diff != "" || truncated != tc.truncated {
				t.Errorf("truncated %v, want %v; flows (-want +got):\n%s", truncated, tc.truncated, diff)
			}
		})
	}

	dp.SetFlows(nil, errors.New("netlink: no buffer space"))
	if _, _, err := h.List(ctx, flowhub.Filter{}, 0); err == nil {
		t.Errorf("List with a failing source succeeded")
	}
}

func TestSourceFailure(t *testing.T) {
	h, dp := run(t, flowhub.WithRetry(time.Millisecond, time.Millisecond))
	s := subscribe(t, h, flowhub.Filter{})
	dp.Emit(newEvent(1))
	dp.FailWatch(errors.New("netlink receive: no buffer space available"))
	// What was buffered comes first, then the end.
	next(t, s, 1)
	var srcErr *flowhub.SourceError
	if _, err := s.Next(context.Background()); !errors.As(err, &srcErr) {
		t.Fatalf("Next after the source failed: %v, want a *SourceError", err)
	}
	if n := h.Subscribers(); n != 0 {
		t.Errorf("%d subscribers after the source failed, want 0", n)
	}
	// The hub reads again, for new subscribers.
	s2 := subscribe(t, h, flowhub.Filter{})
	dp.Emit(newEvent(2))
	if diff := cmp.Diff(news(2), next(t, s2, 1)); diff != "" {
		t.Errorf("after the restart (-want +got):\n%s", diff)
	}
}

func TestUnsupportedSourceStops(t *testing.T) {
	dp := fake.New()
	h := flowhub.New(hclog.NewNullLogger(), dp)
	s, err := h.Subscribe(flowhub.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- h.Run(context.Background()) }()
	dp.FailWatch(fmt.Errorf("conntrack events: %w", dataplane.ErrUnsupported))
	if err := <-done; !errors.Is(err, dataplane.ErrUnsupported) {
		t.Errorf("Run: %v, want ErrUnsupported", err)
	}
	if _, err := s.Next(context.Background()); err == nil {
		t.Errorf("the subscription outlived the hub")
	}
	if _, err := h.Subscribe(flowhub.Filter{}); !errors.Is(err, flowhub.ErrStopped) {
		t.Errorf("Subscribe after Run returned: %v, want ErrStopped", err)
	}
}

func TestStopAndClose(t *testing.T) {
	dp := fake.New()
	h := flowhub.New(hclog.NewNullLogger(), dp)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()

	closed, err := h.Subscribe(flowhub.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := h.Subscribe(flowhub.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	dp.Emit(newEvent(1))
	closed.Close()
	closed.Close()
	if n := h.Subscribers(); n != 1 {
		t.Errorf("%d subscribers after one of two closed, want 1", n)
	}
	// Buffered events can still be read after Close.
	if diff := cmp.Diff(news(1), next(t, closed, 1)); diff != "" {
		t.Errorf("closed (-want +got):\n%s", diff)
	}
	if _, err := closed.Next(context.Background()); !errors.Is(err, flowhub.ErrClosed) {
		t.Errorf("Next after Close: %v, want ErrClosed", err)
	}

	// Next waits until the hub stops.
	if diff := cmp.Diff(news(1), next(t, s, 1)); diff != "" {
		t.Errorf("s (-want +got):\n%s", diff)
	}
	got := make(chan error, 1)
	go func() {
		_, err := s.Next(context.Background())
		got <- err
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run: %v", err)
	}
	if err := <-got; !errors.Is(err, flowhub.ErrStopped) {
		t.Errorf("Next after the hub stopped: %v, want ErrStopped", err)
	}
	if _, err := h.Subscribe(flowhub.Filter{}); !errors.Is(err, flowhub.ErrStopped) {
		t.Errorf("Subscribe after the hub stopped: %v, want ErrStopped", err)
	}
}

// TestPublishHealth: a health transition reaches the subscribers whose
// filter selects it (no filter, its service, its backend with or without
// the probed port, the HealthTransition type) and no other (another
// service, backend or port, any VIP, client or protocol, flow types
// only), with its health; a full buffer counts it as lost.
func TestPublishHealth(t *testing.T) {
	h, dp := run(t, flowhub.WithBuffer(1))
	be := netip.MustParseAddrPort("10.0.1.1:8080")
	yes := map[string]*flowhub.Subscription{
		"all":          subscribe(t, h, flowhub.Filter{}),
		"service":      subscribe(t, h, flowhub.Filter{Service: "default/web"}),
		"backend":      subscribe(t, h, flowhub.Filter{Backend: be.Addr()}),
		"backend:port": subscribe(t, h, flowhub.Filter{Backend: be.Addr(), BackendPort: 8080}),
		"type":         subscribe(t, h, flowhub.Filter{Types: []dataplane.FlowEventType{flowhub.HealthTransition}}),
	}
	no := map[string]*flowhub.Subscription{
		"other service": subscribe(t, h, flowhub.Filter{Service: "default/db"}),
		"other backend": subscribe(t, h, flowhub.Filter{Backend: netip.MustParseAddr("10.0.1.2")}),
		"other port":    subscribe(t, h, flowhub.Filter{Backend: be.Addr(), BackendPort: 9090}),
		"vip":           subscribe(t, h, flowhub.Filter{Service: "default/web", VIP: vipWeb.Addr()}),
		"client":        subscribe(t, h, flowhub.Filter{Client: netip.MustParsePrefix("0.0.0.0/0")}),
		"protocol":      subscribe(t, h, flowhub.Filter{Protocol: dataplane.TCP}),
		"flow types":    subscribe(t, h, flowhub.Filter{Types: []dataplane.FlowEventType{dataplane.FlowNew, dataplane.FlowClosed}}),
	}
	since := t0.Add(time.Second)
	want := flowhub.Health{State: flowhub.HealthFailing, Since: since, LastError: "connection refused", Consecutive: 3,
		Detail: "failing health check (connection refused, 3 in a row)"}
	h.PublishHealth("default/web", be, want)
	for name, s := range yes {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		m, err := s.Next(ctx)
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		e := m.Event
		if e.Type != flowhub.HealthTransition || !e.Time.Equal(since) || e.Flow.Service != "default/web" || e.Flow.Backend != be ||
			e.Health == nil || *e.Health != want {
			t.Errorf("%s: got %+v (health %+v)", name, e, e.Health)
		}
	}
	for name, s := range no {
		t.Run(name, func(t *testing.T) { idle(t, s) })
	}
	// A buffer of one, full: the second transition is lost, and counted.
	h.PublishHealth("default/web", be, flowhub.Health{State: flowhub.HealthPassing, Since: since})
	h.PublishHealth("default/web", be, flowhub.Health{State: flowhub.HealthFailing, Since: since})
	if got := next(t, yes["all"], 2); got[1] != "lost subscriber 1" {
		t.Errorf("after a full buffer: %v, want the loss reported", got)
	}
	_ = dp
}
