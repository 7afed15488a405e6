package server_test

import (
	"slices"
	"testing"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
)

// TestUpsertResult: UpsertService says whether it created the service,
// changed it (a new generation, applied) or found it with the same spec
// (the same generation, nothing applied).
func TestUpsertResult(t *testing.T) {
	in := start(t, config{})
	steps := []struct {
		name    string
		svc     *vipdv1.Service
		take    bool
		want    vipdv1.UpsertResult
		gen     uint64
		applies int // new dataplane applies
	}{
		{"a new service", web("web", "198.19.0.1", "198.18.1.1", "198.18.1.2"), false, vipdv1.UpsertResult_UPSERT_RESULT_CREATED, 1, 1},
		{"the same spec", web("web", "198.19.0.1", "198.18.1.1", "198.18.1.2"), false, vipdv1.UpsertResult_UPSERT_RESULT_UNCHANGED, 1, 0},
		{"the same spec, written otherwise", func() *vipdv1.Service {
			s := web("web", "198.19.0.1", "198.18.1.2", "198.18.1.1")
			s.Owner = "default"
			s.Backends[0].Weight = 1
			return s
		}(), false, vipdv1.UpsertResult_UPSERT_RESULT_UNCHANGED, 1, 0},
		{"a backend more", web("web", "198.19.0.1", "198.18.1.1", "198.18.1.2", "198.18.1.3"), false, vipdv1.UpsertResult_UPSERT_RESULT_CONFIGURED, 2, 1},
		{"only the owner changes", owned("nomad", "web", "198.19.0.1", "198.18.1.1", "198.18.1.2", "198.18.1.3"), true, vipdv1.UpsertResult_UPSERT_RESULT_CONFIGURED, 3, 1},
		{"no owner: the same spec", web("web", "198.19.0.1", "198.18.1.1", "198.18.1.2", "198.18.1.3"), false, vipdv1.UpsertResult_UPSERT_RESULT_UNCHANGED, 3, 0},
	}
	for _, s := range steps {
		records := len(in.dp.Records())
		resp, err := in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: s.svc, TakeOwnership: s.take})
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if resp.Result != s.want || resp.Service.Generation != s.gen {
			t.Errorf("%s: %v at generation %d; want %v at %d", s.name, resp.Result, resp.Service.Generation, s.want, s.gen)
		}
		if n := len(in.dp.Records()) - records; n != s.applies {
			t.Errorf("%s: %d dataplane applies; want %d", s.name, n, s.applies)
		}
	}
}

// TestUpdateBackendsAbsent: UpdateBackends lists the IPs of remove that
// the service did not have, as the request wrote them, in request order
// and once each, and removes the others.
func TestUpdateBackendsAbsent(t *testing.T) {
	in := start(t, config{})
	upsert(t, in, web("web", "198.19.0.1", "198.18.1.1", "198.18.1.2", "198.18.1.3"))
	resp, err := in.lb.UpdateBackends(ctxT(t), &vipdv1.UpdateBackendsRequest{Name: "web",
		Remove: []string{"198.18.1.9", "198.18.1.2", "198.18.1.9", "198.18.1.8", "198.18.1.3"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"198.18.1.9", "198.18.1.8"}; !slices.Equal(resp.Absent, want) {
		t.Errorf("absent %q; want %q", resp.Absent, want)
	}
	if got := backendIPs(resp.Service); !slices.Equal(got, []string{"198.18.1.1"}) || resp.Service.Generation != 2 {
		t.Errorf("service has %v at generation %d; want [198.18.1.1] at 2", got, resp.Service.Generation)
	}

	// Only absent IPs: nothing changes, not even the generation.
	records := len(in.dp.Records())
	resp, err = in.lb.UpdateBackends(ctxT(t), &vipdv1.UpdateBackendsRequest{Name: "web", Remove: []string{"198.18.1.2"}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(resp.Absent, []string{"198.18.1.2"}) || resp.Service.Generation != 2 || len(in.dp.Records()) != records {
		t.Errorf("absent %q at generation %d, %d new applies; want [198.18.1.2] at 2, none", resp.Absent, resp.Service.Generation, len(in.dp.Records())-records)
	}

	// Nothing absent: an empty list.
	resp, err = in.lb.UpdateBackends(ctxT(t), &vipdv1.UpdateBackendsRequest{Name: "web", Remove: []string{"198.18.1.1"}})
	if err != nil || len(resp.Absent) != 0 {
		t.Errorf("absent %q (%v); want none", resp.GetAbsent(), err)
	}
}

func backendIPs(svc *vipdv1.Service) []string {
	var ips []string
	for _, b := range svc.GetBackends() {
		ips = append(ips, b.Ip)
	}
	return ips
}

// TestUpdateBackendsRemoveMapped: an IPv4-mapped address in remove is
// InvalidArgument naming remove[i] and the IPv4 form, as a mapped VIP or
// backend is, and nothing changes; it is not taken for its IPv4 address.
func TestUpdateBackendsRemoveMapped(t *testing.T) {
	in := start(t, config{})
	before := upsert(t, in, web("web", "198.19.0.1", "198.18.1.1", "198.18.1.2"))
	_, err := in.lb.UpdateBackends(ctxT(t), &vipdv1.UpdateBackendsRequest{Name: "web", Remove: []string{"198.18.1.2", "::ffff:198.18.1.1"}})
	wantCode(t, err, codes.InvalidArgument, `"::ffff:198.18.1.1" is an IPv4-mapped IPv6 address; use the IPv4 form 198.18.1.1`)
	if f := fieldsOf(err); !slices.Equal(f, []string{"remove[1]"}) {
		t.Errorf("fields %v; want remove[1]", f)
	}
	got, err := in.lb.GetService(ctxT(t), &vipdv1.GetServiceRequest{Name: "web"})
	if err != nil || !proto.Equal(got.Service, before) {
		t.Errorf("service after the refused remove: %v %v; want it unchanged: %v", got, err, before)
	}
}
