package server_test

import (
	"slices"
	"testing"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/grpc/codes"
)

// TestExplainMappedAddresses: Explain refuses an IPv4-mapped client_ip or
// vip with InvalidArgument naming the field and the IPv4 form, as
// UpsertService refuses such a VIP or backend, and asks the dataplane
// nothing; the IPv4 forms are explained.
func TestExplainMappedAddresses(t *testing.T) {
	env := startFlows(t)
	vip := webVIP.Addr().String()
	_, err := env.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: web("x", "::ffff:"+vip)})
	wantCode(t, err, codes.InvalidArgument, "use the IPv4 form "+vip)
	for _, tc := range []struct {
		req      *vipdv1.ExplainRequest
		field    string
		contains string
	}{
		{&vipdv1.ExplainRequest{ClientIp: "::ffff:10.0.0.9", Vip: vip, Port: 80}, "client_ip", "use the IPv4 form 10.0.0.9"},
		{&vipdv1.ExplainRequest{ClientIp: "10.0.0.9", Vip: "::ffff:" + vip, Port: 80}, "vip", "use the IPv4 form " + vip},
	} {
		_, err := env.status.Explain(ctxT(t), tc.req)
		wantCode(t, err, codes.InvalidArgument, tc.contains)
		if f := fieldsOf(err); !slices.Equal(f, []string{tc.field}) {
			t.Errorf("Explain(%v): fields %v; want %s", tc.req, f, tc.field)
		}
	}
	if q := env.srv.Dataplane().ExplainQueries(); len(q) != 0 {
		t.Errorf("the dataplane was asked %v about refused requests", q)
	}
	resp, err := env.status.Explain(ctxT(t), &vipdv1.ExplainRequest{ClientIp: "10.0.0.9", Vip: vip, Port: 80})
	if err != nil || resp.Service != "default/web" {
		t.Fatalf("Explain of the IPv4 forms: %v, %v", resp, err)
	}
}
