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

// TestMappedAddressesRefusedAlike: an IPv4-mapped IPv6 address gets the
// same violation, word for word, in UpdateBackends' remove and in every
// address of a flow filter as in a service's VIP, naming the field; a
// mapped CIDR in a flow filter names the IPv4 CIDR to write instead.
func TestMappedAddressesRefusedAlike(t *testing.T) {
	svc := valid()
	svc.Vips = []string{"::ffff:10.96.0.10"}
	_, _, sv := validation.Service(svc, validation.Limits{}, "service")
	if len(sv) != 1 || sv[0].Field != "service.vips[0]" {
		t.Fatalf("a mapped VIP: %v", sv)
	}
	want := sv[0].Description
	if _, v := validation.RemovedBackendIP("::ffff:10.96.0.10", "remove[2]"); len(v) != 1 || v[0].Field != "remove[2]" || v[0].Description != want {
		t.Errorf("remove: %v; want on remove[2]: %s", v, want)
	}
	if ip, v := validation.RemovedBackendIP("10.96.0.10", "remove[0]"); len(v) > 0 || ip.String() != "10.96.0.10" {
		t.Errorf("remove of the IPv4 form: %v, %v", ip, v)
	}
	for _, tc := range []struct {
		filter *vipdv1.FlowFilter
		field  string
		desc   string
	}{
		{&vipdv1.FlowFilter{Vip: "::ffff:10.96.0.10"}, "filter.vip", want},
		{&vipdv1.FlowFilter{Backend: "::ffff:10.96.0.10"}, "filter.backend", want},
		{&vipdv1.FlowFilter{Client: "::ffff:10.96.0.10"}, "filter.client", want},
		{&vipdv1.FlowFilter{Vip: "[::ffff:10.96.0.10]:80"}, "filter.vip", `"[::ffff:10.96.0.10]:80" is an IPv4-mapped IPv6 address; use the IPv4 form 10.96.0.10`},
		{&vipdv1.FlowFilter{Client: "::ffff:10.0.0.0/104"}, "filter.client", `"::ffff:10.0.0.0/104" is an IPv4-mapped IPv6 CIDR; use the IPv4 form 10.0.0.0/8`},
	} {
		_, v := validation.FlowFilter(tc.filter, "filter")
		if len(v) != 1 || v[0].Field != tc.field || v[0].Description != tc.desc {
			t.Errorf("FlowFilter(%v): %v; want on %s: %s", tc.filter, v, tc.field, tc.desc)
		}
	}
}
