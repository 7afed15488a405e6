package server_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/vipd/vipd/dataplane"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server"
	"github.com/vipd/vipd/server/authz"
	"google.golang.org/grpc/codes"
)

// startNode runs a test vipd in zone ("": none; otherwise with node name
// node-1), under policy (nil: no authz file).
func startNode(t *testing.T, zone string, policy *authz.Policy) (*instance, vipdv1.NodeServiceClient) {
	t.Helper()
	cfg := config{nodeName: "node-1", zone: zone}
	if policy != nil {
		cfg.serverOps = []server.Option{withTestIdentities(policy)}
	}
	in := start(t, cfg)
	return in, in.node
}

func zoneStatus(t *testing.T, in *instance) (zone, source, node string) {
	t.Helper()
	st, err := in.status.GetStatus(ctxT(t), &vipdv1.GetStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return st.GetZone(), st.GetZoneSource(), st.GetNodeName()
}

// readyIPs is the READY backends of the applied service name.
func readyIPs(t *testing.T, in *instance, name string) []string {
	t.Helper()
	applied, _ := in.dp.Applied()
	var out []string
	for _, b := range applied[name].Backends {
		if b.State == dataplane.BackendReady {
			out = append(out, b.IP.String())
		}
	}
	return out
}

// TestSetNodeTopology: GetStatus reports the zone from --zone as "flag";
// SetNodeTopology changes the backends topology selects at once, answers
// the previous zone, and GetStatus then says "api"; an empty zone clears
// it; a bad zone is InvalidArgument naming "zone" and changes nothing.
func TestSetNodeTopology(t *testing.T) {
	in, node := startNode(t, "zone-a", nil)
	if z, src, n := zoneStatus(t, in); z != "zone-a" || src != "flag" || n != "node-1" {
		t.Fatalf("GetStatus zone %q source %q node %q, want zone-a, flag, node-1", z, src, n)
	}
	upsert(t, in, &vipdv1.Service{Name: "web", Vips: []string{"198.19.0.1"}, Ports: []*vipdv1.Port{{Port: 80}},
		TrafficDistribution: vipdv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_PREFER_SAME_ZONE,
		Backends:            []*vipdv1.Backend{{Ip: "198.18.1.1", Zone: "zone-a"}, {Ip: "198.18.2.1", Zone: "zone-b"}}})
	if got := readyIPs(t, in, "web"); !slices.Equal(got, []string{"198.18.1.1"}) {
		t.Fatalf("READY in zone-a: %v", got)
	}

	resp, err := node.SetNodeTopology(ctxT(t), &vipdv1.SetNodeTopologyRequest{Zone: "zone-b"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetZone() != "zone-b" || resp.GetPreviousZone() != "zone-a" {
		t.Errorf("response %v, want zone-b replacing zone-a", resp)
	}
	if got := readyIPs(t, in, "web"); !slices.Equal(got, []string{"198.18.2.1"}) {
		t.Errorf("READY after SetNodeTopology(zone-b): %v, want [198.18.2.1]", got)
	}
	if z, src, _ := zoneStatus(t, in); z != "zone-b" || src != "api" {
		t.Errorf("GetStatus zone %q source %q, want zone-b, api", z, src)
	}

	for _, bad := range []string{strings.Repeat("z", 64), "zone\n"} {
		_, err := node.SetNodeTopology(ctxT(t), &vipdv1.SetNodeTopologyRequest{Zone: bad})
		wantCode(t, err, codes.InvalidArgument)
		if got := fieldsOf(err); !slices.Equal(got, []string{"zone"}) {
			t.Errorf("zone %q: fields %v, want [zone]", bad, got)
		}
	}
	if z, _, _ := zoneStatus(t, in); z != "zone-b" {
		t.Errorf("a refused zone changed it to %q", z)
	}

	if _, err := node.SetNodeTopology(ctxT(t), &vipdv1.SetNodeTopologyRequest{}); err != nil {
		t.Fatal(err)
	}
	if got := readyIPs(t, in, "web"); !slices.Equal(got, []string{"198.18.1.1", "198.18.2.1"}) {
		t.Errorf("READY without a zone: %v, want both", got)
	}
	if z, src, _ := zoneStatus(t, in); z != "" || src != "api" {
		t.Errorf("GetStatus zone %q source %q after clearing, want empty, api", z, src)
	}
}

// TestSetNodeTopologyNoZone: without --zone, GetStatus has no zone and no
// source.
func TestSetNodeTopologyNoZone(t *testing.T) {
	in, _ := startNode(t, "", nil)
	if z, src, _ := zoneStatus(t, in); z != "" || src != "" {
		t.Fatalf("GetStatus zone %q source %q, want both empty", z, src)
	}
}

// TestSetNodeTopologyNeedsAllOwners: under an authz file, only an
// identity with "*" may set the zone; others get PermissionDenied and
// change nothing.
func TestSetNodeTopologyNeedsAllOwners(t *testing.T) {
	policy, err := authz.Parse([]byte("ctrl-a: [team-a]\nadmin: \"*\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	in, node := startNode(t, "zone-a", policy)
	_, err = node.SetNodeTopology(as(t, "ctrl-a"), &vipdv1.SetNodeTopologyRequest{Zone: "zone-b"})
	wantCode(t, err, codes.PermissionDenied, `"ctrl-a"`, `"*"`)
	_, err = node.SetNodeTopology(as(t, "stranger"), &vipdv1.SetNodeTopologyRequest{Zone: "zone-b"})
	wantCode(t, err, codes.PermissionDenied)
	if z, src, _ := zoneStatus(t, in); z != "zone-a" || src != "flag" {
		t.Fatalf("a denied call changed the zone to %q (%s)", z, src)
	}
	if _, err := node.SetNodeTopology(as(t, "admin"), &vipdv1.SetNodeTopologyRequest{Zone: "zone-b"}); err != nil {
		t.Fatalf("admin: %v", err)
	}
	if z, _, _ := zoneStatus(t, in); z != "zone-b" {
		t.Fatalf("zone %q after admin's call", z)
	}
}
