package validation_test

import (
	"slices"
	"testing"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/validation"
)

// TestBackendAddressRules: no service may have a backend whose address no
// host can answer on, in either family, or in an IPv4-mapped IPv6 form:
// loopback, link-local multicast (multicast in all), unspecified, the
// reserved 240.0.0.0/4 and 255.255.255.255. The violation names
// backends[i].ip, and upsert[i].ip through validation.Backend as
// UpdateBackends calls it. Addresses just outside the ranges pass.
func TestBackendAddressRules(t *testing.T) {
	refused := []string{
		"127.0.0.1", "127.255.255.254", "::1",
		"224.0.0.1", "224.0.0.251", "224.0.0.255", "ff02::1", "ff02::1:2",
		"0.0.0.0", "::",
		"240.0.0.0", "240.0.0.1", "250.1.2.3", "255.255.255.254", "255.255.255.255",
		"::ffff:127.0.0.1", "::ffff:224.0.0.1", "::ffff:0.0.0.0", "::ffff:240.0.0.1", "::ffff:255.255.255.255",
	}
	accepted := []string{"223.255.255.254", "128.0.0.1", "126.255.255.254", "198.18.1.1", "fd00:198::1", "2001:db8::1"}
	svc := func(ip string) *vipdv1.Service {
		return &vipdv1.Service{
			Name:     "default/web",
			Vips:     []string{"10.96.0.10", "fd00:96::10"},
			Ports:    []*vipdv1.Port{{Name: "http", Port: 80}},
			Backends: []*vipdv1.Backend{{Ip: "10.0.0.1"}, {Ip: ip}},
		}
	}
	for _, ip := range refused {
		_, _, v := validation.Service(svc(ip), validation.Limits{}, "service")
		if got := violationFields(v); !slices.Equal(got, []string{"service.backends[1].ip"}) {
			t.Errorf("backend %s: violations %v; want service.backends[1].ip", ip, v)
		}
		_, dp, v := validation.Service(svc("10.0.0.2"), validation.Limits{}, "service")
		if len(v) > 0 {
			t.Fatal(v)
		}
		ctx := validation.NewBackendContext(dp)
		if _, v := validation.Backend(&vipdv1.Backend{Ip: ip}, ctx, "upsert[0]"); !slices.Equal(violationFields(v), []string{"upsert[0].ip"}) {
			t.Errorf("upsert %s: violations %v; want upsert[0].ip", ip, v)
		}
	}
	for _, ip := range accepted {
		if _, _, v := validation.Service(svc(ip), validation.Limits{}, "service"); len(v) > 0 {
			t.Errorf("backend %s: %v; want it accepted", ip, v)
		}
	}
}

// violationFields lists the field paths of v in order.
func violationFields(v validation.Violations) []string {
	var f []string
	for _, x := range v {
		f = append(f, x.Field)
	}
	return f
}
