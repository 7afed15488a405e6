package server_test

import (
	"testing"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
)

// TestUpsertNeverTakesOverSilently: an UpsertService that names another
// owner than the stored service's is FailedPrecondition naming the stored
// owner, and changes nothing, unless it sets take_ownership; one that names
// no owner keeps the stored owner, and a new service without an owner gets
// "default".
func TestUpsertNeverTakesOverSilently(t *testing.T) {
	tests := []struct {
		name      string
		req       *vipdv1.UpsertServiceRequest
		code      codes.Code
		contains  []string
		wantOwner string // on success
	}{{
		name:     "another owner without take_ownership",
		req:      &vipdv1.UpsertServiceRequest{Service: owned("default", "web", "198.19.0.1", "198.18.1.2")},
		code:     codes.FailedPrecondition,
		contains: []string{`service "web" is owned by "nomad"`, "take_ownership"},
	}, {
		name:     "another owner, with the same spec otherwise",
		req:      &vipdv1.UpsertServiceRequest{Service: owned("default", "web", "198.19.0.1", "198.18.1.1")},
		code:     codes.FailedPrecondition,
		contains: []string{`owned by "nomad"`},
	}, {
		name:     "another owner with a matching expected_generation",
		req:      &vipdv1.UpsertServiceRequest{Service: owned("team-a", "web", "198.19.0.1"), ExpectedGeneration: 1},
		code:     codes.FailedPrecondition,
		contains: []string{`owned by "nomad"`},
	}, {
		name:     "another owner with a stale expected_generation: the generation first",
		req:      &vipdv1.UpsertServiceRequest{Service: owned("team-a", "web", "198.19.0.1"), ExpectedGeneration: 7},
		code:     codes.Aborted,
		contains: []string{"expected generation 7"},
	}, {
		name:      "another owner with take_ownership",
		req:       &vipdv1.UpsertServiceRequest{Service: owned("default", "web", "198.19.0.1", "198.18.1.2"), TakeOwnership: true},
		wantOwner: "default",
	}, {
		name:      "no owner keeps the stored one",
		req:       &vipdv1.UpsertServiceRequest{Service: web("web", "198.19.0.1", "198.18.1.2")},
		wantOwner: "nomad",
	}, {
		name:      "no owner with take_ownership still keeps the stored one",
		req:       &vipdv1.UpsertServiceRequest{Service: web("web", "198.19.0.1", "198.18.1.2"), TakeOwnership: true},
		wantOwner: "nomad",
	}, {
		name:      "the same owner",
		req:       &vipdv1.UpsertServiceRequest{Service: owned("nomad", "web", "198.19.0.1", "198.18.1.2")},
		wantOwner: "nomad",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := start(t, config{})
			before := upsert(t, in, owned("nomad", "web", "198.19.0.1", "198.18.1.1"))
			records := len(in.dp.Records())
			resp, err := in.lb.UpsertService(ctxT(t), tt.req)
			got, gerr := in.lb.GetService(ctxT(t), &vipdv1.GetServiceRequest{Name: "web"})
			if gerr != nil {
				t.Fatal(gerr)
			}
			if tt.code != codes.OK {
				wantCode(t, err, tt.code, tt.contains...)
				if !proto.Equal(got.Service, before) {
					t.Errorf("a refused upsert changed the service:\n got %v\nwant %v", got.Service, before)
				}
				if n := len(in.dp.Records()); n != records {
					t.Errorf("a refused upsert reached the dataplane (%d applies, want %d)", n, records)
				}
				return
			}
			if err != nil {
				t.Fatalf("upsert: %v", err)
			}
			if resp.Service.Owner != tt.wantOwner || got.Service.Owner != tt.wantOwner {
				t.Errorf("owner %q in the response, %q stored; want %q", resp.Service.Owner, got.Service.Owner, tt.wantOwner)
			}
			applied, _ := in.dp.Applied()
			if o := applied["web"].Owner; o != tt.wantOwner {
				t.Errorf("the dataplane has owner %q; want %q", o, tt.wantOwner)
			}
		})
	}

	t.Run("a new service without an owner is the default owner's", func(t *testing.T) {
		in := start(t, config{})
		if got := upsert(t, in, web("web", "198.19.0.1")); got.Owner != "default" {
			t.Fatalf("owner %q; want default", got.Owner)
		}
	})
}

// TestSyncServicesNeverTakesOver: a SyncServices that lists a name another
// owner holds fails as a whole and changes nothing; take_ownership is an
// UpsertService field only.
func TestSyncServicesNeverTakesOver(t *testing.T) {
	in := start(t, config{})
	nomad := upsert(t, in, owned("nomad", "web", "198.19.0.1", "198.18.1.1"))
	_, err := in.lb.SyncServices(ctxT(t), &vipdv1.SyncServicesRequest{Owner: "default",
		Services: []*vipdv1.Service{web("web", "198.19.0.1"), web("other", "198.19.0.2")}})
	wantCode(t, err, codes.AlreadyExists, "belongs to owner nomad")
	list, err := in.lb.ListServices(ctxT(t), &vipdv1.ListServicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Services) != 1 || !proto.Equal(list.Services[0], nomad) {
		t.Fatalf("services after a refused sync: %v; want only %v", list.Services, nomad)
	}
}
