package server_test

import (
	"strings"
	"testing"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// violation returns the only field violation of err, an InvalidArgument.
func violation(t *testing.T, err error) *errdetails.BadRequest_FieldViolation {
	t.Helper()
	wantCode(t, err, codes.InvalidArgument)
	var vs []*errdetails.BadRequest_FieldViolation
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			vs = append(vs, br.FieldViolations...)
		}
	}
	if len(vs) != 1 {
		t.Fatalf("violations %v; want one", vs)
	}
	return vs[0]
}

// TestVIPAsBackendIsInvalid: a backend whose IP is a VIP that vipd serves
// (another service's or the same one's), and a VIP that is a backend of
// any service, are InvalidArgument on the field that holds the address,
// as the request wrote it, naming the other service; nothing changes.
func TestVIPAsBackendIsInvalid(t *testing.T) {
	type call func(in *instance) error
	upsertSvc := func(svc *vipdv1.Service) call {
		return func(in *instance) error {
			_, err := in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: svc})
			return err
		}
	}
	sync := func(svcs ...*vipdv1.Service) call {
		return func(in *instance) error {
			_, err := in.lb.SyncServices(ctxT(t), &vipdv1.SyncServicesRequest{Owner: "team-a", Services: svcs})
			return err
		}
	}
	update := func(name string, ips ...string) call {
		return func(in *instance) error {
			req := &vipdv1.UpdateBackendsRequest{Name: name}
			for _, ip := range ips {
				req.Upsert = append(req.Upsert, &vipdv1.Backend{Ip: ip})
			}
			_, err := in.lb.UpdateBackends(ctxT(t), req)
			return err
		}
	}
	twoVIPs := owned("team-a", "new", "198.19.0.3", "198.18.3.1")
	twoVIPs.Vips = append(twoVIPs.Vips, "198.18.1.2")
	tests := []struct {
		name     string
		call     call
		field    string // "": success
		contains []string
	}{
		// The backends are out of order on purpose: the path is the
		// request's, not the sorted one's.
		{"upsert: another service's VIP", upsertSvc(owned("team-a", "new", "198.19.0.3", "198.18.3.2", "198.19.0.2", "198.18.3.1")),
			"service.backends[1].ip", []string{"198.19.0.2 is a VIP of service db"}},
		{"upsert: its own VIP", upsertSvc(owned("team-a", "new", "198.19.0.3", "198.18.3.1", "198.19.0.3")),
			"service.backends[1].ip", []string{"198.19.0.3 is a VIP of this service"}},
		{"upsert: a VIP that is another service's backend", upsertSvc(twoVIPs),
			"service.vips[1]", []string{"198.18.1.2 is a backend of service web"}},
		{"upsert: the same backends and one more", upsertSvc(owned("team-a", "web", "198.19.0.1", "198.18.1.1", "198.18.1.2", "198.18.3.3")),
			"", nil},
		{"update backends: another service's VIP", update("web", "198.18.1.9", "198.19.0.2"),
			"upsert[1].ip", []string{"198.19.0.2 is a VIP of service db"}},
		{"update backends: its own VIP", update("web", "198.19.0.1"),
			"upsert[0].ip", []string{"198.19.0.1 is a VIP of this service"}},
		{"sync: another service's VIP", sync(owned("", "web", "198.19.0.1", "198.18.1.1"), owned("", "new", "198.19.0.3", "198.18.9.9", "198.19.0.2", "198.18.3.1")),
			"services[1].backends[1].ip", []string{"198.19.0.2 is a VIP of service db"}},
		{"sync: a VIP that is another owner's backend", sync(owned("", "web", "198.19.0.1"), owned("", "new", "198.18.2.1")),
			"services[1].vips[0]", []string{"198.18.2.1 is a backend of service db"}},
		{"sync: one listed service's VIP as another's backend", sync(owned("", "new", "198.19.0.5"), owned("", "web", "198.19.0.1", "198.18.1.1", "198.19.0.5")),
			"services[1].backends[1].ip", []string{"198.19.0.5 is a VIP of service new"}},
		{"sync: VIPs and backends swapped", sync(owned("", "web", "198.18.1.1", "198.19.0.1")),
			"", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := start(t, config{})
			upsert(t, in, owned("team-a", "web", "198.19.0.1", "198.18.1.1", "198.18.1.2"))
			upsert(t, in, owned("team-b", "db", "198.19.0.2", "198.18.2.1"))
			before, err := in.lb.ListServices(ctxT(t), &vipdv1.ListServicesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			records := len(in.dp.Records())
			err = tt.call(in)
			if tt.field == "" {
				if err != nil {
					t.Fatalf("got %v; want success", err)
				}
				return
			}
			v := violation(t, err)
			if v.Field != tt.field {
				t.Errorf("field %q (%s); want %q", v.Field, v.Description, tt.field)
			}
			for _, c := range tt.contains {
				if !strings.Contains(v.Description, c) {
					t.Errorf("description %q does not say %q", v.Description, c)
				}
			}
			after, err := in.lb.ListServices(ctxT(t), &vipdv1.ListServicesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(before, after) || len(in.dp.Records()) != records {
				t.Errorf("a refused change changed something:\n before %v\n after %v", before, after)
			}
		})
	}
}
