package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/cgroup2"
	"github.com/vipd/vipd/internal/netlab"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// flowBenchDuration is how long the workers of BenchmarkFlowEvents make
// connections, per iteration.
const flowBenchDuration = 3 * time.Second

// BenchmarkFlowEvents measures the flow event pipeline under load, per
// dataplane: W workers in a client pod each make TCP connections to a VIP
// one after the other (connect, one request, close) for 3 s, while one
// WatchFlows stream (vipd's default buffer) reads every event of the
// service. It reports
//
//   - conn/s: connections made;
//   - events: NEW and CLOSED events the stream got; missing: those it got
//     neither as an event nor as part of a LostEvents count;
//   - lost: events reported lost (kernel and subscriber);
//   - new-p50-us, new-p99-us: from the start of connect() to the NEW
//     event's arrival on the stream, matched by client port.
//
// For iptables, node1's conntrack TIME_WAIT is cut to 1 s, so that CLOSED
// events (reported when the kernel destroys the entry) arrive while the
// benchmark waits for them.
//
//	go test ./bench/ -run '^$' -bench FlowEvents -benchtime 1x
func BenchmarkFlowEvents(b *testing.B) {
	for _, dp := range []string{"iptables", "ebpf"} {
		for _, w := range []int{4, 16} {
			b.Run(fmt.Sprintf("%s/workers=%d", dp, w), func(b *testing.B) { benchFlowEvents(b, dp, w) })
		}
	}
}

func benchFlowEvents(b *testing.B, dp string, workers int) {
	lab := netlab.New(b, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: []string{"client", "be1", "be2", "be3"}}}})
	node := lab.Node(1)
	clientPod := node.Pod("client")
	svc := &vipdv1.Service{
		Name: "bench/flows", Vips: []string{"198.19.0.10"},
		Ports: []*vipdv1.Port{{Name: "http", Port: 80, TargetPort: 8080}},
	}
	for _, name := range []string{"be1", "be2", "be3"} {
		p := node.Pod(name)
		if _, err := p.StartEcho(name, 8080); err != nil {
			b.Fatal(err)
		}
		svc.Backends = append(svc.Backends, &vipdv1.Backend{Ip: p.IPv4().String()})
	}
	vip := netip.MustParseAddrPort("198.19.0.10:80")
	// Room for every connection's port while it sits in TIME_WAIT; the
	// probes' ports lie below.
	if err := clientPod.SetSysctl("net.ipv4.ip_local_port_range", "2000 65535"); err != nil {
		b.Fatal(err)
	}
	args := []string{"--dataplane", dp}
	if dp == "ebpf" {
		args = append(args, "--cgroup-path", cgroup2.NewTestGroup(b))
	} else {
		for _, s := range [][2]string{
			{"net.netfilter.nf_conntrack_tcp_timeout_time_wait", "1"},
			{"net.netfilter.nf_conntrack_tcp_timeout_close_wait", "1"},
			{"net.netfilter.nf_conntrack_tcp_timeout_fin_wait", "1"},
			{"net.netfilter.nf_conntrack_tcp_timeout_last_ack", "1"},
			{"net.netfilter.nf_conntrack_tcp_timeout_close", "1"},
		} {
			if err := node.SetSysctl(s[0], s[1]); err != nil {
				b.Fatal(err)
			}
		}
	}
	_, api := startVipd(b, node, args...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := api.UpsertService(ctx, svc, 0); err != nil {
		b.Fatal(err)
	}

	w, err := watchFlowEvents(ctx, api, svc.Name)
	if err != nil {
		b.Fatal(err)
	}
	// The stream is subscribed once a connection's NEW reaches it.
	deadline := time.Now().Add(15 * time.Second)
	for port, synced := uint16(1024), false; !synced; port++ {
		if time.Now().After(deadline) || port == 2000 {
			b.Fatal("the stream got no NEW event of a probe connection in 15 s")
		}
		w.ignore(port)
		if _, _, err := flowRequest(clientPod.NS, vip, port); err != nil {
			b.Fatal(err)
		}
		for end := time.Now().Add(250 * time.Millisecond); !synced && time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			synced = w.sawProbe(port)
		}
	}

	var (
		conns   []flowBenchConn
		elapsed time.Duration
		errs    int
		firstEr error
	)
	b.ResetTimer()
	for range b.N {
		c, d, n, err := runFlowWorkers(clientPod.NS, vip, workers, flowBenchDuration)
		conns = append(conns, c...)
		elapsed += d
		errs += n
		if firstEr == nil {
			firstEr = err
		}
	}
	b.StopTimer()

	// Wait for every connection's NEW and CLOSED, or their loss reports.
	// For iptables a dump makes the kernel destroy expired entries.
	want := 2 * len(conns)
	deadline = time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		st := w.stats()
		if st.news+st.closeds+int(st.lost) >= want {
			break
		}
		if dp == "iptables" {
			lctx, lcancel := context.WithTimeout(ctx, 10*time.Second)
			api.ListFlows(lctx, nil, 0)
			lcancel()
		}
		time.Sleep(500 * time.Millisecond)
	}
	st := w.stats()
	if err := w.failure(); err != nil {
		b.Fatalf("WatchFlows: %v", err)
	}
	lat := w.latencies(conns)
	failed := fmt.Sprint(errs)
	if firstEr != nil {
		failed += fmt.Sprintf(", first: %v", firstEr)
	}
	b.Logf("%s, %d workers: %d connections in %v (%s failed); %d NEW + %d CLOSED events, %d lost (kernel %d, subscriber %d); %d of %d NEW matched to their connection",
		dp, workers, len(conns), elapsed.Round(time.Millisecond), failed, st.news, st.closeds, st.lost, st.lostKernel, st.lost-st.lostKernel, len(lat), len(conns))
	b.ReportMetric(float64(len(conns))/elapsed.Seconds(), "conn/s")
	b.ReportMetric(float64(st.news+st.closeds), "events")
	b.ReportMetric(float64(st.lost), "lost")
	b.ReportMetric(float64(max(0, want-st.news-st.closeds-int(st.lost))), "missing")
	if len(lat) > 0 {
		slices.Sort(lat)
		pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) }
		b.ReportMetric(pct(0.5), "new-p50-us")
		b.ReportMetric(pct(0.99), "new-p99-us")
	}
}

// flowBenchConn is one connection: its client port and when connect()
// started.
type flowBenchConn struct {
	port  uint16
	start time.Time
}

// runFlowWorkers has workers goroutines in ns make connections to vip for
// d, one after the other each. It returns the connections that succeeded,
// how long the workers ran, and the number and first of the failures.
func runFlowWorkers(ns *netlab.NS, vip netip.AddrPort, workers int, d time.Duration) ([]flowBenchConn, time.Duration, int, error) {
	var (
		mu    sync.Mutex
		conns []flowBenchConn
		errs  int
		first error
		wg    sync.WaitGroup
	)
	start := time.Now()
	stop := start.Add(d)
	for range workers {
		wg.Go(func() {
			var mine []flowBenchConn
			var n int
			var ferr error
			// One locked thread in the namespace for all of the
			// worker's sockets, rather than a namespace switch for each.
			err := ns.Do(func() error {
				for time.Now().Before(stop) {
					local, t0, err := flowRequestHere(vip, 0)
					if err != nil {
						n++
						if ferr == nil {
							ferr = err
						}
						continue
					}
					mine = append(mine, flowBenchConn{port: local.Port(), start: t0})
				}
				return nil
			})
			mu.Lock()
			defer mu.Unlock()
			conns = append(conns, mine...)
			errs += n
			if first == nil {
				first = ferr
			}
			if err != nil && first == nil {
				first = err
			}
		})
	}
	wg.Wait()
	return conns, time.Since(start), errs, first
}

// flowRequest makes one connection from inside ns; see flowRequestHere.
func flowRequest(ns *netlab.NS, vip netip.AddrPort, localPort uint16) (netip.AddrPort, time.Time, error) {
	var (
		local netip.AddrPort
		t0    time.Time
	)
	err := ns.Do(func() error {
		var err error
		local, t0, err = flowRequestHere(vip, localPort)
		return err
	})
	return local, t0, err
}

// flowRequestHere connects to vip from the calling thread's namespace, from
// localPort (0: any), sends one request, reads the reply and closes. It
// returns the client socket's address and when connect() started.
func flowRequestHere(vip netip.AddrPort, localPort uint16) (netip.AddrPort, time.Time, error) {
	d := net.Dialer{Timeout: 3 * time.Second}
	if localPort != 0 {
		d.LocalAddr = &net.TCPAddr{Port: int(localPort)}
	}
	t0 := time.Now()
	c, err := d.Dial("tcp4", vip.String())
	if err != nil {
		return netip.AddrPort{}, t0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		return netip.AddrPort{}, t0, err
	}
	if _, err := bufio.NewReaderSize(c, 128).ReadSlice('\n'); err != nil {
		return netip.AddrPort{}, t0, err
	}
	return c.LocalAddr().(*net.TCPAddr).AddrPort(), t0, nil
}

// flowEventWatch reads one WatchFlows stream, keeping when each NEW event
// of a client port arrived.
type flowEventWatch struct {
	mu sync.Mutex
	// probes are the client ports of the connections that synced the
	// stream: their events do not count, and probeNew notes their NEW.
	probes     map[uint16]bool
	probeNew   map[uint16]bool
	newAt      map[uint16][]time.Time
	news       int
	closeds    int
	lost       uint64
	lostKernel uint64
	err        error
}

type flowEventStats struct {
	news, closeds    int
	lost, lostKernel uint64
}

func watchFlowEvents(ctx context.Context, api *client.Client, service string) (*flowEventWatch, error) {
	stream, err := api.WatchFlows(ctx, &vipdv1.WatchFlowsRequest{Filter: &vipdv1.FlowFilter{Service: service}})
	if err != nil {
		return nil, err
	}
	w := &flowEventWatch{probes: map[uint16]bool{}, probeNew: map[uint16]bool{}, newAt: map[uint16][]time.Time{}}
	go func() {
		for {
			m, err := stream.Recv()
			at := time.Now()
			w.mu.Lock()
			if err != nil {
				if ctx.Err() == nil {
					w.err = err
				}
				w.mu.Unlock()
				return
			}
			if l := m.GetLost(); l != nil {
				w.lost += l.GetCount()
				if l.GetSource() == vipdv1.LostEventsSource_LOST_EVENTS_SOURCE_KERNEL {
					w.lostKernel += l.GetCount()
				}
			}
			ev := m.GetFlow()
			p := uint16(ev.GetClient().GetPort())
			switch {
			case ev == nil:
			case w.probes[p]:
				w.probeNew[p] = w.probeNew[p] || ev.GetType() == vipdv1.FlowEventType_FLOW_EVENT_TYPE_NEW
			case ev.GetType() == vipdv1.FlowEventType_FLOW_EVENT_TYPE_NEW:
				w.news++
				w.newAt[p] = append(w.newAt[p], at)
			case ev.GetType() == vipdv1.FlowEventType_FLOW_EVENT_TYPE_CLOSED:
				w.closeds++
			}
			w.mu.Unlock()
		}
	}()
	return w, nil
}

// ignore makes the stream skip the events of a probe from port.
func (w *flowEventWatch) ignore(port uint16) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.probes[port] = true
}

// sawProbe reports whether the NEW event of the probe from port came.
func (w *flowEventWatch) sawProbe(port uint16) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.probeNew[port]
}

func (w *flowEventWatch) stats() flowEventStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return flowEventStats{w.news, w.closeds, w.lost, w.lostKernel}
}

func (w *flowEventWatch) failure() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// latencies returns, for each connection whose NEW event arrived, the time
// from its connect() to that arrival. A port's connections and NEW events
// are matched in order.
func (w *flowEventWatch) latencies(conns []flowBenchConn) []time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	byPort := map[uint16][]time.Time{}
	for _, c := range conns {
		byPort[c.port] = append(byPort[c.port], c.start)
	}
	var lat []time.Duration
	for port, starts := range byPort {
		slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
		ats := w.newAt[port]
		for i := range min(len(starts), len(ats)) {
			lat = append(lat, ats[i].Sub(starts[i]))
		}
	}
	return lat
}
