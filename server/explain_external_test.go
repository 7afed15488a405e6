package server_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/internal/testkit/testserver"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/grpc/codes"
)

// TestExplainExternal checks Explain for a connection to an external or
// load-balancer IP: the backends as external traffic gets them (the
// external traffic policy), what the node and its pods get, and a client
// outside load_balancer_source_ranges dropped; and a node port, on a
// node-port address only.
func TestExplainExternal(t *testing.T) {
	env := startFlows(t, testserver.WithNode(dataplane.Node{NodePortAddresses: []netip.Addr{netip.MustParseAddr("198.18.0.1")}}))
	svc := &vipdv1.Service{
		Ports:                    []*vipdv1.Port{{Name: "http", Port: 80, TargetPort: 8080, NodePort: 30080}},
		Backends:                 []*vipdv1.Backend{{Ip: "198.18.1.1", NodeLocal: true}, {Ip: "198.18.1.2"}},
		ExternalIps:              []string{"198.19.5.1"},
		LoadBalancerIps:          []string{"198.19.6.1"},
		LoadBalancerSourceRanges: []string{"198.18.200.0/24"},
		ExternalTrafficPolicy:    vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL,
	}
	upsertForExplain(t, env, svc)
	explainPort := func(client, addr string, port uint32) *vipdv1.ExplainResponse {
		t.Helper()
		resp, err := env.status.Explain(ctxT(t), &vipdv1.ExplainRequest{ClientIp: client, Vip: addr, Port: port, Protocol: vipdv1.Protocol_PROTOCOL_TCP})
		if err != nil {
			t.Fatalf("Explain %s → %s: %v", client, addr, err)
		}
		return resp
	}
	explain := func(client, addr string) *vipdv1.ExplainResponse { t.Helper(); return explainPort(client, addr, 80) }
	eligible := func(resp *vipdv1.ExplainResponse) map[string]string {
		m := map[string]string{}
		for _, b := range resp.GetBackends() {
			m[b.GetIp()] = b.GetIneligibleReason()
		}
		return m
	}
	wantSummary := func(resp *vipdv1.ExplainResponse, parts ...string) {
		t.Helper()
		for _, p := range parts {
			if !strings.Contains(resp.GetSummary(), p) {
				t.Errorf("summary %q does not say %q", resp.GetSummary(), p)
			}
		}
	}

	// LOCAL: only the node-local backend, for traffic from outside.
	resp := explain("192.0.2.9", "198.19.5.1")
	if e := eligible(resp); e["198.18.1.1"] != "" || !strings.Contains(e["198.18.1.2"], "external traffic policy is local") {
		t.Errorf("eligibility %v", e)
	}
	wantSummary(resp, "198.19.5.1:80/TCP is an external IP of service default/web port http",
		"external traffic policy local", "1 of 2 backends are eligible", "from the node or its pods, 2", "It would go to 198.18.1.1:8080.")
	if resp.GetWouldPick().GetIp() != "198.18.1.1" {
		t.Errorf("would pick %v", resp.GetWouldPick())
	}

	// The load-balancer IP from inside the source ranges, and from outside.
	resp = explain("198.18.200.7", "198.19.6.1")
	wantSummary(resp, "is a load-balancer IP of service default/web", "1 of 2 backends are eligible")
	resp = explain("192.0.2.9", "198.19.6.1")
	wantSummary(resp, "dropped: source 192.0.2.9 not in load_balancer_source_ranges")
	for ip, why := range eligible(resp) {
		if why != "the client is not in load_balancer_source_ranges" {
			t.Errorf("%s: %q", ip, why)
		}
	}
	if resp.GetWouldPick() != nil {
		t.Errorf("a dropped client would pick %v", resp.GetWouldPick())
	}
	// The source ranges are for the load-balancer IPs only.
	wantSummary(explain("192.0.2.9", "198.19.5.1"), "1 of 2 backends are eligible")

	// The node port, on the node-port address; on another address of
	// the node it is no service's.
	wantSummary(explainPort("192.0.2.9", "198.18.0.1", 30080), "198.18.0.1:30080/TCP is a node port of service default/web port http",
		"external traffic policy local", "1 of 2 backends are eligible", "from the node or its pods, 2")
	_, err := env.status.Explain(ctxT(t), &vipdv1.ExplainRequest{ClientIp: "192.0.2.9", Vip: "198.18.0.2", Port: 30080})
	wantCode(t, err, codes.NotFound)

	// LOCAL without a node-local backend: dropped from outside.
	svc.Backends = []*vipdv1.Backend{{Ip: "198.18.1.2"}}
	upsertForExplain(t, env, svc)
	wantSummary(explain("192.0.2.9", "198.19.5.1"), "0 of 1 backends are eligible", "from the node or its pods, 1",
		"Packets from outside the node are dropped: no node-local backend.")

	// CLUSTER: every backend, masqueraded.
	svc.ExternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER
	upsertForExplain(t, env, svc)
	wantSummary(explain("192.0.2.9", "198.19.5.1"), "external traffic policy cluster: the source is masqueraded", "1 of 1 backends are eligible")

	// Another port of the address is no service's.
	_, err = env.status.Explain(ctxT(t), &vipdv1.ExplainRequest{ClientIp: "192.0.2.9", Vip: "198.19.5.1", Port: 81})
	wantCode(t, err, codes.NotFound)
}
