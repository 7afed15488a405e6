package server

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/vipd/vipd/dataplane"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Explain implements vipdv1.StatusServiceServer. It reads the desired
// state (which the dataplane has applied once Ready) and, when the
// dataplane is an Explainer, the dataplane's state for this client.
func (a *API) Explain(ctx context.Context, req *vipdv1.ExplainRequest) (*vipdv1.ExplainResponse, error) {
	q, v := validation.Explain(req)
	if len(v) > 0 {
		return nil, toStatus(v)
	}
	e, port, ok := claimant(a.rec.Snapshot(), q.Protocol, q.VIP)
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no service claims %s/%s", q.VIP, q.Protocol)
	}
	svc, failing := a.withHealth(e.Dataplane)
	api := e.Service()
	resp := &vipdv1.ExplainResponse{
		Service:               svc.Name,
		Port:                  &vipdv1.Port{Name: port.Name, Protocol: protocolToProto[port.Protocol], Port: uint32(port.Port), TargetPort: uint32(port.TargetPort)},
		LoadBalancing:         api.LoadBalancing,
		SessionAffinity:       api.SessionAffinity,
		InternalTrafficPolicy: api.InternalTrafficPolicy,
		Affinity:              &vipdv1.ExplainedAffinity{},
	}

	eligible := svc.EligibleBackends(port, q.VIP.Addr().Is6())
	var total float64
	for _, b := range eligible {
		total += float64(max(b.Weight, 1))
	}
	hasReady := slices.ContainsFunc(eligible, func(b *dataplane.Backend) bool { return b.State == dataplane.BackendReady })
	for i := range svc.Backends {
		b := &svc.Backends[i]
		state := b.State
		if _, ok := failing[b.IP]; ok {
			state = e.Dataplane.Backends[i].State
		}
		eb := &vipdv1.ExplainedBackend{
			Ip:        b.IP.String(),
			State:     backendStateToProto[state],
			Weight:    uint32(max(b.Weight, 1)),
			NodeLocal: b.NodeLocal,
			Eligible:  slices.Contains(eligible, b),
		}
		// A backend that does not serve the port has no target port for it.
		if b.Serves(port) {
			eb.TargetPort = uint32(b.TargetPort(port))
		}
		if eb.Eligible && svc.LoadBalancing == dataplane.LoadBalancingRandom {
			eb.Probability = float64(eb.Weight) / total
		}
		if !eb.Eligible {
			eb.IneligibleReason = ineligibleReason(svc, b, port, q.VIP.Addr(), hasReady)
			if why, ok := failing[b.IP]; ok && eb.IneligibleReason == "not serving" {
				eb.IneligibleReason = why
			}
		}
		resp.Backends = append(resp.Backends, eb)
	}

	var ex dataplane.Explanation
	if a.explainer != nil {
		var err error
		if ex, err = a.explainer.ExplainFlow(ctx, q); err != nil {
			return nil, status.Errorf(codes.Unavailable, "ask the %s dataplane about %s → %s/%s: %v", a.dataplane, q.Client.Addr(), q.VIP, q.Protocol, err)
		}
	}
	affinityEligible := false
	if ex.AffinityBackend.Addr().IsValid() {
		resp.Affinity = &vipdv1.ExplainedAffinity{Present: true, Backend: endpoint(ex.AffinityBackend), Remaining: durationpb.New(ex.AffinityRemaining)}
		affinityEligible = slices.ContainsFunc(eligible, func(b *dataplane.Backend) bool { return b.IP == ex.AffinityBackend.Addr().Unmap() })
	}
	switch {
	case len(eligible) == 0:
	case ex.Pick.Addr().IsValid():
		resp.WouldPick = endpoint(ex.Pick)
	case affinityEligible:
		resp.WouldPick = endpoint(ex.AffinityBackend)
	case len(eligible) == 1:
		resp.WouldPick = endpoint(netip.AddrPortFrom(eligible[0].IP, eligible[0].TargetPort(port)))
	}
	resp.Summary = explainSummary(svc, port, q, resp, len(eligible), a.explainer != nil, affinityEligible)
	return resp, nil
}

// withHealth returns svc as the dataplane has it: with the backends that
// fail their health checks NOT_SERVING, each with the reason in words.
func (a *API) withHealth(svc *dataplane.Service) (*dataplane.Service, map[netip.Addr]string) {
	if a.health == nil {
		return svc, nil
	}
	var out *dataplane.Service
	var failing map[netip.Addr]string
	for i, b := range svc.Backends {
		if b.State == dataplane.BackendNotServing {
			continue
		}
		why, ok := a.health.Explain(svc.Name, b.IP)
		if !ok {
			continue
		}
		if out == nil {
			c := *svc
			c.Backends = slices.Clone(svc.Backends)
			out, failing = &c, map[netip.Addr]string{}
		}
		out.Backends[i].State = dataplane.BackendNotServing
		failing[b.IP] = why
	}
	if out == nil {
		return svc, nil
	}
	return out, failing
}

// ineligibleReason says why b may not take a new connection to port of vip.
// hasReady tells whether a READY backend is eligible for that port.
func ineligibleReason(svc *dataplane.Service, b *dataplane.Backend, port dataplane.Port, vip netip.Addr, hasReady bool) string {
	switch {
	case b.IP.Is6() != vip.Is6():
		return fmt.Sprintf("an IPv%d backend cannot serve an IPv%d VIP", ipVersion(b.IP), ipVersion(vip))
	case !b.Serves(port):
		return fmt.Sprintf("does not serve port %s (only_named_ports, and ports does not name it)", portName(port))
	case svc.TrafficPolicy == dataplane.TrafficPolicyLocal && !b.NodeLocal:
		return "not node-local, and the internal traffic policy is local"
	case b.State == dataplane.BackendNotServing:
		return "not serving"
	case b.State == dataplane.BackendTerminating && hasReady:
		return "terminating, and ready backends are left"
	}
	return "not eligible"
}

// portName names p for a sentence: its name, or "80/TCP" when it has none.
func portName(p dataplane.Port) string {
	if p.Name != "" {
		return strconv.Quote(p.Name)
	}
	return fmt.Sprintf("%d/%s", p.Port, p.Protocol)
}

func ipVersion(a netip.Addr) int {
	if a.Is4() {
		return 4
	}
	return 6
}

// explainSummary says in words what resp holds.
func explainSummary(svc *dataplane.Service, port dataplane.Port, q dataplane.ExplainQuery, resp *vipdv1.ExplainResponse, eligible int, asked, affinityEligible bool) string {
	var s strings.Builder
	fmt.Fprintf(&s, "%s/%s is service %s", q.VIP, q.Protocol, svc.Name)
	if port.Name != "" {
		fmt.Fprintf(&s, " port %s", port.Name)
	}
	fmt.Fprintf(&s, "; %d of %d backends are eligible for a new connection.", eligible, len(svc.Backends))
	if eligible == 0 {
		refusal := "an ICMP port unreachable"
		if q.Protocol == dataplane.TCP {
			refusal = "a TCP reset"
		}
		fmt.Fprintf(&s, " The connection is refused with %s.", refusal)
		return s.String()
	}
	if a := resp.Affinity; a.Present {
		b := netip.AddrPortFrom(netip.MustParseAddr(a.Backend.Ip), uint16(a.Backend.Port))
		fmt.Fprintf(&s, " Session affinity pins %s to %s for %v more", q.Client.Addr(), b, a.Remaining.AsDuration().Round(1e9))
		if !affinityEligible {
			s.WriteString(", but that backend is not eligible, so the entry is ignored")
		}
		s.WriteString(".")
	}
	switch {
	case resp.WouldPick != nil:
		fmt.Fprintf(&s, " It would go to %s:%d.", resp.WouldPick.Ip, resp.WouldPick.Port)
	case svc.LoadBalancing == dataplane.LoadBalancingMaglev && !asked:
		s.WriteString(" Maglev picks by a hash of the connection's addresses and ports; this dataplane cannot tell which backend it would get.")
	case svc.LoadBalancing == dataplane.LoadBalancingMaglev && q.Client.Port() == 0:
		s.WriteString(" Maglev picks by a hash of the connection's addresses and ports; give the client port to learn which backend it would get.")
	case svc.LoadBalancing == dataplane.LoadBalancingMaglev:
		s.WriteString(" Maglev picks by a hash of the connection's addresses and ports; the dataplane did not say which backend it would get.")
	default:
		s.WriteString(" A backend is picked at random, in proportion to the weights:")
		first := true
		for _, b := range resp.Backends {
			if b.Eligible {
				if !first {
					s.WriteString(",")
				}
				first = false
				fmt.Fprintf(&s, " %s %.1f%%", b.Ip, 100*b.Probability)
			}
		}
		s.WriteString(".")
	}
	return s.String()
}

var backendStateToProto = map[dataplane.BackendState]vipdv1.BackendState{
	dataplane.BackendReady:       vipdv1.BackendState_BACKEND_STATE_READY,
	dataplane.BackendTerminating: vipdv1.BackendState_BACKEND_STATE_TERMINATING,
	dataplane.BackendNotServing:  vipdv1.BackendState_BACKEND_STATE_NOT_SERVING,
}
