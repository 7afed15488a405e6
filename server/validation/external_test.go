package validation_test

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vipd/vipd/dataplane"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
)

// addrs returns n distinct addresses of 198.19.1.0/24, from 198.19.1.1.
func addrs(n int) []string {
	var res []string
	for i := range n {
		res = append(res, fmt.Sprintf("198.19.1.%d", i+1))
	}
	return res
}

// cidrs returns n distinct /24 CIDRs of 10.0.0.0/8.
func cidrs(n int) []string {
	var res []string
	for i := range n {
		res = append(res, fmt.Sprintf("10.%d.%d.0/24", i/256, i%256))
	}
	return res
}

// TestExternalViolations: every rule of the external fields, each
// violation named by its field, and nothing changed in the input.
func TestExternalViolations(t *testing.T) {
	local := vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	tests := []struct {
		name string
		edit func(s *vipdv1.Service)
		want []string // violated fields, sorted; nil: valid
	}{
		// node_port
		{name: "node port", edit: func(s *vipdv1.Service) { s.Ports[0].NodePort = 30080 }},
		{name: "node port 1", edit: func(s *vipdv1.Service) { s.Ports[0].NodePort = 1 }},
		{name: "node port 65535", edit: func(s *vipdv1.Service) { s.Ports[0].NodePort = 65535 }},
		{name: "node port 65536", edit: func(s *vipdv1.Service) { s.Ports[0].NodePort = 65536 }, want: []string{"service.ports[0].node_port"}},
		{name: "node port equal to the port", edit: func(s *vipdv1.Service) { s.Ports[0].NodePort = 80 }},
		{name: "same node port on TCP and UDP", edit: func(s *vipdv1.Service) {
			s.Ports = []*vipdv1.Port{{Name: "a", Port: 53, NodePort: 30053}, {Name: "b", Port: 53, NodePort: 30053, Protocol: vipdv1.Protocol_PROTOCOL_UDP}}
		}},
		{name: "same node port twice on TCP", edit: func(s *vipdv1.Service) {
			s.Ports = []*vipdv1.Port{{Name: "a", Port: 80, NodePort: 30080}, {Name: "b", Port: 81, NodePort: 30080}}
		}, want: []string{"service.ports[1].node_port"}},
		{name: "unspecified protocol is TCP for the node port", edit: func(s *vipdv1.Service) {
			s.Ports = []*vipdv1.Port{{Name: "a", Port: 80, NodePort: 30080}, {Name: "b", Port: 81, NodePort: 30080, Protocol: vipdv1.Protocol_PROTOCOL_TCP}}
		}, want: []string{"service.ports[1].node_port"}},

		// external_ips and load_balancer_ips
		{name: "external IPs", edit: func(s *vipdv1.Service) { s.ExternalIps = addrs(8) }},
		{name: "9 external IPs", edit: func(s *vipdv1.Service) { s.ExternalIps = addrs(9) }, want: []string{"service.external_ips"}},
		{name: "load-balancer IPs", edit: func(s *vipdv1.Service) { s.LoadBalancerIps = addrs(8) }},
		{name: "9 load-balancer IPs", edit: func(s *vipdv1.Service) { s.LoadBalancerIps = addrs(9) }, want: []string{"service.load_balancer_ips"}},
		{name: "external IP that does not parse", edit: func(s *vipdv1.Service) { s.ExternalIps = []string{"198.19.1"} }, want: []string{"service.external_ips[0]"}},
		{name: "empty external IP", edit: func(s *vipdv1.Service) { s.ExternalIps = []string{""} }, want: []string{"service.external_ips[0]"}},
		{name: "external IP with a zone", edit: func(s *vipdv1.Service) {
			s.Vips = []string{"fd00:198::10"}
			s.Backends[0].Ip = "fd00:198::1:1"
			s.ExternalIps = []string{"fe80::1%eth0"}
		}, want: []string{"service.external_ips[0]"}},
		{name: "IPv4-mapped external IP", edit: func(s *vipdv1.Service) { s.ExternalIps = []string{"::ffff:198.19.1.1"} }, want: []string{"service.external_ips[0]"}},
		{name: "loopback load-balancer IP", edit: func(s *vipdv1.Service) { s.LoadBalancerIps = []string{"127.0.0.5"} }, want: []string{"service.load_balancer_ips[0]"}},
		{name: "multicast external IP", edit: func(s *vipdv1.Service) { s.ExternalIps = []string{"224.0.0.5"} }, want: []string{"service.external_ips[0]"}},
		{name: "unspecified load-balancer IP", edit: func(s *vipdv1.Service) { s.LoadBalancerIps = []string{"0.0.0.0"} }, want: []string{"service.load_balancer_ips[0]"}},
		{name: "link-local external IP", edit: func(s *vipdv1.Service) { s.ExternalIps = []string{"169.254.0.9"} }, want: []string{"service.external_ips[0]"}},
		{name: "broadcast external IP", edit: func(s *vipdv1.Service) { s.ExternalIps = []string{"255.255.255.255"} }, want: []string{"service.external_ips[0]"}},
		{name: "external IP twice", edit: func(s *vipdv1.Service) { s.ExternalIps = []string{"198.19.1.1", "198.19.1.1"} }, want: []string{"service.external_ips[1]"}},
		{name: "external IP twice, once in IPv6 text", edit: func(s *vipdv1.Service) {
			s.Vips = []string{"fd00:198::10"}
			s.Backends[0].Ip = "fd00:198::1:1"
			s.ExternalIps = []string{"fd00:198::5", "fd00:198:0::0005"}
		}, want: []string{"service.external_ips[1]"}},
		{name: "load-balancer IP that is an external IP", edit: func(s *vipdv1.Service) {
			s.ExternalIps = []string{"198.19.1.1"}
			s.LoadBalancerIps = []string{"198.19.1.2", "198.19.1.1"}
		}, want: []string{"service.load_balancer_ips[1]"}},
		{name: "external IP that is a VIP of the service", edit: func(s *vipdv1.Service) { s.ExternalIps = []string{"10.96.0.10"} }, want: []string{"service.external_ips[0]"}},
		{name: "load-balancer IP that is a VIP of the service", edit: func(s *vipdv1.Service) { s.LoadBalancerIps = []string{"10.96.0.10"} }, want: []string{"service.load_balancer_ips[0]"}},
		{name: "IPv6 external IP of an IPv4 service", edit: func(s *vipdv1.Service) { s.ExternalIps = []string{"fd00:198::5"} }, want: []string{"service.external_ips[0]"}},
		{name: "IPv4 load-balancer IP of an IPv6 service", edit: func(s *vipdv1.Service) {
			s.Vips = []string{"fd00:198::10"}
			s.Backends[0].Ip = "fd00:198::1:1"
			s.LoadBalancerIps = []string{"198.19.1.1"}
		}, want: []string{"service.load_balancer_ips[0]"}},
		{name: "both families on a dual-stack service", edit: func(s *vipdv1.Service) {
			s.Vips = []string{"10.96.0.10", "fd00:198::10"}
			s.ExternalIps = []string{"198.19.1.1", "fd00:198::5"}
			s.LoadBalancerIps = []string{"fd00:198::6", "198.19.1.2"}
		}},

		// load_balancer_source_ranges
		{name: "64 source ranges", edit: func(s *vipdv1.Service) { s.LoadBalancerSourceRanges = cidrs(64) }},
		{name: "65 source ranges", edit: func(s *vipdv1.Service) { s.LoadBalancerSourceRanges = cidrs(65) }, want: []string{"service.load_balancer_source_ranges"}},
		{name: "source ranges without load-balancer IPs", edit: func(s *vipdv1.Service) { s.LoadBalancerSourceRanges = []string{"10.0.0.0/8"} }},
		{name: "source ranges of both families", edit: func(s *vipdv1.Service) {
			s.LoadBalancerSourceRanges = []string{"10.0.0.0/8", "fd00::/8", "0.0.0.0/0", "::/0"}
		}},
		{name: "source range with host bits", edit: func(s *vipdv1.Service) { s.LoadBalancerSourceRanges = []string{"10.1.2.3/8"} }},
		{name: "source range that is an address", edit: func(s *vipdv1.Service) { s.LoadBalancerSourceRanges = []string{"10.1.2.3"} }, want: []string{"service.load_balancer_source_ranges[0]"}},
		{name: "source range with a bad length", edit: func(s *vipdv1.Service) { s.LoadBalancerSourceRanges = []string{"10.0.0.0/33"} }, want: []string{"service.load_balancer_source_ranges[0]"}},
		{name: "empty source range", edit: func(s *vipdv1.Service) { s.LoadBalancerSourceRanges = []string{""} }, want: []string{"service.load_balancer_source_ranges[0]"}},
		{name: "IPv4-mapped source range", edit: func(s *vipdv1.Service) { s.LoadBalancerSourceRanges = []string{"::ffff:10.0.0.0/104"} }, want: []string{"service.load_balancer_source_ranges[0]"}},
		{name: "IPv4-mapped source range shorter than /96", edit: func(s *vipdv1.Service) { s.LoadBalancerSourceRanges = []string{"::ffff:0.0.0.0/80"} }, want: []string{"service.load_balancer_source_ranges[0]"}},
		{name: "source range twice", edit: func(s *vipdv1.Service) { s.LoadBalancerSourceRanges = []string{"10.0.0.0/8", "10.0.0.0/8"} }, want: []string{"service.load_balancer_source_ranges[1]"}},
		{name: "source range twice once masked", edit: func(s *vipdv1.Service) { s.LoadBalancerSourceRanges = []string{"10.0.0.0/8", "10.9.9.9/8"} }, want: []string{"service.load_balancer_source_ranges[1]"}},
		{name: "nested source ranges", edit: func(s *vipdv1.Service) { s.LoadBalancerSourceRanges = []string{"10.0.0.0/8", "10.1.0.0/16"} }},

		// external_traffic_policy
		{name: "external traffic policy LOCAL", edit: func(s *vipdv1.Service) { s.ExternalTrafficPolicy = local }},
		{name: "external traffic policy CLUSTER", edit: func(s *vipdv1.Service) { s.ExternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER }},
		{name: "unknown external traffic policy", edit: func(s *vipdv1.Service) { s.ExternalTrafficPolicy = 3 }, want: []string{"service.external_traffic_policy"}},

		// health_check_node_port
		{name: "health-check node port with LOCAL", edit: func(s *vipdv1.Service) { s.ExternalTrafficPolicy = local; s.HealthCheckNodePort = 32000 }},
		{name: "health-check node port 65535", edit: func(s *vipdv1.Service) { s.ExternalTrafficPolicy = local; s.HealthCheckNodePort = 65535 }},
		{name: "health-check node port 65536", edit: func(s *vipdv1.Service) { s.ExternalTrafficPolicy = local; s.HealthCheckNodePort = 65536 }, want: []string{"service.health_check_node_port"}},
		{name: "health-check node port with CLUSTER", edit: func(s *vipdv1.Service) {
			s.ExternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER
			s.HealthCheckNodePort = 32000
		}, want: []string{"service.health_check_node_port"}},
		{name: "health-check node port with the default policy", edit: func(s *vipdv1.Service) { s.HealthCheckNodePort = 32000 }, want: []string{"service.health_check_node_port"}},
		{name: "health-check node port that is a TCP node port of the service", edit: func(s *vipdv1.Service) {
			s.ExternalTrafficPolicy = local
			s.Ports[0].NodePort = 32000
			s.HealthCheckNodePort = 32000
		}, want: []string{"service.health_check_node_port"}},
		{name: "health-check node port that is a UDP node port of the service", edit: func(s *vipdv1.Service) {
			s.ExternalTrafficPolicy = local
			s.Ports[0].Protocol = vipdv1.Protocol_PROTOCOL_UDP
			s.Ports[0].NodePort = 32000
			s.HealthCheckNodePort = 32000
		}},

		{name: "every external violation is reported", edit: func(s *vipdv1.Service) {
			s.Ports[0].NodePort = 70000
			s.ExternalIps = []string{"x", "10.96.0.10"}
			s.LoadBalancerIps = []string{"fd00::1"}
			s.LoadBalancerSourceRanges = []string{"10.0.0.0/8", "10.0.0.0/8"}
			s.ExternalTrafficPolicy = 7
			s.HealthCheckNodePort = 1
		}, want: []string{
			"service.external_ips[0]", "service.external_ips[1]", "service.external_traffic_policy",
			"service.health_check_node_port", "service.load_balancer_ips[0]", "service.load_balancer_source_ranges[1]",
			"service.ports[0].node_port",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := valid()
			tt.edit(in)
			before := proto.Clone(in)
			out, dp, v := validation.Service(in, validation.Limits{}, "service")
			if diff := cmp.Diff(tt.want, fields(v)); diff != "" {
				t.Errorf("violated fields (-want +got):\n%s\nviolations: %v", diff, v)
			}
			for _, x := range v {
				if x.Description == "" {
					t.Errorf("violation of %s has no description", x.Field)
				}
				if err := validation.ResolvePath(&vipdv1.UpsertServiceRequest{Service: in}, x.Field); err != nil {
					t.Errorf("violation names no field of the request: %v", err)
				}
			}
			if len(v) > 0 && (out != nil || dp != nil) {
				t.Errorf("Service returned a result along with violations: %v, %v", out, dp)
			}
			if len(v) == 0 && (out == nil || dp == nil) {
				t.Errorf("Service returned no result for a valid service")
			}
			if !proto.Equal(in, before) {
				t.Errorf("Service modified its input:\n%s", cmp.Diff(before, in, protocmp.Transform()))
			}
		})
	}
}

// TestExternalNormalized: the external fields in their stored and their
// dataplane form.
func TestExternalNormalized(t *testing.T) {
	in := &vipdv1.Service{
		Name: "web",
		Vips: []string{"10.96.0.10", "fd00:198::10"},
		Ports: []*vipdv1.Port{
			{Name: "http", Port: 80, NodePort: 30080},
			{Name: "dns", Port: 53, Protocol: vipdv1.Protocol_PROTOCOL_UDP, NodePort: 30053},
			{Name: "admin", Port: 9000},
		},
		ExternalIps:              []string{"198.19.1.9", "fd00:198:0:0::5", "198.19.1.1"},
		LoadBalancerIps:          []string{"198.19.2.1"},
		LoadBalancerSourceRanges: []string{"192.0.2.77/24", "fd00:0198::1/32", "::ffff:10.1.0.0/112"},
		ExternalTrafficPolicy:    vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL,
		HealthCheckNodePort:      32000,
	}
	want := &vipdv1.Service{
		Name:  "web",
		Owner: "default",
		Vips:  []string{"10.96.0.10", "fd00:198::10"},
		Ports: []*vipdv1.Port{
			{Name: "http", Protocol: vipdv1.Protocol_PROTOCOL_TCP, Port: 80, TargetPort: 80, NodePort: 30080},
			{Name: "dns", Protocol: vipdv1.Protocol_PROTOCOL_UDP, Port: 53, TargetPort: 53, NodePort: 30053},
			{Name: "admin", Protocol: vipdv1.Protocol_PROTOCOL_TCP, Port: 9000, TargetPort: 9000},
		},
		SessionAffinity:          &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_NONE},
		InternalTrafficPolicy:    vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
		LoadBalancing:            vipdv1.LoadBalancing_LOAD_BALANCING_RANDOM,
		ExternalIps:              []string{"198.19.1.9", "fd00:198::5", "198.19.1.1"},
		LoadBalancerIps:          []string{"198.19.2.1"},
		LoadBalancerSourceRanges: []string{"192.0.2.0/24", "fd00:198::/32", "10.1.0.0/16"},
		ExternalTrafficPolicy:    vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL,
		HealthCheckNodePort:      32000,
	}
	wantDP := &dataplane.Service{
		Name:  "web",
		Owner: "default",
		VIPs:  []netip.Addr{addr("10.96.0.10"), addr("fd00:198::10")},
		Ports: []dataplane.Port{
			{Name: "http", Protocol: dataplane.TCP, Port: 80, TargetPort: 80, NodePort: 30080},
			{Name: "dns", Protocol: dataplane.UDP, Port: 53, TargetPort: 53, NodePort: 30053},
			{Name: "admin", Protocol: dataplane.TCP, Port: 9000, TargetPort: 9000},
		},
		TrafficPolicy:         dataplane.TrafficPolicyCluster,
		LoadBalancing:         dataplane.LoadBalancingRandom,
		ExternalIPs:           []netip.Addr{addr("198.19.1.9"), addr("fd00:198::5"), addr("198.19.1.1")},
		LoadBalancerIPs:       []netip.Addr{addr("198.19.2.1")},
		ExternalTrafficPolicy: dataplane.TrafficPolicyLocal,
		HealthCheckNodePort:   32000,
		LoadBalancerSourceRanges: []netip.Prefix{
			netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("fd00:198::/32"), netip.MustParsePrefix("10.1.0.0/16"),
		},
	}
	// The policy refuses the mapped CIDR; the conversion, which loads what
	// is stored, takes it as its IPv4 form.
	_, _, v := validation.Service(in, validation.Limits{}, "service")
	if diff := cmp.Diff([]string{"service.load_balancer_source_ranges[2]"}, fields(v)); diff != "" {
		t.Errorf("violated fields (-want +got):\n%s", diff)
	}
	stored := proto.Clone(in).(*vipdv1.Service)
	dp, v := validation.ConvertService(stored, "service")
	if len(v) > 0 {
		t.Fatal(v)
	}
	if diff := cmp.Diff(want, stored, protocmp.Transform()); diff != "" {
		t.Errorf("normalized service (-want +got):\n%s", diff)
	}
	prefixCmp := cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })
	if diff := cmp.Diff(wantDP, dp, addrCmp, prefixCmp); diff != "" {
		t.Errorf("dataplane service (-want +got):\n%s", diff)
	}
	// What is stored is admitted and stays as it is.
	out, dp2, v := validation.Service(stored, validation.Limits{}, "service")
	if len(v) > 0 {
		t.Fatal(v)
	}
	if diff := cmp.Diff(stored, out, protocmp.Transform()); diff != "" {
		t.Errorf("second normalization changed the service (-first +second):\n%s", diff)
	}
	if diff := cmp.Diff(dp, dp2, addrCmp, prefixCmp); diff != "" {
		t.Errorf("second normalization changed the dataplane service (-first +second):\n%s", diff)
	}

	// Without the new fields the defaults are those of a ClusterIP
	// service: no node port, policy CLUSTER, nothing external.
	dp, v = validation.ConvertService(valid(), "service")
	if len(v) > 0 {
		t.Fatal(v)
	}
	if dp.HasExternal() || dp.ExternalTrafficPolicy != dataplane.TrafficPolicyCluster || dp.HealthCheckNodePort != 0 {
		t.Errorf("plain service converted to %+v", dp)
	}
}
