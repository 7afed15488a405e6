package server_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/fake"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
)

// observed is everything a change could move: the stored services, the
// status, the dataplane's applies and the state directory's bytes.
type observed struct {
	services []*vipdv1.Service
	applied  uint64
	applies  int
	files    map[string]string
}

func observe(t *testing.T, in *instance, dir string) observed {
	t.Helper()
	list, err := in.lb.ListServices(ctxT(t), &vipdv1.ListServicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := in.status.GetStatus(ctxT(t), &vipdv1.GetStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	o := observed{services: list.Services, applied: st.AppliedGeneration, applies: len(in.dp.Records()), files: map[string]string{}}
	err = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		o.files[path] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// TestValidateOnly: UpsertService, SyncServices and UpdateBackends with
// validate_only run every check of the write against the current state
// (validation, VIP:port conflicts, owners, expected_generation,
// create_only, limits, the dataplane's capabilities) and answer what the
// write would have, but change nothing: not the store, not a generation,
// not the dataplane, not a byte of the state directory.
func TestValidateOnly(t *testing.T) {
	type call struct {
		name     string
		do       func(in *instance) (proto.Message, error)
		code     codes.Code
		contains []string
		fields   []string
		want     proto.Message // the response, on success
	}
	upsertReq := func(req *vipdv1.UpsertServiceRequest) func(*instance) (proto.Message, error) {
		req.ValidateOnly = true
		return func(in *instance) (proto.Message, error) { return in.lb.UpsertService(ctxT(t), req) }
	}
	syncReq := func(owner string, svcs ...*vipdv1.Service) func(*instance) (proto.Message, error) {
		return func(in *instance) (proto.Message, error) {
			return in.lb.SyncServices(ctxT(t), &vipdv1.SyncServicesRequest{Owner: owner, Services: svcs, ValidateOnly: true})
		}
	}
	updateReq := func(req *vipdv1.UpdateBackendsRequest) func(*instance) (proto.Message, error) {
		req.ValidateOnly = true
		return func(in *instance) (proto.Message, error) { return in.lb.UpdateBackends(ctxT(t), req) }
	}
	// stored is svc as the store would keep it at generation gen.
	stored := func(svc *vipdv1.Service, gen uint64) *vipdv1.Service {
		out, _, v := validation.Service(svc, validation.Limits{}, "service")
		if len(v) > 0 {
			t.Fatalf("invalid expectation: %v", v)
		}
		out.Generation = gen
		return out
	}
	// The state: web (team-a, generation 1) and db (team-b, generation 2),
	// three backends in all, at most four (--max-total-backends).
	webSvc := owned("team-a", "web", "198.19.0.1", "198.18.1.1", "198.18.1.2")
	dbSvc := owned("team-b", "db", "198.19.0.2", "198.18.2.1")
	sctp := owned("team-a", "web", "198.19.0.1")
	sctp.Ports[0].Protocol = vipdv1.Protocol_PROTOCOL_SCTP

	calls := []call{{
		name: "upsert: a create",
		do:   upsertReq(&vipdv1.UpsertServiceRequest{Service: owned("team-a", "new", "198.19.0.3", "198.18.3.1")}),
		want: &vipdv1.UpsertServiceResponse{Service: stored(owned("team-a", "new", "198.19.0.3", "198.18.3.1"), 3), Result: vipdv1.UpsertResult_UPSERT_RESULT_CREATED},
	}, {
		name: "upsert: a change, with the right expected_generation",
		do:   upsertReq(&vipdv1.UpsertServiceRequest{Service: owned("team-a", "web", "198.19.0.1", "198.18.1.1"), ExpectedGeneration: 1}),
		want: &vipdv1.UpsertServiceResponse{Service: stored(owned("team-a", "web", "198.19.0.1", "198.18.1.1"), 3), Result: vipdv1.UpsertResult_UPSERT_RESULT_CONFIGURED},
	}, {
		name: "upsert: the same spec",
		do:   upsertReq(&vipdv1.UpsertServiceRequest{Service: web("web", "198.19.0.1", "198.18.1.2", "198.18.1.1")}),
		want: &vipdv1.UpsertServiceResponse{Service: stored(webSvc, 1), Result: vipdv1.UpsertResult_UPSERT_RESULT_UNCHANGED},
	}, {
		name:   "upsert: an invalid field",
		do:     upsertReq(&vipdv1.UpsertServiceRequest{Service: owned("team-a", "web", "198.19.0.300")}),
		code:   codes.InvalidArgument,
		fields: []string{"service.vips[0]"},
	}, {
		name:     "upsert: another service's VIP:port",
		do:       upsertReq(&vipdv1.UpsertServiceRequest{Service: owned("team-a", "new", "198.19.0.2")}),
		code:     codes.AlreadyExists,
		contains: []string{"198.19.0.2:80/TCP", "service db"},
	}, {
		name:     "upsert: another service's VIP as a backend",
		do:       upsertReq(&vipdv1.UpsertServiceRequest{Service: owned("team-a", "new", "198.19.0.3", "198.19.0.2")}),
		code:     codes.InvalidArgument,
		contains: []string{"198.19.0.2 is a VIP of service db"},
		fields:   []string{"service.backends[0].ip"},
	}, {
		name:     "upsert: a stale expected_generation",
		do:       upsertReq(&vipdv1.UpsertServiceRequest{Service: owned("team-a", "web", "198.19.0.1"), ExpectedGeneration: 2}),
		code:     codes.Aborted,
		contains: []string{"expected generation 2", "at generation 1"},
	}, {
		name:     "upsert: another owner's service",
		do:       upsertReq(&vipdv1.UpsertServiceRequest{Service: owned("team-a", "db", "198.19.0.2")}),
		code:     codes.FailedPrecondition,
		contains: []string{`owned by "team-b"`},
	}, {
		name: "upsert: another owner's service, taken over",
		do:   upsertReq(&vipdv1.UpsertServiceRequest{Service: owned("team-a", "db", "198.19.0.2"), TakeOwnership: true}),
		want: &vipdv1.UpsertServiceResponse{Service: stored(owned("team-a", "db", "198.19.0.2"), 3), Result: vipdv1.UpsertResult_UPSERT_RESULT_CONFIGURED},
	}, {
		name:     "upsert: create_only of an existing name",
		do:       upsertReq(&vipdv1.UpsertServiceRequest{Service: owned("team-a", "web", "198.19.0.1"), CreateOnly: true}),
		code:     codes.AlreadyExists,
		contains: []string{"create_only"},
	}, {
		name:     "upsert: past --max-total-backends",
		do:       upsertReq(&vipdv1.UpsertServiceRequest{Service: owned("team-a", "new", "198.19.0.3", "198.18.3.1", "198.18.3.2")}),
		code:     codes.ResourceExhausted,
		contains: []string{"--max-total-backends"},
	}, {
		name:     "upsert: a protocol the dataplane lacks",
		do:       upsertReq(&vipdv1.UpsertServiceRequest{Service: sctp}),
		code:     codes.FailedPrecondition,
		contains: []string{"SCTP"},
	}, {
		name: "sync: a change, a create and a delete",
		do:   syncReq("team-a", owned("", "web", "198.19.0.1", "198.18.1.1"), owned("", "new", "198.19.0.3")),
		want: &vipdv1.SyncServicesResponse{Created: []string{"new"}, Updated: []string{"web"}},
	}, {
		name: "sync: deleting everything of an owner",
		do:   syncReq("team-b"),
		want: &vipdv1.SyncServicesResponse{Deleted: []string{"db"}},
	}, {
		name:     "sync: another service's VIP:port",
		do:       syncReq("team-a", owned("", "web", "198.19.0.1"), owned("", "new", "198.19.0.2")),
		code:     codes.AlreadyExists,
		contains: []string{"198.19.0.2:80/TCP", "service db"},
		fields:   []string{"services[1].vips[0]"}, // the culprit, as every sync refusal names it
	}, {
		name:     "sync: another service's VIP as a backend",
		do:       syncReq("team-a", owned("", "web", "198.19.0.1", "198.19.0.2")),
		code:     codes.InvalidArgument,
		contains: []string{"198.19.0.2 is a VIP of service db"},
		fields:   []string{"services[0].backends[0].ip"},
	}, {
		name:     "sync: another owner's service",
		do:       syncReq("team-a", owned("", "db", "198.19.0.2")),
		code:     codes.AlreadyExists,
		contains: []string{"belongs to owner team-b"},
		fields:   []string{"services[0].name"}, // the culprit, as every sync refusal names it
	}, {
		name:   "sync: an invalid field",
		do:     syncReq("team-a", owned("", "web", "198.19.0.1"), owned("", "new", "nope")),
		code:   codes.InvalidArgument,
		fields: []string{"services[1].vips[0]"},
	}, {
		name:     "sync: past --max-total-backends",
		do:       syncReq("team-a", owned("", "web", "198.19.0.1", "198.18.1.1", "198.18.1.2", "198.18.1.3", "198.18.1.4")),
		code:     codes.ResourceExhausted,
		contains: []string{"--max-total-backends"},
		fields:   []string{"services[0]"}, // the culprit, as every sync refusal names it
	}, {
		name: "update backends: one more, and an absent one removed",
		do: updateReq(&vipdv1.UpdateBackendsRequest{Name: "web", Upsert: []*vipdv1.Backend{{Ip: "198.18.1.3"}},
			Remove: []string{"198.18.1.9"}, ExpectedGeneration: 1}),
		want: &vipdv1.UpdateBackendsResponse{Service: stored(owned("team-a", "web", "198.19.0.1", "198.18.1.1", "198.18.1.2", "198.18.1.3"), 3),
			Absent: []string{"198.18.1.9"}},
	}, {
		name:     "update backends: a stale expected_generation",
		do:       updateReq(&vipdv1.UpdateBackendsRequest{Name: "web", Remove: []string{"198.18.1.1"}, ExpectedGeneration: 7}),
		code:     codes.Aborted,
		contains: []string{"expected generation 7"},
	}, {
		name:     "update backends: another service's VIP",
		do:       updateReq(&vipdv1.UpdateBackendsRequest{Name: "web", Upsert: []*vipdv1.Backend{{Ip: "198.19.0.2"}}}),
		code:     codes.InvalidArgument,
		contains: []string{"198.19.0.2 is a VIP of service db"},
		fields:   []string{"upsert[0].ip"},
	}, {
		name:   "update backends: an invalid backend",
		do:     updateReq(&vipdv1.UpdateBackendsRequest{Name: "web", Upsert: []*vipdv1.Backend{{Ip: "198.18.1.3", Weight: 70000}}}),
		code:   codes.InvalidArgument,
		fields: []string{"upsert[0].weight"},
	}, {
		name:     "update backends: past --max-total-backends",
		do:       updateReq(&vipdv1.UpdateBackendsRequest{Name: "db", Upsert: []*vipdv1.Backend{{Ip: "198.18.2.2"}, {Ip: "198.18.2.3"}}}),
		code:     codes.ResourceExhausted,
		contains: []string{"--max-total-backends"},
	}, {
		name: "update backends: an unknown service",
		do:   updateReq(&vipdv1.UpdateBackendsRequest{Name: "nope", Remove: []string{"198.18.1.1"}}),
		code: codes.NotFound,
	}}

	// setup starts an instance in a state directory of its own, holding
	// web and db.
	setup := func(t *testing.T) (*instance, string) {
		dir := t.TempDir()
		dp := fake.New(fake.WithCapabilities(dataplane.Capabilities{
			LoadBalancing: []dataplane.LoadBalancing{dataplane.LoadBalancingRandom},
			Protocols:     []dataplane.Protocol{dataplane.TCP, dataplane.UDP},
		}))
		in := start(t, config{stateDir: dir, dp: dp, limits: validation.Limits{MaxBackends: 100, MaxTotalBackends: 4}})
		upsert(t, in, webSvc)
		upsert(t, in, dbSvc)
		return in, dir
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			in, dir := setup(t)
			before := observe(t, in, dir)
			if before.applied != 2 || len(before.files) == 0 {
				t.Fatalf("setup: applied generation %d, state files %v", before.applied, before.files)
			}
			resp, err := c.do(in)
			if c.code == codes.OK {
				if err != nil {
					t.Fatalf("got %v; want success", err)
				}
				if d := cmp.Diff(c.want, resp, protocmp.Transform()); d != "" {
					t.Errorf("response (-want +got):\n%s", d)
				}
			} else {
				wantCode(t, err, c.code, c.contains...)
				if got := fieldsOf(err); !slices.Equal(got, c.fields) {
					t.Errorf("field violations %v; want %v", got, c.fields)
				}
			}
			after := observe(t, in, dir)
			if d := cmp.Diff(before, after, protocmp.Transform(), cmp.AllowUnexported(observed{})); d != "" {
				t.Errorf("validate_only changed something (-before +after):\n%s", d)
			}
			// No generation was used up: the next real write gets the
			// one validate_only predicts.
			if got := upsert(t, in, owned("team-a", "other", "198.19.0.9")); got.Generation != 3 {
				t.Errorf("the next write got generation %d; want 3", got.Generation)
			}
		})
	}
}
