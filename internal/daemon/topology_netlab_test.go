package daemon_test

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/daemon"
	"github.com/vipd/vipd/internal/testkit/netlab"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestTopologyRealTraffic runs vipd --zone zone-a --node-name node-1 on
// each real dataplane in a lab node whose pods stand for backends in two
// zones, and checks with real TCP and UDP traffic from a pod that:
// PREFER_SAME_ZONE without hints sends every new connection to a zone-a
// backend; zone hints on every backend do the same; with one backend's
// hints removed new connections reach both zones; and node hints on every
// backend, one for node-1, send every new connection to that one. A zone
// set at run time (SetNodeTopology) moves new connections to the zone-b
// backend, and to both zones without a zone.
func TestTopologyRealTraffic(t *testing.T) {
	netlab.RequireRoot(t)
	for _, dp := range []string{daemon.DataplaneIPTables, daemon.DataplaneEBPF} {
		t.Run(dp, func(t *testing.T) { testTopologyRealTraffic(t, dp) })
	}
}

func testTopologyRealTraffic(t *testing.T, dp string) {
	lab := netlab.New(t, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: []string{"client", "a1", "a2", "b1"}}}})
	node := lab.Node(1)
	cl := node.Pod("client")
	ip := map[string]string{}
	for _, name := range []string{"a1", "a2", "b1"} {
		p := node.Pod(name)
		if _, err := p.StartEcho("", 8080); err != nil {
			t.Fatal(err)
		}
		ip[name] = p.IPv4().String()
	}
	cfg := config(t)
	cfg.NetNS = node.Path()
	cfg.Zone, cfg.NodeName = "zone-a", "node-1"
	labDataplane(t, &cfg, dp)
	r := start(t, cfg, healthpb.HealthCheckResponse_SERVING)

	vip := netip.MustParseAddrPort("198.19.0.20:80")
	type backend struct {
		name, zone      string
		forZones, nodes []string
	}
	apply := func(step string, dist vipdv1.TrafficDistribution, bs ...backend) {
		t.Helper()
		svc := &vipdv1.Service{Name: "web", Vips: []string{vip.Addr().String()}, TrafficDistribution: dist,
			Ports: []*vipdv1.Port{
				{Name: "tcp", Protocol: vipdv1.Protocol_PROTOCOL_TCP, Port: uint32(vip.Port()), TargetPort: 8080},
				{Name: "udp", Protocol: vipdv1.Protocol_PROTOCOL_UDP, Port: uint32(vip.Port()), TargetPort: 8080},
			}}
		for _, b := range bs {
			svc.Backends = append(svc.Backends, &vipdv1.Backend{Ip: ip[b.name], Zone: b.zone, ForZones: b.forZones, ForNodes: b.nodes})
		}
		if _, err := r.local.UpsertService(ctxT(t), svc, 0); err != nil {
			t.Fatalf("%s: upsert: %v", step, err)
		}
	}
	// reached sends n new connections over proto and returns how many
	// each backend answered. Every request has a source port of its own:
	// a flow that an earlier step tracked (a UDP one from a reused
	// ephemeral port) keeps its backend, as it should, and would be no
	// new connection. (IP_LOCAL_PORT_RANGE does not reach the port an
	// unconnected UDP socket binds.)
	port := uint16(20000)
	reached := func(step, proto string, n int) map[string]int {
		t.Helper()
		got := map[string]int{}
		for range n {
			port++
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			rep, err := cl.Request(ctx, proto, vip.String(), netlab.WithLocalPort(port))
			cancel()
			if err != nil {
				t.Fatalf("%s: %s request: %v\nlog:\n%s", step, proto, err, r.log)
			}
			got[rep.Backend]++
		}
		return got
	}
	// only checks that 40 new connections of each protocol reach only
	// backends in want.
	only := func(step string, want ...string) {
		t.Helper()
		for _, proto := range []string{"tcp", "udp"} {
			got := reached(step, proto, 40)
			for b := range got {
				if !slices.Contains(want, b) {
					t.Errorf("%s: %s connections reached %v; want only %v", step, proto, got, want)
					break
				}
			}
		}
	}
	// both checks that new connections of each protocol reach a zone-a
	// and a zone-b backend.
	both := func(step string) {
		t.Helper()
		for _, proto := range []string{"tcp", "udp"} {
			got := reached(step, proto, 60)
			if got["b1"] == 0 || got["a1"]+got["a2"] == 0 {
				t.Errorf("%s: %s connections reached %v; want both zones", step, proto, got)
			}
		}
	}
	sameZone := vipdv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_PREFER_SAME_ZONE

	apply("zones only", sameZone, backend{name: "a1", zone: "zone-a"}, backend{name: "a2", zone: "zone-a"}, backend{name: "b1", zone: "zone-b"})
	only("zones only", "a1", "a2")

	apply("no distribution", 0, backend{name: "a1", zone: "zone-a"}, backend{name: "a2", zone: "zone-a"}, backend{name: "b1", zone: "zone-b"})
	both("no distribution")

	hinted := []backend{
		{name: "a1", zone: "zone-a", forZones: []string{"zone-a"}},
		{name: "a2", zone: "zone-a", forZones: []string{"zone-a"}},
		{name: "b1", zone: "zone-b", forZones: []string{"zone-b"}},
	}
	apply("zone hints", sameZone, hinted...)
	only("zone hints", "a1", "a2")

	// The zone changed at run time (NodeService.SetNodeTopology, as
	// vipd-k8s does from the Node's label): the hints of zone-b now
	// match, and new connections follow at once.
	if _, err := r.local.SetNodeTopology(ctxT(t), "zone-b"); err != nil {
		t.Fatalf("set zone-b: %v", err)
	}
	only("zone hints, node now in zone-b", "b1")
	if _, err := r.local.SetNodeTopology(ctxT(t), ""); err != nil {
		t.Fatalf("clear the zone: %v", err)
	}
	both("zone hints, node without a zone")
	if _, err := r.local.SetNodeTopology(ctxT(t), "zone-a"); err != nil {
		t.Fatalf("set zone-a: %v", err)
	}
	only("zone hints, node back in zone-a", "a1", "a2")

	hinted[2].forZones = nil
	apply("one backend without hints", sameZone, hinted...)
	both("one backend without hints")

	apply("node hints", sameZone,
		backend{name: "a1", zone: "zone-a", forZones: []string{"zone-a"}, nodes: []string{"node-2"}},
		backend{name: "a2", zone: "zone-a", forZones: []string{"zone-a"}, nodes: []string{"node-3"}},
		backend{name: "b1", zone: "zone-b", forZones: []string{"zone-b"}, nodes: []string{"node-1"}})
	only("node hints", "b1")
	if t.Failed() {
		t.Logf("log:\n%s", r.log)
	}
}
