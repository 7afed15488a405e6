package server_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/protobuf/testing/protocmp"
)

// TestExplainPerPort checks that Explain judges eligibility port by port:
// a backend that does not serve the port asked about (only_named_ports) is
// not eligible, has no target port, and does not count for the port's
// READY-else-TERMINATING fallback.
func TestExplainPerPort(t *testing.T) {
	env := startFlows(t)
	ready, terminating := vipdv1.BackendState_BACKEND_STATE_READY, vipdv1.BackendState_BACKEND_STATE_TERMINATING
	httpReq := &vipdv1.ExplainRequest{ClientIp: "10.0.0.9", Vip: "198.19.0.10", Port: 80, Protocol: vipdv1.Protocol_PROTOCOL_TCP}
	dnsReq := &vipdv1.ExplainRequest{ClientIp: "10.0.0.9", Vip: "198.19.0.10", Port: 53, Protocol: vipdv1.Protocol_PROTOCOL_UDP}
	const notDNS = `does not serve port "dns" (only_named_ports, and ports does not name it)`
	type view struct {
		Target   uint32
		Eligible bool
		P        float64
		Reason   string
	}
	for _, tc := range []struct {
		name     string
		backends []*vipdv1.Backend
		req      *vipdv1.ExplainRequest
		want     map[string]view
		summary  []string
	}{
		{
			name: "the port the backend serves",
			backends: []*vipdv1.Backend{
				{Ip: "198.18.1.1"}, {Ip: "198.18.1.2", Ports: map[string]uint32{"http": 8081}, OnlyNamedPorts: true}, {Ip: "198.18.1.3", State: terminating},
			},
			req: httpReq,
			want: map[string]view{
				"198.18.1.1": {8080, true, 0.5, ""},
				"198.18.1.2": {8081, true, 0.5, ""},
				"198.18.1.3": {8080, false, 0, "terminating, and ready backends are left"},
				"fd00::1":    {8080, false, 0, "an IPv6 backend cannot serve an IPv4 VIP"},
			},
			summary: []string{"2 of 4 backends are eligible", "198.18.1.1 50.0%, 198.18.1.2 50.0%."},
		},
		{
			name: "a port the backend does not serve",
			backends: []*vipdv1.Backend{
				{Ip: "198.18.1.1"}, {Ip: "198.18.1.2", Ports: map[string]uint32{"http": 8081}, OnlyNamedPorts: true}, {Ip: "198.18.1.3", State: terminating},
			},
			req: dnsReq,
			want: map[string]view{
				"198.18.1.1": {53, true, 1, ""},
				"198.18.1.2": {0, false, 0, notDNS},
				"198.18.1.3": {53, false, 0, "terminating, and ready backends are left"},
				"fd00::1":    {53, false, 0, "an IPv6 backend cannot serve an IPv4 VIP"},
			},
			summary: []string{"1 of 4 backends are eligible", "It would go to 198.18.1.1:53."},
		},
		{
			name: "terminating fallback per port",
			backends: []*vipdv1.Backend{
				{Ip: "198.18.1.2", State: ready, OnlyNamedPorts: true, Ports: map[string]uint32{"http": 8080}}, {Ip: "198.18.1.3", State: terminating},
			},
			req: dnsReq,
			want: map[string]view{
				"198.18.1.2": {0, false, 0, notDNS},
				"198.18.1.3": {53, true, 1, ""},
				"fd00::1":    {53, false, 0, "an IPv6 backend cannot serve an IPv4 VIP"},
			},
			summary: []string{"It would go to 198.18.1.3:53."},
		},
		{
			name:     "no backend serves the port",
			backends: []*vipdv1.Backend{{Ip: "198.18.1.2", OnlyNamedPorts: true, Ports: map[string]uint32{"http": 8080}}, {Ip: "198.18.1.3", OnlyNamedPorts: true}},
			req:      dnsReq,
			want: map[string]view{
				"198.18.1.2": {0, false, 0, notDNS},
				"198.18.1.3": {0, false, 0, notDNS},
				"fd00::1":    {53, false, 0, "an IPv6 backend cannot serve an IPv4 VIP"},
			},
			summary: []string{"0 of 3 backends are eligible", "refused with an ICMP port unreachable"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			upsertForExplain(t, env, &vipdv1.Service{Backends: append(tc.backends, &vipdv1.Backend{Ip: "fd00::1"})})
			resp, err := env.status.Explain(ctxT(t), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]view{}
			for _, b := range resp.GetBackends() {
				got[b.GetIp()] = view{b.GetTargetPort(), b.GetEligible(), b.GetProbability(), b.GetIneligibleReason()}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("backends (-want +got):\n%s", diff)
			}
			for _, s := range tc.summary {
				if !strings.Contains(resp.GetSummary(), s) {
					t.Errorf("summary %q does not say %q", resp.GetSummary(), s)
				}
			}
		})
	}
}

// TestExplainUnnamedPortByEmptyName checks that the empty name in a
// backend's ports gives the target port of a service's only, unnamed port.
func TestExplainUnnamedPortByEmptyName(t *testing.T) {
	env := startFlows(t)
	upsertForExplain(t, env, &vipdv1.Service{
		Ports:    []*vipdv1.Port{{Port: 80, TargetPort: 8080}},
		Backends: []*vipdv1.Backend{{Ip: "198.18.1.1", Ports: map[string]uint32{"": 9090}, OnlyNamedPorts: true}, {Ip: "198.18.1.2", OnlyNamedPorts: true}},
	})
	resp, err := env.status.Explain(ctxT(t), &vipdv1.ExplainRequest{ClientIp: "10.0.0.9", Vip: "198.19.0.10", Port: 80})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(&vipdv1.Endpoint{Ip: "198.18.1.1", Port: 9090}, resp.GetWouldPick(), protocmp.Transform()); diff != "" {
		t.Errorf("would_pick (-want +got):\n%s", diff)
	}
	if r := resp.GetBackends()[1].GetIneligibleReason(); r != "does not serve port 80/TCP (only_named_ports, and ports does not name it)" {
		t.Errorf("198.18.1.2: ineligible reason %q", r)
	}
}
