package server_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vipd/vipd/dataplane/fake"
	"github.com/vipd/vipd/internal/testkit/fuzzcorpus"
	"github.com/vipd/vipd/internal/testkit/testserver"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server"
	"github.com/vipd/vipd/server/reconcile"
	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
)

// fuzzAPILimits are small enough for the fuzzer to reach every one.
var fuzzAPILimits = validation.Limits{MaxBackends: 8, MaxPorts: 4, MaxServices: 4, MaxTotalBackends: 12}

// nopPersister keeps nothing: FuzzAPI checks the API, not the disk.
type nopPersister struct{}

func (nopPersister) Save(*store.Snapshot) error { return nil }

// fuzzWeb and fuzzDB are the services each FuzzAPI input starts with.
func fuzzWeb() *vipdv1.Service {
	return &vipdv1.Service{
		Name: "default/web",
		Vips: []string{"198.19.0.10", "fd00:198:ff::10"},
		Ports: []*vipdv1.Port{
			{Name: "http", Port: 80, TargetPort: 8080},
			{Name: "dns", Protocol: vipdv1.Protocol_PROTOCOL_UDP, Port: 53},
		},
		Backends: []*vipdv1.Backend{{Ip: "198.18.1.10"}, {Ip: "198.18.1.11", Weight: 2},
			{Ip: "198.18.2.10", State: vipdv1.BackendState_BACKEND_STATE_TERMINATING}, {Ip: "fd00:198:1::10"}},
	}
}

// fuzzDB has the external fields (a node port, an external and a
// load-balancer IP, policy LOCAL with a health-check node port), so that
// the fuzzer meets their conflicts.
func fuzzDB() *vipdv1.Service {
	return &vipdv1.Service{Name: "other/db", Owner: "other", Vips: []string{"198.19.0.20"},
		Ports: []*vipdv1.Port{{Port: 5432, NodePort: 30432}}, Backends: []*vipdv1.Backend{{Ip: "198.18.3.1"}, {Ip: "198.18.3.2"}},
		ExternalIps: []string{"198.19.5.20"}, LoadBalancerIps: []string{"198.19.6.20"}, LoadBalancerSourceRanges: []string{"198.18.0.0/16"},
		ExternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL, HealthCheckNodePort: 32432}
}

// FuzzAPI fuzzes the wire bytes of an UpsertServiceRequest, an
// UpdateBackendsRequest and a SyncServicesRequest, called in that order on
// the API handlers over a store that starts with two services (of owners
// "default" and "other") and enforces small limits. It checks that
//   - no call panics or fails with a code other than the documented ones;
//   - every InvalidArgument carries BadRequest field violations that name
//     fields of the request, and every ResourceExhausted a QuotaFailure;
//   - a failed call changes nothing: neither the store nor its generation
//     nor the dataplane;
//   - a successful call stores what it returns, normalized for good;
//   - afterwards the store is within its limits, and the dataplane has
//     applied exactly the stored services.
//
// Its seed corpus is in testdata/fuzz/FuzzAPI (see TestFuzzAPICorpus).
func FuzzAPI(f *testing.F) {
	f.Fuzz(func(t *testing.T, upsert, update, sync []byte) {
		env := startFuzzAPI(t)
		defer env.stop()
		var (
			ureq = &vipdv1.UpsertServiceRequest{}
			breq = &vipdv1.UpdateBackendsRequest{}
			sreq = &vipdv1.SyncServicesRequest{}
		)
		if proto.Unmarshal(upsert, ureq) == nil {
			env.call(t, "UpsertService", ureq, func(ctx context.Context) (*vipdv1.Service, error) {
				resp, err := env.api.UpsertService(ctx, proto.Clone(ureq).(*vipdv1.UpsertServiceRequest))
				return resp.GetService(), err
			})
		}
		if proto.Unmarshal(update, breq) == nil {
			env.call(t, "UpdateBackends", breq, func(ctx context.Context) (*vipdv1.Service, error) {
				resp, err := env.api.UpdateBackends(ctx, proto.Clone(breq).(*vipdv1.UpdateBackendsRequest))
				return resp.GetService(), err
			})
		}
		if proto.Unmarshal(sync, sreq) == nil {
			env.call(t, "SyncServices", sreq, func(ctx context.Context) (*vipdv1.Service, error) {
				resp, err := env.api.SyncServices(ctx, proto.Clone(sreq).(*vipdv1.SyncServicesRequest))
				if err == nil {
					checkSynced(t, env, sreq, resp)
				}
				return nil, err
			})
		}
		env.checkInvariants(t)
	})
}

// fuzzAPIEnv is the API as internal/daemon assembles it (testserver), over
// the fake dataplane; FuzzAPI calls its handlers without the wire.
type fuzzAPIEnv struct {
	srv  *testserver.Server
	dp   *fake.Dataplane
	api  *server.API
	stop func()
}

func startFuzzAPI(t *testing.T) *fuzzAPIEnv {
	t.Helper()
	srv := testserver.Start(t, testserver.WithLimits(fuzzAPILimits), testserver.WithVersion("fuzz"),
		testserver.WithPersister(func(*store.Dir) reconcile.Persister { return nopPersister{} }))
	env := &fuzzAPIEnv{srv: srv, dp: srv.Dataplane(), api: srv.API(), stop: func() { srv.Close() }}
	for _, svc := range []*vipdv1.Service{fuzzWeb(), fuzzDB()} {
		if _, err := env.api.UpsertService(context.Background(), &vipdv1.UpsertServiceRequest{Service: svc}); err != nil {
			env.stop()
			t.Fatalf("upsert %s: %v", svc.Name, err)
		}
	}
	return env
}

// call runs do, the handler of rpc for req, and checks its outcome. do
// returns the service the call stored, if any.
func (env *fuzzAPIEnv) call(t *testing.T, rpc string, req proto.Message, do func(context.Context) (*vipdv1.Service, error)) {
	t.Helper()
	revision, applies := env.srv.Snapshot().Revision(), len(env.dp.Records())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stored, err := do(ctx)
	if err == nil && isValidateOnly(req) {
		env.checkUnchanged(t, rpc+" with validate_only", nil, revision, applies)
		return
	}
	if err == nil {
		if stored != nil {
			checkStored(t, env, rpc, stored)
		}
		return
	}
	st := status.Convert(err)
	switch st.Code() {
	case codes.InvalidArgument:
		br := detail[*errdetails.BadRequest](st)
		if br == nil || len(br.FieldViolations) == 0 {
			t.Fatalf("%s: InvalidArgument without field violations: %v", rpc, err)
		}
		for _, v := range br.FieldViolations {
			if v.Description == "" {
				t.Errorf("%s: violation of %q has no description", rpc, v.Field)
			}
			if rpc == "UpdateBackends" && v.Field == updateBackendsLimitField {
				continue
			}
			if err := validation.ResolvePath(req, v.Field); err != nil {
				t.Errorf("%s: violation %q (%s) names no field of the request: %v", rpc, v.Field, v.Description, err)
			}
		}
	case codes.ResourceExhausted:
		qf := detail[*errdetails.QuotaFailure](st)
		if qf == nil || len(qf.Violations) != 1 || (qf.Violations[0].Subject != "services" && qf.Violations[0].Subject != "backends") {
			t.Fatalf("%s: ResourceExhausted without a QuotaFailure on services or backends: %v", rpc, err)
		}
	case codes.AlreadyExists, codes.Aborted, codes.NotFound, codes.FailedPrecondition:
		if st.Message() == "" {
			t.Fatalf("%s: %v without a message", rpc, st.Code())
		}
	default:
		t.Fatalf("%s: unexpected %v: %v", rpc, st.Code(), err)
	}
	env.checkUnchanged(t, rpc, err, revision, applies)
}

// isValidateOnly reports whether req asks only to validate (AIP-163).
func isValidateOnly(req proto.Message) bool {
	v, ok := req.(interface{ GetValidateOnly() bool })
	return ok && v.GetValidateOnly()
}

// checkUnchanged checks that a call that failed with err, or only
// validated (err nil), left the store at revision and the dataplane at
// applies.
func (env *fuzzAPIEnv) checkUnchanged(t *testing.T, rpc string, err error, revision uint64, applies int) {
	t.Helper()
	if r, a := env.srv.Snapshot().Revision(), len(env.dp.Records()); r != revision || a != applies {
		t.Fatalf("%s (%v) changed the store (revision %d → %d) or reached the dataplane (%d → %d applies)", rpc, err, revision, r, applies, a)
	}
}

func detail[T proto.Message](st *status.Status) T {
	var zero T
	for _, d := range st.Details() {
		if x, ok := d.(T); ok {
			return x
		}
	}
	return zero
}

// checkStored checks that svc, returned by a successful call, is what the
// store holds, and a fixed point of validation.
func checkStored(t *testing.T, env *fuzzAPIEnv, rpc string, svc *vipdv1.Service) {
	t.Helper()
	e, ok := env.srv.Snapshot().Get(svc.Name)
	if !ok {
		t.Fatalf("%s returned %s, which is not stored", rpc, svc.Name)
	}
	if stored := e.Service(); !proto.Equal(stored, svc) {
		t.Fatalf("%s returned a service other than the stored one (-stored +returned):\n%s", rpc, cmp.Diff(stored, svc, protocmp.Transform()))
	}
	out, _, v := validation.Service(svc, fuzzAPILimits, "service")
	if len(v) > 0 {
		t.Fatalf("%s stored a service that does not validate: %v", rpc, v)
	}
	want := proto.Clone(svc).(*vipdv1.Service)
	want.Generation = 0
	if !proto.Equal(want, out) {
		t.Fatalf("%s stored a service that validation changes (-stored +validated):\n%s", rpc, cmp.Diff(want, out, protocmp.Transform()))
	}
}

// checkSynced checks a successful SyncServices: the owner's services are
// exactly the ones asked for, each in one of the response's lists.
func checkSynced(t *testing.T, env *fuzzAPIEnv, req *vipdv1.SyncServicesRequest, resp *vipdv1.SyncServicesResponse) {
	t.Helper()
	var want []string
	for _, s := range req.Services {
		want = append(want, s.GetName())
	}
	slices.Sort(want)
	if !req.GetValidateOnly() {
		var have []string
		for _, e := range env.srv.Snapshot().List(req.Owner) {
			have = append(have, e.Name())
			checkStored(t, env, "SyncServices", e.Service())
		}
		if !slices.Equal(want, have) {
			t.Fatalf("SyncServices for %q asked for %v; the owner has %v", req.Owner, want, have)
		}
	}
	listed := slices.Concat(resp.Created, resp.Updated, resp.Unchanged)
	slices.Sort(listed)
	if !slices.Equal(listed, want) {
		t.Fatalf("SyncServices reported %v created, updated or unchanged; want %v", listed, want)
	}
	for _, name := range resp.Deleted {
		if _, ok := env.srv.Snapshot().Get(name); ok && !req.GetValidateOnly() {
			t.Fatalf("SyncServices reported %s deleted, but it is stored", name)
		}
	}
}

func (env *fuzzAPIEnv) checkInvariants(t *testing.T) {
	t.Helper()
	snap := env.srv.Snapshot()
	if snap.Len() > fuzzAPILimits.MaxServices || snap.BackendCount() > fuzzAPILimits.MaxTotalBackends {
		t.Fatalf("the store holds %d services and %d backends, past its limits", snap.Len(), snap.BackendCount())
	}
	applied, gen := env.dp.Applied()
	if gen != snap.Revision() {
		t.Fatalf("the dataplane applied generation %d, the store is at %d", gen, snap.Revision())
	}
	var stored []string
	for name := range snap.All() {
		stored = append(stored, name)
	}
	if names := slices.Sorted(maps.Keys(applied)); !slices.Equal(names, stored) {
		t.Fatalf("the dataplane applied %v; the store holds %v", names, stored)
	}
	for name, e := range snap.All() {
		if applied[name].Generation != e.Generation() {
			t.Fatalf("%s: applied generation %d, stored %d", name, applied[name].Generation, e.Generation())
		}
	}
}

// The seed corpus of FuzzAPI is committed in testdata/fuzz/FuzzAPI/ and
// checked by TestFuzzAPICorpus; to rewrite it after changing a seed, run
//
//	VIPD_WRITE_FUZZ_CORPUS=1 go test -run TestFuzzAPICorpus ./server/

func fuzzAPISeeds(t *testing.T) map[string][3][]byte {
	w := func(m proto.Message) []byte {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	up := func(svc *vipdv1.Service) []byte { return w(&vipdv1.UpsertServiceRequest{Service: svc}) }
	upd := func(name string, add []*vipdv1.Backend, remove ...string) []byte {
		return w(&vipdv1.UpdateBackendsRequest{Name: name, Upsert: add, Remove: remove})
	}
	sync := func(owner string, svcs ...*vipdv1.Service) []byte {
		return w(&vipdv1.SyncServicesRequest{Owner: owner, Services: svcs})
	}
	svc := func(name string, vip string, backends int) *vipdv1.Service {
		s := &vipdv1.Service{Name: name, Vips: []string{vip}, Ports: []*vipdv1.Port{{Port: 80, TargetPort: 8080}}}
		for i := range backends {
			s.Backends = append(s.Backends, &vipdv1.Backend{Ip: fmt.Sprintf("198.18.9.%d", i+1)})
		}
		return s
	}
	readme := svc("default/web", "198.19.0.10", 0)
	readme.Backends = []*vipdv1.Backend{{Ip: "198.18.1.10"}, {Ip: "198.18.1.11", Weight: 2}}
	eight := svc("default/web", "198.19.0.10", 8)
	takeOver := fuzzDB()
	takeOver.Owner = ""
	mismatch := svc("a", "198.19.1.1", 0)
	mismatch.Owner = "someone"
	stale := &vipdv1.UpsertServiceRequest{Service: svc("default/web", "198.19.0.10", 1), ExpectedGeneration: 99}
	unknown := append(up(readme), protowire.AppendTag(nil, 99, protowire.VarintType)...)
	unknown = protowire.AppendVarint(unknown, 1)
	broken := &vipdv1.Service{Name: "Web!", Vips: []string{"127.0.0.1", "nope"}, Ports: []*vipdv1.Port{{Port: 0}, {Port: 70000}},
		Backends: []*vipdv1.Backend{{Ip: "fd00::1", Weight: 1 << 20}, nil}, Labels: map[string]string{"": strings.Repeat("v", 300)}}
	// external takes db's node port, health-check node port, external IP
	// port and load-balancer IP as a backend, each a conflict; the sync
	// gives db's owner a service that moves them.
	external := svc("x", "198.19.1.1", 0)
	external.Ports[0].NodePort = 30432
	external.LoadBalancerIps = []string{"198.19.5.20"}
	external.Ports[0].Port = 5432
	moved := fuzzDB()
	moved.Ports[0].NodePort, moved.HealthCheckNodePort = 30433, 30432
	moved.ExternalIps, moved.LoadBalancerIps = moved.LoadBalancerIps, moved.ExternalIps
	externalBroken := svc("y", "198.19.1.2", 0)
	externalBroken.Ports[0].NodePort = 70000
	externalBroken.ExternalIps = []string{"198.19.1.2", "x", "fd00::1", "::ffff:198.19.5.1"}
	externalBroken.LoadBalancerSourceRanges = []string{"10.0.0.0/8", "10.0.0.1/8"}
	externalBroken.HealthCheckNodePort = 32000
	return map[string][3][]byte{
		"external": {up(external), upd("default/web", []*vipdv1.Backend{{Ip: "198.19.6.20"}}),
			sync("other", moved, svc("other/new", "198.19.0.21", 0))},
		"external-broken": {up(externalBroken), upd("other/db", []*vipdv1.Backend{{Ip: "198.19.5.20"}}),
			sync("default", fuzzWeb(), externalBroken)},
		"readme": {up(readme), upd("default/web", []*vipdv1.Backend{{Ip: "198.18.1.12"}}, "198.18.1.10"), sync("nomad")},
		"examples": {up(fuzzWeb()), upd("default/web", []*vipdv1.Backend{{Ip: "198.18.1.12", Weight: 2}}),
			sync("default", fuzzWeb(), svc("default/api", "198.19.0.30", 2))},
		"max-services": {up(svc("c", "198.19.1.1", 0)), upd("c", []*vipdv1.Backend{{Ip: "198.18.9.9"}}),
			sync("third", svc("d", "198.19.1.2", 0), svc("e", "198.19.1.3", 0))},
		"max-total-backends": {up(svc("c", "198.19.1.1", 6)), upd("c", []*vipdv1.Backend{{Ip: "198.18.8.1"}}),
			sync("default", fuzzWeb(), svc("x", "198.19.1.9", 7))},
		"max-backends": {up(eight), upd("default/web", []*vipdv1.Backend{{Ip: "198.18.8.1"}}), sync("default", eight)},
		"conflicts": {up(svc("steal", "198.19.0.10", 1)), upd("nope", []*vipdv1.Backend{{Ip: "198.18.8.1"}}),
			sync("default", takeOver)},
		"generations": {w(stale), w(&vipdv1.UpdateBackendsRequest{Name: "default/web", ExpectedGeneration: 1}), sync("other")},
		"owner-mismatch": {up(mismatch), upd("default/web", nil, "198.18.1.10", "bad", "::ffff:198.18.1.11"),
			sync("default", mismatch, svc("a", "198.19.1.1", 0))},
		"broken": {up(broken), upd("default/web", []*vipdv1.Backend{{Ip: "198.18.1.10"}, {Ip: "198.18.1.10"}, {Ip: "x"}}, "198.18.1.10"),
			sync("Bad Owner!", broken, nil)},
		"empty":         {nil, nil, nil},
		"unknown-field": {unknown, upd("default/web", nil), sync("default")},
		"swap-vips": {up(svc("default/web", "198.19.0.20", 0)), upd("other/db", []*vipdv1.Backend{{Ip: "fd00::1"}}),
			sync("other", svc("other/db", "198.19.0.10", 1), svc("other/db2", "198.19.0.20", 1))},
	}
}

func TestFuzzAPICorpus(t *testing.T) {
	seeds := map[string][][]byte{}
	for name, args := range fuzzAPISeeds(t) {
		seeds[name] = args[:]
	}
	fuzzcorpus.Check(t, "FuzzAPI", seeds)
}
