package server_test

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vipd/vipd/dataplane/fake"
	"github.com/vipd/vipd/internal/testkit/testserver"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
)

// updateBackendsLimitField is the field UpdateBackends names when the merged
// service would have more than --max-backends backends.
const updateBackendsLimitField = "upsert"

// limitsEnv is the API as internal/daemon assembles it (testserver), with
// the totals of its limits enforced by the store, over the fake dataplane
// and a real state directory, served on a bufconn.
type limitsEnv struct {
	srv      *testserver.Server
	dp       *fake.Dataplane
	stateDir string
	lb       vipdv1.LoadBalancerServiceClient
	status   vipdv1.StatusServiceClient
}

func startWithLimits(t *testing.T, lim validation.Limits, opts ...server.Option) *limitsEnv {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	env := &limitsEnv{stateDir: t.TempDir()}
	env.srv = testserver.Start(t, testserver.WithLimits(lim), testserver.WithStateDir(env.stateDir),
		testserver.WithListener(lis), testserver.WithServerOptions(opts...))
	env.dp = env.srv.Dataplane()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(1<<30)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	env.lb = vipdv1.NewLoadBalancerServiceClient(conn)
	env.status = vipdv1.NewStatusServiceClient(conn)
	return env
}

// state is what a rejected request must leave alone: the services as
// stored and listed, the generation, the dataplane's applies, and the bytes
// of the state directory.
type state struct {
	services []*vipdv1.Service
	revision uint64
	applies  int
	files    map[string]string
}

func (env *limitsEnv) state(t *testing.T) state {
	t.Helper()
	list, err := env.lb.ListServices(ctxT(t), &vipdv1.ListServicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	st := state{services: list.Services, revision: env.srv.Snapshot().Revision(), applies: len(env.dp.Records()), files: map[string]string{}}
	entries, err := os.ReadDir(env.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Type().IsRegular() {
			b, err := os.ReadFile(filepath.Join(env.stateDir, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			st.files[e.Name()] = string(b)
		}
	}
	return st
}

func (env *limitsEnv) unchanged(t *testing.T, before state) {
	t.Helper()
	after := env.state(t)
	if !slices.EqualFunc(before.services, after.services, func(a, b *vipdv1.Service) bool { return proto.Equal(a, b) }) {
		t.Errorf("a rejected request changed the services:\n%v\n%v", before.services, after.services)
	}
	if after.revision != before.revision {
		t.Errorf("a rejected request moved the generation from %d to %d", before.revision, after.revision)
	}
	if after.applies != before.applies {
		t.Errorf("a rejected request reached the dataplane: %d applies, before %d", after.applies, before.applies)
	}
	if !maps.Equal(before.files, after.files) {
		t.Errorf("a rejected request changed the state directory")
	}
}

// svcN is service name on VIP 198.19.<i/250>.<i%250+1> with n backends.
func svcN(name string, i, n int) *vipdv1.Service {
	svc := web(name, fmt.Sprintf("198.19.%d.%d", i/250, i%250+1))
	for j := range n {
		svc.Backends = append(svc.Backends, &vipdv1.Backend{Ip: fmt.Sprintf("198.18.%d.%d", j/250, j%250+1)})
	}
	return svc
}

// rejection is what a limit rejection must carry.
type rejection struct {
	code codes.Code
	// fields are the BadRequest field violations of an InvalidArgument,
	// sorted; subject is the QuotaFailure subject of a ResourceExhausted.
	fields  []string
	subject string
	// inRequest is whether each field must name a field of the request.
	inRequest bool
}

func checkRejection(t *testing.T, err error, req proto.Message, want rejection) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != want.code {
		t.Fatalf("got %v (%v), want %v", st.Code(), err, want.code)
	}
	var fields, subjects []string
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.BadRequest:
			for _, v := range d.FieldViolations {
				fields = append(fields, v.Field)
				if v.Description == "" {
					t.Errorf("violation of %s has no description", v.Field)
				}
				if want.inRequest {
					if err := validation.ResolvePath(req, v.Field); err != nil {
						t.Errorf("violation names no field of the request: %v", err)
					}
				}
			}
		case *errdetails.QuotaFailure:
			for _, v := range d.Violations {
				subjects = append(subjects, v.Subject)
				if v.Description == "" {
					t.Errorf("quota violation of %s has no description", v.Subject)
				}
			}
		}
	}
	slices.Sort(fields)
	if want.code == codes.InvalidArgument && !slices.Equal(fields, want.fields) {
		t.Errorf("field violations %v, want %v", fields, want.fields)
	}
	if want.code == codes.ResourceExhausted {
		if !slices.Equal(subjects, []string{want.subject}) {
			t.Errorf("quota failures %v, want [%s]", subjects, want.subject)
		}
		if flag := "--max-" + map[string]string{"services": "services", "backends": "total-backends"}[want.subject]; !strings.Contains(st.Message(), flag) {
			t.Errorf("message %q does not name the flag %s", st.Message(), flag)
		}
	}
}

// TestLimitsAtTheEdges checks every limit through the API: a request at
// the limit passes, and one past it is rejected with a field-level error
// (InvalidArgument with BadRequest field violations; ResourceExhausted with
// a QuotaFailure for the totals) and changes nothing.
func TestLimitsAtTheEdges(t *testing.T) {
	lim := validation.Limits{MaxBackends: 4, MaxPorts: 3, MaxServices: 3, MaxTotalBackends: 8}
	long := func(n int) string { return strings.Repeat("a", n) }
	upsert := func(svc *vipdv1.Service) func(*limitsEnv) (proto.Message, error) {
		return func(env *limitsEnv) (proto.Message, error) {
			req := &vipdv1.UpsertServiceRequest{Service: svc}
			_, err := env.lb.UpsertService(context.Background(), req)
			return req, err
		}
	}
	sync := func(owner string, svcs ...*vipdv1.Service) func(*limitsEnv) (proto.Message, error) {
		return func(env *limitsEnv) (proto.Message, error) {
			req := &vipdv1.SyncServicesRequest{Owner: owner, Services: svcs}
			_, err := env.lb.SyncServices(context.Background(), req)
			return req, err
		}
	}
	update := func(name string, backends ...*vipdv1.Backend) func(*limitsEnv) (proto.Message, error) {
		return func(env *limitsEnv) (proto.Message, error) {
			req := &vipdv1.UpdateBackendsRequest{Name: name, Upsert: backends}
			_, err := env.lb.UpdateBackends(context.Background(), req)
			return req, err
		}
	}
	with := func(edit func(*vipdv1.Service)) *vipdv1.Service {
		svc := svcN("default/web", 0, 1)
		edit(svc)
		return svc
	}
	labels := func(n, keyLen, valueLen int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m[fmt.Sprintf("%0*d", keyLen, i)] = long(valueLen)
		}
		return m
	}
	invalid := func(fields ...string) rejection {
		return rejection{code: codes.InvalidArgument, fields: fields, inRequest: true}
	}
	over := func(subject string) rejection { return rejection{code: codes.ResourceExhausted, subject: subject} }
	ports := func(n int) []*vipdv1.Port {
		var res []*vipdv1.Port
		for i := range n {
			res = append(res, &vipdv1.Port{Name: fmt.Sprintf("p%d", i), Port: uint32(80 + i)})
		}
		return res
	}
	vips := func(n int) []string {
		var res []string
		for i := range n {
			res = append(res, fmt.Sprintf("198.19.0.%d", i+1))
		}
		return res
	}
	backends := func(first, n int) []*vipdv1.Backend {
		var res []*vipdv1.Backend
		for i := range n {
			res = append(res, &vipdv1.Backend{Ip: fmt.Sprintf("198.18.9.%d", first+i)})
		}
		return res
	}
	tests := []struct {
		name     string
		setup    []*vipdv1.Service // upserted first
		atLimit  func(*limitsEnv) (proto.Message, error)
		overDo   func(*limitsEnv) (proto.Message, error)
		rejected rejection
	}{
		{"name length", nil,
			upsert(with(func(s *vipdv1.Service) { s.Name = long(validation.MaxNameLength) })),
			upsert(with(func(s *vipdv1.Service) { s.Name = long(validation.MaxNameLength + 1) })),
			invalid("service.name")},
		{"owner length", nil,
			upsert(with(func(s *vipdv1.Service) { s.Owner = long(validation.MaxNameLength) })),
			upsert(with(func(s *vipdv1.Service) { s.Owner = long(validation.MaxNameLength + 1) })),
			invalid("service.owner")},
		{"VIPs per service", nil,
			upsert(with(func(s *vipdv1.Service) { s.Vips = vips(validation.MaxVIPs) })),
			upsert(with(func(s *vipdv1.Service) { s.Vips = vips(validation.MaxVIPs + 1) })),
			invalid("service.vips")},
		{"ports per service (--max-ports)", nil,
			upsert(with(func(s *vipdv1.Service) { s.Ports = ports(lim.MaxPorts) })),
			upsert(with(func(s *vipdv1.Service) { s.Ports = ports(lim.MaxPorts + 1) })),
			invalid("service.ports")},
		{"ports per service in a sync", nil,
			sync("default", with(func(s *vipdv1.Service) { s.Ports = ports(lim.MaxPorts) })),
			sync("default", svcN("a", 1, 0), with(func(s *vipdv1.Service) { s.Ports = ports(lim.MaxPorts + 1) })),
			invalid("services[1].ports")},
		{"backends per service (--max-backends)", nil,
			upsert(with(func(s *vipdv1.Service) { s.Backends = backends(1, lim.MaxBackends) })),
			upsert(with(func(s *vipdv1.Service) { s.Backends = backends(1, lim.MaxBackends+1) })),
			invalid("service.backends")},
		{"backends per service in a sync", nil,
			sync("default", with(func(s *vipdv1.Service) { s.Backends = backends(1, lim.MaxBackends) })),
			sync("default", with(func(s *vipdv1.Service) { s.Backends = backends(1, lim.MaxBackends+1) })),
			invalid("services[0].backends")},
		{"backends per service through UpdateBackends", []*vipdv1.Service{svcN("default/web", 0, 1)},
			update("default/web", backends(1, lim.MaxBackends-1)...),
			update("default/web", backends(1, lim.MaxBackends)...),
			rejection{code: codes.InvalidArgument, fields: []string{updateBackendsLimitField}}},
		{"labels per service", nil,
			upsert(with(func(s *vipdv1.Service) { s.Labels = labels(validation.MaxLabels, 2, 1) })),
			upsert(with(func(s *vipdv1.Service) { s.Labels = labels(validation.MaxLabels+1, 2, 1) })),
			invalid("service.labels")},
		{"label key length", nil,
			upsert(with(func(s *vipdv1.Service) { s.Labels = labels(1, validation.MaxLabelLength, 1) })),
			upsert(with(func(s *vipdv1.Service) { s.Labels = labels(1, validation.MaxLabelLength+1, 1) })),
			invalid(fmt.Sprintf("service.labels[%q]", fmt.Sprintf("%0*d", validation.MaxLabelLength+1, 0)))},
		{"label value length", nil,
			upsert(with(func(s *vipdv1.Service) { s.Labels = labels(1, 1, validation.MaxLabelLength) })),
			upsert(with(func(s *vipdv1.Service) { s.Labels = labels(1, 1, validation.MaxLabelLength+1) })),
			invalid(`service.labels["0"]`)},
		{"port name length", nil,
			upsert(with(func(s *vipdv1.Service) { s.Ports[0].Name = long(validation.MaxPortNameLength) })),
			upsert(with(func(s *vipdv1.Service) { s.Ports[0].Name = long(validation.MaxPortNameLength + 1) })),
			invalid("service.ports[0].name")},
		{"port", nil,
			upsert(with(func(s *vipdv1.Service) { s.Ports[0].Port = 65535 })),
			upsert(with(func(s *vipdv1.Service) { s.Ports[0].Port = 65536 })),
			invalid("service.ports[0].port")},
		{"target port", nil,
			upsert(with(func(s *vipdv1.Service) { s.Ports[0].TargetPort = 65535 })),
			upsert(with(func(s *vipdv1.Service) { s.Ports[0].TargetPort = 65536 })),
			invalid("service.ports[0].target_port")},
		{"backend weight", nil,
			upsert(with(func(s *vipdv1.Service) { s.Backends[0].Weight = validation.MaxWeight })),
			upsert(with(func(s *vipdv1.Service) { s.Backends[0].Weight = validation.MaxWeight + 1 })),
			invalid("service.backends[0].weight")},
		{"backend weight through UpdateBackends", []*vipdv1.Service{svcN("default/web", 0, 1)},
			update("default/web", &vipdv1.Backend{Ip: "198.18.9.1", Weight: validation.MaxWeight}),
			update("default/web", &vipdv1.Backend{Ip: "198.18.9.1", Weight: validation.MaxWeight + 1}),
			invalid("upsert[0].weight")},
		{"backend port override", nil,
			upsert(with(func(s *vipdv1.Service) {
				s.Ports[0].Name = "http"
				s.Backends[0].Ports = map[string]uint32{"http": 65535}
			})),
			upsert(with(func(s *vipdv1.Service) {
				s.Ports[0].Name = "http"
				s.Backends[0].Ports = map[string]uint32{"http": 65536}
			})),
			invalid(`service.backends[0].ports["http"]`)},
		{"zone length", nil,
			upsert(with(func(s *vipdv1.Service) { s.Backends[0].Zone = long(validation.MaxZoneLength) })),
			upsert(with(func(s *vipdv1.Service) { s.Backends[0].Zone = long(validation.MaxZoneLength + 1) })),
			invalid("service.backends[0].zone")},
		{"affinity timeout", nil,
			upsert(with(func(s *vipdv1.Service) {
				s.SessionAffinity = &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP, TimeoutSeconds: validation.MaxAffinityTimeout}
			})),
			upsert(with(func(s *vipdv1.Service) {
				s.SessionAffinity = &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP, TimeoutSeconds: validation.MaxAffinityTimeout + 1}
			})),
			invalid("service.session_affinity.timeout_seconds")},
		{"services in all (--max-services)", []*vipdv1.Service{svcN("a", 1, 1), svcN("b", 2, 1)},
			upsert(svcN("c", 3, 1)),
			upsert(svcN("d", 4, 1)),
			over("services")},
		{"services in all, by a sync of another owner", []*vipdv1.Service{svcN("a", 1, 1)},
			sync("other", svcN("b", 2, 0), svcN("c", 3, 0)),
			sync("other", svcN("b", 2, 0), svcN("c", 3, 0), svcN("d", 4, 0)),
			over("services")},
		{"backends in all (--max-total-backends)", []*vipdv1.Service{svcN("a", 1, 4)},
			upsert(svcN("b", 2, 4)),
			upsert(svcN("c", 3, 1)),
			over("backends")},
		{"backends in all, by growing a service", []*vipdv1.Service{svcN("a", 1, 4), svcN("b", 2, 1), svcN("c", 3, 2)},
			upsert(svcN("b", 2, 2)),
			upsert(svcN("c", 3, 3)),
			over("backends")},
		{"backends in all, by UpdateBackends", []*vipdv1.Service{svcN("a", 1, 4), svcN("b", 2, 1), svcN("c", 3, 2)},
			update("b", backends(1, 1)...),
			update("c", backends(1, 1)...),
			over("backends")},
		{"backends in all, by a sync", []*vipdv1.Service{svcN("a", 1, 4)},
			sync("default", svcN("a", 1, 2), svcN("b", 2, 3), svcN("c", 3, 3)),
			sync("default", svcN("a", 1, 3), svcN("b", 2, 3), svcN("c", 3, 3)),
			over("backends")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := startWithLimits(t, lim)
			for _, svc := range tc.setup {
				if _, err := env.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: svc}); err != nil {
					t.Fatalf("setup %s: %v", svc.Name, err)
				}
			}
			if _, err := tc.atLimit(env); err != nil {
				t.Fatalf("at the limit: %v", err)
			}
			before := env.state(t)
			req, err := tc.overDo(env)
			if err == nil {
				t.Fatal("past the limit: accepted")
			}
			checkRejection(t, err, req, tc.rejected)
			env.unchanged(t, before)
			// No generation was used up: the next change gets the next one.
			if _, err := env.lb.DeleteService(ctxT(t), &vipdv1.DeleteServiceRequest{Name: before.services[0].Name}); err != nil {
				t.Fatalf("a change after the rejection: %v", err)
			}
			if got := env.srv.Snapshot().Revision(); got != before.revision+1 {
				t.Errorf("the next change made revision %d, want %d", got, before.revision+1)
			}
		})
	}
}

// requestOfSize returns an UpsertServiceRequest for a valid service that
// is exactly size bytes on the wire.
func requestOfSize(t *testing.T, size int) *vipdv1.UpsertServiceRequest {
	t.Helper()
	req := &vipdv1.UpsertServiceRequest{Service: svcN("a", 0, 8)}
	req.Service.Labels = map[string]string{}
	// Whole labels first, then one that leaves 99 or 100 bytes, then the
	// name, which adds one byte per character up to 127 characters.
	for i := 0; size-proto.Size(req) > 300; i++ {
		req.Service.Labels[fmt.Sprintf("k%d", i)] = strings.Repeat("v", validation.MaxLabelLength)
	}
	for n := 0; size-proto.Size(req) > 100 && n <= validation.MaxLabelLength; n++ {
		req.Service.Labels["last"] = strings.Repeat("v", n)
	}
	req.Service.Name += strings.Repeat("x", size-proto.Size(req))
	if got := proto.Size(req); got != size {
		t.Fatalf("built a request of %d bytes, want %d", got, size)
	}
	return req
}

// TestRequestSizeAtTheEdge checks --max-recv-msg-size through the API: a
// request of exactly the limit is served, and one byte more gets
// ResourceExhausted and changes nothing.
func TestRequestSizeAtTheEdge(t *testing.T) {
	const limit = 8 << 10
	env := startWithLimits(t, validation.Limits{MaxBackends: validation.DefaultMaxBackends}, server.WithMaxRecvMsgSize(limit))
	at := requestOfSize(t, limit)
	resp, err := env.lb.UpsertService(ctxT(t), at)
	if err != nil {
		t.Fatalf("a request of exactly %d bytes: %v", limit, err)
	}
	if resp.Service.Name != at.Service.Name || len(resp.Service.Labels) != len(at.Service.Labels) {
		t.Fatalf("stored %v", resp.Service)
	}
	before := env.state(t)
	over := requestOfSize(t, limit+1)
	over.Service.Vips = []string{"198.19.9.9"} // the same size, another VIP
	if proto.Size(over) != limit+1 {
		t.Fatalf("request of %d bytes, want %d", proto.Size(over), limit+1)
	}
	_, err = env.lb.UpsertService(ctxT(t), over)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a request of %d bytes: got %v, want ResourceExhausted", limit+1, err)
	}
	env.unchanged(t, before)
	// The limit is on every request, a sync among them.
	overSync := &vipdv1.SyncServicesRequest{Owner: "default", Services: []*vipdv1.Service{at.Service, svcN("b", 1, 0)}}
	if _, err := env.lb.SyncServices(ctxT(t), overSync); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a sync of %d bytes: got %v, want ResourceExhausted", proto.Size(overSync), err)
	}
	env.unchanged(t, before)
}
