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
	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Explain implements vipdv1.StatusServiceServer. It reads the desired
// state (which the dataplane has applied once Ready) and, when the
// dataplane is an Explainer, the dataplane's state for this client.
//
// vip may be a VIP, an external or load-balancer IP, or a node-port
// address (of the Node the dataplane has) at a node port. For the latter,
// vipd cannot tell from the request whether the client is outside the
// node, so the backends are judged as for traffic from outside
// (external_traffic_policy), and the summary says what the node and its
// pods get (cluster semantics); a client outside a load-balancer IP's
// load_balancer_source_ranges is dropped whatever it comes from.
func (a *API) Explain(ctx context.Context, req *vipdv1.ExplainRequest) (*vipdv1.ExplainResponse, error) {
	q, v := validation.Explain(req)
	if len(v) > 0 {
		return nil, toStatus(v)
	}
	snap := a.rec.Snapshot()
	e, port, ok := claimant(snap, q.Protocol, q.VIP)
	var ext *externalView
	if !ok {
		e, port, ext, ok = externalClaimant(snap, q, a.rec.Status().NodePortAddresses)
	}
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no service claims %s/%s", q.VIP, q.Protocol)
	}
	svc, failing := a.withTopology(a.withHealth(e.Dataplane))
	api := e.Service()
	resp := &vipdv1.ExplainResponse{
		Service:               svc.Name,
		Port:                  &vipdv1.Port{Name: port.Name, Protocol: protocolToProto[port.Protocol], Port: uint32(port.Port), TargetPort: uint32(port.TargetPort)},
		LoadBalancing:         api.LoadBalancing,
		SessionAffinity:       api.SessionAffinity,
		InternalTrafficPolicy: api.InternalTrafficPolicy,
		Affinity:              &vipdv1.ExplainedAffinity{},
	}

	var eligible []*dataplane.Backend
	switch {
	case ext == nil:
		eligible = svc.EligibleBackends(port, q.VIP.Addr().Is6())
	case !ext.dropped:
		eligible = svc.ExternalBackends(port, q.VIP.Addr().Is6(), svc.ExternalTrafficPolicy)
	}
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
			eb.IneligibleReason = ineligibleReason(svc, b, port, q.VIP.Addr(), hasReady, ext)
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
	resp.Summary = explainSummary(svc, port, q, resp, len(eligible), a.explainer != nil, affinityEligible, ext)
	return resp, nil
}

// externalView is how Explain sees a connection to an external or
// load-balancer IP.
type externalView struct {
	// role names the address's field: "external IP", "load-balancer IP"
	// or "node port" (an address of the node at a port's node_port).
	role string
	// dropped is true when the client is outside the load-balancer IP's
	// load_balancer_source_ranges.
	dropped bool
	// cluster is how many backends the node and its pods may reach
	// (cluster semantics).
	cluster int
}

// externalClaimant finds the service that serves q's address as an
// external or load-balancer IP on q's port, or as a node port when the
// address is one of nodePortAddrs (the node-port addresses the dataplane
// has), and how it treats q.
func externalClaimant(snap *store.Snapshot, q dataplane.ExplainQuery, nodePortAddrs []netip.Addr) (*store.Entry, dataplane.Port, *externalView, bool) {
	addr := q.VIP.Addr().Unmap()
	claim := store.Claim{VIP: addr, Protocol: q.Protocol, Port: q.VIP.Port(), Kind: store.ClaimExternal}
	servedAs := func(p dataplane.Port) bool { return p.Protocol == q.Protocol && p.Port == q.VIP.Port() }
	view := &externalView{role: "external IP"}
	if _, ok := snap.Holder(claim); !ok && slices.Contains(nodePortAddrs, addr) {
		claim = store.Claim{Protocol: q.Protocol, Port: q.VIP.Port(), Kind: store.ClaimNodePort}
		servedAs = func(p dataplane.Port) bool { return p.Protocol == q.Protocol && p.NodePort == q.VIP.Port() }
		view.role = "node port"
	}
	name, ok := snap.Holder(claim)
	if !ok {
		return nil, dataplane.Port{}, nil, false
	}
	e, ok := snap.Get(name)
	if !ok {
		return nil, dataplane.Port{}, nil, false
	}
	// A TCP node-port claim may be the service's health-check node port,
	// which no port serves.
	i := slices.IndexFunc(e.Dataplane.Ports, servedAs)
	if i < 0 {
		return nil, dataplane.Port{}, nil, false
	}
	svc, port := e.Dataplane, e.Dataplane.Ports[i]
	if view.role != "node port" && slices.Contains(svc.LoadBalancerIPs, addr) {
		view.role = "load-balancer IP"
		client := q.Client.Addr().Unmap()
		view.dropped = len(svc.LoadBalancerSourceRanges) > 0 &&
			!slices.ContainsFunc(svc.LoadBalancerSourceRanges, func(p netip.Prefix) bool { return p.Contains(client) })
	}
	view.cluster = len(svc.ExternalBackends(port, addr.Is6(), dataplane.TrafficPolicyCluster))
	return e, port, view, true
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
// hasReady tells whether a READY backend is eligible for that port. ext is
// not nil when vip is an external or load-balancer IP.
func ineligibleReason(svc *dataplane.Service, b *dataplane.Backend, port dataplane.Port, vip netip.Addr, hasReady bool, ext *externalView) string {
	switch {
	case ext != nil && ext.dropped:
		return "the client is not in load_balancer_source_ranges"
	case b.IP.Is6() != vip.Is6():
		return fmt.Sprintf("an IPv%d backend cannot serve an IPv%d VIP", ipVersion(b.IP), ipVersion(vip))
	case !b.Serves(port):
		return fmt.Sprintf("does not serve port %s (only_named_ports, and ports does not name it)", portName(port))
	case ext == nil && svc.TrafficPolicy == dataplane.TrafficPolicyLocal && !b.NodeLocal:
		return "not node-local, and the internal traffic policy is local"
	case ext != nil && svc.ExternalTrafficPolicy == dataplane.TrafficPolicyLocal && !b.NodeLocal:
		return "not node-local, and the external traffic policy is local (for traffic from outside the node)"
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

// explainSummary says in words what resp holds. ext is not nil when
// q.VIP is an external or load-balancer IP.
func explainSummary(svc *dataplane.Service, port dataplane.Port, q dataplane.ExplainQuery, resp *vipdv1.ExplainResponse, eligible int, asked, affinityEligible bool, ext *externalView) string {
	var s strings.Builder
	fmt.Fprintf(&s, "%s/%s is ", q.VIP, q.Protocol)
	if ext != nil {
		article := "a"
		if ext.role == "external IP" {
			article = "an"
		}
		fmt.Fprintf(&s, "%s %s of ", article, ext.role)
	}
	fmt.Fprintf(&s, "service %s", svc.Name)
	if port.Name != "" {
		fmt.Fprintf(&s, " port %s", port.Name)
	}
	if ext != nil && ext.dropped {
		fmt.Fprintf(&s, "; dropped: source %s not in load_balancer_source_ranges.", q.Client.Addr())
		return s.String()
	}
	if ext != nil {
		policy := "cluster: the source is masqueraded to the node's address"
		if svc.ExternalTrafficPolicy == dataplane.TrafficPolicyLocal {
			policy = "local: node-local backends only, the source kept"
		}
		fmt.Fprintf(&s, "; from outside the node (external traffic policy %s), %d of %d backends are eligible for a new connection;"+
			" from the node or its pods, %d (any usable backend, no masquerade).", policy, eligible, len(svc.Backends), ext.cluster)
		if eligible == 0 && svc.ExternalTrafficPolicy == dataplane.TrafficPolicyLocal {
			s.WriteString(" Packets from outside the node are dropped: no node-local backend.")
			return s.String()
		}
	} else {
		fmt.Fprintf(&s, "; %d of %d backends are eligible for a new connection.", eligible, len(svc.Backends))
	}
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
