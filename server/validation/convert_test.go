package validation_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/protobuf/proto"
)

// TestConvertServiceIgnoresPolicy: what only the admission policy forbids
// (and an earlier vipd may have stored) converts, while Service, the
// policy, still refuses it, naming the field.
func TestConvertServiceIgnoresPolicy(t *testing.T) {
	tests := []struct {
		name  string
		edit  func(*vipdv1.Service)
		field string // Service's violation
	}{
		{"label with a control character", func(s *vipdv1.Service) { s.Labels = map[string]string{"note": "a\tb"} }, `service.labels["note"]`},
		{"label key with a control character", func(s *vipdv1.Service) { s.Labels = map[string]string{"k\x01": "v"} }, `service.labels["k\x01"]`},
		{"zone with a control character", func(s *vipdv1.Service) { s.Backends[0].Zone = "zone-a\a" }, "service.backends[0].zone"},
		{"long label value", func(s *vipdv1.Service) { s.Labels = map[string]string{"k": strings.Repeat("v", 300)} }, `service.labels["k"]`},
		{"too many labels", func(s *vipdv1.Service) { s.Labels = labels(validation.MaxLabels + 1) }, "service.labels"},
		{"upper-case name", func(s *vipdv1.Service) { s.Name = "Default/Web" }, "service.name"},
		{"long owner", func(s *vipdv1.Service) { s.Owner = strings.Repeat("o", 300) }, "service.owner"},
		{"loopback VIP", func(s *vipdv1.Service) { s.Vips = []string{"127.0.0.10"} }, "service.vips[0]"},
		{"multicast backend", func(s *vipdv1.Service) { s.Backends[0].Ip = "224.0.0.9" }, "service.backends[0].ip"},
		{"VIP outside the service CIDRs", func(s *vipdv1.Service) { s.Vips = []string{"192.0.2.1"} }, "service.vips[0]"},
		{"too many VIPs", func(s *vipdv1.Service) { s.Vips = vips(validation.MaxVIPs + 1) }, "service.vips"},
		{"no VIPs", func(s *vipdv1.Service) { s.Vips = nil }, "service.vips"},
		{"no ports", func(s *vipdv1.Service) { s.Ports = nil; s.Backends[0].Ports = nil }, "service.ports"},
		{"too many ports", func(s *vipdv1.Service) { s.Ports = ports(validation.DefaultMaxPorts + 1) }, "service.ports"},
		{"too many backends", func(s *vipdv1.Service) { s.Backends = backends(11) }, "service.backends"},
		{"bad port name", func(s *vipdv1.Service) { s.Ports[0].Name = "HTTP" }, "service.ports[0].name"},
		{"unnamed ports", func(s *vipdv1.Service) { s.Ports = []*vipdv1.Port{{Port: 80}, {Port: 81}} }, "service.ports[0].name"},
		{"affinity timeout above the maximum", func(s *vipdv1.Service) {
			s.SessionAffinity = &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP, TimeoutSeconds: validation.MaxAffinityTimeout + 1}
		}, "service.session_affinity.timeout_seconds"},
	}
	lim := validation.Limits{MaxBackends: 10, MaxPorts: validation.DefaultMaxPorts, ServiceCIDRs: serviceCIDRs}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := valid()
			tt.edit(in)
			_, _, v := validation.Service(in, lim, "service")
			if !slices.Contains(fields(v), tt.field) {
				t.Errorf("Service: violations %v, want one of %s", v, tt.field)
			}
			stored := proto.Clone(in).(*vipdv1.Service)
			dp, v := validation.ConvertService(stored, "service")
			if len(v) > 0 || dp == nil {
				t.Fatalf("ConvertService: %v", v)
			}
			if dp.Name != in.Name || len(dp.Backends) != len(in.Backends) || len(dp.Ports) != len(in.Ports) || len(dp.VIPs) != len(in.Vips) {
				t.Errorf("ConvertService dropped something: %+v from %v", dp, in)
			}
			if diff := cmp.Diff(in.Labels, stored.Labels); diff != "" {
				t.Errorf("labels changed (-in +converted):\n%s", diff)
			}
		})
	}
}

// TestConvertServiceStructural: what has no dataplane form fails the
// conversion, named by its field, and no service is returned.
func TestConvertServiceStructural(t *testing.T) {
	tests := []struct {
		name string
		edit func(*vipdv1.Service)
		want []string
	}{
		{"no name", func(s *vipdv1.Service) { s.Name = "" }, []string{"service.name"}},
		{"VIP that does not parse", func(s *vipdv1.Service) { s.Vips = []string{"10.96.0.300"} }, []string{"service.vips[0]"}},
		{"VIP with a zone", func(s *vipdv1.Service) { s.Vips = []string{"fe80::1%eth0"} }, []string{"service.vips[0]"}},
		{"VIP twice", func(s *vipdv1.Service) { s.Vips = []string{"10.96.0.10", "10.96.0.10"} }, []string{"service.vips[1]"}},
		{"nil port", func(s *vipdv1.Service) { s.Ports = append(s.Ports, nil) }, []string{"service.ports[1]"}},
		{"port 0", func(s *vipdv1.Service) { s.Ports[0].Port = 0 }, []string{"service.ports[0].port"}},
		{"target port above 65535", func(s *vipdv1.Service) { s.Ports[0].TargetPort = 70000 }, []string{"service.ports[0].target_port"}},
		{"unknown protocol", func(s *vipdv1.Service) { s.Ports[0].Protocol = 9 }, []string{"service.ports[0].protocol"}},
		{"same port twice", func(s *vipdv1.Service) { s.Ports = append(s.Ports, &vipdv1.Port{Name: "b", Port: 80}) }, []string{"service.ports[1]"}},
		{"same port name twice", func(s *vipdv1.Service) { s.Ports = append(s.Ports, &vipdv1.Port{Name: "http", Port: 81}) }, []string{"service.ports[1].name"}},
		{"backend that does not parse", func(s *vipdv1.Service) { s.Backends[0].Ip = "x" }, []string{"service.backends[0].ip"}},
		{"backend of another family", func(s *vipdv1.Service) { s.Backends[0].Ip = "fd00::1" }, []string{"service.backends[0].ip"}},
		{"backend twice", func(s *vipdv1.Service) { s.Backends = append(s.Backends, &vipdv1.Backend{Ip: "10.0.0.1"}) }, []string{"service.backends[1].ip"}},
		{"nil backend", func(s *vipdv1.Service) { s.Backends = append(s.Backends, nil) }, []string{"service.backends[1]"}},
		{"backend port of no port", func(s *vipdv1.Service) { s.Backends[0].Ports = map[string]uint32{"x": 80} }, []string{`service.backends[0].ports["x"]`}},
		{"weight above 65535", func(s *vipdv1.Service) { s.Backends[0].Weight = 1 << 16 }, []string{"service.backends[0].weight"}},
		{"unknown backend state", func(s *vipdv1.Service) { s.Backends[0].State = 9 }, []string{"service.backends[0].state"}},
		{"unknown affinity", func(s *vipdv1.Service) { s.SessionAffinity = &vipdv1.SessionAffinityConfig{Mode: 9} }, []string{"service.session_affinity.mode"}},
		{"unknown traffic policy", func(s *vipdv1.Service) { s.InternalTrafficPolicy = 9 }, []string{"service.internal_traffic_policy"}},
		{"unknown load balancing", func(s *vipdv1.Service) { s.LoadBalancing = 9 }, []string{"service.load_balancing"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := valid()
			tt.edit(in)
			dp, v := validation.ConvertService(in, "service")
			if dp != nil {
				t.Errorf("ConvertService returned %+v", dp)
			}
			if diff := cmp.Diff(tt.want, fields(v)); diff != "" {
				t.Errorf("violated fields (-want +got):\n%s\n%v", diff, v)
			}
		})
	}
	if dp, v := validation.ConvertService(nil, "services[1]"); dp != nil || len(v) != 1 || v[0].Field != "services[1]" {
		t.Errorf("ConvertService(nil) = %v, %v", dp, v)
	}
}

// TestConvertServiceUnmaps: an IPv4-mapped address, which the policy
// refuses, is stored as its IPv4 form.
func TestConvertServiceUnmaps(t *testing.T) {
	in := valid()
	in.Vips = []string{"::ffff:10.96.0.10"}
	in.Backends[0].Ip = "::ffff:10.0.0.1"
	dp, v := validation.ConvertService(in, "service")
	if len(v) > 0 {
		t.Fatal(v)
	}
	if in.Vips[0] != "10.96.0.10" || in.Backends[0].Ip != "10.0.0.1" || !dp.VIPs[0].Is4() || !dp.Backends[0].IP.Is4() {
		t.Errorf("converted to %v and %+v", in, dp)
	}
}

// TestUpdatedBackends: a stored service whose backends changed is held to
// --max-backends, and to nothing else of the policy.
func TestUpdatedBackends(t *testing.T) {
	in := valid()
	in.Labels = map[string]string{"note": "a\tb"}
	in.Backends = backends(3)
	lim := validation.Limits{MaxBackends: 3}
	out, dp, v := validation.UpdatedBackends(proto.Clone(in).(*vipdv1.Service), lim, "service")
	if len(v) > 0 || out.Labels["note"] != "a\tb" || len(dp.Backends) != 3 {
		t.Errorf("UpdatedBackends = %v, %+v, %v", out, dp, v)
	}
	in.Backends = backends(4)
	if _, _, v := validation.UpdatedBackends(in, lim, "service"); !slices.Equal(fields(v), []string{"service.backends"}) {
		t.Errorf("4 backends over a limit of 3: %v", v)
	}
	in.Backends[0].Weight = 1 << 16
	if _, _, v := validation.UpdatedBackends(in, validation.Limits{}, "service"); !slices.Equal(fields(v), []string{"service.backends[0].weight"}) {
		t.Errorf("weight out of range: %v", v)
	}
}
