package server_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/fake"
	"github.com/vipd/vipd/internal/testkit/testserver"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server"
	"github.com/vipd/vipd/server/reconcile"
	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// instance is one running API server (internal/testkit/testserver: the real wiring
// over the fake dataplane and a real state directory) with clients for it.
type instance struct {
	dp     *fake.Dataplane
	ready  <-chan struct{}
	lb     vipdv1.LoadBalancerServiceClient
	status vipdv1.StatusServiceClient
	node   vipdv1.NodeServiceClient
	health healthpb.HealthClient
	stop   func()
}

type config struct {
	stateDir  string
	dp        *fake.Dataplane
	limits    validation.Limits
	persister func(*store.Dir) reconcile.Persister
	serverOps []server.Option
	noWait    bool
	// nodeName and zone, when zone is set, are vipd's --node-name and
	// --zone.
	nodeName, zone string
}

// start runs an instance; it is stopped at the end of the test or by stop.
func start(t testing.TB, cfg config) *instance {
	t.Helper()
	opts := []testserver.Option{testserver.WithServerOptions(cfg.serverOps...), testserver.WithVersion("test")}
	if cfg.stateDir != "" {
		opts = append(opts, testserver.WithStateDir(cfg.stateDir))
	}
	if cfg.dp != nil {
		opts = append(opts, testserver.WithDataplane(cfg.dp))
	}
	if cfg.limits.MaxBackends != 0 || cfg.limits.ServiceCIDRs != nil {
		opts = append(opts, testserver.WithLimits(cfg.limits))
	}
	if cfg.persister != nil {
		opts = append(opts, testserver.WithPersister(cfg.persister))
	}
	if cfg.noWait {
		opts = append(opts, testserver.WithoutWaiting())
	}
	if cfg.zone != "" {
		opts = append(opts, testserver.WithTopology(cfg.nodeName, cfg.zone))
	}
	srv := testserver.Start(t, opts...)
	conn, err := grpc.NewClient(srv.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	in := &instance{
		dp: srv.Dataplane(), ready: srv.Ready(),
		lb:     vipdv1.NewLoadBalancerServiceClient(conn),
		status: vipdv1.NewStatusServiceClient(conn),
		node:   vipdv1.NewNodeServiceClient(conn),
		health: healthpb.NewHealthClient(conn),
	}
	in.stop = func() {
		once.Do(func() {
			conn.Close()
			if err := srv.Close(); err != nil {
				t.Errorf("stop: %v", err)
			}
		})
	}
	t.Cleanup(in.stop)
	return in
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func web(name, vip string, backends ...string) *vipdv1.Service {
	svc := &vipdv1.Service{
		Name:  name,
		Vips:  []string{vip},
		Ports: []*vipdv1.Port{{Port: 80, TargetPort: 8080}},
	}
	for _, b := range backends {
		svc.Backends = append(svc.Backends, &vipdv1.Backend{Ip: b})
	}
	return svc
}

func wantCode(t *testing.T, err error, code codes.Code, contains ...string) {
	t.Helper()
	if got := status.Code(err); got != code {
		t.Fatalf("got %v (%v), want %v", got, err, code)
	}
	for _, c := range contains {
		if !strings.Contains(status.Convert(err).Message(), c) {
			t.Fatalf("error %q does not mention %q", status.Convert(err).Message(), c)
		}
	}
}

func fieldsOf(err error) []string {
	var fields []string
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.FieldViolations {
				fields = append(fields, v.Field)
			}
		}
	}
	slices.Sort(fields)
	return fields
}

func upsert(t *testing.T, in *instance, svc *vipdv1.Service) *vipdv1.Service {
	t.Helper()
	resp, err := in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: svc})
	if err != nil {
		t.Fatalf("upsert %s: %v", svc.Name, err)
	}
	return resp.Service
}

func appliedNames(in *instance) []string {
	applied, _ := in.dp.Applied()
	var names []string
	for n := range applied {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func TestUpsertFillsDefaultsAndIsApplied(t *testing.T) {
	in := start(t, config{})
	got := upsert(t, in, web("default/web", "198.19.0.10", "198.18.1.11", "198.18.1.10"))
	want := &vipdv1.Service{
		Name: "default/web", Owner: "default", Vips: []string{"198.19.0.10"},
		Ports: []*vipdv1.Port{{Protocol: vipdv1.Protocol_PROTOCOL_TCP, Port: 80, TargetPort: 8080}},
		Backends: []*vipdv1.Backend{
			{Ip: "198.18.1.10", State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 1},
			{Ip: "198.18.1.11", State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 1},
		},
		SessionAffinity:       &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_NONE},
		InternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
		ExternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
		LoadBalancing:         vipdv1.LoadBalancing_LOAD_BALANCING_RANDOM,
		Generation:            1,
	}
	if !proto.Equal(got, want) {
		t.Fatalf("stored service:\n got %v\nwant %v", got, want)
	}
	applied, gen := in.dp.Applied()
	if gen != 1 || applied["default/web"] == nil || len(applied["default/web"].Backends) != 2 {
		t.Fatalf("dataplane has generation %d, services %v", gen, applied)
	}
	get, err := in.lb.GetService(ctxT(t), &vipdv1.GetServiceRequest{Name: "default/web"})
	if err != nil || !proto.Equal(get.Service, want) {
		t.Fatalf("get: %v %v", get, err)
	}

	// The same spec again changes nothing and does not reach the dataplane.
	records := len(in.dp.Records())
	again := upsert(t, in, web("default/web", "198.19.0.10", "198.18.1.10", "198.18.1.11"))
	if again.Generation != 1 || len(in.dp.Records()) != records {
		t.Fatalf("unchanged upsert: generation %d, %d applies (was %d)", again.Generation, len(in.dp.Records()), records)
	}

	st, err := in.status.GetStatus(ctxT(t), &vipdv1.GetStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Dataplane != "fake" || st.Services != 1 || st.Backends != 2 || st.AppliedGeneration != 1 || !st.Ready || st.Version != "test" {
		t.Fatalf("status %v", st)
	}
}

func TestInvalidRequestsChangeNothing(t *testing.T) {
	in := start(t, config{limits: validation.Limits{MaxBackends: 2}})
	upsert(t, in, web("default/web", "198.19.0.10", "198.18.1.10"))
	records := len(in.dp.Records())

	tooMany := web("default/web", "198.19.0.10", "198.18.1.10", "198.18.1.11", "198.18.1.12")
	badVIPs := web("default/web", "127.0.0.1", "198.18.1.10")
	badVIPs.Vips = append(badVIPs.Vips, "224.0.0.1", "0.0.0.0", "nope")
	familyMismatch := web("default/web", "198.19.0.10", "fd00:198::10")
	dupPorts := web("default/web", "198.19.0.10")
	dupPorts.Ports = []*vipdv1.Port{{Name: "a", Port: 80}, {Name: "b", Port: 80}, {Name: "c", Port: 70000}}
	cases := []struct {
		name   string
		svc    *vipdv1.Service
		fields []string
	}{
		{"missing", nil, []string{"service"}},
		{"bad name", web("Web!", "198.19.0.10"), []string{"service.name"}},
		{"bad vips", badVIPs, []string{"service.vips[0]", "service.vips[1]", "service.vips[2]", "service.vips[3]"}},
		{"too many backends", tooMany, []string{"service.backends"}},
		{"family mismatch", familyMismatch, []string{"service.backends[0].ip"}},
		{"duplicate and out-of-range ports", dupPorts, []string{"service.ports[1]", "service.ports[2].port"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: c.svc})
			wantCode(t, err, codes.InvalidArgument)
			if got := fieldsOf(err); !slices.Equal(got, c.fields) {
				t.Fatalf("violated fields %v, want %v", got, c.fields)
			}
		})
	}
	if n := len(in.dp.Records()); n != records {
		t.Fatalf("invalid requests reached the dataplane: %d applies, want %d", n, records)
	}
	get, err := in.lb.GetService(ctxT(t), &vipdv1.GetServiceRequest{Name: "default/web"})
	if err != nil || get.Service.Generation != 1 || len(get.Service.Backends) != 1 {
		t.Fatalf("stored service changed: %v %v", get, err)
	}
}

func TestServiceCIDRs(t *testing.T) {
	in := start(t, config{limits: validation.Limits{MaxBackends: 10, ServiceCIDRs: []netipPrefix{mustPrefix("198.19.0.0/24")}}})
	upsert(t, in, web("a", "198.19.0.10"))
	_, err := in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: web("b", "198.19.1.10")})
	wantCode(t, err, codes.InvalidArgument, "outside the service CIDRs")
}

func TestGenerationsAndConflicts(t *testing.T) {
	in := start(t, config{})
	first := upsert(t, in, web("a", "198.19.0.10", "198.18.1.10"))

	_, err := in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: web("a", "198.19.0.10", "198.18.1.11"), ExpectedGeneration: first.Generation + 5})
	wantCode(t, err, codes.Aborted, "expected generation")
	_, err = in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: web("new", "198.19.0.99"), ExpectedGeneration: 3})
	wantCode(t, err, codes.Aborted, "does not exist")

	second, err := in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: web("a", "198.19.0.10", "198.18.1.11"), ExpectedGeneration: first.Generation})
	if err != nil || second.Service.Generation <= first.Generation {
		t.Fatalf("conditional upsert: %v %v", second, err)
	}

	// A second service on the same VIP:port/protocol is refused, naming the first.
	_, err = in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: web("b", "198.19.0.10")})
	wantCode(t, err, codes.AlreadyExists, "198.19.0.10:80/TCP", "service a")
	// The same VIP on another port, or another protocol, is fine.
	other := web("b", "198.19.0.10")
	other.Ports = []*vipdv1.Port{{Port: 80, Protocol: vipdv1.Protocol_PROTOCOL_UDP}}
	upsert(t, in, other)

	_, err = in.lb.DeleteService(ctxT(t), &vipdv1.DeleteServiceRequest{Name: "a", ExpectedGeneration: first.Generation})
	wantCode(t, err, codes.Aborted)
	if _, err := in.lb.DeleteService(ctxT(t), &vipdv1.DeleteServiceRequest{Name: "a", ExpectedGeneration: second.Service.Generation}); err != nil {
		t.Fatal(err)
	}
	_, err = in.lb.DeleteService(ctxT(t), &vipdv1.DeleteServiceRequest{Name: "a"})
	wantCode(t, err, codes.NotFound)
	_, err = in.lb.GetService(ctxT(t), &vipdv1.GetServiceRequest{Name: "a"})
	wantCode(t, err, codes.NotFound)

	// Re-created, the name gets a generation it never had before.
	again := upsert(t, in, web("a", "198.19.0.10"))
	if again.Generation <= second.Service.Generation {
		t.Fatalf("re-created service reuses generation %d (had %d)", again.Generation, second.Service.Generation)
	}
	if got := appliedNames(in); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("dataplane has %v", got)
	}
}

func TestSyncServicesOwnership(t *testing.T) {
	in := start(t, config{})
	theirs := web("other/z", "198.19.0.30")
	theirs.Owner = "other"
	upsert(t, in, theirs)
	sync := func(owner string, svcs ...*vipdv1.Service) (*vipdv1.SyncServicesResponse, error) {
		return in.lb.SyncServices(ctxT(t), &vipdv1.SyncServicesRequest{Owner: owner, Services: svcs})
	}
	resp, err := sync("k8s", web("k8s/x", "198.19.0.1"), web("k8s/y", "198.19.0.2"))
	if err != nil || !slices.Equal(resp.Created, []string{"k8s/x", "k8s/y"}) {
		t.Fatalf("first sync: %v %v", resp, err)
	}
	// y changes, x goes, w comes; and y takes over the VIP x had, in the same call.
	resp, err = sync("k8s", web("k8s/w", "198.19.0.3"), web("k8s/y", "198.19.0.1", "198.18.1.10"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(resp.Created, []string{"k8s/w"}) || !slices.Equal(resp.Updated, []string{"k8s/y"}) ||
		!slices.Equal(resp.Deleted, []string{"k8s/x"}) || len(resp.Unchanged) != 0 {
		t.Fatalf("second sync: %v", resp)
	}
	resp, err = sync("k8s", web("k8s/w", "198.19.0.3"), web("k8s/y", "198.19.0.1", "198.18.1.10"))
	if err != nil || !slices.Equal(resp.Unchanged, []string{"k8s/w", "k8s/y"}) || len(resp.Created)+len(resp.Updated)+len(resp.Deleted) != 0 {
		t.Fatalf("idempotent sync: %v %v", resp, err)
	}
	if got := appliedNames(in); !slices.Equal(got, []string{"k8s/w", "k8s/y", "other/z"}) {
		t.Fatalf("dataplane has %v", got)
	}

	before := len(in.dp.Records())
	// Rejected as a whole: a conflict inside the list, a conflict with another
	// owner's VIP, taking over another owner's service, or a foreign owner field.
	_, err = sync("k8s", web("k8s/a", "198.19.0.50"), web("k8s/b", "198.19.0.50"))
	wantCode(t, err, codes.AlreadyExists, "service k8s/a")
	_, err = sync("k8s", web("k8s/a", "198.19.0.30"))
	wantCode(t, err, codes.AlreadyExists, "service other/z")
	_, err = sync("k8s", web("other/z", "198.19.0.31"))
	wantCode(t, err, codes.AlreadyExists, "owner other")
	foreign := web("k8s/q", "198.19.0.40")
	foreign.Owner = "other"
	_, err = sync("k8s", foreign)
	wantCode(t, err, codes.InvalidArgument)
	if got := fieldsOf(err); !slices.Equal(got, []string{"services[0].owner"}) {
		t.Fatalf("fields %v", got)
	}
	_, err = sync("", web("k8s/a", "198.19.0.50"))
	wantCode(t, err, codes.InvalidArgument)
	if n := len(in.dp.Records()); n != before {
		t.Fatalf("rejected syncs reached the dataplane (%d applies, want %d)", n, before)
	}

	// An empty list removes only this owner's services.
	resp, err = sync("k8s")
	if err != nil || !slices.Equal(resp.Deleted, []string{"k8s/w", "k8s/y"}) {
		t.Fatalf("empty sync: %v %v", resp, err)
	}
	list, err := in.lb.ListServices(ctxT(t), &vipdv1.ListServicesRequest{})
	if err != nil || len(list.Services) != 1 || list.Services[0].Name != "other/z" {
		t.Fatalf("list after empty sync: %v %v", list, err)
	}
}

func TestListFiltersByOwner(t *testing.T) {
	in := start(t, config{})
	a := web("a", "198.19.0.1")
	a.Owner = "one"
	upsert(t, in, a)
	upsert(t, in, web("c", "198.19.0.3"))
	upsert(t, in, web("b", "198.19.0.2"))
	for owner, want := range map[string][]string{"": {"a", "b", "c"}, "one": {"a"}, "default": {"b", "c"}, "none": nil} {
		list, err := in.lb.ListServices(ctxT(t), &vipdv1.ListServicesRequest{Owner: owner})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, s := range list.Services {
			got = append(got, s.Name)
		}
		if !slices.Equal(got, want) {
			t.Errorf("owner %q: %v, want %v", owner, got, want)
		}
	}
}

func TestUpdateBackends(t *testing.T) {
	in := start(t, config{})
	svc := web("a", "198.19.0.10", "198.18.1.10", "198.18.1.11")
	svc.Ports[0].Name = "http"
	first := upsert(t, in, svc)
	upd := func(req *vipdv1.UpdateBackendsRequest) (*vipdv1.Service, error) {
		resp, err := in.lb.UpdateBackends(ctxT(t), req)
		return resp.GetService(), err
	}
	got, err := upd(&vipdv1.UpdateBackendsRequest{
		Name:   "a",
		Upsert: []*vipdv1.Backend{{Ip: "198.18.1.12", Weight: 5, Ports: map[string]uint32{"http": 9090}}, {Ip: "198.18.1.11", State: vipdv1.BackendState_BACKEND_STATE_TERMINATING}},
		Remove: []string{"198.18.1.10", "198.18.9.9"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Backends) != 2 || got.Backends[0].Ip != "198.18.1.11" || got.Backends[0].State != vipdv1.BackendState_BACKEND_STATE_TERMINATING ||
		got.Backends[1].Weight != 5 || got.Backends[1].Ports["http"] != 9090 || got.Generation <= first.Generation {
		t.Fatalf("after update: %v", got)
	}
	applied, _ := in.dp.Applied()
	if b := applied["a"].Backends; len(b) != 2 || b[1].TargetPort(applied["a"].Ports[0]) != 9090 {
		t.Fatalf("dataplane backends %+v", b)
	}

	_, err = upd(&vipdv1.UpdateBackendsRequest{Name: "a", Upsert: []*vipdv1.Backend{{Ip: "fd00:198::1"}, {Ip: "198.18.1.20", Ports: map[string]uint32{"nope": 1}}}, Remove: []string{"x"}})
	wantCode(t, err, codes.InvalidArgument)
	if f := fieldsOf(err); !slices.Equal(f, []string{"remove[0]"}) {
		t.Fatalf("fields %v", f)
	}
	_, err = upd(&vipdv1.UpdateBackendsRequest{Name: "a", Upsert: []*vipdv1.Backend{{Ip: "fd00:198::1"}, {Ip: "198.18.1.20", Ports: map[string]uint32{"nope": 1}}, {Ip: "198.18.1.11"}}, Remove: []string{"198.18.1.11"}})
	wantCode(t, err, codes.InvalidArgument)
	if f := fieldsOf(err); !slices.Equal(f, []string{`upsert[0].ip`, `upsert[1].ports["nope"]`, `upsert[2].ip`}) {
		t.Fatalf("fields %v", f)
	}
	_, err = upd(&vipdv1.UpdateBackendsRequest{Name: "missing", Remove: []string{"198.18.1.1"}})
	wantCode(t, err, codes.NotFound)
	_, err = upd(&vipdv1.UpdateBackendsRequest{Name: "a", Remove: []string{"198.18.1.11"}, ExpectedGeneration: first.Generation})
	wantCode(t, err, codes.Aborted)
}

func TestDataplaneFailureRollsBack(t *testing.T) {
	in := start(t, config{})
	upsert(t, in, web("a", "198.19.0.10", "198.18.1.10"))
	in.dp.FailNext(errors.New("injected failure"))
	_, err := in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: web("a", "198.19.0.10", "198.18.1.99")})
	wantCode(t, err, codes.Unavailable, "injected failure", "rolled back")

	get, err := in.lb.GetService(ctxT(t), &vipdv1.GetServiceRequest{Name: "a"})
	if err != nil || get.Service.Backends[0].Ip != "198.18.1.10" {
		t.Fatalf("desired state was not rolled back: %v %v", get, err)
	}
	applied, _ := in.dp.Applied()
	if applied["a"].Backends[0].IP.String() != "198.18.1.10" {
		t.Fatalf("dataplane state changed: %v", applied["a"].Backends)
	}
	st, _ := in.status.GetStatus(ctxT(t), &vipdv1.GetStatusRequest{})
	if !strings.Contains(st.LastError, "injected failure") {
		t.Fatalf("status last_error %q", st.LastError)
	}

	// The next change succeeds, as a full apply.
	upsert(t, in, web("a", "198.19.0.10", "198.18.1.11"))
	recs := in.dp.Records()
	if last := recs[len(recs)-1]; last.Err != nil || !last.Full {
		t.Fatalf("apply after failure: err %v full %v", last.Err, last.Full)
	}
	// An unsupported feature is a FailedPrecondition from the dataplane's capabilities.
	limited := start(t, config{dp: fake.New(fake.WithCapabilities(dataplane.Capabilities{
		LoadBalancing: []dataplane.LoadBalancing{dataplane.LoadBalancingRandom},
		Protocols:     []dataplane.Protocol{dataplane.TCP, dataplane.UDP},
		Hint:          "use the eBPF dataplane",
	}))})
	maglev := web("m", "198.19.0.10")
	maglev.LoadBalancing = vipdv1.LoadBalancing_LOAD_BALANCING_MAGLEV
	_, err = limited.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: maglev})
	wantCode(t, err, codes.FailedPrecondition, "maglev", "use the eBPF dataplane")
}

type failingPersister struct {
	reconcile.Persister
	fail bool
}

func (f *failingPersister) Save(s *store.Snapshot) error {
	if f.fail {
		return errors.New("disk full")
	}
	return f.Persister.Save(s)
}

func TestSaveFailureRollsBackDataplane(t *testing.T) {
	fp := &failingPersister{}
	in := start(t, config{persister: func(d *store.Dir) reconcile.Persister { fp.Persister = d; return fp }})
	upsert(t, in, web("a", "198.19.0.10", "198.18.1.10"))
	fp.fail = true
	_, err := in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: web("b", "198.19.0.11")})
	wantCode(t, err, codes.Internal, "disk full")
	if got := appliedNames(in); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("dataplane kept the unsaved change: %v", got)
	}
	if _, err := in.lb.GetService(ctxT(t), &vipdv1.GetServiceRequest{Name: "b"}); status.Code(err) != codes.NotFound {
		t.Fatalf("unsaved service is visible: %v", err)
	}
}

// holdDataplane makes the next Apply wait until the returned release is
// called; held is closed once that Apply has started. poison, when not
// empty, names a service that every Apply refuses.
func holdDataplane(in *instance, poison string) (held chan struct{}, release func()) {
	held, gate := make(chan struct{}), make(chan struct{})
	var once sync.Once
	in.dp.SetHook(func(ctx context.Context, s *dataplane.State) error {
		once.Do(func() { close(held); <-gate })
		if _, bad := s.Get(poison); bad {
			return fmt.Errorf("%w: %s", dataplane.ErrResourceExhausted, poison)
		}
		return nil
	})
	return held, func() { close(gate) }
}

func upsertAsync(t *testing.T, in *instance, svc *vipdv1.Service) chan error {
	ch := make(chan error, 1)
	go func() {
		_, err := in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: svc})
		ch <- err
	}()
	return ch
}

// burst upserts n services while the dataplane is held, so that they queue up
// behind one apply, plus the extra ones; it returns their results.
func burst(t *testing.T, in *instance, poison string, n int, extra ...*vipdv1.Service) []error {
	held, release := holdDataplane(in, poison)
	first := upsertAsync(t, in, web("s0", "198.19.0.200"))
	<-held
	var chans []chan error
	for i := 1; i <= n; i++ {
		chans = append(chans, upsertAsync(t, in, web(fmt.Sprintf("s%d", i), fmt.Sprintf("198.19.0.%d", i))))
	}
	for _, svc := range extra {
		chans = append(chans, upsertAsync(t, in, svc))
	}
	time.Sleep(200 * time.Millisecond) // let the requests queue behind the held apply
	release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	var errs []error
	for _, ch := range chans {
		errs = append(errs, <-ch)
	}
	return errs
}

func TestBurstsAreMerged(t *testing.T) {
	in := start(t, config{})
	const n = 40
	for i, err := range burst(t, in, "", n) {
		if err != nil {
			t.Fatalf("s%d: %v", i+1, err)
		}
	}
	if got := len(appliedNames(in)); got != n+1 {
		t.Fatalf("dataplane has %d services, want %d", got, n+1)
	}
	// One initial apply, the held one, and the queued changes in few applies.
	if applies := len(in.dp.Records()); applies > 5 {
		t.Fatalf("%d applies for %d queued changes: bursts were not merged", applies, n)
	}
}

func TestMergedFailureIsIsolated(t *testing.T) {
	in := start(t, config{})
	const n = 20
	errs := burst(t, in, "poison", n, web("poison", "198.19.1.1"))
	for i, err := range errs[:n] {
		if err != nil {
			t.Fatalf("s%d failed beside a bad change: %v", i+1, err)
		}
	}
	wantCode(t, errs[n], codes.ResourceExhausted, "poison")
	if got := len(appliedNames(in)); got != n+1 {
		t.Fatalf("dataplane has %d services, want %d", got, n+1)
	}
}

func TestConcurrentClients(t *testing.T) {
	in := start(t, config{})
	const clients, each = 16, 20
	var wg sync.WaitGroup
	errs := make(chan error, clients*each)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				svc := web(fmt.Sprintf("c%d/s%d", c, i), fmt.Sprintf("198.19.%d.%d", c, i+1), fmt.Sprintf("198.18.%d.%d", c, i+1))
				if _, err := in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: svc}); err != nil {
					errs <- err
				}
				// Everyone fights over one shared service with conditional writes.
				cur, err := in.lb.GetService(ctxT(t), &vipdv1.GetServiceRequest{Name: "shared"})
				var gen uint64
				if err == nil {
					gen = cur.Service.Generation
				}
				_, err = in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{
					Service: web("shared", "198.19.200.1", fmt.Sprintf("198.18.%d.%d", c, i+1)), ExpectedGeneration: gen})
				if err != nil && status.Code(err) != codes.Aborted {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	list, err := in.lb.ListServices(ctxT(t), &vipdv1.ListServicesRequest{})
	if err != nil || len(list.Services) != clients*each+1 {
		t.Fatalf("list: %d services, %v", len(list.Services), err)
	}
	gens := map[uint64]string{}
	for _, s := range list.Services {
		if other, dup := gens[s.Generation]; dup {
			t.Fatalf("%s and %s share generation %d", s.Name, other, s.Generation)
		}
		gens[s.Generation] = s.Name
	}
	applied, _ := in.dp.Applied()
	if len(applied) != len(list.Services) {
		t.Fatalf("dataplane has %d services, store %d", len(applied), len(list.Services))
	}
	for _, s := range list.Services {
		if applied[s.Name].Generation != s.Generation {
			t.Fatalf("%s: dataplane generation %d, store %d", s.Name, applied[s.Name].Generation, s.Generation)
		}
	}
}

func TestStateSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	in := start(t, config{stateDir: dir})
	a := upsert(t, in, web("a", "198.19.0.10", "198.18.1.10"))
	upsert(t, in, web("b", "198.19.0.11", "198.18.1.11"))
	if _, err := in.lb.DeleteService(ctxT(t), &vipdv1.DeleteServiceRequest{Name: "b"}); err != nil {
		t.Fatal(err)
	}
	in.stop()

	// The restored state is applied before health turns SERVING.
	dp := fake.New()
	release := make(chan struct{})
	dp.SetHook(func(context.Context, *dataplane.State) error { <-release; return nil })
	again := start(t, config{stateDir: dir, dp: dp, noWait: true})
	h, err := again.health.Check(ctxT(t), &healthpb.HealthCheckRequest{})
	if err != nil || h.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health before the initial apply: %v %v", h, err)
	}
	close(release)
	<-again.ready
	deadline := time.Now().Add(5 * time.Second)
	for {
		h, err = again.health.Check(ctxT(t), &healthpb.HealthCheckRequest{})
		if err == nil && h.Status == healthpb.HealthCheckResponse_SERVING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health after the initial apply: %v %v", h, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	recs := dp.Records()
	if len(recs) != 1 || !recs[0].Full || len(recs[0].State.Services) != 1 || recs[0].State.Services["a"] == nil {
		t.Fatalf("initial apply after restart: %+v", recs)
	}
	get, err := again.lb.GetService(ctxT(t), &vipdv1.GetServiceRequest{Name: "a"})
	if err != nil || !proto.Equal(get.Service, a) {
		t.Fatalf("restored service %v %v, want %v", get, err, a)
	}
	// Generations keep growing after the restart.
	c := upsert(t, again, web("c", "198.19.0.12"))
	if c.Generation <= a.Generation+2 {
		t.Fatalf("generation %d after restart does not exceed the old revision", c.Generation)
	}
}

func TestOversizedRequestIsRefused(t *testing.T) {
	in := start(t, config{serverOps: []server.Option{server.WithMaxRecvMsgSize(4096)}})
	svc := web("a", "198.19.0.10")
	for i := range 500 {
		svc.Backends = append(svc.Backends, &vipdv1.Backend{Ip: fmt.Sprintf("198.18.%d.%d", i/200, i%200+1)})
	}
	_, err := in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: svc})
	wantCode(t, err, codes.ResourceExhausted)
	if n := len(appliedNames(in)); n != 0 {
		t.Fatalf("oversized request was applied")
	}
}
