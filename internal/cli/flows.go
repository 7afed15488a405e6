package cli

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/manifest"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

func (a *App) flowsCommand() *cobra.Command {
	var (
		filter   flowFilterFlags
		follow   bool
		types    []string
		existing bool
		limit    uint32
	)
	cmd := &cobra.Command{
		Use:     "flows",
		Aliases: []string{"flow"},
		Short:   "List or follow the connections through VIPs",
		Long: `List the connections (flows) through VIPs that are live now, as the kernel's
connection tracking sees them, or with --follow stream their events as they
happen, until interrupted.

One line per event: time, event (NEW, CLOSED, or EXISTING for a live flow,
with the time it began), protocol, client → VIP → backend, and the
service:port. With --follow, a backend's health-check transition (passing to
failing or back) is a HEALTH line: time, service, the probed backend
address, and its health, such as
"HEALTH    default/web 198.18.1.10:8080 failing: connection refused (3 in a row)";
--service and --backend select them, --vip, --client and --protocol leave
them out. CLOSED lines add the close reason, the packets and bytes each
way and the duration; EXISTING lines the TCP state as conntrack names it
(ESTABLISHED, TIME_WAIT, ...; "-" for UDP and SCTP, or where the dataplane
does not know), the packets and bytes each way and the flow's age.
Filter flags are ANDed; --timeout applies to the listing, not to --follow.

vipd buffers --flow-buffer events for each stream; a stream read too slowly
misses events and is told how many, on a line starting with "!! LOST". Events
the kernel dropped are reported the same way.

-o json prints one JSON object per line: {"flow": {...}} for an event,
{"lost": {...}} for lost events.`,
		Example: `  vipctl flows --service default/web
  vipctl flows -f --client 10.0.0.0/8 --protocol udp
  vipctl flows -f --existing --types closed -o json
  vipctl flows -f --types health --service default/web`,
		Args: cobra.NoArgs,
		RunE: a.run(func(ctx context.Context, _ []string) error {
			if a.output == outputYAML {
				return usageErrorf("flows prints -o table or -o json")
			}
			f, err := filter.proto()
			if err != nil {
				return err
			}
			if !follow {
				switch {
				case len(types) > 0:
					return usageErrorf("--types needs --follow")
				case existing:
					return usageErrorf("--existing needs --follow")
				}
				return a.listFlows(ctx, f, limit)
			}
			if limit != 0 {
				return usageErrorf("--limit applies without --follow only")
			}
			req := &vipdv1.WatchFlowsRequest{Filter: f, IncludeExisting: existing}
			for _, t := range types {
				var ft vipdv1.FlowEventType
				n, err := manifest.ParseEnum(ft.Descriptor(), t)
				if err != nil {
					return usageErrorf("--types: %w", err)
				}
				req.Types = append(req.Types, vipdv1.FlowEventType(n))
			}
			return a.watchFlows(ctx, req)
		}),
	}
	fl := cmd.Flags()
	filter.add(cmd)
	fl.BoolVarP(&follow, "follow", "f", false, "stream events as they happen, until interrupted")
	fl.StringSliceVar(&types, "types", nil, "with --follow: the event types to show, of new, closed, health, existing (default new,closed,health)")
	fl.BoolVar(&existing, "existing", false, "with --follow: first show the flows live now, as EXISTING")
	fl.Uint32Var(&limit, "limit", 0, "without --follow: show at most this many flows, oldest first (0: vipd's maximum)")
	return cmd
}

// flowFilterFlags are the filter flags of "flows".
type flowFilterFlags struct {
	service, vip, backend, client, protocol string
}

func (f *flowFilterFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.service, "service", "", "only flows of this service")
	fl.StringVar(&f.vip, "vip", "", "only flows to this VIP: IP or IP:PORT")
	fl.StringVar(&f.backend, "backend", "", "only flows to this backend: IP or IP:PORT")
	fl.StringVar(&f.client, "client", "", "only flows from this client: IP or CIDR")
	fl.StringVar(&f.protocol, "protocol", "", "only flows of this protocol: tcp, udp or sctp")
}

// proto is the filter as vipd takes it; vipd checks the addresses.
func (f *flowFilterFlags) proto() (*vipdv1.FlowFilter, error) {
	out := &vipdv1.FlowFilter{Service: f.service, Vip: f.vip, Backend: f.backend, Client: f.client}
	if f.protocol != "" {
		n, err := manifest.ParseEnum(out.Protocol.Descriptor(), f.protocol)
		if err != nil {
			return nil, usageErrorf("--protocol: %w", err)
		}
		out.Protocol = vipdv1.Protocol(n)
	}
	return out, nil
}

func (a *App) listFlows(ctx context.Context, f *vipdv1.FlowFilter, limit uint32) error {
	return a.withClient(func(c *client.Client) error {
		resp, err := c.ListFlows(ctx, f, limit)
		if err != nil {
			return err
		}
		for _, ev := range resp.GetFlows() {
			if err := a.writeFlow(&vipdv1.WatchFlowsResponse{Event: &vipdv1.WatchFlowsResponse_Flow{Flow: ev}}); err != nil {
				return err
			}
		}
		if resp.GetTruncated() {
			fmt.Fprintf(a.streams.Err, "More flows matched than the %d shown; see --limit.\n", len(resp.GetFlows()))
		}
		return nil
	})
}

func (a *App) watchFlows(ctx context.Context, req *vipdv1.WatchFlowsRequest) error {
	return a.withClient(func(c *client.Client) error {
		stream, err := a.startWatch(ctx, c, req)
		if err != nil {
			return err
		}
		for {
			m, err := stream.Recv()
			switch {
			case errors.Is(err, io.EOF):
				return nil
			case err != nil && ctx.Err() != nil:
				// Interrupted: the way a --follow ends.
				return nil
			case err != nil:
				return err
			}
			if err := a.writeFlow(m); err != nil {
				return err
			}
		}
	})
}

// startWatch opens the stream of req, which must start within --timeout
// (the stream itself has no deadline); it ends with ctx.
func (a *App) startWatch(ctx context.Context, c *client.Client, req *vipdv1.WatchFlowsRequest) (client.FlowStream, error) {
	if a.timeout == 0 {
		return c.WatchFlows(ctx, req)
	}
	watchCtx, cancel := context.WithCancel(ctx)
	timer := time.AfterFunc(a.timeout, cancel)
	stream, err := c.WatchFlows(watchCtx, req)
	if !timer.Stop() && ctx.Err() == nil {
		// The timer fired: the stream, if any, is cancelled.
		return nil, status.Errorf(codes.DeadlineExceeded, "the flow stream did not start within %v", a.timeout)
	}
	if err != nil {
		cancel()
		return nil, err
	}
	context.AfterFunc(ctx, cancel) // watchCtx ends with ctx, and no sooner
	return stream, nil
}

// writeFlow writes one event or loss report, as one line.
func (a *App) writeFlow(m *vipdv1.WatchFlowsResponse) error {
	if a.output == outputJSON {
		b, err := compactJSON(m)
		if err != nil {
			return err
		}
		_, err = a.streams.Out.Write(b)
		return err
	}
	var line string
	if l := m.GetLost(); l != nil {
		line = lostLine(l)
	} else {
		line = flowLine(m.GetFlow())
	}
	_, err := io.WriteString(a.streams.Out, line+"\n")
	return err
}

// compactJSON is msg as one line of protojson, the API's canonical JSON.
// protojson varies its whitespace on purpose; json.Compact makes it stable.
func compactJSON(msg proto.Message) ([]byte, error) {
	b, err := marshalOne(msg)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return nil, fmt.Errorf("compact json: %w", err)
	}
	buf.WriteByte('\n')
	return buf.Bytes(), nil
}

// lostLine stands out from the event lines on purpose.
func lostLine(l *vipdv1.LostEvents) string {
	why := "source unknown"
	switch l.GetSource() {
	case vipdv1.LostEventsSource_LOST_EVENTS_SOURCE_SUBSCRIBER:
		why = "subscriber buffer full: this stream was read too slowly"
	case vipdv1.LostEventsSource_LOST_EVENTS_SOURCE_KERNEL:
		why = "dropped by the kernel before vipd could read them"
	}
	noun := "events"
	if l.GetCount() == 1 {
		noun = "event"
	}
	return fmt.Sprintf("!! LOST %d %s (%s)", l.GetCount(), noun, why)
}

// flowTimeFormat is RFC 3339 in UTC with milliseconds, of fixed width.
const flowTimeFormat = "2006-01-02T15:04:05.000Z07:00"

// flowLine is one event: time, event, protocol, client → VIP → backend,
// service:port, then what CLOSED events add (close reason, counters,
// duration) and EXISTING events (TCP state, counters, age).
func flowLine(ev *vipdv1.FlowEvent) string {
	// An EXISTING event happened when the flow began; the time it was
	// listed is the same on every line.
	ts := ev.GetTime()
	if ev.GetType() == vipdv1.FlowEventType_FLOW_EVENT_TYPE_EXISTING && ev.GetStart() != nil {
		ts = ev.GetStart()
	}
	at := "-"
	if ts != nil {
		at = ts.AsTime().UTC().Format(flowTimeFormat)
	}
	if ev.GetType() == vipdv1.FlowEventType_FLOW_EVENT_TYPE_HEALTH {
		return fmt.Sprintf("%s  %-8s  %s %s %s", at, "HEALTH", ev.GetService(), endpointString(ev.GetBackend()), healthString(ev.GetHealth()))
	}
	svc := ev.GetService()
	if svc != "" && ev.GetPortName() != "" {
		svc += ":" + ev.GetPortName()
	}
	if svc == "" {
		svc = "-"
	}
	line := fmt.Sprintf("%s  %-8s  %-4s  %s → %s → %s  %s", at, strings.ToUpper(enumString(ev.GetType())), protocolString(ev.GetProtocol()),
		endpointString(ev.GetClient()), endpointString(ev.GetVip()), endpointString(ev.GetBackend()), svc)
	counters := fmt.Sprintf("client→backend %d pkts %d B, backend→client %d pkts %d B",
		ev.GetPacketsToBackend(), ev.GetBytesToBackend(), ev.GetPacketsToClient(), ev.GetBytesToClient())
	switch ev.GetType() {
	case vipdv1.FlowEventType_FLOW_EVENT_TYPE_CLOSED:
		reason := ev.GetCloseReason()
		if reason == "" {
			reason = "-"
		}
		line += fmt.Sprintf("  %s  %s, %v", reason, counters, ev.GetDuration().AsDuration())
	case vipdv1.FlowEventType_FLOW_EVENT_TYPE_EXISTING:
		line += "  " + tcpStateString(ev.GetTcpState()) + "  " + counters
		if ev.GetDuration() != nil {
			line += fmt.Sprintf(", age %v", ev.GetDuration().AsDuration().Round(time.Millisecond))
		}
	}
	return line
}

// healthString is a backend's health after a transition: "failing:
// connection refused (3 in a row)" or "passing (2 in a row)".
func healthString(h *vipdv1.BackendHealth) string {
	state := strings.ToLower(strings.TrimPrefix(h.GetState().String(), "HEALTH_STATE_"))
	if h.GetState() == vipdv1.HealthState_HEALTH_STATE_FAILING && h.GetLastError() != "" {
		state += ": " + h.GetLastError()
	}
	return fmt.Sprintf("%s (%d in a row)", state, h.GetConsecutive())
}

// tcpStateString is s as conntrack -L spells it (ESTABLISHED, SYN_SENT), or
// "-" when unspecified.
func tcpStateString(s vipdv1.TcpState) string {
	if s == vipdv1.TcpState_TCP_STATE_UNSPECIFIED {
		return "-"
	}
	return strings.TrimPrefix(s.String(), "TCP_STATE_")
}

// endpointString is ip:port, [ip]:port for IPv6, or "-" when unset.
func endpointString(e *vipdv1.Endpoint) string {
	if e == nil {
		return "-"
	}
	if a, err := netip.ParseAddr(e.GetIp()); err == nil && e.GetPort() <= 65535 {
		return netip.AddrPortFrom(a, uint16(e.GetPort())).String()
	}
	return net.JoinHostPort(e.GetIp(), strconv.FormatUint(uint64(e.GetPort()), 10))
}

func (a *App) explainCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "explain CLIENT VIP:PORT[/PROTO]",
		Short: "Explain which backend a connection from CLIENT to VIP:PORT would get",
		Long: `Explain what vipd would do with a new connection from CLIENT (an IP, or
IP:PORT with the client's source port) to VIP:PORT, over PROTO (tcp, udp or
sctp; tcp by default): the service and port that claim it, every backend with
its state, weight and whether it is eligible, the chance of each for random
load balancing, the client's session-affinity entry, and the backend the
connection would get where the dataplane can tell (session affinity, or
Maglev for a known client port). IPv6 addresses go in brackets with a port:
[fd00::1]:80.

Exits with 3 when no service claims VIP:PORT/PROTO.`,
		Example: `  vipctl explain 10.0.0.9 10.96.0.10:80
  vipctl explain 10.0.0.9:43512 10.96.0.53:53/udp
  vipctl explain fd00::9 [fd00:96::10]:443`,
		Args: cobra.ExactArgs(2),
		RunE: a.run(func(ctx context.Context, args []string) error {
			req, err := explainRequest(args[0], args[1])
			if err != nil {
				return err
			}
			return a.withClient(func(c *client.Client) error {
				resp, err := c.Explain(ctx, req)
				if err != nil {
					return err
				}
				return a.printer().show(resp, explainView(resp))
			})
		}),
	}
}

// explainRequest parses the arguments of explain. It checks their shape
// only; vipd checks the addresses and numbers.
func explainRequest(clientArg, target string) (*vipdv1.ExplainRequest, error) {
	req := &vipdv1.ExplainRequest{ClientIp: clientArg}
	if ap, err := netip.ParseAddrPort(clientArg); err == nil {
		req.ClientIp, req.ClientPort = ap.Addr().String(), uint32(ap.Port())
	}
	if i := strings.LastIndex(target, "/"); i >= 0 {
		n, err := manifest.ParseEnum(req.Protocol.Descriptor(), target[i+1:])
		if err != nil {
			return nil, usageErrorf("%s: protocol: %w", target, err)
		}
		req.Protocol = vipdv1.Protocol(n)
		target = target[:i]
	}
	host, port, err := net.SplitHostPort(target)
	if err != nil {
		return nil, usageErrorf("%s: want VIP:PORT[/PROTO], with IPv6 as [VIP]:PORT", target)
	}
	p, err := strconv.ParseUint(port, 10, 32)
	if err != nil {
		return nil, usageErrorf("%s: %q is not a port number", target, port)
	}
	req.Vip, req.Port = host, uint32(p)
	return req, nil
}

// explainView is the key/value view of "explain", then its backends.
func explainView(r *vipdv1.ExplainResponse) func(*table) {
	return func(t *table) {
		// The backends' target ports, as portString reads them: one on
		// the port's target_port uses it, any other is the backend's own.
		own := cmp.Or(r.GetPort().GetTargetPort(), r.GetPort().GetPort())
		backends := make([]*vipdv1.Backend, len(r.GetBackends()))
		for i, b := range r.GetBackends() {
			switch tp := b.GetTargetPort(); tp {
			case own:
				backends[i] = &vipdv1.Backend{}
			case 0: // it does not serve the port
				backends[i] = &vipdv1.Backend{OnlyNamedPorts: true}
			default:
				backends[i] = &vipdv1.Backend{Ports: map[string]uint32{r.GetPort().GetName(): tp}}
			}
		}
		port := portString(r.GetPort(), backends)
		if name := r.GetPort().GetName(); name != "" {
			port = name + " " + port
		}
		affinity := "none"
		if a := r.GetAffinity(); a.GetPresent() {
			affinity = fmt.Sprintf("%s, %v left", endpointString(a.GetBackend()), a.GetRemaining().AsDuration().Round(time.Second))
		}
		pick := ""
		if r.GetWouldPick() != nil {
			pick = endpointString(r.GetWouldPick())
		}
		t.field("Service", r.GetService())
		t.field("Port", port)
		t.field("Load balancing", enumString(r.GetLoadBalancing()))
		t.field("Session affinity", affinityString(r.GetSessionAffinity()))
		t.field("Internal traffic policy", enumString(r.GetInternalTrafficPolicy()))
		t.field("Affinity entry", affinity)
		t.field("Would pick", pick)
		t.field("Summary", r.GetSummary())
		if len(r.GetBackends()) == 0 {
			return
		}
		t.section()
		random := r.GetLoadBalancing() == vipdv1.LoadBalancing_LOAD_BALANCING_RANDOM
		t.row("  BACKEND", "PORT", "STATE", "WEIGHT", "ELIGIBLE", "PROBABILITY", "WHY NOT")
		for _, b := range r.GetBackends() {
			prob := ""
			if random {
				prob = fmt.Sprintf("%.1f%%", 100*b.GetProbability())
			}
			eligible := "no"
			if b.GetEligible() {
				eligible = "yes"
			}
			port := "-" // the backend does not serve the port
			if tp := b.GetTargetPort(); tp != 0 {
				port = strconv.FormatUint(uint64(tp), 10)
			}
			t.row("  "+b.GetIp(), port, enumString(b.GetState()),
				strconv.FormatUint(uint64(b.GetWeight()), 10), eligible, prob, b.GetIneligibleReason())
		}
	}
}
