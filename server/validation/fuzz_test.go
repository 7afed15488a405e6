package validation_test

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/vipd/vipd/dataplane"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/flowhub"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
)

// The fuzz targets below take the wire bytes of a request, as gRPC hands
// them to vipd, and check what every caller of this package relies on:
//   - nothing panics;
//   - a rejection carries at least one violation, and every violation has
//     a description and a field path that names a field of the request
//     (validation.ResolvePath: real field names, indices inside their
//     lists, keys in their maps);
//   - an accepted service is normalized for good: validating it again
//     accepts it unchanged, and so does decoding its wire form as the
//     state file does;
//   - the API form and the dataplane form agree.
// Their seed corpora are in testdata/fuzz (see TestFuzzCorpus).

// fuzzLimits are limits small enough for the fuzzer to cross.
var fuzzLimits = validation.Limits{
	MaxBackends: 64,
	MaxPorts:    16,
	ServiceCIDRs: []netip.Prefix{
		netip.MustParsePrefix("198.19.0.0/16"),
		netip.MustParsePrefix("10.96.0.0/12"),
		netip.MustParsePrefix("fd00::/8"),
	},
}

var dpCmp = []cmp.Option{addrCmp, cmpopts.EquateEmpty(), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })}

// sameDataplane reports whether a and b are the same dataplane service. It
// is reflect.DeepEqual, which is exact (nil and empty differ) and much
// faster than cmp; cmp explains a difference.
func sameDataplane(a, b *dataplane.Service) bool { return reflect.DeepEqual(a, b) }

// checkViolations fails unless v is a well-formed rejection of req: at
// least one violation, each with a description and a path into req under
// prefix.
func checkViolations(t *testing.T, req proto.Message, prefix string, v validation.Violations) {
	t.Helper()
	if len(v) == 0 {
		t.Fatal("rejected without violations")
	}
	for _, x := range v {
		if x.Description == "" {
			t.Errorf("violation of %q has no description", x.Field)
		}
		if x.Field != prefix && !strings.HasPrefix(x.Field, prefix+".") && !strings.HasPrefix(x.Field, prefix+"[") {
			t.Errorf("violation %q is outside %q, the field validated", x.Field, prefix)
		}
		if err := validation.ResolvePath(req, x.Field); err != nil {
			t.Errorf("violation %q (%s) names no field of the request: %v", x.Field, x.Description, err)
		}
	}
}

// validateTwice runs Service on in, checks that it leaves in alone and
// agrees with ServiceInPlace on a copy, and returns Service's result.
func validateTwice(t *testing.T, in *vipdv1.Service, lim validation.Limits, field string) (*vipdv1.Service, *dataplane.Service, validation.Violations) {
	t.Helper()
	var before, cp *vipdv1.Service
	if in != nil {
		before, cp = proto.Clone(in).(*vipdv1.Service), proto.Clone(in).(*vipdv1.Service)
	}
	out, dp, v := validation.Service(in, lim, field)
	if in != nil && !proto.Equal(in, before) {
		t.Fatalf("Service modified its input:\n%v", cmp.Diff(before, in, protocmp.Transform()))
	}
	out2, dp2, v2 := validation.ServiceInPlace(cp, lim, field)
	if !slices.Equal(v, v2) {
		t.Fatalf("Service and ServiceInPlace disagree on violations (-Service +InPlace):\n%s", cmp.Diff(v, v2))
	}
	if !proto.Equal(out, out2) {
		t.Fatalf("Service and ServiceInPlace disagree (-Service +InPlace):\n%s", cmp.Diff(out, out2, protocmp.Transform()))
	}
	if !sameDataplane(dp, dp2) {
		t.Fatalf("Service and ServiceInPlace disagree on the dataplane form (-Service +InPlace):\n%s", cmp.Diff(dp, dp2, dpCmp...))
	}
	if (out == nil) != (len(v) > 0) || (dp == nil) != (len(v) > 0) {
		t.Fatalf("Service returned %v, %v and %d violations", out != nil, dp != nil, len(v))
	}
	return out, dp, v
}

// checkAccepted checks a service Service accepted with lim: its two forms
// agree, and it is a fixed point of validation, also after a trip through
// its wire form without limits, as the store reloads it.
func checkAccepted(t *testing.T, out *vipdv1.Service, dp *dataplane.Service, lim validation.Limits) {
	t.Helper()
	if out.Generation != 0 || dp.Generation != 0 {
		t.Errorf("accepted service has generation %d/%d, want 0", out.Generation, dp.Generation)
	}
	if out.Owner == "" || dp.Name != out.Name || dp.Owner != out.Owner {
		t.Errorf("names: API %q/%q, dataplane %q/%q", out.Owner, out.Name, dp.Owner, dp.Name)
	}
	if len(dp.VIPs) != len(out.Vips) || len(dp.VIPs) == 0 || len(dp.VIPs) > validation.MaxVIPs {
		t.Fatalf("%d VIPs in the API form, %d in the dataplane form", len(out.Vips), len(dp.VIPs))
	}
	for i, a := range dp.VIPs {
		if a.String() != out.Vips[i] || !a.IsGlobalUnicast() || a.Is4In6() || a.Zone() != "" {
			t.Errorf("VIP %d: API %q, dataplane %v", i, out.Vips[i], a)
		}
	}
	if len(dp.Ports) != len(out.Ports) || len(dp.Ports) == 0 {
		t.Fatalf("%d ports in the API form, %d in the dataplane form", len(out.Ports), len(dp.Ports))
	}
	for i, p := range dp.Ports {
		o := out.Ports[i]
		if p.Name != o.Name || uint32(p.Port) != o.Port || uint32(p.TargetPort) != o.TargetPort || p.Port == 0 || p.TargetPort == 0 {
			t.Errorf("port %d: API %v, dataplane %+v", i, o, p)
		}
	}
	if len(dp.Backends) != len(out.Backends) {
		t.Fatalf("%d backends in the API form, %d in the dataplane form", len(out.Backends), len(dp.Backends))
	}
	for i, b := range dp.Backends {
		o := out.Backends[i]
		if b.IP.String() != o.Ip || uint32(b.Weight) != o.Weight || b.Weight == 0 || b.NodeLocal != o.NodeLocal || b.Zone != o.Zone ||
			b.OnlyNamedPorts != o.OnlyNamedPorts {
			t.Errorf("backend %d: API %v, dataplane %+v", i, o, b)
		}
		if i > 0 && dp.Backends[i-1].IP.Compare(b.IP) >= 0 {
			t.Errorf("backends %d and %d are not sorted and distinct: %v, %v", i-1, i, dp.Backends[i-1].IP, b.IP)
		}
		if len(b.Ports) != len(o.Ports) {
			t.Errorf("backend %d: %d port overrides in the API form, %d in the dataplane form", i, len(o.Ports), len(b.Ports))
		}
		for name, tp := range b.Ports {
			if !slices.ContainsFunc(dp.Ports, func(p dataplane.Port) bool { return p.Name == name }) {
				t.Errorf("backend %d: override %q=%d names no port of the service", i, name, tp)
			}
		}
		for _, p := range dp.Ports {
			if b.Serves(p) && b.TargetPort(p) == 0 {
				t.Errorf("backend %d serves port %q on target port 0", i, p.Name)
			}
		}
	}
	if out.SessionAffinity == nil || out.LoadBalancing == vipdv1.LoadBalancing_LOAD_BALANCING_UNSPECIFIED ||
		out.InternalTrafficPolicy == vipdv1.TrafficPolicy_TRAFFIC_POLICY_UNSPECIFIED ||
		out.ExternalTrafficPolicy == vipdv1.TrafficPolicy_TRAFFIC_POLICY_UNSPECIFIED {
		t.Errorf("defaults not filled in: %v", out)
	}
	checkExternalAccepted(t, out, dp)

	again, dpAgain, v := validateTwice(t, out, lim, "service")
	if len(v) > 0 {
		t.Fatalf("an accepted service is rejected when validated again: %v", v)
	}
	if !proto.Equal(out, again) {
		t.Fatalf("validating an accepted service again changes it (-first +second):\n%s", cmp.Diff(out, again, protocmp.Transform()))
	}
	if !sameDataplane(dp, dpAgain) {
		t.Fatalf("validating an accepted service again changes its dataplane form (-first +second):\n%s", cmp.Diff(dp, dpAgain, dpCmp...))
	}

	wire, err := proto.MarshalOptions{Deterministic: true}.Marshal(out)
	if err != nil {
		t.Fatalf("marshal an accepted service: %v", err)
	}
	decoded := &vipdv1.Service{}
	if err := proto.Unmarshal(wire, decoded); err != nil {
		t.Fatalf("unmarshal an accepted service: %v", err)
	}
	// The store loads it by the conversion alone, as it loads the state file.
	reloaded := decoded
	dpReloaded, v := validation.ConvertService(reloaded, "service")
	if len(v) > 0 {
		t.Fatalf("an accepted service does not reload: %v", v)
	}
	if !proto.Equal(out, reloaded) {
		t.Fatalf("an accepted service changes when reloaded (-accepted +reloaded):\n%s", cmp.Diff(out, reloaded, protocmp.Transform()))
	}
	if !sameDataplane(dp, dpReloaded) {
		t.Fatalf("an accepted service's dataplane form changes when reloaded (-accepted +reloaded):\n%s", cmp.Diff(dp, dpReloaded, dpCmp...))
	}
}

// checkExternalAccepted checks that the external fields of an accepted
// service agree in its two forms and keep their rules.
func checkExternalAccepted(t *testing.T, out *vipdv1.Service, dp *dataplane.Service) {
	t.Helper()
	type key struct {
		p    dataplane.Protocol
		port uint16
	}
	nodePorts := map[key]bool{}
	for i, p := range dp.Ports {
		if uint32(p.NodePort) != out.Ports[i].NodePort {
			t.Errorf("port %d: node port %d in the API form, %d in the dataplane form", i, out.Ports[i].NodePort, p.NodePort)
		}
		if p.NodePort != 0 {
			if nodePorts[key{p.Protocol, p.NodePort}] {
				t.Errorf("node port %d/%s twice", p.NodePort, p.Protocol)
			}
			nodePorts[key{p.Protocol, p.NodePort}] = true
		}
	}
	seen := map[netip.Addr]bool{}
	for _, l := range []struct {
		api []string
		dp  []netip.Addr
	}{{out.ExternalIps, dp.ExternalIPs}, {out.LoadBalancerIps, dp.LoadBalancerIPs}} {
		if len(l.api) != len(l.dp) || len(l.dp) > validation.MaxExternalIPs {
			t.Fatalf("external addresses: API %v, dataplane %v", l.api, l.dp)
		}
		for i, a := range l.dp {
			if a.String() != l.api[i] || !a.IsGlobalUnicast() || a.Is4In6() || a.Zone() != "" || seen[a] || slices.Contains(dp.VIPs, a) ||
				!slices.ContainsFunc(dp.VIPs, func(v netip.Addr) bool { return v.Is4() == a.Is4() }) {
				t.Errorf("external address %d: API %q, dataplane %v (VIPs %v)", i, l.api[i], a, dp.VIPs)
			}
			seen[a] = true
		}
	}
	if len(out.LoadBalancerSourceRanges) != len(dp.LoadBalancerSourceRanges) || len(dp.LoadBalancerSourceRanges) > validation.MaxSourceRanges {
		t.Fatalf("source ranges: API %v, dataplane %v", out.LoadBalancerSourceRanges, dp.LoadBalancerSourceRanges)
	}
	for i, p := range dp.LoadBalancerSourceRanges {
		if p.String() != out.LoadBalancerSourceRanges[i] || p != p.Masked() || p.Addr().Is4In6() ||
			slices.Index(dp.LoadBalancerSourceRanges, p) != i {
			t.Errorf("source range %d: API %q, dataplane %v", i, out.LoadBalancerSourceRanges[i], p)
		}
	}
	local := out.ExternalTrafficPolicy == vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	if local != (dp.ExternalTrafficPolicy == dataplane.TrafficPolicyLocal) ||
		!local && dp.ExternalTrafficPolicy != dataplane.TrafficPolicyCluster {
		t.Errorf("external traffic policy: API %v, dataplane %v", out.ExternalTrafficPolicy, dp.ExternalTrafficPolicy)
	}
	if uint32(dp.HealthCheckNodePort) != out.HealthCheckNodePort || dp.HealthCheckNodePort != 0 && (!local || nodePorts[key{dataplane.TCP, dp.HealthCheckNodePort}]) {
		t.Errorf("health-check node port: API %d, dataplane %d (policy %v, node ports %v)", out.HealthCheckNodePort, dp.HealthCheckNodePort, out.ExternalTrafficPolicy, nodePorts)
	}
}

// FuzzUpsertService fuzzes UpsertServiceRequest.service.
func FuzzUpsertService(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		req := &vipdv1.UpsertServiceRequest{}
		if proto.Unmarshal(data, req) != nil {
			return
		}
		orig := proto.Clone(req)
		out, dp, v := validateTwice(t, req.Service, fuzzLimits, "service")
		if len(v) > 0 {
			checkViolations(t, orig, "service", v)
			return
		}
		checkAccepted(t, out, dp, fuzzLimits)
	})
}

// FuzzSyncServices fuzzes the services of a SyncServicesRequest, each
// validated in place under its own index as the server does.
func FuzzSyncServices(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		req := &vipdv1.SyncServicesRequest{}
		if proto.Unmarshal(data, req) != nil {
			return
		}
		orig := proto.Clone(req).(*vipdv1.SyncServicesRequest)
		for i, in := range req.Services {
			field := "services[" + strconv.Itoa(i) + "]"
			out, dp, v := validation.ServiceInPlace(in, fuzzLimits, field)
			if len(v) > 0 {
				if out != nil || dp != nil {
					t.Fatalf("%s: rejected with a result", field)
				}
				checkViolations(t, orig, field, v)
				continue
			}
			if out != in {
				t.Fatalf("%s: ServiceInPlace returned another message", field)
			}
			checkAccepted(t, out, dp, fuzzLimits)
			// What ServiceInPlace accepts, Service accepts the same way.
			out2, dp2, v2 := validation.Service(orig.Services[i], fuzzLimits, field)
			if len(v2) > 0 || !proto.Equal(out, out2) || !sameDataplane(dp, dp2) {
				t.Fatalf("%s: Service and ServiceInPlace disagree: %v", field, v2)
			}
		}
	})
}

// fallbackService is the service FuzzUpdateBackends changes when its fuzzed
// service does not validate: dual-stack, with two named ports.
var fallbackService = &vipdv1.Service{
	Name:  "default/web",
	Vips:  []string{"198.19.0.10", "fd00:198:ff::10"},
	Ports: []*vipdv1.Port{{Name: "http", Port: 80, TargetPort: 8080}, {Name: "dns", Protocol: vipdv1.Protocol_PROTOCOL_UDP, Port: 53}},
}

// FuzzUpdateBackends fuzzes the backends of an UpdateBackendsRequest,
// validated against a (fuzzed) service as the server does before it merges
// them: each is named upsert[i].
func FuzzUpdateBackends(f *testing.F) {
	f.Fuzz(func(t *testing.T, service, request []byte) {
		var dp *dataplane.Service
		if svc := (&vipdv1.Service{}); proto.Unmarshal(service, svc) == nil {
			_, dp, _ = validation.Service(svc, fuzzLimits, "service")
		}
		if dp == nil {
			var v validation.Violations
			if _, dp, v = validation.Service(fallbackService, fuzzLimits, "service"); len(v) > 0 {
				t.Fatalf("the fallback service does not validate: %v", v)
			}
		}
		req := &vipdv1.UpdateBackendsRequest{}
		if proto.Unmarshal(request, req) != nil {
			return
		}
		orig := proto.Clone(req)
		ctx := validation.NewBackendContext(dp)
		for i, in := range req.Upsert {
			field := fmt.Sprintf("upsert[%d]", i)
			b, _ := proto.Clone(in).(*vipdv1.Backend)
			db, v := validation.Backend(b, ctx, field)
			if len(v) > 0 {
				checkViolations(t, orig, field, v)
				continue
			}
			if db.IP.String() != b.Ip || uint32(db.Weight) != b.Weight || db.Weight == 0 || len(db.Ports) != len(b.Ports) {
				t.Fatalf("%s: API %v, dataplane %+v", field, b, db)
			}
			if !slices.ContainsFunc(dp.VIPs, func(a netip.Addr) bool { return a.Is4() == db.IP.Is4() }) {
				t.Fatalf("%s: %v is of a family the service has no VIP of", field, db.IP)
			}
			again := proto.Clone(b).(*vipdv1.Backend)
			db2, v2 := validation.Backend(again, ctx, field)
			if len(v2) > 0 || !proto.Equal(again, b) || !reflect.DeepEqual(db, db2) {
				t.Fatalf("%s: validating an accepted backend again: %v\n%v", field, v2, cmp.Diff(b, again, protocmp.Transform()))
			}
		}
	})
}

// FuzzFlowFilter fuzzes the filter and types of a WatchFlowsRequest (a
// ListFlowsRequest has the same filter). An accepted filter must select a
// flow made of the very addresses it was given.
func FuzzFlowFilter(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		req := &vipdv1.WatchFlowsRequest{}
		if proto.Unmarshal(data, req) != nil {
			return
		}
		filter, v := validation.FlowFilter(req.Filter, "filter")
		if len(v) > 0 {
			checkViolations(t, req, "filter", v)
		} else {
			checkFilterMatches(t, req.Filter, filter)
		}
		live, existing, watch, vt := validation.FlowTypes(req.Types, "types")
		if len(vt) > 0 {
			checkViolations(t, req, "types", vt)
			return
		}
		wantExisting := slices.Contains(req.Types, vipdv1.FlowEventType_FLOW_EVENT_TYPE_EXISTING)
		if existing != wantExisting || watch != (len(req.Types) == 0 || len(live) > 0) {
			t.Fatalf("types %v: live %v, existing %v, watch %v", req.Types, live, existing, watch)
		}
	})
}

// checkFilterMatches checks that f, accepted from in, selects a flow built
// from in's own addresses, parsed independently.
func checkFilterMatches(t *testing.T, in *vipdv1.FlowFilter, f flowhub.Filter) {
	t.Helper()
	if in == nil {
		return
	}
	fl := &flowhub.Flow{Service: in.Service}
	fl.Protocol = f.Protocol
	addrPort := func(s string) netip.AddrPort {
		if s == "" {
			return netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), 1)
		}
		if ap, err := netip.ParseAddrPort(s); err == nil {
			return ap
		}
		return netip.AddrPortFrom(netip.MustParseAddr(s), 1)
	}
	fl.VIP, fl.Backend = addrPort(in.Vip), addrPort(in.Backend)
	fl.Client = netip.AddrPortFrom(netip.MustParseAddr("192.0.2.2"), 1)
	if in.Client != "" {
		if p, err := netip.ParsePrefix(in.Client); err == nil {
			fl.Client = netip.AddrPortFrom(p.Masked().Addr(), 1)
		} else {
			fl.Client = netip.AddrPortFrom(netip.MustParseAddr(in.Client), 1)
		}
	}
	if !f.Match(fl) {
		t.Fatalf("filter %v (accepted as %+v) does not select a flow of its own addresses: %+v", in, f, fl)
	}
}

// FuzzExplain fuzzes ExplainRequest.
func FuzzExplain(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		req := &vipdv1.ExplainRequest{}
		if proto.Unmarshal(data, req) != nil {
			return
		}
		q, v := validation.Explain(req)
		if len(v) > 0 {
			for _, x := range v {
				if err := validation.ResolvePath(req, x.Field); err != nil || x.Description == "" {
					t.Errorf("violation %q (%s): %v", x.Field, x.Description, err)
				}
			}
			return
		}
		client, vip := q.Client.Addr(), q.VIP.Addr()
		if client.Is4() != vip.Is4() || client.Is4In6() || vip.Is4In6() || q.VIP.Port() == 0 || q.Protocol == 0 {
			t.Fatalf("accepted %v as %+v", req, q)
		}
		if uint32(q.VIP.Port()) != req.Port || uint32(q.Client.Port()) != req.ClientPort {
			t.Fatalf("ports of %v became %+v", req, q)
		}
		if want := netip.MustParseAddr(req.Vip).Unmap(); vip != want {
			t.Fatalf("vip %q became %v", req.Vip, vip)
		}
	})
}
