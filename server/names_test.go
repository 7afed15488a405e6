package server_test

import (
	"slices"
	"testing"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/grpc/codes"
)

// TestUnsafeServiceNames: the names ".", "..", "/" and "-" (and the like:
// see validation.NewName) are InvalidArgument on the field that holds
// them in every call that would create them, and nothing is stored; a
// call that only looks a name up (DeleteService) finds no such service.
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
		wantCode(t, err, codes.NotFound)
	}
	list, err := in.lb.ListServices(ctxT(t), &vipdv1.ListServicesRequest{})
	if err != nil || len(list.Services) != 0 {
		t.Fatalf("services after refused writes: %v (%v); want none", list.GetServices(), err)
	}
}

// legacyState returns a state dir holding what vipd admitted before the
// unsafe-name rule (validation.NewName): service "web/" of owner "team/",
// and "default/ok" of owner "team/" too.
func legacyState(t *testing.T) string {
	t.Helper()
	path := t.TempDir()
	dir, err := store.OpenDir(path)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	snap, err := dir.Load()
	if err != nil {
		t.Fatal(err)
	}
	tx := snap.Begin()
	for _, svc := range []*vipdv1.Service{owned("team/", "web/", "198.19.0.1", "198.18.1.1"), owned("team/", "default/ok", "198.19.0.2")} {
		out, dp, v := validation.Service(svc, validation.Limits{}, "service")
		if len(v) > 0 {
			t.Fatal(v)
		}
		if _, err := tx.Put(out, dp); err != nil {
			t.Fatal(err)
		}
	}
	if err := dir.Save(tx.Commit()); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestLegacyUnsafeNames: a service and an owner that an earlier vipd
// stored under a name the unsafe-name rule now refuses can still be read,
// listed, changed, synced and deleted; only a new name or a new owner is
// refused.
func TestLegacyUnsafeNames(t *testing.T) {
	in := start(t, config{stateDir: legacyState(t)})
	<-in.ready

	if got, err := in.lb.GetService(ctxT(t), &vipdv1.GetServiceRequest{Name: "web/"}); err != nil || got.Service.Owner != "team/" {
		t.Fatalf("GetService web/: %v %v", got, err)
	}
	list, err := in.lb.ListServices(ctxT(t), &vipdv1.ListServicesRequest{Owner: "team/"})
	if err != nil || len(list.Services) != 2 {
		t.Fatalf("ListServices owner team/: %v %v; want its 2 services", list, err)
	}
	if _, err := in.lb.UpdateBackends(ctxT(t), &vipdv1.UpdateBackendsRequest{Name: "web/", Upsert: []*vipdv1.Backend{{Ip: "198.18.1.2"}}}); err != nil {
		t.Fatalf("UpdateBackends web/: %v", err)
	}
	// An upsert without an owner keeps team/; one naming it does too.
	if _, err := in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: web("web/", "198.19.0.1", "198.18.1.3")}); err != nil {
		t.Fatalf("UpsertService web/ without an owner: %v", err)
	}
	if _, err := in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: owned("team/", "default/ok", "198.19.0.3")}); err != nil {
		t.Fatalf("UpsertService default/ok of owner team/: %v", err)
	}
	// A new service of the existing owner, by upsert and by sync.
	if _, err := in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: owned("team/", "default/new", "198.19.0.4")}); err != nil {
		t.Fatalf("UpsertService of a new service of owner team/: %v", err)
	}
	resp, err := in.lb.SyncServices(ctxT(t), &vipdv1.SyncServicesRequest{Owner: "team/", Services: []*vipdv1.Service{
		web("web/", "198.19.0.1", "198.18.1.3"), web("default/ok", "198.19.0.3"), web("default/synced", "198.19.0.5"),
	}})
	if err != nil {
		t.Fatalf("SyncServices owner team/: %v", err)
	}
	if !slices.Equal(resp.Created, []string{"default/synced"}) || !slices.Equal(resp.Deleted, []string{"default/new"}) {
		t.Errorf("SyncServices owner team/: created %v, deleted %v; want [default/synced], [default/new]", resp.Created, resp.Deleted)
	}

	// New unsafe names and owners are refused, on the field that has them.
	refused := []struct {
		call   func() error
		fields []string
	}{
		{func() error {
			_, err := in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: owned("team/", "new/", "198.19.0.6")})
			return err
		}, []string{"service.name"}},
		{func() error {
			_, err := in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: owned("other/", "default/x", "198.19.0.6")})
			return err
		}, []string{"service.owner"}},
		{func() error {
			_, err := in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: owned("other/", "web/", "198.19.0.1"), TakeOwnership: true})
			return err
		}, []string{"service.owner"}},
		{func() error {
			_, err := in.lb.SyncServices(ctxT(t), &vipdv1.SyncServicesRequest{Owner: "team/", Services: []*vipdv1.Service{
				web("web/", "198.19.0.1"), web("new/", "198.19.0.6")}})
			return err
		}, []string{"services[1].name"}},
		{func() error {
			_, err := in.lb.SyncServices(ctxT(t), &vipdv1.SyncServicesRequest{Owner: "other/"})
			return err
		}, []string{"owner"}},
	}
	for i, r := range refused {
		err := r.call()
		wantCode(t, err, codes.InvalidArgument)
		if f := fieldsOf(err); !slices.Equal(f, r.fields) {
			t.Errorf("refused call %d: fields %v; want %v", i, f, r.fields)
		}
	}

	if _, err := in.lb.DeleteService(ctxT(t), &vipdv1.DeleteServiceRequest{Name: "web/"}); err != nil {
		t.Fatalf("DeleteService web/: %v", err)
	}
	list, err = in.lb.ListServices(ctxT(t), &vipdv1.ListServicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range list.Services {
		names = append(names, s.Owner+" "+s.Name)
	}
	if want := []string{"team/ default/ok", "team/ default/synced"}; !slices.Equal(names, want) {
		t.Errorf("services at the end: %v; want %v", names, want)
	}
}
