package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/testkit/netlab"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

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
