package server_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/dataplane/fake"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server"
	"github.com/vipd/vipd/server/authz"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// owned is web(name, vip) of owner.
func owned(owner, name, vip string, backends ...string) *vipdv1.Service {
	s := web(name, vip, backends...)
	s.Owner = owner
	return s
}

// TestCreateOnly: an UpsertService with create_only creates a free name,
// and is AlreadyExists for a name that exists, whoever owns it and whatever
// its spec, changing nothing; combined with expected_generation it is
// InvalidArgument naming create_only.
func TestCreateOnly(t *testing.T) {
	tests := []struct {
		name     string
		existing *vipdv1.Service // stored before the create; nil: none
		req      *vipdv1.UpsertServiceRequest
		code     codes.Code
		contains []string // in the message
		fields   []string // InvalidArgument's field violations
	}{{
		name: "a free name is created",
		req:  &vipdv1.UpsertServiceRequest{Service: owned("team-a", "s", "198.19.0.1", "198.18.1.1"), CreateOnly: true},
		code: codes.OK,
	}, {
		name:     "the name exists under the same owner",
		existing: owned("team-a", "s", "198.19.0.1", "198.18.1.1"),
		req:      &vipdv1.UpsertServiceRequest{Service: owned("team-a", "s", "198.19.0.2", "198.18.1.2"), CreateOnly: true},
		code:     codes.AlreadyExists,
		contains: []string{"service s already exists", "owner team-a", "create_only"},
	}, {
		name:     "the name exists under another owner",
		existing: owned("team-b", "s", "198.19.0.1", "198.18.1.1"),
		req:      &vipdv1.UpsertServiceRequest{Service: owned("team-a", "s", "198.19.0.2"), CreateOnly: true},
		code:     codes.AlreadyExists,
		contains: []string{"service s already exists", "owner team-b"},
	}, {
		name:     "the name exists with the very same spec: still no no-op",
		existing: owned("team-a", "s", "198.19.0.1", "198.18.1.1"),
		req:      &vipdv1.UpsertServiceRequest{Service: owned("team-a", "s", "198.19.0.1", "198.18.1.1"), CreateOnly: true},
		code:     codes.AlreadyExists,
		contains: []string{"service s already exists"},
	}, {
		name:     "a free name whose VIP:port another service holds",
		existing: owned("team-b", "other", "198.19.0.1"),
		req:      &vipdv1.UpsertServiceRequest{Service: owned("team-a", "s", "198.19.0.1"), CreateOnly: true},
		code:     codes.AlreadyExists,
		contains: []string{"198.19.0.1:80/TCP", "service other"},
	}, {
		name:     "combined with expected_generation",
		existing: owned("team-a", "s", "198.19.0.1"),
		req:      &vipdv1.UpsertServiceRequest{Service: owned("team-a", "s", "198.19.0.2"), CreateOnly: true, ExpectedGeneration: 1},
		code:     codes.InvalidArgument,
		contains: []string{"expected_generation"},
		fields:   []string{"create_only"},
	}, {
		name: "combined with expected_generation, with an invalid service too: both named",
		req: &vipdv1.UpsertServiceRequest{Service: &vipdv1.Service{Name: "s", Vips: []string{"198.19.0.300"}, Ports: []*vipdv1.Port{{Port: 80}}},
			CreateOnly: true, ExpectedGeneration: 7},
		code:   codes.InvalidArgument,
		fields: []string{"create_only", "service.vips[0]"},
	}, {
		name:   "an invalid service is InvalidArgument as without create_only",
		req:    &vipdv1.UpsertServiceRequest{Service: &vipdv1.Service{Name: "s", Ports: []*vipdv1.Port{{Port: 80}}}, CreateOnly: true},
		code:   codes.InvalidArgument,
		fields: []string{"service.vips"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := start(t, config{})
			var before *vipdv1.Service
			if tt.existing != nil {
				before = upsert(t, in, tt.existing)
			}
			records := len(in.dp.Records())
			resp, err := in.lb.UpsertService(ctxT(t), tt.req)
			if tt.code == codes.OK {
				if err != nil {
					t.Fatalf("create: %v", err)
				}
				got, gerr := in.lb.GetService(ctxT(t), &vipdv1.GetServiceRequest{Name: tt.req.Service.Name})
				if gerr != nil || !proto.Equal(got.Service, resp.Service) || resp.Service.Generation == 0 {
					t.Fatalf("stored %v (%v); want the created %v, with a generation", got, gerr, resp.Service)
				}
				if names := appliedNames(in); !slices.Contains(names, tt.req.Service.Name) {
					t.Fatalf("dataplane has %v; want %s applied", names, tt.req.Service.Name)
				}
				return
			}
			wantCode(t, err, tt.code, tt.contains...)
			if got := fieldsOf(err); !slices.Equal(got, tt.fields) {
				t.Errorf("field violations %v; want %v", got, tt.fields)
			}
			if n := len(in.dp.Records()); n != records {
				t.Errorf("a refused create reached the dataplane (%d applies, want %d)", n, records)
			}
			list, lerr := in.lb.ListServices(ctxT(t), &vipdv1.ListServicesRequest{})
			if lerr != nil {
				t.Fatal(lerr)
			}
			if before == nil {
				if len(list.Services) != 0 {
					t.Errorf("services after a refused create: %v; want none", list.Services)
				}
				return
			}
			if len(list.Services) != 1 || !proto.Equal(list.Services[0], before) {
				t.Errorf("services after a refused create: %v; want only the existing one, unchanged: %v", list.Services, before)
			}
		})
	}
}

// TestCreateOnlyIsAtomicWithTheChange: the name check is made in the same
// transaction as the write. While one create of a name is being applied,
// a second create of it queues behind it; it must be judged against the
// state after the first (AlreadyExists), not the one it saw arriving, and
// must not replace the first.
func TestCreateOnlyIsAtomicWithTheChange(t *testing.T) {
	dp := fake.New()
	in := start(t, config{dp: dp})
	entered, release := blockNextApply(t, dp)
	first := make(chan error, 1)
	go func() {
		_, err := in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: owned("team-a", "s", "198.19.0.1", "198.18.1.1"), CreateOnly: true})
		first <- err
	}()
	<-entered
	// The first create is in the dataplane, not yet stored: a snapshot
	// read now finds no service s.
	if _, err := in.lb.GetService(ctxT(t), &vipdv1.GetServiceRequest{Name: "s"}); status.Code(err) != codes.NotFound {
		t.Fatalf("GetService while the first create is applied: %v; want NotFound", err)
	}
	second := make(chan error, 1)
	go func() {
		_, err := in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: owned("team-b", "s", "198.19.0.2", "198.18.1.2"), CreateOnly: true})
		second <- err
	}()
	// Let it arrive and queue behind the first (as the owner-check test
	// does): had it checked the name outside the transaction, it would
	// have found it free by now.
	time.Sleep(100 * time.Millisecond)
	release()
	if err := <-first; err != nil {
		t.Fatalf("first create: %v", err)
	}
	wantCode(t, <-second, codes.AlreadyExists, "owner team-a")
	got, err := in.lb.GetService(ctxT(t), &vipdv1.GetServiceRequest{Name: "s"})
	if err != nil || got.Service.Owner != "team-a" || got.Service.Vips[0] != "198.19.0.1" {
		t.Fatalf("service s after both creates: %v %v; want the first's", got, err)
	}
}

// TestConcurrentCreates: of many clients creating one name at once, with
// different owners and VIPs, exactly one succeeds; the stored service is
// the winner's, and every other gets AlreadyExists.
func TestConcurrentCreates(t *testing.T) {
	const n = 16
	in := start(t, config{})
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			_, errs[i] = in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{
				Service:    owned(fmt.Sprintf("owner-%d", i), "s", fmt.Sprintf("198.19.0.%d", i+1), fmt.Sprintf("198.18.1.%d", i+1)),
				CreateOnly: true,
			})
		})
	}
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch status.Code(err) {
		case codes.OK:
			if winner >= 0 {
				t.Fatalf("creates %d and %d both succeeded", winner, i)
			}
			winner = i
		case codes.AlreadyExists:
		default:
			t.Fatalf("create %d: %v; want OK or AlreadyExists", i, err)
		}
	}
	if winner < 0 {
		t.Fatal("no create succeeded")
	}
	got, err := in.lb.GetService(ctxT(t), &vipdv1.GetServiceRequest{Name: "s"})
	if err != nil || got.Service.Owner != fmt.Sprintf("owner-%d", winner) || got.Service.Vips[0] != fmt.Sprintf("198.19.0.%d", winner+1) {
		t.Fatalf("stored %v (%v); want the winner's, owner-%d", got, err, winner)
	}
	applied, _ := in.dp.Applied()
	if len(applied) != 1 || applied["s"] == nil || applied["s"].Owner != got.Service.Owner {
		t.Fatalf("dataplane has %v; want only the winner's s", applied)
	}
}

// TestCreateOnlyAuthorization: a create needs permission for the new
// owner only. A name that exists is AlreadyExists even when it is held by
// an owner the caller may not change: the create does not touch it.
func TestCreateOnlyAuthorization(t *testing.T) {
	policy, err := authz.Parse([]byte("ctrl-a: [team-a]\nadmin: \"*\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	in := start(t, config{serverOps: []server.Option{withTestIdentities(policy)}})
	theirs := upsert(t, in, owned("team-b", "s", "198.19.0.1"))

	_, err = in.lb.UpsertService(as(t, "ctrl-a"), &vipdv1.UpsertServiceRequest{Service: owned("team-a", "s", "198.19.0.2"), CreateOnly: true})
	wantCode(t, err, codes.AlreadyExists, "owner team-b")
	_, err = in.lb.UpsertService(as(t, "ctrl-a"), &vipdv1.UpsertServiceRequest{Service: owned("team-b", "t", "198.19.0.3"), CreateOnly: true})
	wantCode(t, err, codes.PermissionDenied, `owner "team-b"`)
	if _, err := in.lb.UpsertService(as(t, "ctrl-a"), &vipdv1.UpsertServiceRequest{Service: owned("team-a", "t", "198.19.0.3"), CreateOnly: true}); err != nil {
		t.Fatalf("create of a free name for an allowed owner: %v", err)
	}
	got, err := in.lb.GetService(ctxT(t), &vipdv1.GetServiceRequest{Name: "s"})
	if err != nil || !proto.Equal(got.Service, theirs) {
		t.Fatalf("team-b's s is now %v (%v); want unchanged %v", got, err, theirs)
	}
}

// TestCreateOnlyTakenNameNeedsNoPermission: a create_only of a name that
// another owner's service holds is AlreadyExists for a client that may
// not change that owner, also when the request gives no owner (which for
// an upsert would mean the stored one); it is never PermissionDenied.
func TestCreateOnlyTakenNameNeedsNoPermission(t *testing.T) {
	policy, err := authz.Parse([]byte("ctrl-a: [team-a, default]\n"))
	if err != nil {
		t.Fatal(err)
	}
	in := start(t, config{serverOps: []server.Option{withTestIdentities(policy)}})
	before := upsert(t, in, owned("team-b", "s", "198.19.0.1", "198.18.1.1"))
	for _, owner := range []string{"", "team-a"} {
		_, err := in.lb.UpsertService(as(t, "ctrl-a"), &vipdv1.UpsertServiceRequest{Service: owned(owner, "s", "198.19.0.2"), CreateOnly: true})
		wantCode(t, err, codes.AlreadyExists, "service s already exists", "owner team-b")
	}
	got, err := in.lb.GetService(ctxT(t), &vipdv1.GetServiceRequest{Name: "s"})
	if err != nil || !proto.Equal(got.Service, before) {
		t.Fatalf("service s after the refused creates: %v %v; want it unchanged: %v", got, err, before)
	}
}
