package validation_test

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vipd/vipd/dataplane"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/flowhub"
	"github.com/vipd/vipd/server/validation"
)

func TestFlowFilter(t *testing.T) {
	for _, tc := range []struct {
		name  string
		in    *vipdv1.FlowFilter
		want  flowhub.Filter
		field string // of the one violation expected, if any
	}{
		{name: "nil", in: nil},
		{name: "empty", in: &vipdv1.FlowFilter{}},
		{name: "service", in: &vipdv1.FlowFilter{Service: "default/web"}, want: flowhub.Filter{Service: "default/web"}},
		{name: "bad service", in: &vipdv1.FlowFilter{Service: "Default/Web"}, field: "f.service"},
		{name: "vip", in: &vipdv1.FlowFilter{Vip: "10.96.0.10"}, want: flowhub.Filter{VIP: netip.MustParseAddr("10.96.0.10")}},
		{name: "vip:port", in: &vipdv1.FlowFilter{Vip: "10.96.0.10:80"}, want: flowhub.Filter{VIP: netip.MustParseAddr("10.96.0.10"), VIPPort: 80}},
		{name: "ipv6 vip", in: &vipdv1.FlowFilter{Vip: "fd00::10"}, want: flowhub.Filter{VIP: netip.MustParseAddr("fd00::10")}},
		{name: "[ipv6 vip]:port", in: &vipdv1.FlowFilter{Vip: "[fd00::10]:443"}, want: flowhub.Filter{VIP: netip.MustParseAddr("fd00::10"), VIPPort: 443}},
		// IPv4-mapped addresses are refused, as everywhere in the API (see TestMappedAddressesRefusedAlike).
		{name: "mapped vip", in: &vipdv1.FlowFilter{Vip: "::ffff:10.96.0.10"}, field: "f.vip"},
		{name: "mapped vip:port", in: &vipdv1.FlowFilter{Vip: "[::ffff:10.96.0.10]:80"}, field: "f.vip"},
		{name: "mapped backend", in: &vipdv1.FlowFilter{Backend: "::ffff:10.0.1.5"}, field: "f.backend"},
		{name: "mapped client ip", in: &vipdv1.FlowFilter{Client: "::ffff:10.0.0.9"}, field: "f.client"},
		{name: "vip port 0", in: &vipdv1.FlowFilter{Vip: "10.96.0.10:0"}, field: "f.vip"},
		{name: "vip with zone", in: &vipdv1.FlowFilter{Vip: "fe80::1%eth0"}, field: "f.vip"},
		{name: "vip not an address", in: &vipdv1.FlowFilter{Vip: "web"}, field: "f.vip"},
		{name: "backend:port", in: &vipdv1.FlowFilter{Backend: "10.0.1.5:8080"}, want: flowhub.Filter{Backend: netip.MustParseAddr("10.0.1.5"), BackendPort: 8080}},
		{name: "backend port out of range", in: &vipdv1.FlowFilter{Backend: "10.0.1.5:80800"}, field: "f.backend"},
		{name: "client ip", in: &vipdv1.FlowFilter{Client: "10.0.0.9"}, want: flowhub.Filter{Client: netip.MustParsePrefix("10.0.0.9/32")}},
		{name: "client ipv6", in: &vipdv1.FlowFilter{Client: "fd00::9"}, want: flowhub.Filter{Client: netip.MustParsePrefix("fd00::9/128")}},
		{name: "client cidr is masked", in: &vipdv1.FlowFilter{Client: "10.0.0.9/8"}, want: flowhub.Filter{Client: netip.MustParsePrefix("10.0.0.0/8")}},
		{name: "mapped client cidr", in: &vipdv1.FlowFilter{Client: "::ffff:10.0.0.0/104"}, field: "f.client"},
		{name: "mapped client cidr /96", in: &vipdv1.FlowFilter{Client: "::ffff:0.0.0.0/96"}, field: "f.client"},
		// Found by FuzzFlowFilter: it also covers IPv6 addresses that no IPv4 CIDR can stand for.
		{name: "mapped client cidr shorter than /96", in: &vipdv1.FlowFilter{Client: "::ffff:0.0.0.0/90"}, field: "f.client"},
		{name: "bad client cidr", in: &vipdv1.FlowFilter{Client: "10.0.0.0/33"}, field: "f.client"},
		{name: "bad client", in: &vipdv1.FlowFilter{Client: "me"}, field: "f.client"},
		{name: "protocol", in: &vipdv1.FlowFilter{Protocol: vipdv1.Protocol_PROTOCOL_SCTP}, want: flowhub.Filter{Protocol: dataplane.SCTP}},
		{name: "unknown protocol", in: &vipdv1.FlowFilter{Protocol: 4}, field: "f.protocol"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, v := validation.FlowFilter(tc.in, "f")
			if tc.field != "" {
				if len(v) != 1 || v[0].Field != tc.field {
					t.Fatalf("violations %v, want one of %s", v, tc.field)
				}
				return
			}
			if len(v) > 0 {
				t.Fatalf("violations %v", v)
			}
			if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
				cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
				t.Errorf("filter (-want +got):\n%s", diff)
			}
		})
	}
}

func TestFlowTypes(t *testing.T) {
	const (
		newT      = vipdv1.FlowEventType_FLOW_EVENT_TYPE_NEW
		closedT   = vipdv1.FlowEventType_FLOW_EVENT_TYPE_CLOSED
		existingT = vipdv1.FlowEventType_FLOW_EVENT_TYPE_EXISTING
	)
	for _, tc := range []struct {
		in       []vipdv1.FlowEventType
		live     []dataplane.FlowEventType
		existing bool
		watch    bool
	}{
		{nil, nil, false, true},
		{[]vipdv1.FlowEventType{newT}, []dataplane.FlowEventType{dataplane.FlowNew}, false, true},
		{[]vipdv1.FlowEventType{closedT, existingT}, []dataplane.FlowEventType{dataplane.FlowClosed}, true, true},
		{[]vipdv1.FlowEventType{existingT}, nil, true, false},
		{[]vipdv1.FlowEventType{vipdv1.FlowEventType_FLOW_EVENT_TYPE_HEALTH}, []dataplane.FlowEventType{flowhub.HealthTransition}, false, true},
		{[]vipdv1.FlowEventType{existingT, vipdv1.FlowEventType_FLOW_EVENT_TYPE_HEALTH, closedT}, []dataplane.FlowEventType{flowhub.HealthTransition, dataplane.FlowClosed}, true, true},
	} {
		live, existing, watch, v := validation.FlowTypes(tc.in, "types")
		if len(v) > 0 || !cmp.Equal(tc.live, live) || existing != tc.existing || watch != tc.watch {
			t.Errorf("FlowTypes(%v) = %v, %v, %v, %v; want %v, %v, %v", tc.in, live, existing, watch, v, tc.live, tc.existing, tc.watch)
		}
	}
	if _, _, _, v := validation.FlowTypes([]vipdv1.FlowEventType{newT, 0}, "types"); len(v) != 1 || v[0].Field != "types[1]" {
		t.Errorf("FlowTypes with UNSPECIFIED: violations %v, want types[1]", v)
	}
}

func TestExplain(t *testing.T) {
	q, v := validation.Explain(&vipdv1.ExplainRequest{ClientIp: "10.0.0.9", ClientPort: 43512, Vip: "10.96.0.10", Port: 53, Protocol: vipdv1.Protocol_PROTOCOL_UDP})
	want := dataplane.ExplainQuery{Protocol: dataplane.UDP, Client: netip.MustParseAddrPort("10.0.0.9:43512"), VIP: netip.MustParseAddrPort("10.96.0.10:53")}
	if len(v) > 0 || q != want {
		t.Errorf("Explain = %v, %v; want %v", q, v, want)
	}
	q, v = validation.Explain(&vipdv1.ExplainRequest{ClientIp: "fd00::9", Vip: "fd00::10", Port: 80})
	if len(v) > 0 || q.Protocol != dataplane.TCP || q.Client.Port() != 0 {
		t.Errorf("Explain without protocol and client port = %v, %v; want TCP and client port 0", q, v)
	}
}
