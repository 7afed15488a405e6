package main

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/vipd/vipd/internal/testkit/netlab"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// flowStep is one load level of the flow-event benchmark.
type flowStep struct {
	workers   int
	rate      float64
	conns     int
	failed    int
	events    int
	lost      uint64
	missing   int
	p50, p99  time.Duration
	matched   int
	firstFail error
}

func (s flowStep) zeroLoss() bool { return s.lost == 0 && s.missing == 0 && s.conns > 0 }

// flowEvents runs one load level: a fresh node with a client pod and three
// backends, vipd with dataplane dp, one WatchFlows stream (vipd's default
// buffer) reading every event of the service while workers make
// connections (connect, one request, close) for d.
func (b *bench) flowEvents(ctx context.Context, dp string, workers int, d time.Duration) (step flowStep, err error) {
	step.workers = workers
	lab, err := netlab.Build(ctx, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: []string{"client", "be1", "be2", "be3"}}}}, nil)
	if err != nil {
		return step, err
	}
	defer lab.Close()
	node := lab.Node(1)
	clientPod := node.Pod("client")
	svc := &vipdv1.Service{
		Name: owner + "/flows", Owner: owner, Vips: []string{"198.19.255.20"},
		Ports: []*vipdv1.Port{{Name: "http", Port: 80, TargetPort: echoPort}},
	}
	for _, name := range []string{"be1", "be2", "be3"} {
		p := node.Pod(name)
		if _, err := p.StartEcho(name, echoPort); err != nil {
			return step, err
		}
		svc.Backends = append(svc.Backends, &vipdv1.Backend{Ip: p.IPv4().String()})
	}
	vip := netip.MustParseAddrPort("198.19.255.20:80")
	// Room for every connection's port while it sits in TIME_WAIT; the
	// probes' ports lie below.
	if err := clientPod.SetSysctl("net.ipv4.ip_local_port_range", "2000 65535"); err != nil {
		return step, err
	}
	if dp == "iptables" {
		// iptables reports a close when the kernel destroys the entry:
		// cut TIME_WAIT and friends so that CLOSED events come while the
		// benchmark waits for them.
		for _, key := range []string{"time_wait", "close_wait", "fin_wait", "last_ack", "close"} {
			if err := node.SetSysctl("net.netfilter.nf_conntrack_tcp_timeout_"+key, "1"); err != nil {
				return step, err
			}
		}
	}
	dmn, err := newDaemon(b.vipd, b.vipdArgs, dp, node, b.work)
	if err != nil {
		return step, err
	}
	defer func() {
		if cerr := dmn.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	if _, err := dmn.start(); err != nil {
		return step, err
	}
	api := dmn.api
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if _, err := api.UpsertService(wctx, svc, 0); err != nil {
		return step, err
	}
	w, err := watchFlowEvents(wctx, api, svc.Name)
	if err != nil {
		return step, err
	}
	// The stream is subscribed once a probe connection's NEW reaches it.
	deadline := time.Now().Add(15 * time.Second)
	for port, synced := uint16(1024), false; !synced; port++ {
		if time.Now().After(deadline) || port == 2000 {
			return step, fmt.Errorf("the stream got no NEW event of a probe connection in 15 s")
		}
		w.ignore(port)
		if _, _, err := flowRequest(clientPod.NS, vip, port); err != nil {
			return step, err
		}
		for end := time.Now().Add(250 * time.Millisecond); !synced && time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			synced = w.sawProbe(port)
		}
	}

	conns, elapsed, failed, firstErr := runFlowWorkers(clientPod.NS, vip, workers, d)
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
			lctx, lcancel := context.WithTimeout(wctx, 10*time.Second)
			api.ListFlows(lctx, nil, 0)
			lcancel()
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err := w.failure(); err != nil {
		return step, fmt.Errorf("WatchFlows: %w", err)
	}
	st := w.stats()
	lat := w.latencies(conns)
	step.rate = float64(len(conns)) / elapsed.Seconds()
	step.conns, step.failed, step.firstFail = len(conns), failed, firstErr
	step.events = st.news + st.closeds
	step.lost = st.lost
	step.missing = max(0, want-st.news-st.closeds-int(st.lost))
	step.matched = len(lat)
	step.p50, step.p99 = quantile(lat, 0.5), quantile(lat, 0.99)
	return step, nil
}

// flowSection finds, per dataplane, the highest connection rate whose
// events all arrived, stepping the number of workers up.
func (b *bench) flowSection(ctx context.Context) (*table, error) {
	t := &table{
		title: "4. Flow events",
		intro: fmt.Sprintf("W workers in a client pod make TCP connections to a VIP (connect, one request, close) for %v while one WatchFlows stream "+
			"(vipd's default buffer) reads every event of the service; each load level runs on a fresh node and vipd. "+
			"**lost** counts events reported lost (kernel or subscriber), **missing** the NEW/CLOSED events that arrived neither as events nor in a loss count. "+
			"Latency is from the start of connect() to the NEW event's arrival on the stream, matched by client port. "+
			"For iptables the node's conntrack TIME_WAIT is cut to 1 s so that CLOSED events (sent when the kernel destroys the entry) arrive in time.", b.cfg.flowDuration),
		header: []string{"dataplane", "workers", "conn/s", "events", "lost", "missing", "connect→NEW p50", "p99", "zero loss"},
	}
	var firstErr error
	for _, dp := range []string{"ebpf", "iptables"} {
		best, fastest := flowStep{}, flowStep{}
		for _, workers := range b.cfg.flowWorkers {
			b.logf("flow events: %s, %d workers", dp, workers)
			s, err := b.flowEvents(ctx, dp, workers, b.cfg.flowDuration)
			if err != nil {
				if firstErr == nil {
					firstErr = fmt.Errorf("flow events %s with %d workers: %w", dp, workers, err)
				}
				t.add(dp, fmt.Sprint(workers), "error: "+oneLine(err))
				continue
			}
			if s.failed > 0 {
				t.note("%s, %d workers: %d connections failed (first: %v)", dp, workers, s.failed, s.firstFail)
			}
			if s.rate > fastest.rate {
				fastest = s
			}
			zero := "no"
			if s.zeroLoss() {
				zero = "yes"
				if s.rate > best.rate {
					best = s
				}
			}
			t.add(dp, fmt.Sprint(workers), fmtRate(s.rate), fmt.Sprint(s.events), fmt.Sprint(s.lost), fmt.Sprint(s.missing), ms(s.p50), ms(s.p99), zero)
		}
		if fastest.conns > 0 {
			b.figure("flows/"+dp+"/max-rate", fastest.rate)
			b.figure("flows/"+dp+"/lost-at-max", float64(fastest.lost)+float64(fastest.missing))
		}
		if best.conns > 0 {
			t.note("**%s**: highest rate with zero lost events %s conn/s (%d workers), connect→NEW p50 %s, p99 %s.", dp, fmtRate(best.rate), best.workers, ms(best.p50), ms(best.p99))
		} else {
			t.note("**%s**: no load level ran without loss.", dp)
		}
	}
	return t, firstErr
}
