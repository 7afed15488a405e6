package iptables

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/mdlayher/netlink"
	"github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/internal/nsdo"
)

// The flow source (dataplane.FlowSource) reads the node's conntrack table
// through ctnetlink, and only the entries of connections vipd DNATed: every
// SVC chain marks them with FlowMark, and the kernel filters on that mark,
// so the reader never parses the rest of the node's connections.
//
//   - WatchFlows subscribes to the NEW and DESTROY event groups on a socket
//     with a classic BPF filter (flowEventFilter) that passes only events
//     whose connmark carries FlowMark. The kernel runs the filter before it
//     queues an event, so other events neither cross into user space nor
//     take room in the socket's buffer.
//   - ListFlows dumps the table with a CTA_MARK/CTA_MARK_MASK filter, which
//     the kernel applies during the dump.
//
// Counters and timestamps need nf_conntrack_acct and nf_conntrack_timestamp
// (see flowSysctls); they apply to connections created after they are set.

// flowSysctls are set in the dataplane's namespace when it opens, if
// Config.SetFlowSysctls allows (else the flow source does without): byte and
// packet counters, start and stop timestamps, and conntrack events for
// every connection. With nf_conntrack_events at its default of 2, a
// connection gets the event extension only if a listener exists when it
// starts, so one that began while no WatchFlows ran would never report its
// close.
var flowSysctls = []struct{ path, value string }{
	{"/proc/sys/net/netfilter/nf_conntrack_acct", "1"},
	{"/proc/sys/net/netfilter/nf_conntrack_timestamp", "1"},
	{"/proc/sys/net/netfilter/nf_conntrack_events", "1"},
}

// enableFlowAccounting sets flowSysctls in the dataplane's namespace,
// writing only those that differ, and returns what it changed, as
// "path: old -> new" lines.
func (c *conntrackCleaner) enableFlowAccounting() (changed []string, err error) {
	err = nsdo.In(c.ns, func() error {
		for _, s := range flowSysctls {
			b, err := os.ReadFile(s.path)
			if err != nil {
				return fmt.Errorf("enable flow accounting: %w", err)
			}
			old := strings.TrimSpace(string(b))
			if old == s.value {
				continue
			}
			if err := os.WriteFile(s.path, []byte(s.value), 0); err != nil {
				return fmt.Errorf("enable flow accounting: %w", err)
			}
			changed = append(changed, fmt.Sprintf("%s: %s -> %s", s.path, old, s.value))
		}
		return nil
	})
	return changed, err
}

// Netlink and ctnetlink constants that golang.org/x/sys/unix lacks.
const (
	// ctaMark is CTA_MARK, a top-level attribute of a conntrack message
	// holding the connmark as a big-endian u32. The kernel includes it
	// whenever the mark is non-zero.
	ctaMark = 8
	// skfAdNlattr is SKF_AD_OFF + SKF_AD_NLATTR: a classic BPF load from it
	// sets A to the offset of the first attribute of type X at or after
	// offset A of the message, or to 0 when there is none.
	skfAdNlattr = 0xfffff000 + 12
	// attrsOffset is where a netfilter message's attributes start: after
	// struct nlmsghdr (16 bytes) and struct nfgenmsg (4).
	attrsOffset = unix.SizeofNlMsghdr + 4
)

// flowEventFilter is the classic BPF program of the event socket. It
// accepts a message whose CTA_MARK has FlowMark set under FlowMarkMask and
// drops every other one. Each multicast event is a message of its own.
func flowEventFilter() []unix.SockFilter {
	// Jump offsets count the instructions skipped.
	const toDrop = 5 // from 3 to 9
	return []unix.SockFilter{
		/* 0 */ {Code: unix.BPF_LD | unix.BPF_IMM, K: attrsOffset},
		/* 1 */ {Code: unix.BPF_LDX | unix.BPF_IMM, K: ctaMark},
		/* 2 */ {Code: unix.BPF_LD | unix.BPF_B | unix.BPF_ABS, K: skfAdNlattr},
		/* 3 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: 0, Jt: toDrop},
		/* 4 */ {Code: unix.BPF_MISC | unix.BPF_TAX},
		// The value follows the 4-byte attribute header; loads are big-endian.
		/* 5 */ {Code: unix.BPF_LD | unix.BPF_W | unix.BPF_IND, K: unix.SizeofNlAttr},
		/* 6 */ {Code: unix.BPF_ALU | unix.BPF_AND | unix.BPF_K, K: FlowMarkMask},
		/* 7 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: FlowMark, Jt: 0, Jf: 1},
		/* 8 */ {Code: unix.BPF_RET | unix.BPF_K, K: 0xffffffff},
		/* 9 */ {Code: unix.BPF_RET | unix.BPF_K, K: 0},
	}
}

// flowReadBuffer is the event socket's receive buffer: room for tens of
// thousands of events while the reader is busy. The kernel drops events
// that do not fit (an overrun), and WatchFlows reports them as lost.
const flowReadBuffer = 16 << 20

// flowEventSocket is a ctnetlink socket subscribed to vipd's NEW and
// DESTROY events.
type flowEventSocket struct {
	conn *netlink.Conn
	raw  syscall.RawConn
	// drops is the socket's drop count that was last reported; see overrun.
	drops uint32
	// congested is set from an overrun until the queue has been drained:
	// while it lasts, the kernel drops events without another ENOBUFS.
	congested bool
}

// dialFlowEvents opens the event socket in the dataplane's namespace with a
// receive buffer of readBuffer bytes. The filter is attached before the
// socket joins the groups, so no unfiltered event is ever queued.
func (c *conntrackCleaner) dialFlowEvents(readBuffer int) (*flowEventSocket, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, c.netlinkConfig())
	if err != nil {
		return nil, fmt.Errorf("open conntrack event socket: %w", err)
	}
	s := &flowEventSocket{conn: conn}
	if err := s.setup(readBuffer); err != nil {
		conn.Close()
		return nil, fmt.Errorf("open conntrack event socket: %w", err)
	}
	return s, nil
}

func (s *flowEventSocket) setup(readBuffer int) error {
	raw, err := s.conn.SyscallConn()
	if err != nil {
		return err
	}
	s.raw = raw
	filter := flowEventFilter()
	var serr error
	err = raw.Control(func(fd uintptr) {
		prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
		if serr = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &prog); serr != nil {
			serr = fmt.Errorf("attach mark filter: %w", serr)
			return
		}
		// SO_RCVBUFFORCE passes net.core.rmem_max, which is not per namespace.
		if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, readBuffer); serr != nil {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, readBuffer)
		}
	})
	if err = errors.Join(err, serr); err != nil {
		return err
	}
	for _, g := range []uint32{unix.NFNLGRP_CONNTRACK_NEW, unix.NFNLGRP_CONNTRACK_DESTROY} {
		if err := s.conn.JoinGroup(g); err != nil {
			return fmt.Errorf("join conntrack event group %d: %w", g, err)
		}
	}
	return nil
}

// meminfo returns the socket's SO_MEMINFO counters.
func (s *flowEventSocket) meminfo() ([unix.SK_MEMINFO_VARS]uint32, error) {
	var mem [unix.SK_MEMINFO_VARS]uint32
	var errno syscall.Errno
	err := s.raw.Control(func(fd uintptr) {
		size := uint32(unsafe.Sizeof(mem))
		_, _, errno = unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, unix.SO_MEMINFO,
			uintptr(unsafe.Pointer(&mem[0])), uintptr(unsafe.Pointer(&size)), 0)
	})
	if err == nil && errno != 0 {
		err = errno
	}
	return mem, err
}

// overrun reports, through lost, the events the kernel dropped since the
// last report. The kernel counts every event it could not queue in the
// socket's drop counter (SO_MEMINFO), but signals only the first drop of an
// overrun with ENOBUFS; it signals again only after the queue has once been
// empty. So after an ENOBUFS (enobufs set) overrun keeps reading the counter
// after every read until the queue is seen empty. Without SO_MEMINFO an
// ENOBUFS counts as one lost event, the least it can mean.
func (s *flowEventSocket) overrun(enobufs bool, lost func(uint64)) {
	if enobufs {
		s.congested = true
	}
	if !s.congested {
		return
	}
	mem, err := s.meminfo()
	if err != nil {
		if enobufs {
			lost(1)
		}
		s.congested = false
		return
	}
	if d := mem[unix.SK_MEMINFO_DROPS] - s.drops; d > 0 {
		lost(uint64(d))
	} else if enobufs {
		lost(1)
	}
	s.drops = mem[unix.SK_MEMINFO_DROPS]
	s.congested = mem[unix.SK_MEMINFO_RMEM_ALLOC] != 0
}

func (s *flowEventSocket) close() error { return s.conn.Close() }

// WatchFlows implements dataplane.FlowSource. Each call reads its own
// socket. A flow's ID is its conntrack ID, and an event's Time is when it
// was read. A FlowNew event has the flow's addresses only: ctnetlink sends
// the start time and the counters with DESTROY events and dumps, not with
// NEW ones.
//
// A FlowClosed event comes when the kernel destroys the entry: for a TCP
// connection closed with FINs, once its TIME_WAIT is over
// (nf_conntrack_tcp_timeout_time_wait, 120 s by default); for any expired
// entry, once conntrack's garbage collector (which may take up to a minute
// to come round), a packet or a dump (ListFlows) comes across it. It has the
// final counters, the duration from the start and stop timestamps, and a
// CloseReason:
//
//   - backend_removed or service_removed for an entry vipd deleted (stale
//     UDP flows after a change);
//   - deleted for an entry someone else deleted through ctnetlink
//     (conntrack -D, a flush): the event names the deleting socket;
//   - otherwise, from the protocol state the entry ended in: fin after a
//     FIN handshake (TCP FIN_WAIT through TIME_WAIT, SCTP SHUTDOWN_* and
//     CLOSED, which an ABORT also reaches), rst for TCP CLOSE, which only a
//     RST reaches, and timeout for the rest (UDP, and TCP or SCTP entries
//     that expired while open).
//
// Overruns of the socket are reported through lost with the exact number of
// events the kernel dropped (see overrun).
func (d *Dataplane) WatchFlows(ctx context.Context, emit func(dataplane.FlowEvent), lost func(count uint64)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s, err := d.ct.dialFlowEvents(flowReadBuffer)
	if err != nil {
		return err
	}
	defer s.close()
	return d.readFlows(ctx, s, emit, lost)
}

// readFlows is WatchFlows on an open event socket.
func (d *Dataplane) readFlows(ctx context.Context, s *flowEventSocket, emit func(dataplane.FlowEvent), lost func(uint64)) error {
	stop := context.AfterFunc(ctx, func() { s.conn.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	// Enough for any one event, which is a few hundred bytes.
	buf := make([]byte, 64<<10)
	for {
		var n int
		var rerr error
		err := s.raw.Read(func(fd uintptr) bool {
			n, _, rerr = unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
			return rerr != unix.EAGAIN
		})
		switch {
		case ctx.Err() != nil:
			s.overrun(false, lost)
			return ctx.Err()
		case err != nil:
			return fmt.Errorf("read conntrack events: %w", err)
		case rerr == unix.ENOBUFS:
			s.overrun(true, lost)
			continue
		case rerr == unix.EINTR:
			continue
		case rerr != nil:
			return fmt.Errorf("read conntrack events: %w", rerr)
		}
		now := time.Now()
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return fmt.Errorf("read conntrack events: %w", err)
		}
		for _, m := range msgs {
			if ev, ok := d.flowEvent(m, now); ok {
				emit(ev)
			}
		}
		s.overrun(false, lost)
	}
}

// flowEvent decodes one conntrack event message. It skips messages that
// are not vipd's flows' NEW or DESTROY events.
func (d *Dataplane) flowEvent(m syscall.NetlinkMessage, now time.Time) (dataplane.FlowEvent, bool) {
	var ev conntrack.Event
	err := ev.Unmarshal(netlink.Message{
		Header: netlink.Header{
			Length: m.Header.Len, Type: netlink.HeaderType(m.Header.Type), Flags: netlink.HeaderFlags(m.Header.Flags),
			Sequence: m.Header.Seq, PID: m.Header.Pid,
		},
		Data: m.Data,
	})
	if err != nil {
		d.log.Warn("skip undecodable conntrack event", "error", err)
		return dataplane.FlowEvent{}, false
	}
	if ev.Flow == nil || ev.Flow.Mark&FlowMarkMask != FlowMark {
		return dataplane.FlowEvent{}, false
	}
	fl, ok := flowOf(ev.Flow)
	if !ok {
		return dataplane.FlowEvent{}, false
	}
	out := dataplane.FlowEvent{Time: now, Flow: fl}
	switch ev.Type {
	case conntrack.EventNew:
		out.Type = dataplane.FlowNew
	case conntrack.EventDestroy:
		out.Type = dataplane.FlowClosed
		if ts := ev.Flow.Timestamp; !ts.Start.IsZero() && !ts.Stop.IsZero() {
			out.Flow.Duration = ts.Stop.Sub(ts.Start)
		}
		out.Flow.CloseReason = d.closeReason(ev.Flow, m.Header.Pid)
	default:
		return dataplane.FlowEvent{}, false
	}
	return out, true
}

// Conntrack protocol states, from the kernel's enum tcp_conntrack and enum
// sctp_conntrack.
const (
	tcpSynSent     = 1
	tcpSynRecv     = 2
	tcpEstablished = 3
	tcpFinWait     = 4
	tcpCloseWait   = 5
	tcpLastAck     = 6
	tcpTimeWait    = 7
	tcpClose       = 8
	// tcpSynSent2 is a simultaneous open: a SYN answered by a SYN.
	tcpSynSent2 = 9

	sctpClosed          = 1
	sctpShutdownSent    = 5
	sctpShutdownRecd    = 6
	sctpShutdownAckSent = 7
)

// closeReason tells why the entry of a DESTROY event went away; see
// WatchFlows. deleter is the port ID of the netlink socket that deleted the
// entry, which the kernel puts in the event, or 0 when the kernel itself
// destroyed it.
func (d *Dataplane) closeReason(f *conntrack.Flow, deleter uint32) string {
	if deleter != 0 {
		if reason, ok := d.ct.deletedBy(f.ID); ok {
			return reason
		}
		return dataplane.CloseDeleted
	}
	switch pi := f.ProtoInfo; {
	case pi.TCP != nil:
		switch pi.TCP.State {
		case tcpFinWait, tcpCloseWait, tcpLastAck, tcpTimeWait:
			return dataplane.CloseFIN
		case tcpClose:
			return dataplane.CloseRST
		}
	case pi.SCTP != nil:
		switch pi.SCTP.State {
		case sctpClosed, sctpShutdownSent, sctpShutdownRecd, sctpShutdownAckSent:
			return dataplane.CloseFIN
		}
	}
	return dataplane.CloseTimeout
}

// tcpStateOf maps conntrack's TCP state to the dataplane's: the same
// states, except that a simultaneous open (SYN_SENT2) counts as SYN_SENT.
func tcpStateOf(s uint8) dataplane.TCPState {
	switch s {
	case tcpSynSent, tcpSynSent2:
		return dataplane.TCPSynSent
	case tcpSynRecv:
		return dataplane.TCPSynRecv
	case tcpEstablished:
		return dataplane.TCPEstablished
	case tcpFinWait:
		return dataplane.TCPFinWait
	case tcpCloseWait:
		return dataplane.TCPCloseWait
	case tcpLastAck:
		return dataplane.TCPLastAck
	case tcpTimeWait:
		return dataplane.TCPTimeWait
	case tcpClose:
		return dataplane.TCPClose
	}
	return dataplane.TCPStateUnknown
}

// flowOf maps a conntrack entry of a DNATed connection to a Flow: the
// client is the original source, the VIP the original destination and the
// backend the source of the reply direction. A TCP flow's state is
// conntrack's, where the message carries it (dumps, NEW and DESTROY events
// do). It skips protocols vipd does not serve.
func flowOf(f *conntrack.Flow) (dataplane.Flow, bool) {
	var proto dataplane.Protocol
	switch f.TupleOrig.Proto.Protocol {
	case unix.IPPROTO_TCP:
		proto = dataplane.TCP
	case unix.IPPROTO_UDP:
		proto = dataplane.UDP
	case unix.IPPROTO_SCTP:
		proto = dataplane.SCTP
	default:
		return dataplane.Flow{}, false
	}
	ap := func(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a.Unmap(), port) }
	var state dataplane.TCPState
	if proto == dataplane.TCP && f.ProtoInfo.TCP != nil {
		state = tcpStateOf(f.ProtoInfo.TCP.State)
	}
	return dataplane.Flow{
		ID:           uint64(f.ID),
		Protocol:     proto,
		Client:       ap(f.TupleOrig.IP.SourceAddress, f.TupleOrig.Proto.SourcePort),
		VIP:          ap(f.TupleOrig.IP.DestinationAddress, f.TupleOrig.Proto.DestinationPort),
		Backend:      ap(f.TupleReply.IP.SourceAddress, f.TupleReply.Proto.SourcePort),
		Start:        f.Timestamp.Start,
		OrigPackets:  f.CountersOrig.Packets,
		OrigBytes:    f.CountersOrig.Bytes,
		ReplyPackets: f.CountersReply.Packets,
		ReplyBytes:   f.CountersReply.Bytes,
		TCPState:     state,
	}, true
}

// ListFlows implements dataplane.FlowSource: it dumps the conntrack entries
// that carry FlowMark, filtered by the kernel, as conntrack -L --mark
// would show them, including entries of closed TCP connections that wait
// out TIME_WAIT.
func (d *Dataplane) ListFlows(ctx context.Context) ([]dataplane.Flow, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	conn, err := conntrack.Dial(d.ct.netlinkConfig())
	if err != nil {
		return nil, fmt.Errorf("list flows: %w", err)
	}
	defer conn.Close()
	// Closing the socket interrupts the dump.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	dump, err := conn.DumpFilter(conntrack.NewFilter().Mark(FlowMark).MarkMask(FlowMarkMask), nil)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("list flows: %w", err)
	}
	flows := make([]dataplane.Flow, 0, len(dump))
	for i := range dump {
		if fl, ok := flowOf(&dump[i]); ok {
			flows = append(flows, fl)
		}
	}
	return flows, nil
}

var _ dataplane.FlowSource = (*Dataplane)(nil)
