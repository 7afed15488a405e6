package kubeadapter

import (
	"testing"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/protobuf/proto"
)

// TestExternalField: the field paths of the external part, as vipd's
// violations name them after "services[i]", and no others.
func TestExternalField(t *testing.T) {
	for rest, want := range map[string]bool{
		".external_ips[0]":                true,
		".load_balancer_ips[2]":           true,
		".load_balancer_source_ranges[1]": true,
		".load_balancer_source_ranges":    true,
		".external_traffic_policy":        true,
		".health_check_node_port":         true,
		".ports[3].node_port":             true,
		".ports[3].port":                  false,
		".ports[3].target_port":           false,
		".vips[0]":                        false,
		".backends[0].ip":                 false,
		"":                                false,
		".external_ips_extra":             false,
	} {
		if got := externalField(rest); got != want {
			t.Errorf("externalField(%q) = %v, want %v", rest, got, want)
		}
	}
}

// TestWithoutExternal: every field of the external part is cleared, the
// rest kept, and the original left as it was.
func TestWithoutExternal(t *testing.T) {
	full := &vipdv1.Service{
		Name: "shop/web", Owner: "kubernetes", Vips: []string{"198.19.0.10"},
		Ports:                    []*vipdv1.Port{{Name: "http", Port: 80, TargetPort: 8080, NodePort: 30080}},
		Backends:                 []*vipdv1.Backend{{Ip: "198.18.1.1"}},
		ExternalIps:              []string{"198.19.2.1"},
		LoadBalancerIps:          []string{"198.19.1.1"},
		LoadBalancerSourceRanges: []string{"198.18.0.0/16"},
		ExternalTrafficPolicy:    vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL,
		HealthCheckNodePort:      32000,
	}
	before := proto.Clone(full)
	got := withoutExternal(full)
	want := &vipdv1.Service{
		Name: "shop/web", Owner: "kubernetes", Vips: []string{"198.19.0.10"},
		Ports:    []*vipdv1.Port{{Name: "http", Port: 80, TargetPort: 8080}},
		Backends: []*vipdv1.Backend{{Ip: "198.18.1.1"}},
	}
	if !proto.Equal(got, want) {
		t.Errorf("withoutExternal = %v; want %v", got, want)
	}
	if !proto.Equal(full, before) {
		t.Errorf("withoutExternal changed its argument: %v", full)
	}
	if hasExternalPart(got) || !hasExternalPart(full) || servesExternal(got) || !servesExternal(full) {
		t.Error("hasExternalPart/servesExternal disagree with withoutExternal")
	}
	policyOnly := &vipdv1.Service{ExternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL}
	if !hasExternalPart(policyOnly) || servesExternal(policyOnly) {
		t.Error("a policy alone is part of the external half, but asks the dataplane for no external traffic")
	}
}
