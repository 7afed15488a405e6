package daemon_test

import (
	"strings"
	"testing"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// TestTopologyExplainAndRefusals: with vipd --zone, Explain says that a
// backend of another zone is left out by topology-aware routing, and the
// API refuses bad topology fields with InvalidArgument naming the field,
// changing nothing.
func TestTopologyExplainAndRefusals(t *testing.T) {
	cfg := config(t)
	cfg.Zone, cfg.NodeName = "zone-a", "node-1"
	r := start(t, cfg, healthpb.HealthCheckResponse_SERVING)
	web := &vipdv1.Service{Name: "web", Vips: []string{"198.19.0.30"}, Ports: []*vipdv1.Port{{Port: 80, TargetPort: 8080}},
		TrafficDistribution: vipdv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_PREFER_SAME_ZONE,
		Backends:            []*vipdv1.Backend{{Ip: "198.18.1.1", Zone: "zone-a"}, {Ip: "198.18.2.1", Zone: "zone-b"}}}
	stored, err := r.local.UpsertService(ctxT(t), web, 0)
	if err != nil {
		t.Fatal(err)
	}
	if stored.TrafficDistribution != web.TrafficDistribution {
		t.Errorf("stored traffic_distribution %v, want %v", stored.TrafficDistribution, web.TrafficDistribution)
	}
	ex, err := r.local.Explain(ctxT(t), &vipdv1.ExplainRequest{ClientIp: "198.18.9.9", Vip: "198.19.0.30", Port: 80, Protocol: vipdv1.Protocol_PROTOCOL_TCP})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range ex.Backends {
		switch b.Ip {
		case "198.18.1.1":
			if !b.Eligible || b.Probability != 1 {
				t.Errorf("zone-a backend: eligible %v, probability %v; want eligible, 1", b.Eligible, b.Probability)
			}
		case "198.18.2.1":
			if b.Eligible || !strings.Contains(b.IneligibleReason, "topology") || b.State != vipdv1.BackendState_BACKEND_STATE_READY {
				t.Errorf("zone-b backend: eligible %v, state %v, reason %q; want left out by topology, READY", b.Eligible, b.State, b.IneligibleReason)
			}
		}
	}

	bad := proto.Clone(web).(*vipdv1.Service)
	bad.Backends[1].ForZones = []string{"a", "b", "c", "d", "e", "f", "g", "h", "i"}
	bad.TrafficDistribution = 7
	_, err = r.local.UpsertService(ctxT(t), bad, 0)
	wantFields(t, err, "service.backends[1].for_zones", "service.traffic_distribution")
	_, err = r.local.UpdateBackends(ctxT(t), "web", []*vipdv1.Backend{{Ip: "198.18.3.1", ForNodes: []string{""}}}, nil, 0)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "for_nodes[0]") {
		t.Errorf("UpdateBackends with an empty node hint: %v; want InvalidArgument naming for_nodes[0]", err)
	}
	got, err := r.local.GetService(ctxT(t), "web")
	if err != nil {
		t.Fatal(err)
	}
	if got.Generation != stored.Generation {
		t.Errorf("refused changes changed the service: generation %d, was %d", got.Generation, stored.Generation)
	}
}

// wantFields checks that err is InvalidArgument with a BadRequest naming
// exactly fields.
func wantFields(t *testing.T, err error, fields ...string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument {
		t.Fatalf("got %v; want InvalidArgument", err)
	}
	var got []string
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.FieldViolations {
				got = append(got, v.Field)
			}
		}
	}
	for _, f := range fields {
		if !strings.Contains(strings.Join(got, " "), f) {
			t.Errorf("violations %v do not name %s", got, f)
		}
	}
}
