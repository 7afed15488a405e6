package server_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/fake"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
)

// external returns a LoadBalancer-shaped service: node ports, an external
// IP, a load-balancer IP with source ranges, policy LOCAL and a
// health-check node port.
func external(name, vip, extIP, lbIP string, nodePort, hc uint32, backends ...string) *vipdv1.Service {
	s := web(name, vip, backends...)
	s.Ports[0].Name = "http"
	s.Ports[0].NodePort = nodePort
	s.Ports = append(s.Ports, &vipdv1.Port{Name: "dns", Protocol: vipdv1.Protocol_PROTOCOL_UDP, Port: 53, NodePort: nodePort})
	if extIP != "" {
		s.ExternalIps = []string{extIP}
	}
	if lbIP != "" {
		s.LoadBalancerIps = []string{lbIP}
		s.LoadBalancerSourceRanges = []string{"198.18.200.0/24", "fd00:198:200::/48"}
	}
	if hc != 0 {
		s.ExternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
		s.HealthCheckNodePort = hc
	}
	return s
}

// TestExternalFieldsRoundTrip: the external fields are stored as written
// (source ranges masked), read back by GetService and ListServices, handed
// to the dataplane in its form, and survive a restart.
func TestExternalFieldsRoundTrip(t *testing.T) {
	dir := t.TempDir()
	in := start(t, config{stateDir: dir})
	svc := external("lb", "198.19.0.10", "198.19.5.1", "198.19.6.1", 30080, 32000, "198.18.1.10")
	svc.LoadBalancerSourceRanges[0] = "198.18.200.7/24"
	got := upsert(t, in, svc)
	want := proto.Clone(svc).(*vipdv1.Service)
	want.Owner, want.Generation = "default", 1
	want.Ports[0].Protocol = vipdv1.Protocol_PROTOCOL_TCP
	want.Ports[1].TargetPort = 53
	want.Backends[0].State, want.Backends[0].Weight = vipdv1.BackendState_BACKEND_STATE_READY, 1
	want.SessionAffinity = &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_NONE}
	want.InternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER
	want.LoadBalancing = vipdv1.LoadBalancing_LOAD_BALANCING_RANDOM
	want.LoadBalancerSourceRanges[0] = "198.18.200.0/24"
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Fatalf("stored service (-want +got):\n%s", diff)
	}
	get, err := in.lb.GetService(ctxT(t), &vipdv1.GetServiceRequest{Name: "lb"})
	if err != nil || !proto.Equal(get.Service, want) {
		t.Fatalf("get: %v %v", get, err)
	}
	list, err := in.lb.ListServices(ctxT(t), &vipdv1.ListServicesRequest{})
	if err != nil || len(list.Services) != 1 || !proto.Equal(list.Services[0], want) {
		t.Fatalf("list: %v %v", list, err)
	}
	// What GetService returns, sent back, changes nothing.
	again := proto.Clone(get.Service).(*vipdv1.Service)
	again.Generation = 0
	if g := upsert(t, in, again); g.Generation != 1 {
		t.Fatalf("upsert of the stored form made generation %d", g.Generation)
	}

	applied, _ := in.dp.Applied()
	dp := applied["lb"]
	wantDP := &dataplane.Service{
		ExternalIPs:     []netip.Addr{netip.MustParseAddr("198.19.5.1")},
		LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("198.19.6.1")},
		LoadBalancerSourceRanges: []netip.Prefix{
			netip.MustParsePrefix("198.18.200.0/24"), netip.MustParsePrefix("fd00:198:200::/48"),
		},
		ExternalTrafficPolicy: dataplane.TrafficPolicyLocal,
		HealthCheckNodePort:   32000,
	}
	if dp == nil || dp.Ports[0].NodePort != 30080 || dp.Ports[1].NodePort != 30080 || dp.Ports[1].Protocol != dataplane.UDP ||
		!slicesEqual(dp.ExternalIPs, wantDP.ExternalIPs) || !slicesEqual(dp.LoadBalancerIPs, wantDP.LoadBalancerIPs) ||
		!slicesEqual(dp.LoadBalancerSourceRanges, wantDP.LoadBalancerSourceRanges) ||
		dp.ExternalTrafficPolicy != wantDP.ExternalTrafficPolicy || dp.HealthCheckNodePort != wantDP.HealthCheckNodePort {
		t.Fatalf("dataplane got %+v", dp)
	}
	in.stop()

	restarted := start(t, config{stateDir: dir})
	get, err = restarted.lb.GetService(ctxT(t), &vipdv1.GetServiceRequest{Name: "lb"})
	if err != nil || !proto.Equal(get.Service, want) {
		t.Fatalf("after a restart: %v %v, want %v", get, err, want)
	}
	applied, _ = restarted.dp.Applied()
	if dp := applied["lb"]; dp == nil || dp.HealthCheckNodePort != 32000 || dp.Ports[0].NodePort != 30080 || len(dp.LoadBalancerSourceRanges) != 2 {
		t.Fatalf("dataplane after a restart got %+v", dp)
	}
	// The claims are restored too.
	_, err = restarted.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: external("x", "198.19.0.11", "", "", 32000, 0)})
	wantCode(t, err, codes.AlreadyExists, "service x", "service lb", "health_check_node_port")
}

func slicesEqual[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestExternalInvalidChangesNothing: a violation of an external field is
// InvalidArgument naming the field, in UpsertService and SyncServices, and
// nothing changes.
func TestExternalInvalidChangesNothing(t *testing.T) {
	in := start(t, config{})
	upsert(t, in, web("a", "198.19.0.10", "198.18.1.10"))
	records := len(in.dp.Records())
	for _, tt := range []struct {
		name  string
		edit  func(*vipdv1.Service)
		field string
	}{
		{"node port out of range", func(s *vipdv1.Service) { s.Ports[0].NodePort = 70000 }, "ports[0].node_port"},
		{"external IP that does not parse", func(s *vipdv1.Service) { s.ExternalIps = []string{"198.19.5"} }, "external_ips[0]"},
		{"load-balancer IP of no VIP's family", func(s *vipdv1.Service) { s.LoadBalancerIps = []string{"fd00:198::5"} }, "load_balancer_ips[0]"},
		{"external IP that is the service's VIP", func(s *vipdv1.Service) { s.ExternalIps = []string{"198.19.0.10"} }, "external_ips[0]"},
		{"source range that is no CIDR", func(s *vipdv1.Service) { s.LoadBalancerSourceRanges = []string{"everywhere"} }, "load_balancer_source_ranges[0]"},
		{"unknown external policy", func(s *vipdv1.Service) { s.ExternalTrafficPolicy = 5 }, "external_traffic_policy"},
		{"health-check node port without LOCAL", func(s *vipdv1.Service) { s.HealthCheckNodePort = 32000 }, "health_check_node_port"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			svc := web("a", "198.19.0.10", "198.18.1.10")
			tt.edit(svc)
			_, err := in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: svc})
			wantCode(t, err, codes.InvalidArgument)
			if got := fieldsOf(err); !slicesEqual(got, []string{"service." + tt.field}) {
				t.Errorf("upsert: fields %v, want service.%s", got, tt.field)
			}
			svc = web("a", "198.19.0.10", "198.18.1.10")
			tt.edit(svc)
			_, err = in.lb.SyncServices(ctxT(t), &vipdv1.SyncServicesRequest{Owner: "default", Services: []*vipdv1.Service{web("b", "198.19.0.11"), svc}})
			wantCode(t, err, codes.InvalidArgument)
			if got := fieldsOf(err); !slicesEqual(got, []string{"services[1]." + tt.field}) {
				t.Errorf("sync: fields %v, want services[1].%s", got, tt.field)
			}
			if n := len(in.dp.Records()); n != records {
				t.Errorf("a refused change reached the dataplane")
			}
			if names := appliedNames(in); !slicesEqual(names, []string{"a"}) {
				t.Errorf("applied %v", names)
			}
		})
	}
}

// TestExternalConflicts: across services, a node port, a health-check
// node port and an external or load-balancer IP:port are AlreadyExists
// naming both services, and an external or load-balancer IP that is a VIP
// or a backend (or the reverse) is InvalidArgument on the field that holds
// it, naming the other service; through UpsertService, SyncServices,
// UpdateBackends and validate_only alike, and nothing changes.
func TestExternalConflicts(t *testing.T) {
	type call func(in *instance, validateOnly bool) error
	upsertSvc := func(svc *vipdv1.Service) call {
		return func(in *instance, validateOnly bool) error {
			_, err := in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: svc, ValidateOnly: validateOnly})
			return err
		}
	}
	sync := func(svcs ...*vipdv1.Service) call {
		return func(in *instance, validateOnly bool) error {
			_, err := in.lb.SyncServices(ctxT(t), &vipdv1.SyncServicesRequest{Owner: "team-b", Services: svcs, ValidateOnly: validateOnly})
			return err
		}
	}
	update := func(name string, ips ...string) call {
		return func(in *instance, validateOnly bool) error {
			req := &vipdv1.UpdateBackendsRequest{Name: name, ValidateOnly: validateOnly}
			for _, ip := range ips {
				req.Upsert = append(req.Upsert, &vipdv1.Backend{Ip: ip})
			}
			_, err := in.lb.UpdateBackends(ctxT(t), req)
			return err
		}
	}
	mine := func(s *vipdv1.Service) *vipdv1.Service { s.Owner = "team-b"; return s }
	tests := []struct {
		name     string
		call     call
		code     codes.Code // OK: success
		field    string     // for InvalidArgument
		contains []string
	}{
		{"upsert: another service's node port", upsertSvc(external("x", "198.19.0.20", "", "", 30080, 0)),
			codes.AlreadyExists, "", []string{"service x", "node port 30080/TCP", "service lb", "ports[0].node_port"}},
		{"upsert: another service's health-check node port as a node port", upsertSvc(external("x", "198.19.0.20", "", "", 32000, 0)),
			codes.AlreadyExists, "", []string{"service x", "node port 32000/TCP", "service lb", "health_check_node_port"}},
		{"upsert: the same health-check node port", upsertSvc(external("x", "198.19.0.20", "", "", 0, 32000)),
			codes.AlreadyExists, "", []string{"service x", "service lb", "health_check_node_port"}},
		{"upsert: another service's load-balancer IP on the same port", upsertSvc(external("x", "198.19.0.20", "", "198.19.6.1", 0, 0)),
			codes.AlreadyExists, "", []string{"service x", "198.19.6.1:80/TCP", "service lb", "load_balancer_ips[0]"}},
		{"upsert: another service's external IP on other ports", upsertSvc(func() *vipdv1.Service {
			s := external("x", "198.19.0.20", "198.19.5.1", "", 0, 0)
			s.Ports = s.Ports[:1]
			s.Ports[0].Port = 8080
			return s
		}()), codes.OK, "", nil},
		{"upsert: an external IP that is another service's VIP", upsertSvc(external("x", "198.19.0.20", "198.19.0.1", "", 0, 0)),
			codes.InvalidArgument, "service.external_ips[0]", []string{"198.19.0.1 is a VIP of service web", "cannot be a VIP"}},
		{"upsert: a load-balancer IP that is another service's backend", upsertSvc(external("x", "198.19.0.20", "", "198.18.1.1", 0, 0)),
			codes.InvalidArgument, "service.load_balancer_ips[0]", []string{"198.18.1.1 is a backend of service web", "cannot be a backend"}},
		{"upsert: a load-balancer IP that is its own backend", upsertSvc(external("x", "198.19.0.20", "", "198.18.3.3", 0, 0, "198.18.3.3")),
			codes.InvalidArgument, "service.backends[0].ip", []string{"198.18.3.3 is a load-balancer IP of this service"}},
		{"upsert: a VIP that is another service's external IP", upsertSvc(web("x", "198.19.5.1")),
			codes.InvalidArgument, "service.vips[0]", []string{"198.19.5.1 is an external IP of service lb"}},
		{"update backends: another service's load-balancer IP", update("web", "198.18.1.9", "198.19.6.1"),
			codes.InvalidArgument, "upsert[1].ip", []string{"198.19.6.1 is a load-balancer IP of service lb"}},
		{"sync: another owner's node port", sync(mine(external("x", "198.19.0.20", "", "", 30080, 0))),
			codes.AlreadyExists, "", []string{"service x", "service lb"}},
		{"sync: two listed services on one node port", sync(mine(external("x", "198.19.0.20", "", "", 30090, 0)), mine(external("y", "198.19.0.21", "", "", 30090, 0))),
			codes.AlreadyExists, "", []string{"service y", "service x", "node port 30090/TCP"}},
		{"sync: an external IP that is another owner's backend", sync(mine(web("x", "198.19.0.20")), mine(external("y", "198.19.0.21", "198.18.1.1", "", 0, 0))),
			codes.InvalidArgument, "services[1].external_ips[0]", []string{"198.18.1.1 is a backend of service web"}},
		{"sync: node ports moved between the owner's services", sync(mine(external("x", "198.19.0.20", "", "", 30100, 0)), mine(external("y", "198.19.0.21", "", "", 30101, 0))),
			codes.OK, "", nil},
	}
	for _, tt := range tests {
		for _, validateOnly := range []bool{true, false} {
			name := tt.name
			if validateOnly {
				name += " (validate_only)"
			}
			t.Run(name, func(t *testing.T) {
				in := start(t, config{})
				upsert(t, in, owned("team-a", "web", "198.19.0.1", "198.18.1.1", "198.18.1.2"))
				lb := external("lb", "198.19.0.2", "198.19.5.1", "198.19.6.1", 30080, 32000, "198.18.2.1")
				lb.Owner = "team-a"
				upsert(t, in, lb)
				before, err := in.lb.ListServices(ctxT(t), &vipdv1.ListServicesRequest{})
				if err != nil {
					t.Fatal(err)
				}
				records := len(in.dp.Records())
				err = tt.call(in, validateOnly)
				wantCode(t, err, tt.code, tt.contains...)
				if tt.code == codes.InvalidArgument {
					if v := violation(t, err); v.Field != tt.field {
						t.Errorf("field %q (%s); want %q", v.Field, v.Description, tt.field)
					}
				}
				if tt.code == codes.OK && !validateOnly {
					return
				}
				after, err := in.lb.ListServices(ctxT(t), &vipdv1.ListServicesRequest{})
				if err != nil {
					t.Fatal(err)
				}
				if !proto.Equal(before, after) || len(in.dp.Records()) != records {
					t.Errorf("the call changed something:\n before %v\n after %v", before, after)
				}
			})
		}
	}
}

// TestExternalNeedsTheCapability: a dataplane without
// Capabilities.External refuses a service with any external part
// (FailedPrecondition) and takes one without.
func TestExternalNeedsTheCapability(t *testing.T) {
	in := start(t, config{dp: fake.New(fake.WithCapabilities(dataplane.Capabilities{
		LoadBalancing: []dataplane.LoadBalancing{dataplane.LoadBalancingRandom},
		Protocols:     []dataplane.Protocol{dataplane.TCP, dataplane.UDP},
		Hint:          "use --dataplane fake",
	}))})
	for _, svc := range []*vipdv1.Service{
		external("np", "198.19.0.10", "", "", 30080, 0),
		external("ext", "198.19.0.10", "198.19.5.1", "", 0, 0),
		external("lbip", "198.19.0.10", "", "198.19.6.1", 0, 0),
	} {
		_, err := in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: svc})
		wantCode(t, err, codes.FailedPrecondition, "external traffic")
	}
	// Policy and source ranges alone ask for nothing external.
	svc := web("a", "198.19.0.10")
	svc.ExternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	svc.LoadBalancerSourceRanges = []string{"10.0.0.0/8"}
	upsert(t, in, svc)
	if !strings.Contains(strings.Join(appliedNames(in), ","), "a") {
		t.Errorf("applied %v", appliedNames(in))
	}
}
