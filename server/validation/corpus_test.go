package validation_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/vipd/vipd/internal/testkit/fuzzcorpus"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The fuzz targets' seed corpora are committed in testdata/fuzz/<target>/,
// where "go test" runs them as ordinary test cases and "go test -fuzz"
// starts from them. The named seeds are written from the Go values below;
// files with other names are inputs the fuzzer found, kept as regression
// cases. TestFuzzCorpus checks that the committed files are what the
// values give; to rewrite them after changing a value, run
//
//	VIPD_WRITE_FUZZ_CORPUS=1 go test -run TestFuzzCorpus ./server/validation/

func wire(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatalf("marshal seed: %v", err)
	}
	return b
}

// readmeService is the service of the README's grpcurl example.
func readmeService() *vipdv1.Service {
	return &vipdv1.Service{
		Name:     "default/web",
		Vips:     []string{"198.19.0.10"},
		Ports:    []*vipdv1.Port{{Port: 80, TargetPort: 8080}},
		Backends: []*vipdv1.Backend{{Ip: "198.18.1.10"}, {Ip: "198.18.1.11", Weight: 2}},
	}
}

// exampleWeb and exampleAPI are the services of examples/web.yaml.
func exampleWeb() *vipdv1.Service {
	return &vipdv1.Service{
		Name: "default/web",
		Vips: []string{"198.19.0.10", "fd00:198:ff::10"},
		Ports: []*vipdv1.Port{
			{Name: "http", Port: 80, TargetPort: 8080},
			{Name: "dns", Protocol: vipdv1.Protocol_PROTOCOL_UDP, Port: 53},
		},
		Backends: []*vipdv1.Backend{
			{Ip: "198.18.1.10"}, {Ip: "198.18.1.11", Weight: 2},
			{Ip: "198.18.2.10", State: vipdv1.BackendState_BACKEND_STATE_TERMINATING}, {Ip: "fd00:198:1::10"},
		},
		SessionAffinity: &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP, TimeoutSeconds: 600},
		Labels:          map[string]string{"app": "web"},
	}
}

func exampleAPI() *vipdv1.Service {
	return &vipdv1.Service{
		Name:     "default/api",
		Vips:     []string{"198.19.0.20"},
		Ports:    []*vipdv1.Port{{Port: 443, TargetPort: 8443}},
		Backends: []*vipdv1.Backend{{Ip: "198.18.1.20"}, {Ip: "198.18.1.21"}},
	}
}

// everything sets every field of a service to a valid, non-default value.
func everything() *vipdv1.Service {
	return &vipdv1.Service{
		Name:  "team-a/dns.v2_x",
		Owner: "nomad",
		Vips:  []string{"10.96.0.53", "fd00:96::53"},
		Ports: []*vipdv1.Port{
			{Name: "dns", Protocol: vipdv1.Protocol_PROTOCOL_UDP, Port: 53, TargetPort: 5353, NodePort: 30053},
			{Name: "dns-tcp", Protocol: vipdv1.Protocol_PROTOCOL_TCP, Port: 53, TargetPort: 5353, NodePort: 30053},
			{Name: "sig", Protocol: vipdv1.Protocol_PROTOCOL_SCTP, Port: 3868},
		},
		Backends: []*vipdv1.Backend{
			{Ip: "fd00:198:1::2", Ports: map[string]uint32{"dns": 53}, Weight: 65535, NodeLocal: true, Zone: "z1"},
			{Ip: "198.18.3.2", State: vipdv1.BackendState_BACKEND_STATE_NOT_SERVING, Ports: map[string]uint32{"dns": 5300, "dns-tcp": 5301}, OnlyNamedPorts: true},
			{Ip: "198.18.3.1", State: vipdv1.BackendState_BACKEND_STATE_TERMINATING, Weight: 7, Zone: strings.Repeat("z", 63)},
		},
		SessionAffinity:          &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP, TimeoutSeconds: 86400},
		InternalTrafficPolicy:    vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL,
		LoadBalancing:            vipdv1.LoadBalancing_LOAD_BALANCING_MAGLEV,
		Labels:                   map[string]string{"app": "dns", "": "", "k": strings.Repeat("v", 254)},
		Generation:               42,
		ExternalIps:              []string{"198.19.5.53", "fd00:198:5::53"},
		LoadBalancerIps:          []string{"fd00:198:6::53", "198.19.6.53"},
		LoadBalancerSourceRanges: []string{"198.18.0.0/15", "fd00:198::/32", "0.0.0.0/0"},
		ExternalTrafficPolicy:    vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL,
		HealthCheckNodePort:      32053,
	}
}

// broken is wrong in nearly every field at once.
func broken() *vipdv1.Service {
	return &vipdv1.Service{
		Name:  "Web!",
		Owner: strings.Repeat("o", 254),
		Vips:  []string{"127.0.0.1", "224.0.0.1", "0.0.0.0", "nope", "::ffff:198.19.0.1", "fe80::1%eth0", "198.19.0.1", "198.19.0.1", "192.0.2.1"},
		Ports: []*vipdv1.Port{
			{Name: "a", Port: 80}, {Name: "b", Port: 80}, {Name: "c", Port: 70000}, {Port: 0, TargetPort: 65536},
			{Name: "UPPER", Protocol: 99, Port: 1}, nil, {Name: "a", Port: 2},
		},
		Backends: []*vipdv1.Backend{
			{Ip: "fd00::1", Ports: map[string]uint32{"x": 1, "a": 0, "b": 70000}, State: 9, Weight: 1 << 20, Zone: strings.Repeat("z", 64)},
			nil, {Ip: "198.18.0.1"}, {Ip: "198.18.0.1"}, {Ip: "::"}, {Ip: ""},
		},
		SessionAffinity:          &vipdv1.SessionAffinityConfig{Mode: 7, TimeoutSeconds: 86401},
		InternalTrafficPolicy:    5,
		LoadBalancing:            6,
		Labels:                   map[string]string{"": "x"},
		ExternalIps:              []string{"198.19.0.1", "nope", "::ffff:198.19.5.1", "127.0.0.1", "fd00::5", "198.19.5.1"},
		LoadBalancerIps:          []string{"198.19.5.1", "198.18.0.1", "224.0.0.1"},
		LoadBalancerSourceRanges: []string{"10.0.0.0/8", "10.1.0.0/8", "10.0.0.1", "::ffff:10.0.0.0/104", "x/33"},
		ExternalTrafficPolicy:    4,
		HealthCheckNodePort:      70000,
	}
}

func seedBackends(n int) []*vipdv1.Backend {
	var res []*vipdv1.Backend
	for i := range n {
		res = append(res, &vipdv1.Backend{Ip: fmt.Sprintf("198.18.%d.%d", i/250, i%250+1)})
	}
	return res
}

func namedPorts(n int) []*vipdv1.Port {
	var res []*vipdv1.Port
	for i := range n {
		res = append(res, &vipdv1.Port{Name: fmt.Sprintf("p%d", i), Port: uint32(1000 + i)})
	}
	return res
}

// withUnknownField is the wire form of m with an unknown field appended.
func withUnknownField(t *testing.T, m proto.Message) []byte {
	b := wire(t, m)
	b = protowire.AppendTag(b, 99, protowire.BytesType)
	return protowire.AppendBytes(b, []byte("from a newer client"))
}

func upsertSeeds(t *testing.T) map[string][][]byte {
	one := func(svc *vipdv1.Service) [][]byte {
		return [][]byte{wire(t, &vipdv1.UpsertServiceRequest{Service: svc})}
	}
	limitBackends := readmeService()
	limitBackends.Backends = seedBackends(fuzzLimits.MaxBackends)
	overBackends := readmeService()
	overBackends.Backends = seedBackends(fuzzLimits.MaxBackends + 1)
	limitPorts := readmeService()
	limitPorts.Ports = namedPorts(fuzzLimits.MaxPorts)
	overPorts := readmeService()
	overPorts.Ports = namedPorts(fuzzLimits.MaxPorts + 1)
	v6 := &vipdv1.Service{Name: "v6", Vips: []string{"fd00:198::10"}, Ports: []*vipdv1.Port{{Port: 443}},
		Backends: []*vipdv1.Backend{{Ip: "FD00:198:0::0001"}, {Ip: "198.18.0.1"}}}
	outside := readmeService()
	outside.Vips = []string{"192.0.2.10"}
	maxVIPs := readmeService()
	maxVIPs.Vips = []string{"198.19.0.1", "198.19.0.2", "198.19.0.3", "198.19.0.4", "fd00::1", "fd00::2", "fd00::3", "fd00::4"}
	// As a Kubernetes adapter writes EndpointSlices: the only, unnamed
	// port by the empty name, and an endpoint that serves no port.
	kubeEndpoints := readmeService()
	kubeEndpoints.Backends = []*vipdv1.Backend{
		{Ip: "198.18.1.10", Ports: map[string]uint32{"": 8081}, OnlyNamedPorts: true},
		{Ip: "198.18.1.11", OnlyNamedPorts: true},
	}
	labels := readmeService()
	labels.Labels = map[string]string{}
	for i := range 65 {
		labels.Labels[fmt.Sprintf("k%d", i)] = "v"
	}
	// A LoadBalancer Service with every external field, valid.
	loadBalancer := readmeService()
	loadBalancer.Vips = append(loadBalancer.Vips, "fd00:198::10")
	loadBalancer.Ports[0].NodePort = 30080
	loadBalancer.ExternalIps = []string{"198.19.5.1", "fd00:198:5::1"}
	loadBalancer.LoadBalancerIps = []string{"198.19.6.1"}
	loadBalancer.LoadBalancerSourceRanges = []string{"198.18.0.1/16", "fd00::/8"}
	loadBalancer.ExternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	loadBalancer.HealthCheckNodePort = 32000
	return map[string][][]byte{
		"load-balancer":        one(loadBalancer),
		"readme-grpcurl":       one(readmeService()),
		"readme-invalid":       one(&vipdv1.Service{Name: "x", Vips: []string{"127.0.0.1"}}),
		"examples-web":         one(exampleWeb()),
		"examples-api":         one(exampleAPI()),
		"no-service":           {wire(t, &vipdv1.UpsertServiceRequest{ExpectedGeneration: 3})},
		"empty-service":        one(&vipdv1.Service{}),
		"everything":           one(everything()),
		"broken":               one(broken()),
		"ipv6-family-mismatch": one(v6),
		"vip-outside-cidrs":    one(outside),
		"max-vips":             one(maxVIPs),
		"max-backends":         one(limitBackends),
		"max-backends-plus-1":  one(overBackends),
		"max-ports":            one(limitPorts),
		"max-ports-plus-1":     one(overPorts),
		"65-labels":            one(labels),
		"kubernetes-endpoints": one(kubeEndpoints),
		"unknown-field":        {withUnknownField(t, &vipdv1.UpsertServiceRequest{Service: readmeService()})},
		"not-protobuf":         {[]byte("\xff\xff\xff\xff")},
	}
}

func syncSeeds(t *testing.T) map[string][][]byte {
	sync := func(owner string, svcs ...*vipdv1.Service) [][]byte {
		return [][]byte{wire(t, &vipdv1.SyncServicesRequest{Owner: owner, Services: svcs})}
	}
	var many []*vipdv1.Service
	for i := range 50 {
		s := readmeService()
		s.Name = fmt.Sprintf("default/s%d", i)
		s.Vips = []string{fmt.Sprintf("198.19.1.%d", i+1)}
		many = append(many, s)
	}
	dup := readmeService()
	otherOwner := exampleAPI()
	otherOwner.Owner = "someone-else"
	return map[string][][]byte{
		"readme-empty":      sync("nomad"),
		"examples":          sync("default", exampleWeb(), exampleAPI()),
		"readme-grpcurl":    sync("default", readmeService()),
		"fifty-services":    sync("default", many...),
		"duplicate-names":   sync("default", readmeService(), dup),
		"nil-service":       sync("default", readmeService(), nil, exampleAPI()),
		"broken-in-middle":  sync("default", exampleWeb(), broken(), exampleAPI()),
		"everything":        sync("nomad", everything(), readmeService()),
		"other-owner":       sync("default", otherOwner),
		"no-owner":          sync("", readmeService()),
		"bad-owner":         sync("Nomad!", readmeService()),
		"unknown-field":     {withUnknownField(t, &vipdv1.SyncServicesRequest{Owner: "o", Services: []*vipdv1.Service{readmeService()}})},
		"empty-services-20": sync("default", make([]*vipdv1.Service, 20)...),
	}
}

func updateSeeds(t *testing.T) map[string][][]byte {
	web := wire(t, exampleWeb())
	upd := func(svc []byte, req *vipdv1.UpdateBackendsRequest) [][]byte {
		return [][]byte{svc, wire(t, req)}
	}
	return map[string][][]byte{
		"readme-grpcurl": upd(wire(t, readmeService()), &vipdv1.UpdateBackendsRequest{Name: "default/web",
			Upsert: []*vipdv1.Backend{{Ip: "198.18.1.12"}}, Remove: []string{"198.18.1.10"}}),
		"readme-vipctl-add": upd(web, &vipdv1.UpdateBackendsRequest{Name: "default/web", Upsert: []*vipdv1.Backend{{Ip: "198.18.1.12", Weight: 2}}}),
		"dual-stack": upd(web, &vipdv1.UpdateBackendsRequest{Name: "default/web", Upsert: []*vipdv1.Backend{
			{Ip: "fd00:198:1::11", Ports: map[string]uint32{"http": 8081}}, {Ip: "198.18.9.9", State: vipdv1.BackendState_BACKEND_STATE_NOT_SERVING}}}),
		"family-mismatch": upd(wire(t, exampleAPI()), &vipdv1.UpdateBackendsRequest{Name: "default/api", Upsert: []*vipdv1.Backend{{Ip: "fd00::1"}}}),
		"bad-port-names": upd(web, &vipdv1.UpdateBackendsRequest{Name: "default/web", Upsert: []*vipdv1.Backend{
			{Ip: "198.18.1.1", Ports: map[string]uint32{"nope": 1, "http": 0, "dns": 65536}}}}),
		"broken-backends": upd(web, &vipdv1.UpdateBackendsRequest{Name: "default/web", Upsert: []*vipdv1.Backend{
			nil, {Ip: "x"}, {Ip: "224.0.0.1", State: 9, Weight: 70000, Zone: strings.Repeat("z", 64)}}}),
		"remove-only":       upd(web, &vipdv1.UpdateBackendsRequest{Name: "default/web", Remove: []string{"198.18.1.10", "nope", "::ffff:198.18.1.11"}}),
		"unnamed-port":      upd(wire(t, readmeService()), &vipdv1.UpdateBackendsRequest{Name: "default/web", Upsert: []*vipdv1.Backend{{Ip: "198.18.1.1", Ports: map[string]uint32{"": 80}}}}),
		"invalid-service":   upd(wire(t, broken()), &vipdv1.UpdateBackendsRequest{Name: "x", Upsert: []*vipdv1.Backend{{Ip: "198.18.1.1"}}}),
		"no-service":        upd(nil, &vipdv1.UpdateBackendsRequest{Name: "default/web", Upsert: seedBackends(5)}),
		"everything":        upd(wire(t, everything()), &vipdv1.UpdateBackendsRequest{Name: "team-a/dns.v2_x", Upsert: everything().Backends, ExpectedGeneration: 3}),
		"mapped-and-zoned":  upd(web, &vipdv1.UpdateBackendsRequest{Name: "default/web", Upsert: []*vipdv1.Backend{{Ip: "::ffff:198.18.1.1"}, {Ip: "fd00::1%eth0"}}}),
		"not-protobuf":      {web, []byte("\x0a\xff")},
		"many-upserts-100":  upd(web, &vipdv1.UpdateBackendsRequest{Name: "default/web", Upsert: seedBackends(100)}),
		"unknown-field":     {web, withUnknownField(t, &vipdv1.UpdateBackendsRequest{Name: "default/web"})},
		"duplicate-upserts": upd(web, &vipdv1.UpdateBackendsRequest{Name: "default/web", Upsert: []*vipdv1.Backend{{Ip: "198.18.1.1"}, {Ip: "198.18.1.1"}}}),
	}
}

func flowSeeds(t *testing.T) map[string][][]byte {
	w := func(f *vipdv1.FlowFilter, types ...vipdv1.FlowEventType) [][]byte {
		return [][]byte{wire(t, &vipdv1.WatchFlowsRequest{Filter: f, Types: types})}
	}
	return map[string][][]byte{
		"readme-grpcurl": {wire(t, &vipdv1.WatchFlowsRequest{Filter: &vipdv1.FlowFilter{Service: "default/web"}, IncludeExisting: true})},
		"no-filter":      w(nil),
		"everything": w(&vipdv1.FlowFilter{Service: "default/web", Vip: "198.19.0.10:80", Backend: "198.18.1.10:8080", Client: "10.0.0.0/8",
			Protocol: vipdv1.Protocol_PROTOCOL_TCP}, vipdv1.FlowEventType_FLOW_EVENT_TYPE_NEW, vipdv1.FlowEventType_FLOW_EVENT_TYPE_CLOSED),
		"ipv6":              w(&vipdv1.FlowFilter{Vip: "[fd00:198:ff::10]:53", Backend: "fd00:198:1::10", Client: "fd00::/8", Protocol: vipdv1.Protocol_PROTOCOL_UDP}),
		"mapped":            w(&vipdv1.FlowFilter{Vip: "::ffff:198.19.0.10", Backend: "[::ffff:198.18.1.10]:8080", Client: "::ffff:10.0.0.0/104"}),
		"mapped-short-cidr": w(&vipdv1.FlowFilter{Client: "::ffff:0.0.0.0/90"}),
		"client-ip":         w(&vipdv1.FlowFilter{Client: "10.0.0.9"}),
		"existing-only":     w(nil, vipdv1.FlowEventType_FLOW_EVENT_TYPE_EXISTING),
		"bad-types":         w(nil, vipdv1.FlowEventType_FLOW_EVENT_TYPE_UNSPECIFIED, 77, vipdv1.FlowEventType_FLOW_EVENT_TYPE_NEW),
		"broken":            w(&vipdv1.FlowFilter{Service: "Web!", Vip: "198.19.0.10:0", Backend: "[fe80::1%eth0]:80", Client: "10.0.0.0/33", Protocol: 42}),
		"zones":             w(&vipdv1.FlowFilter{Vip: "fe80::1%eth0", Backend: "nope", Client: "fe80::1%eth0"}),
		"unknown-field":     {withUnknownField(t, &vipdv1.WatchFlowsRequest{Filter: &vipdv1.FlowFilter{Service: "a"}})},
	}
}

func explainSeeds(t *testing.T) map[string][][]byte {
	e := func(r *vipdv1.ExplainRequest) [][]byte { return [][]byte{wire(t, r)} }
	return map[string][][]byte{
		"readme-grpcurl":  e(&vipdv1.ExplainRequest{ClientIp: "10.0.0.9", Vip: "198.19.0.10", Port: 80}),
		"readme-vipctl":   e(&vipdv1.ExplainRequest{ClientIp: "10.0.0.9", ClientPort: 43512, Vip: "198.19.0.10", Port: 80, Protocol: vipdv1.Protocol_PROTOCOL_TCP}),
		"ipv6-udp":        e(&vipdv1.ExplainRequest{ClientIp: "fd00:198:1::5", Vip: "fd00:198:ff::10", Port: 53, Protocol: vipdv1.Protocol_PROTOCOL_UDP}),
		"mapped":          e(&vipdv1.ExplainRequest{ClientIp: "::ffff:10.0.0.9", Vip: "198.19.0.10", Port: 80}),
		"family-mismatch": e(&vipdv1.ExplainRequest{ClientIp: "fd00::9", Vip: "198.19.0.10", Port: 80}),
		"empty":           e(&vipdv1.ExplainRequest{}),
		"ports-too-big":   e(&vipdv1.ExplainRequest{ClientIp: "10.0.0.9", ClientPort: 65536, Vip: "198.19.0.10", Port: 65536}),
		"max-ports":       e(&vipdv1.ExplainRequest{ClientIp: "10.0.0.9", ClientPort: 65535, Vip: "198.19.0.10", Port: 65535, Protocol: vipdv1.Protocol_PROTOCOL_SCTP}),
		"bad-protocol":    e(&vipdv1.ExplainRequest{ClientIp: "10.0.0.9", Vip: "198.19.0.10", Port: 80, Protocol: 9}),
		"zones":           e(&vipdv1.ExplainRequest{ClientIp: "fe80::1%eth0", Vip: "fe80::2%eth0", Port: 80}),
		"garbage":         e(&vipdv1.ExplainRequest{ClientIp: "x", Vip: "198.19.0.10:80", Port: 80}),
		"unknown-field":   {withUnknownField(t, &vipdv1.ExplainRequest{ClientIp: "10.0.0.9", Vip: "198.19.0.10", Port: 80})},
	}
}

func TestFuzzCorpus(t *testing.T) {
	for target, seeds := range map[string]func(*testing.T) map[string][][]byte{
		"FuzzUpsertService":  upsertSeeds,
		"FuzzSyncServices":   syncSeeds,
		"FuzzUpdateBackends": updateSeeds,
		"FuzzFlowFilter":     flowSeeds,
		"FuzzExplain":        explainSeeds,
	} {
		t.Run(target, func(t *testing.T) { fuzzcorpus.Check(t, target, seeds(t)) })
	}
}
