package ebpf

// Flows: the dataplane.FlowSource and dataplane.Explainer of the eBPF
// dataplane. The programs report a flow's creation and close through the
// vipd_events ring buffer (bpf/maps.h says when); the conntrack collector
// reports the flows that simply expire; vipd_ct holds the live flows with
// their counters.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/dataplane"
)

// CloseReplaced is the close reason of a TCP flow that was never seen to
// close when a SYN from the same client address and port to the same VIP
// started a new flow in its place (its backend may take no new
// connections): the client had given up on it.
const CloseReplaced = "replaced"

// ErrWatchedAlready is returned by WatchFlows while another WatchFlows
// runs: the ring buffer has one reader, which the daemon fans out.
var ErrWatchedAlready = errors.New("ebpf dataplane: flow events are being watched already (one WatchFlows at a time)")

// errClosed is returned by WatchFlows when the dataplane is closed.
var errClosed = errors.New("ebpf dataplane: closed")

const (
	// flowPollInterval is how often the event reader checks the drop
	// counter and the collector's timeouts, whether the ring is busy or
	// empty: an idle reader wakes this often, and for events.
	flowPollInterval = 100 * time.Millisecond
	// flowReadInterval is how long the reader lets events gather after
	// a look into the ring that found some, so that a busy ring costs a
	// wakeup per interval rather than per event. An idle reader sleeps
	// until the programs wake it: they ask for a wakeup when a record is
	// the first one unread (adaptive notification, bpf/vipd.c), which
	// happens once per look while events come, and never while the
	// reader lags.
	flowReadInterval = 2 * time.Millisecond
	// flowGCQueue is how many collector rounds may wait for the reader;
	// the flows of rounds that find the queue full are reported lost.
	flowGCQueue = 16
)

// flowWatch is a running WatchFlows, as the collector sees it.
type flowWatch struct {
	timeouts chan []dataplane.FlowEvent
	lost     atomic.Uint64 // timeouts that did not fit the queue
}

// offer queues the CLOSED events of flows that timed out, or counts them
// lost when the reader is that far behind: the collector never waits.
func (w *flowWatch) offer(evs []dataplane.FlowEvent) {
	select {
	case w.timeouts <- evs:
	default:
		w.lost.Add(uint64(len(evs)))
	}
}

// currentWatch returns the running WatchFlows, or nil.
func (d *Dataplane) currentWatch() *flowWatch {
	d.watchMu.Lock()
	defer d.watchMu.Unlock()
	return d.watch
}

// WatchFlows implements dataplane.FlowSource. It reads the vipd_events ring
// buffer, from the events the programs report once it started: events left
// in the (pinned) ring from before, when nobody read it, are skipped, and
// so are the drops counted then. Kernel-side losses (a full ring) are read
// from vipd_event_drops and reported through lost, as are the timeouts of
// the collector that found the reader too far behind.
//
// One WatchFlows runs at a time (ErrWatchedAlready). It returns ctx's
// error when ctx ends, and an error when the dataplane is closed.
func (d *Dataplane) WatchFlows(ctx context.Context, emit func(dataplane.FlowEvent), lost func(count uint64)) error {
	// Everything reported from here on is delivered or counted lost.
	dropped, err := sumDrops(d.objs.VipdEventDrops)
	if err != nil {
		return err
	}
	start := ktimeNow()
	w := &flowWatch{timeouts: make(chan []dataplane.FlowEvent, flowGCQueue)}
	d.watchMu.Lock()
	if d.watch != nil {
		d.watchMu.Unlock()
		return ErrWatchedAlready
	}
	if d.closing {
		d.watchMu.Unlock()
		return errors.New("the ebpf dataplane is closed")
	}
	d.watch = w
	// Close waits for this reader before it closes the maps it reads.
	d.watchers.Add(1)
	d.watchMu.Unlock()
	defer func() {
		d.watchMu.Lock()
		d.watch = nil
		d.watchMu.Unlock()
		d.watchers.Done()
	}()

	// Handles of our own: Close may close the dataplane's first.
	events, err := d.objs.VipdEvents.Clone()
	if err != nil {
		return fmt.Errorf("flow event ring: %w", err)
	}
	defer events.Close()
	drops, err := d.objs.VipdEventDrops.Clone()
	if err != nil {
		return fmt.Errorf("flow event drop counter: %w", err)
	}
	defer drops.Close()
	// Not ringbuf.NewReader: it maps the ring's pages twice (eventring.go).
	rd, err := newEventReader(events)
	if err != nil {
		return fmt.Errorf("read flow event ring: %w", err)
	}
	defer rd.Close()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
		case <-d.stopGC:
		case <-done:
			return
		}
		rd.Close() // interrupts Wait and Pause
	}()

	poll := func() error {
		n, err := sumDrops(drops)
		if err != nil {
			return err
		}
		if n > dropped {
			lost(n - dropped)
		}
		dropped = n
		for drained := false; !drained; {
			select {
			case evs := <-w.timeouts:
				for _, ev := range evs {
					emit(ev)
				}
			default:
				drained = true
			}
		}
		if n := w.lost.Swap(0); n > 0 {
			lost(n)
		}
		return nil
	}

	var (
		rec ringbuf.Record
		ev  bpfFlowEvent
	)
	closedErr := func(err error) error {
		if errors.Is(err, os.ErrClosed) {
			if err := ctx.Err(); err != nil {
				return err
			}
			return errClosed
		}
		return fmt.Errorf("read flow event ring: %w", err)
	}
	nextPoll := time.Now().Add(flowPollInterval)
	for {
		// Read what the ring holds, polling when due even if it never
		// runs empty.
		read := 0
		for {
			ok, err := rd.TryRead(&rec)
			if err != nil {
				return closedErr(err)
			}
			if !ok {
				break
			}
			if decodeFlowEvent(rec.RawSample, &ev) && ev.TimeNs >= start {
				if fe, ok := d.flowEvent(&ev); ok {
					emit(fe)
				}
			}
			if read++; read%256 == 0 && !time.Now().Before(nextPoll) {
				if err := poll(); err != nil {
					return err
				}
				nextPoll = time.Now().Add(flowPollInterval)
			}
		}
		if !time.Now().Before(nextPoll) {
			if err := poll(); err != nil {
				return err
			}
			nextPoll = time.Now().Add(flowPollInterval)
		}
		var err error
		if read > 0 {
			// Events are coming: let the next ones gather for
			// flowReadInterval rather than be woken for each.
			until := time.Now().Add(flowReadInterval)
			if nextPoll.Before(until) {
				until = nextPoll
			}
			err = rd.Pause(until)
		} else {
			// None came since the last look: sleep until the next one
			// (the programs wake a reader that has read the ring to its
			// end) or the next poll.
			err = rd.Wait(nextPoll)
		}
		if err != nil {
			return closedErr(err)
		}
	}
}

// sumDrops reads vipd_event_drops: the events that found the ring full,
// summed over CPUs.
func sumDrops(m *ebpf.Map) (uint64, error) {
	var perCPU []uint64
	if err := m.Lookup(uint32(0), &perCPU); err != nil {
		return 0, fmt.Errorf("read flow event drop counter: %w", err)
	}
	var n uint64
	for _, v := range perCPU {
		n += v
	}
	return n, nil
}

// decodeFlowEvent copies a ring buffer record into ev.
func decodeFlowEvent(raw []byte, ev *bpfFlowEvent) bool {
	size := int(unsafe.Sizeof(*ev))
	if len(raw) < size {
		return false
	}
	// The record is struct flow_event as the program wrote it, in host
	// byte order: the generated struct has its layout.
	copy(unsafe.Slice((*byte)(unsafe.Pointer(ev)), size), raw)
	return true
}

// flowEvent turns a ring buffer event into a dataplane.FlowEvent. A TCP
// flow's state is known on NEW (SYN_SENT) and on a CLOSED by RST (CLOSE).
func (d *Dataplane) flowEvent(ev *bpfFlowEvent) (dataplane.FlowEvent, bool) {
	f := dataplane.Flow{
		ID:       ev.FlowId,
		Protocol: protocolOf(ev.Proto),
		Client:   netip.AddrPortFrom(fromWords(ev.Client.W), fromBE16(ev.ClientPort)),
		VIP:      netip.AddrPortFrom(fromWords(ev.Vip.W), fromBE16(ev.VipPort)),
		Backend:  netip.AddrPortFrom(fromWords(ev.Backend.W), fromBE16(ev.BackendPort)),
		Start:    d.wallTime(ev.StartNs),
	}
	out := dataplane.FlowEvent{Time: d.wallTime(ev.TimeNs), Flow: f}
	tcp := f.Protocol == dataplane.TCP
	switch ev.Type {
	case flowEvNew:
		out.Type = dataplane.FlowNew
		if tcp {
			// The programs track a TCP flow only from its SYN.
			out.Flow.TCPState = dataplane.TCPSynSent
		}
	case flowEvClosed:
		out.Type = dataplane.FlowClosed
		out.Flow.OrigPackets, out.Flow.OrigBytes = ev.OrigPackets, ev.OrigBytes
		out.Flow.ReplyPackets, out.Flow.ReplyBytes = ev.ReplyPackets, ev.ReplyBytes
		out.Flow.Duration = time.Duration(ev.TimeNs - ev.StartNs)
		out.Flow.CloseReason = closeReason(ev.Reason)
		// The event does not say which side sent a FIN, so only a RST
		// tells the state.
		if tcp && ev.Reason == flowCloseRST {
			out.Flow.TCPState = dataplane.TCPClose
		}
	default:
		return out, false
	}
	return out, true
}

func closeReason(r uint8) string {
	switch r {
	case flowCloseFIN:
		return dataplane.CloseFIN
	case flowCloseRST:
		return dataplane.CloseRST
	case flowCloseTimeout:
		return dataplane.CloseTimeout
	case flowCloseBackendRemoved:
		return dataplane.CloseBackendRemoved
	case flowCloseReplaced:
		return CloseReplaced
	}
	return fmt.Sprintf("reason-%d", r)
}

func protocolOf(proto uint8) dataplane.Protocol {
	switch proto {
	case ipprotoTCP:
		return dataplane.TCP
	case ipprotoUDP:
		return dataplane.UDP
	case ipprotoSCTP:
		return dataplane.SCTP
	}
	return 0
}

// tcpStateOf derives a TCP flow's conntrack state from the flags that its
// forward entry (client to backend) and its reply entry (backend to client)
// have seen. An entry holds the union of the flags of every packet, not
// their order or sequence numbers, so the mapping is approximate where
// netfilter's conntrack follows the sequence numbers:
//
//   - a RST either way is CLOSE;
//   - a FIN from the client only is FIN_WAIT, from the backend only
//     CLOSE_WAIT, and FINs from both are TIME_WAIT: whether the last FIN
//     was acknowledged yet (LAST_ACK) cannot be told;
//   - else a SYN-ACK from the backend and an ACK from the client is
//     ESTABLISHED, a SYN-ACK alone SYN_RECV, and anything less (the client's
//     SYN only, every tracked TCP flow begins with one) SYN_SENT. Any ACK
//     from the client after the SYN-ACK counts as the handshake's last,
//     whatever it acknowledges.
func tcpStateOf(fwd, reply uint8) dataplane.TCPState {
	switch {
	case (fwd|reply)&tcpFlagRST != 0:
		return dataplane.TCPClose
	case fwd&tcpFlagFIN != 0 && reply&tcpFlagFIN != 0:
		return dataplane.TCPTimeWait
	case fwd&tcpFlagFIN != 0:
		return dataplane.TCPFinWait
	case reply&tcpFlagFIN != 0:
		return dataplane.TCPCloseWait
	case reply&(tcpFlagSYN|tcpFlagACK) == tcpFlagSYN|tcpFlagACK && fwd&tcpFlagACK != 0:
		return dataplane.TCPEstablished
	case reply&(tcpFlagSYN|tcpFlagACK) == tcpFlagSYN|tcpFlagACK:
		return dataplane.TCPSynRecv
	}
	return dataplane.TCPSynSent
}

// ctFlow is the flow of the forward conntrack entry (k, e), with the
// counters of its reply entry r (zero when it has none) and, for TCP, the
// state both entries' flags tell (tcpStateOf).
func (d *Dataplane) ctFlow(k *bpfCtKey, e, r *bpfCtEntry) dataplane.Flow {
	var state dataplane.TCPState
	if k.Proto == ipprotoTCP {
		state = tcpStateOf(e.TcpFlags, r.TcpFlags)
	}
	return dataplane.Flow{
		ID:           e.FlowId,
		Protocol:     protocolOf(k.Proto),
		Client:       netip.AddrPortFrom(fromWords(k.Src.W), fromBE16(k.Sport)),
		VIP:          netip.AddrPortFrom(fromWords(k.Dst.W), fromBE16(k.Dport)),
		Backend:      netip.AddrPortFrom(fromWords(e.NatAddr.W), fromBE16(e.NatPort)),
		Start:        d.wallTime(e.StartNs),
		OrigPackets:  e.Packets,
		OrigBytes:    e.Bytes,
		ReplyPackets: r.Packets,
		ReplyBytes:   r.Bytes,
		TCPState:     state,
	}
}

// timedOut is the CLOSED event of a flow the collector found expired at
// ktime now.
func (d *Dataplane) timedOut(k *bpfCtKey, e, r *bpfCtEntry, now uint64) dataplane.FlowEvent {
	f := d.ctFlow(k, e, r)
	f.CloseReason = dataplane.CloseTimeout
	if now > e.StartNs {
		f.Duration = time.Duration(now - e.StartNs)
	}
	return dataplane.FlowEvent{Type: dataplane.FlowClosed, Time: d.wallTime(now), Flow: f}
}

// ListFlows implements dataplane.FlowSource: the forward entries of
// vipd_ct that have neither expired nor been reported closed (a TCP flow
// is, on its first FIN or RST, though its entries live on for
// ConntrackTimeouts.TCPClose), ordered by start. The counters are the
// forward entry's (client to backend) and its reply entry's, and a TCP
// flow's state is what their flags tell (tcpStateOf): SYN_SENT, SYN_RECV
// or ESTABLISHED, since closing flows are not listed.
func (d *Dataplane) ListFlows(ctx context.Context) ([]dataplane.Flow, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	now := monotonicSeconds()
	type entry struct {
		k bpfCtKey
		e bpfCtEntry
	}
	var live []entry
	replies := map[bpfCtKey]bpfCtEntry{}
	err := forEach(d.objs.VipdCt, func(k bpfCtKey, e bpfCtEntry) {
		switch {
		case k.Dir == ctDirReply:
			replies[k] = e
		case expired(e.Expires, now) || e.EvFlags&ctEvClosed != 0:
		default:
			live = append(live, entry{k, e})
		}
	})
	if err != nil {
		return nil, fmt.Errorf("read conntrack map: %w", err)
	}
	flows := make([]dataplane.Flow, len(live))
	for i, l := range live {
		r := replies[replyKeyOf(&l.k, &l.e)] // zero when it has none
		flows[i] = d.ctFlow(&l.k, &l.e, &r)
	}
	slices.SortFunc(flows, func(a, b dataplane.Flow) int {
		if c := a.Start.Compare(b.Start); c != 0 {
			return c
		}
		return cmpUint64(a.ID, b.ID)
	})
	return flows, ctx.Err()
}

func cmpUint64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// ktimeNow is bpf_ktime_get_ns(): CLOCK_MONOTONIC in nanoseconds.
func ktimeNow() uint64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// monoOffset measures the wall clock minus CLOCK_MONOTONIC, reading the
// wall clock between two monotonic readings.
func monoOffset() int64 {
	before := ktimeNow()
	wall := time.Now().UnixNano()
	after := ktimeNow()
	return wall - int64(before+(after-before)/2)
}

// wallTime turns a bpf_ktime_get_ns() reading into wall-clock time.
func (d *Dataplane) wallTime(ktime uint64) time.Time {
	return time.Unix(0, int64(ktime)+d.monoOffset)
}
