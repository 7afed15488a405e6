package validation

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/vipd/vipd/dataplane"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// This file is the structural half of the package: the conversion of a
// service from its API form to its dataplane form, which the store (loading
// the state file and the journal) and the API (after the admission policy
// of validation.go) share.
//
// The conversion is total: every service that vipd ever stored converts,
// whatever limits, character sets and address rules applied when it was
// written or apply now. It fails only where no dataplane form exists or the
// form would be ambiguous:
//   - an address that does not parse, or that has a zone;
//   - a number outside what the dataplane holds (a port of 0 or above
//     65535, a weight above 65535);
//   - an enum value this vipd does not know;
//   - a key given twice: a VIP, a protocol and port, a port name, a
//     backend IP, the external fields' keys (see external.go);
//   - a backend, external or load-balancer IP whose family no VIP of the
//     service has, or a backend whose ports name no port of the service;
//   - a missing name, or a nil port or backend.
// Each failure is reported as a Violation; nothing is dropped silently.
// Everything else (lengths, counts, character sets, address classes such as
// loopback, --service-cidr, the --max-* limits) is admission policy, which
// only new writes go through.

// ConvertService normalizes svc in place and returns its dataplane form:
// it fills in the defaults (owner DefaultOwner, protocol TCP, target port
// the port, backend state ready, weight 1, affinity none or its default
// timeout, traffic policies cluster, load balancing random), writes the
// addresses in canonical form (an IPv4-mapped IPv6 address as IPv4) and
// the source ranges masked (see convertExternal), and sorts the backends
// by IP; external and load-balancer IPs keep their order. It leaves the generation alone. svc is named
// field in the violations. On violations it returns no service, and svc may
// be left partly normalized.
func ConvertService(svc *vipdv1.Service, field string) (*dataplane.Service, Violations) {
	return convertService(svc, field, false)
}

// convertService is ConvertService. With badVIPs, which the admission
// policy sets when it rejected a VIP, the backends' families are not
// checked: the VIP's violation says enough.
func convertService(svc *vipdv1.Service, field string, badVIPs bool) (*dataplane.Service, Violations) {
	var v Violations
	if svc == nil {
		v.add(field, "is required")
		return nil, v
	}
	if svc.Name == "" {
		v.add(field+".name", "is required")
	}
	if svc.Owner == "" {
		svc.Owner = DefaultOwner
	}
	dp := &dataplane.Service{Name: svc.Name, Owner: svc.Owner}
	dp.VIPs = convertVIPs(&v, svc, field)
	dp.Ports = convertPorts(&v, svc, field)
	ctx := NewBackendContext(dp)
	if badVIPs {
		ctx.has4, ctx.has6 = false, false
	}
	dp.Backends = convertBackends(&v, svc, ctx, field)
	dp.Affinity = affinity(&v, svc, field)
	dp.TrafficPolicy = trafficPolicy(&v, svc, field)
	dp.LoadBalancing = loadBalancing(&v, svc, field)
	convertExternal(&v, svc, dp, field, badVIPs)
	if len(v) > 0 {
		return nil, v
	}
	// Every backend converted, so svc.Backends[i] is dp.Backends[i]: sort
	// both by the parsed address at once.
	sortBackends(svc.Backends, dp.Backends)
	return dp, nil
}

// ConvertBackend normalizes b in place for a service with context ctx, as
// ConvertService does each backend, and returns its dataplane form.
func ConvertBackend(b *vipdv1.Backend, ctx BackendContext, field string) (dataplane.Backend, Violations) {
	var v Violations
	db, _ := convertBackend(&v, b, ctx, field, nil)
	return db, v
}

// parseAddr parses s as an address the dataplane can hold, and returns it
// unmapped (an IPv4-mapped IPv6 address is the IPv4 address).
func parseAddr(v *Violations, s, field string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(s)
	switch {
	case err != nil:
		v.add(field, "%q is not an IP address", s)
	case a.Zone() != "":
		v.add(field, "%q has a zone; zones are not allowed", s)
	default:
		return a.Unmap(), true
	}
	return netip.Addr{}, false
}

func convertVIPs(v *Violations, svc *vipdv1.Service, field string) []netip.Addr {
	var addrs []netip.Addr
	for i, s := range svc.Vips {
		// The field's name is built only for a violation.
		var probe Violations
		a, ok := parseAddr(&probe, s, "")
		if !ok {
			parseAddr(v, s, indexed(field, "vips", i))
			continue
		}
		if slices.Contains(addrs, a) {
			v.add(indexed(field, "vips", i), "%s is listed twice", a)
			continue
		}
		svc.Vips[i] = canonical(a, s)
		addrs = append(addrs, a)
	}
	return addrs
}

func convertPorts(v *Violations, svc *vipdv1.Service, field string) []dataplane.Port {
	type key struct {
		proto dataplane.Protocol
		port  uint32
	}
	// A single port cannot repeat another: the maps that find repeats are
	// made only for more (reading a nil map finds nothing).
	var seen, nodePorts map[key]int
	var names map[string]int
	if len(svc.Ports) > 1 {
		seen, nodePorts, names = make(map[key]int, len(svc.Ports)), map[key]int{}, make(map[string]int, len(svc.Ports))
	}
	var res []dataplane.Port
	if len(svc.Ports) > 0 {
		res = make([]dataplane.Port, 0, len(svc.Ports))
	}
	for i, p := range svc.Ports {
		// The field's name is built only for a violation.
		f := func() string { return indexed(field, "ports", i) }
		ok := true
		if p == nil {
			v.add(f(), "is empty")
			continue
		}
		if p.Name != "" {
			if j, dup := names[p.Name]; dup {
				v.add(f()+".name", "%q is also the name of ports[%d]", p.Name, j)
				ok = false
			}
			if names != nil {
				names[p.Name] = i
			}
		}
		if p.Protocol == vipdv1.Protocol_PROTOCOL_UNSPECIFIED {
			p.Protocol = vipdv1.Protocol_PROTOCOL_TCP
		}
		proto, known := protocols[p.Protocol]
		if !known {
			v.add(f()+".protocol", "%d is not a known protocol", p.Protocol)
			ok = false
		}
		if p.Port == 0 || p.Port > 65535 {
			v.add(f()+".port", "%d is out of range; 1 to 65535 are allowed", p.Port)
			ok = false
		}
		explicitTarget := p.TargetPort != 0
		if !explicitTarget {
			p.TargetPort = p.Port
		}
		if explicitTarget && p.TargetPort > 65535 {
			v.add(f()+".target_port", "%d is out of range; 1 to 65535 are allowed, or 0 for the same as port", p.TargetPort)
			ok = false
		}
		if p.NodePort > 65535 {
			v.add(f()+".node_port", "%d is out of range; 1 to 65535 are allowed, or 0 for none", p.NodePort)
			ok = false
		}
		if !ok {
			continue
		}
		k := key{proto, p.Port}
		if j, dup := seen[k]; dup {
			v.add(f(), "%d/%s is also ports[%d]; each protocol and port may appear once", p.Port, proto, j)
			continue
		}
		if seen != nil {
			seen[k] = i
		}
		if p.NodePort != 0 {
			nk := key{proto, p.NodePort}
			if j, dup := nodePorts[nk]; dup {
				v.add(f()+".node_port", "%d/%s is also the node_port of ports[%d]; each protocol and node port may appear once", p.NodePort, proto, j)
				continue
			}
			if nodePorts != nil {
				nodePorts[nk] = i
			}
		}
		res = append(res, dataplane.Port{Name: p.Name, Protocol: proto, Port: uint16(p.Port), TargetPort: uint16(p.TargetPort), NodePort: uint16(p.NodePort)})
	}
	return res
}

var protocols = map[vipdv1.Protocol]dataplane.Protocol{
	vipdv1.Protocol_PROTOCOL_TCP:  dataplane.TCP,
	vipdv1.Protocol_PROTOCOL_UDP:  dataplane.UDP,
	vipdv1.Protocol_PROTOCOL_SCTP: dataplane.SCTP,
}

func convertBackends(v *Violations, svc *vipdv1.Service, ctx BackendContext, field string) []dataplane.Backend {
	if len(svc.Backends) == 0 {
		return nil
	}
	res := make([]dataplane.Backend, 0, len(svc.Backends))
	// Duplicates are found by a scan of the backends so far while they are
	// few, which is much cheaper than a map for the usual handful.
	var seen map[netip.Addr]int
	var indexBuf [16]int
	index := indexBuf[:0] // index[k]: where res[k] is in svc.Backends
	var shared sharedValues
	for i, b := range svc.Backends {
		// The field's name is built only for a violation: a big SyncServices
		// converts millions of backends.
		var probe Violations
		db, ok := convertBackend(&probe, b, ctx, "", &shared)
		if !ok {
			convertBackend(v, b, ctx, fmt.Sprintf("%s.backends[%d]", field, i), nil)
			continue
		}
		j, dup := -1, false
		if seen == nil {
			for k := range res {
				if res[k].IP == db.IP {
					j, dup = index[k], true
					break
				}
			}
			if len(res) == len(indexBuf) {
				seen = make(map[netip.Addr]int, len(svc.Backends))
				for k := range res {
					seen[res[k].IP] = index[k]
				}
			}
		} else {
			j, dup = seen[db.IP]
		}
		if dup {
			v.add(fmt.Sprintf("%s.backends[%d].ip", field, i), "%s is also backends[%d]; each backend IP may appear once", db.IP, j)
			continue
		}
		if seen != nil {
			seen[db.IP] = i
		} else {
			index = append(index, i)
		}
		res = append(res, db)
	}
	return res
}

// sharedValues are the ports maps and zones of a service's backends
// converted so far, a few of each, so that backends with equal ones share
// one: the backends of a Kubernetes service all name the same ports, and
// a map per backend would cost some 250 bytes each (and more in the heap's
// fragmentation, when the copies die among the kept ones). A dataplane
// service is never modified once converted, so the sharing cannot be
// seen. A nil *sharedValues shares nothing.
type sharedValues struct {
	maps  [4]map[string]uint16
	zones [4]string
}

// ports returns a remembered map equal to api, or nil.
func (sv *sharedValues) ports(api map[string]uint32) map[string]uint16 {
	if sv == nil {
		return nil
	}
next:
	for _, m := range sv.maps {
		if m == nil {
			return nil
		}
		if len(m) != len(api) {
			continue
		}
		for k, p := range api {
			if q, ok := m[k]; !ok || uint32(q) != p {
				continue next
			}
		}
		return m
	}
	return nil
}

// remember makes b use an equal zone remembered before, and remembers
// b's zone, and its ports map when fresh (not a remembered one), while
// there is room.
func (sv *sharedValues) remember(b *dataplane.Backend, fresh bool) {
	if sv == nil {
		return
	}
	if fresh && b.Ports != nil {
		for i, m := range sv.maps {
			if m == nil {
				sv.maps[i] = b.Ports
				break
			}
		}
	}
	if b.Zone != "" {
		for i, z := range sv.zones {
			if z == "" {
				sv.zones[i] = b.Zone
				break
			}
			if z == b.Zone {
				b.Zone = z
				break
			}
		}
	}
}

// sortBackends sorts dp by IP, and api (its API form, index for index)
// the same way.
func sortBackends(api []*vipdv1.Backend, dp []dataplane.Backend) {
	cmpIP := func(a, b dataplane.Backend) int { return a.IP.Compare(b.IP) }
	if slices.IsSortedFunc(dp, cmpIP) {
		return
	}
	type pair struct {
		api *vipdv1.Backend
		dp  dataplane.Backend
	}
	pairs := make([]pair, len(dp))
	for i := range dp {
		pairs[i] = pair{api[i], dp[i]}
	}
	slices.SortFunc(pairs, func(a, b pair) int { return cmpIP(a.dp, b.dp) })
	for i, p := range pairs {
		api[i], dp[i] = p.api, p.dp
	}
}

// canonical returns a's text, reusing s when s is that text already.
func canonical(a netip.Addr, s string) string {
	var buf [64]byte
	if b := a.AppendTo(buf[:0]); string(b) != s {
		return string(b)
	}
	return s
}

// BackendContext is what a backend is checked against: the service's address
// families and ports.
type BackendContext struct {
	has4, has6 bool
	ports      []dataplane.Port
}

// names reports whether a backend's ports key name names a port of the
// service: a port's name, or "" for the service's only port when that port
// has no name (as a Kubernetes EndpointSlice names it).
func (ctx BackendContext) names(name string) bool {
	if name == "" {
		return len(ctx.ports) == 1 && ctx.ports[0].Name == ""
	}
	return slices.ContainsFunc(ctx.ports, func(p dataplane.Port) bool { return p.Name == name })
}

// NewBackendContext returns the context that backends of svc are validated in.
func NewBackendContext(svc *dataplane.Service) BackendContext {
	ctx := BackendContext{ports: svc.Ports}
	for _, a := range svc.VIPs {
		ctx.has4 = ctx.has4 || a.Is4()
		ctx.has6 = ctx.has6 || a.Is6()
	}
	return ctx
}

var backendStates = map[vipdv1.BackendState]dataplane.BackendState{
	vipdv1.BackendState_BACKEND_STATE_READY:       dataplane.BackendReady,
	vipdv1.BackendState_BACKEND_STATE_TERMINATING: dataplane.BackendTerminating,
	vipdv1.BackendState_BACKEND_STATE_NOT_SERVING: dataplane.BackendNotServing,
}

// convertBackend converts b. With shared, the backend shares an equal
// ports map or zone of the service's backends converted before it.
func convertBackend(v *Violations, b *vipdv1.Backend, ctx BackendContext, field string, shared *sharedValues) (dataplane.Backend, bool) {
	if b == nil {
		v.add(field, "is empty")
		return dataplane.Backend{}, false
	}
	before := len(*v)
	ip, ok := parseAddr(v, b.Ip, field+".ip")
	if ok {
		b.Ip = canonical(ip, b.Ip)
		// Without a valid VIP the family is unknown; the VIP violation says enough.
		if (ctx.has4 || ctx.has6) && (ip.Is4() && !ctx.has4 || ip.Is6() && !ctx.has6) {
			v.add(field+".ip", "%s is %s, but the service has no VIP of that family", ip, family(ip))
		}
	}
	var ports map[string]uint16
	// Sorted, so that the same input always gives the same violations.
	var names []string
	fresh := false // ports is a new map, not a shared one
	if len(b.Ports) > 0 {
		// A map equal to one that converted has every name and port valid.
		if ports = shared.ports(b.Ports); ports == nil {
			names, fresh = slices.Sorted(maps.Keys(b.Ports)), true
		}
	}
	for _, name := range names {
		port := b.Ports[name]
		f := fmt.Sprintf("%s.ports[%q]", field, name)
		if !ctx.names(name) {
			switch {
			case name != "":
				v.add(f, "names no port of the service")
			case len(ctx.ports) == 1:
				v.add(f, "the empty name stands for a service's only port when that port has no name, but this service's port is named %q", ctx.ports[0].Name)
			default:
				v.add(f, "the empty name stands for a service's only port when that port has no name, but this service has %d ports", len(ctx.ports))
			}
			continue
		}
		if port == 0 || port > 65535 {
			v.add(f, "%d is out of range; 1 to 65535 are allowed", port)
			continue
		}
		if ports == nil {
			ports = map[string]uint16{}
		}
		ports[name] = uint16(port)
	}
	if b.State == vipdv1.BackendState_BACKEND_STATE_UNSPECIFIED {
		b.State = vipdv1.BackendState_BACKEND_STATE_READY
	}
	state, known := backendStates[b.State]
	if !known {
		v.add(field+".state", "%d is not a known backend state", b.State)
	}
	if b.Weight == 0 {
		b.Weight = 1
	}
	if b.Weight > MaxWeight {
		v.add(field+".weight", "%d is out of range; 1 to %d are allowed, or 0 for 1", b.Weight, MaxWeight)
	}
	if len(*v) > before {
		return dataplane.Backend{}, false
	}
	db := dataplane.Backend{IP: ip, Ports: ports, OnlyNamedPorts: b.OnlyNamedPorts, State: state, Weight: uint16(b.Weight),
		NodeLocal: b.NodeLocal, Zone: b.Zone}
	shared.remember(&db, fresh)
	return db, true
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

func affinity(v *Violations, svc *vipdv1.Service, field string) dataplane.SessionAffinity {
	if svc.SessionAffinity == nil {
		svc.SessionAffinity = &vipdv1.SessionAffinityConfig{}
	}
	a := svc.SessionAffinity
	switch a.Mode {
	case vipdv1.SessionAffinity_SESSION_AFFINITY_UNSPECIFIED, vipdv1.SessionAffinity_SESSION_AFFINITY_NONE:
		a.Mode = vipdv1.SessionAffinity_SESSION_AFFINITY_NONE
		return dataplane.SessionAffinity{}
	case vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP:
		if a.TimeoutSeconds == 0 {
			a.TimeoutSeconds = DefaultAffinityTimeout
		}
		return dataplane.SessionAffinity{ClientIP: true, Timeout: time.Duration(a.TimeoutSeconds) * time.Second}
	default:
		v.add(field+".session_affinity.mode", "%d is not a known session affinity mode", a.Mode)
		return dataplane.SessionAffinity{}
	}
}

func trafficPolicy(v *Violations, svc *vipdv1.Service, field string) dataplane.TrafficPolicy {
	switch svc.InternalTrafficPolicy {
	case vipdv1.TrafficPolicy_TRAFFIC_POLICY_UNSPECIFIED, vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER:
		svc.InternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER
		return dataplane.TrafficPolicyCluster
	case vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL:
		return dataplane.TrafficPolicyLocal
	}
	v.add(field+".internal_traffic_policy", "%d is not a known traffic policy", svc.InternalTrafficPolicy)
	return 0
}

func loadBalancing(v *Violations, svc *vipdv1.Service, field string) dataplane.LoadBalancing {
	switch svc.LoadBalancing {
	case vipdv1.LoadBalancing_LOAD_BALANCING_UNSPECIFIED, vipdv1.LoadBalancing_LOAD_BALANCING_RANDOM:
		svc.LoadBalancing = vipdv1.LoadBalancing_LOAD_BALANCING_RANDOM
		return dataplane.LoadBalancingRandom
	case vipdv1.LoadBalancing_LOAD_BALANCING_MAGLEV:
		return dataplane.LoadBalancingMaglev
	}
	v.add(field+".load_balancing", "%d is not a known load-balancing algorithm", svc.LoadBalancing)
	return 0
}
