package validation_test

import (
	"testing"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/validation"
)

// TestExplainRefusesMappedAddressesAsServicesDo: an IPv4-mapped IPv6
// client_ip or vip gets the violation, word for word, that a service's VIP
// or backend written that way gets, rather than being read as its IPv4
// address; a mapped client with an IPv6 VIP too, which is no family
// mismatch but a mapped address.
func TestExplainRefusesMappedAddressesAsServicesDo(t *testing.T) {
	svc := valid()
	svc.Vips = []string{"::ffff:10.96.0.10"}
	_, _, sv := validation.Service(svc, validation.Limits{}, "service")
	if len(sv) != 1 || sv[0].Field != "service.vips[0]" {
		t.Fatalf("a mapped VIP: %v", sv)
	}
	for _, tc := range []struct {
		req   *vipdv1.ExplainRequest
		field string
	}{
		{&vipdv1.ExplainRequest{ClientIp: "::ffff:10.96.0.10", Vip: "10.96.0.20", Port: 80}, "client_ip"},
		{&vipdv1.ExplainRequest{ClientIp: "10.0.0.9", Vip: "::ffff:10.96.0.10", Port: 80}, "vip"},
		{&vipdv1.ExplainRequest{ClientIp: "::ffff:10.96.0.10", Vip: "fd00::10", Port: 80}, "client_ip"},
	} {
		_, v := validation.Explain(tc.req)
		if len(v) != 1 || v[0].Field != tc.field || v[0].Description != sv[0].Description {
			t.Errorf("Explain(%v): %v; want on %s: %s", tc.req, v, tc.field, sv[0].Description)
		}
	}
}
