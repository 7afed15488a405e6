package server_test

import (
	"slices"
	"testing"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/grpc/codes"
)

// TestUnsafeServiceNames: the names ".", "..", "/" and "-" (and the like:
// see validation.Name) are InvalidArgument on the field that holds them,
// in every call that takes a name, and nothing is stored.
func TestUnsafeServiceNames(t *testing.T) {
	in := start(t, config{})
	for _, name := range []string{".", "..", "/", "-"} {
		_, err := in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: web(name, "198.19.0.1")})
		wantCode(t, err, codes.InvalidArgument)
		if f := fieldsOf(err); !slices.Equal(f, []string{"service.name"}) {
			t.Errorf("upsert %q: fields %v; want service.name", name, f)
		}
		_, err = in.lb.SyncServices(ctxT(t), &vipdv1.SyncServicesRequest{Owner: "team-a", Services: []*vipdv1.Service{web(name, "198.19.0.1")}})
		if f := fieldsOf(err); !slices.Equal(f, []string{"services[0].name"}) {
			t.Errorf("sync %q: fields %v; want services[0].name", name, f)
		}
		_, err = in.lb.SyncServices(ctxT(t), &vipdv1.SyncServicesRequest{Owner: name})
		if f := fieldsOf(err); !slices.Equal(f, []string{"owner"}) {
			t.Errorf("sync of owner %q: fields %v; want owner", name, f)
		}
		_, err = in.lb.DeleteService(ctxT(t), &vipdv1.DeleteServiceRequest{Name: name})
		if f := fieldsOf(err); !slices.Equal(f, []string{"name"}) {
			t.Errorf("delete %q: fields %v; want name", name, f)
		}
	}
	list, err := in.lb.ListServices(ctxT(t), &vipdv1.ListServicesRequest{})
	if err != nil || len(list.Services) != 0 {
		t.Fatalf("services after refused writes: %v (%v); want none", list.GetServices(), err)
	}
}
