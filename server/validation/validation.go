package validation

import (
	"fmt"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/vipd/vipd/dataplane"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/protobuf/proto"
)

// API limits and defaults that are fixed by the API contract.
const (
	MaxNameLength          = 253
	MaxVIPs                = 8
	MaxWeight              = 65535
	MaxAffinityTimeout     = 86400
	DefaultAffinityTimeout = 10800
	DefaultOwner           = "default"
	MaxLabels              = 64
	MaxLabelLength         = 253
	MaxZoneLength          = 63
	MaxPortNameLength      = 63
)

// Defaults of the limits an operator may configure (Limits), as vipd's
// flags set them.
const (
	// DefaultMaxBackends is the default of Limits.MaxBackends (--max-backends).
	DefaultMaxBackends = 10000
	// DefaultMaxPorts is the default of Limits.MaxPorts (--max-ports), and
	// what a zero MaxPorts means.
	DefaultMaxPorts = 100
	// DefaultMaxServices is the default of Limits.MaxServices
	// (--max-services): twice the 100,000 services the eBPF maps are sized
	// for by default.
	DefaultMaxServices = 200000
	// DefaultMaxTotalBackends is the default of Limits.MaxTotalBackends
	// (--max-total-backends): twice the 100,000 × 10 backends the eBPF maps
	// are sized for by default.
	DefaultMaxTotalBackends = 2000000
)

// Limits are the limits an operator may configure. Service checks the
// per-service ones; the store enforces the totals (MaxServices and
// MaxTotalBackends) when a change is staged, because only it sees every
// service.
type Limits struct {
	// MaxBackends is the most backends one service may have; 0 means no
	// limit, which is how the store reads its state file.
	MaxBackends int
	// MaxPorts is the most ports one service may have; 0 means
	// DefaultMaxPorts, and a negative value means no limit, which is how
	// the store reads its state file.
	MaxPorts int
	// MaxServices is the most services the store may hold; 0 means no limit.
	MaxServices int
	// MaxTotalBackends is the most backends the store may hold, summed over
	// all services; 0 means no limit.
	MaxTotalBackends int
	// ServiceCIDRs, when not empty, are the only ranges VIPs may come from.
	ServiceCIDRs []netip.Prefix
}

// maxPorts is the port limit l sets, or -1 for none.
func (l Limits) maxPorts() int {
	switch {
	case l.MaxPorts == 0:
		return DefaultMaxPorts
	case l.MaxPorts < 0:
		return -1
	}
	return l.MaxPorts
}

// Violation is one invalid field.
type Violation struct {
	// Field is the path of the field in the request, such as "service.vips[0]".
	Field string
	// Description says what is wrong, in a way a user can act on.
	Description string
}

// Violations is a list of field violations; empty means valid.
type Violations []Violation

func (v *Violations) add(field, format string, args ...any) {
	*v = append(*v, Violation{Field: field, Description: fmt.Sprintf(format, args...)})
}

// Error lists every violation on one line.
func (v Violations) Error() string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = x.Field + ": " + x.Description
	}
	return strings.Join(parts, "; ")
}

var (
	namePattern     = regexp.MustCompile(`^[a-z0-9._/-]+$`)
	portNamePattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)
)

// Name checks a service or owner name: 1-253 characters of [a-z0-9] and
// "-./_", not starting with "-", and without an empty, "." or ".." segment
// between slashes (see unsafeName).
func Name(name, field string) Violations {
	var v Violations
	checkName(&v, name, field)
	return v
}

func checkName(v *Violations, name, field string) {
	switch {
	case name == "":
		v.add(field, "is required")
	case len(name) > MaxNameLength:
		v.add(field, "is %d characters long; at most %d are allowed", len(name), MaxNameLength)
	case !namePattern.MatchString(name):
		v.add(field, "%q may contain only lowercase letters, digits and \"-./_\"", name)
	case unsafeName(name) != "":
		v.add(field, "%q %s", name, unsafeName(name))
	}
}

// Service validates in, which is named field in the request. On success it
// returns a normalized copy (defaults filled in, addresses canonical, backends
// sorted by IP, generation zero) and its dataplane form. in is not modified.
func Service(in *vipdv1.Service, lim Limits, field string) (*vipdv1.Service, *dataplane.Service, Violations) {
	if in == nil {
		return ServiceInPlace(nil, lim, field)
	}
	return ServiceInPlace(proto.Clone(in).(*vipdv1.Service), lim, field)
}

// ServiceInPlace is Service for a message the caller owns and gives up,
// such as a request's: it normalizes in itself, without a copy, and returns
// it. On violations in may be left partly normalized.
func ServiceInPlace(in *vipdv1.Service, lim Limits, field string) (*vipdv1.Service, *dataplane.Service, Violations) {
	var v Violations
	if in == nil {
		v.add(field, "is required")
		return nil, nil, v
	}
	out := in
	out.Generation = 0
	dp := &dataplane.Service{}

	checkName(&v, out.Name, field+".name")
	dp.Name = out.Name
	if out.Owner == "" {
		out.Owner = DefaultOwner
	}
	checkName(&v, out.Owner, field+".owner")
	dp.Owner = out.Owner

	dp.VIPs = vips(&v, out, lim, field)
	dp.Ports = ports(&v, out, lim, field)

	ctx := NewBackendContext(dp)
	if lim.MaxBackends > 0 && len(out.Backends) > lim.MaxBackends {
		v.add(field+".backends", "has %d backends; at most %d are allowed (--max-backends)", len(out.Backends), lim.MaxBackends)
	}
	if len(out.Backends) > 0 {
		dp.Backends = make([]dataplane.Backend, 0, len(out.Backends))
	}
	// Duplicates are found by a scan of the backends so far while they are
	// few, which is much cheaper than a map for the usual handful.
	var seen map[netip.Addr]int
	var indexBuf [16]int
	index := indexBuf[:0] // index[k]: where dp.Backends[k] is in out.Backends
	for i, b := range out.Backends {
		// The field's name is built only for a violation: a big SyncServices
		// validates millions of valid backends.
		var probe Violations
		db, ok := backend(&probe, b, ctx, "")
		if !ok {
			backend(&v, b, ctx, fmt.Sprintf("%s.backends[%d]", field, i))
			continue
		}
		j, dup := -1, false
		if seen == nil {
			for k := range dp.Backends {
				if dp.Backends[k].IP == db.IP {
					j, dup = index[k], true
					break
				}
			}
			if len(dp.Backends) == len(indexBuf) {
				seen = make(map[netip.Addr]int, len(out.Backends))
				for k := range dp.Backends {
					seen[dp.Backends[k].IP] = index[k]
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
		dp.Backends = append(dp.Backends, db)
	}
	if len(v) == 0 {
		// Every backend is valid, so out.Backends[i] is dp.Backends[i]:
		// sort both by the parsed address at once.
		sortBackends(out.Backends, dp.Backends)
	}

	dp.Affinity = affinity(&v, out, field)
	dp.TrafficPolicy = trafficPolicy(&v, out, field)
	dp.LoadBalancing = loadBalancing(&v, out, field)
	labels(&v, out, field)

	if len(v) > 0 {
		return nil, nil, v
	}
	return out, dp, nil
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

// unicast parses s as a unicast address that may be used for a VIP or a
// backend, and returns it canonical.
func unicast(v *Violations, s, field string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(s)
	switch {
	case err != nil:
		v.add(field, "%q is not an IP address", s)
	case a.Zone() != "":
		v.add(field, "%q has a zone; zones are not allowed", s)
	case a.Is4In6():
		v.add(field, "%q is an IPv4-mapped IPv6 address; use the IPv4 form %s", s, a.Unmap())
	case a.IsUnspecified():
		v.add(field, "%s is the unspecified address", a)
	case a.IsLoopback():
		v.add(field, "%s is a loopback address", a)
	case a.IsMulticast():
		v.add(field, "%s is a multicast address", a)
	case a.IsLinkLocalUnicast():
		v.add(field, "%s is a link-local address", a)
	case !a.IsGlobalUnicast():
		v.add(field, "%s is not a unicast address", a)
	default:
		return a, true
	}
	return netip.Addr{}, false
}

func vips(v *Violations, out *vipdv1.Service, lim Limits, field string) []netip.Addr {
	if n := len(out.Vips); n == 0 || n > MaxVIPs {
		v.add(field+".vips", "has %d addresses; 1 to %d are required", n, MaxVIPs)
	}
	var addrs []netip.Addr
	for i, s := range out.Vips {
		f := fmt.Sprintf("%s.vips[%d]", field, i)
		a, ok := unicast(v, s, f)
		if !ok {
			continue
		}
		if slices.Contains(addrs, a) {
			v.add(f, "%s is listed twice", a)
			continue
		}
		if len(lim.ServiceCIDRs) > 0 && !slices.ContainsFunc(lim.ServiceCIDRs, func(p netip.Prefix) bool { return p.Contains(a) }) {
			v.add(f, "%s is outside the service CIDRs %v (--service-cidr)", a, lim.ServiceCIDRs)
			continue
		}
		out.Vips[i] = canonical(a, s)
		addrs = append(addrs, a)
	}
	return addrs
}

func ports(v *Violations, out *vipdv1.Service, lim Limits, field string) []dataplane.Port {
	switch n, most := len(out.Ports), lim.maxPorts(); {
	case n == 0:
		v.add(field+".ports", "has no ports; at least 1 is required")
	case most >= 0 && n > most:
		v.add(field+".ports", "has %d ports; at most %d are allowed (--max-ports)", n, most)
	}
	type key struct {
		proto dataplane.Protocol
		port  uint32
	}
	seen := map[key]int{}
	names := map[string]int{}
	var res []dataplane.Port
	for i, p := range out.Ports {
		f := fmt.Sprintf("%s.ports[%d]", field, i)
		ok := true
		if p == nil {
			v.add(f, "is empty")
			continue
		}
		switch {
		case p.Name == "" && len(out.Ports) > 1:
			v.add(f+".name", "is required when a service has more than one port")
			ok = false
		case p.Name != "" && (len(p.Name) > MaxPortNameLength || !portNamePattern.MatchString(p.Name)):
			v.add(f+".name", "%q must be 1-%d lowercase letters, digits and '-', starting and ending with a letter or digit", p.Name, MaxPortNameLength)
			ok = false
		case p.Name != "":
			if j, dup := names[p.Name]; dup {
				v.add(f+".name", "%q is also the name of ports[%d]", p.Name, j)
				ok = false
			}
			names[p.Name] = i
		}
		if p.Protocol == vipdv1.Protocol_PROTOCOL_UNSPECIFIED {
			p.Protocol = vipdv1.Protocol_PROTOCOL_TCP
		}
		proto, known := protocols[p.Protocol]
		if !known {
			v.add(f+".protocol", "%d is not a known protocol", p.Protocol)
			ok = false
		}
		if p.Port == 0 || p.Port > 65535 {
			v.add(f+".port", "%d is out of range; 1 to 65535 are allowed", p.Port)
			ok = false
		}
		explicitTarget := p.TargetPort != 0
		if !explicitTarget {
			p.TargetPort = p.Port
		}
		if explicitTarget && p.TargetPort > 65535 {
			v.add(f+".target_port", "%d is out of range; 1 to 65535 are allowed, or 0 for the same as port", p.TargetPort)
			ok = false
		}
		if !ok {
			continue
		}
		k := key{proto, p.Port}
		if j, dup := seen[k]; dup {
			v.add(f, "%d/%s is also ports[%d]; each protocol and port may appear once", p.Port, proto, j)
			continue
		}
		seen[k] = i
		res = append(res, dataplane.Port{Name: p.Name, Protocol: proto, Port: uint16(p.Port), TargetPort: uint16(p.TargetPort)})
	}
	return res
}

var protocols = map[vipdv1.Protocol]dataplane.Protocol{
	vipdv1.Protocol_PROTOCOL_TCP:  dataplane.TCP,
	vipdv1.Protocol_PROTOCOL_UDP:  dataplane.UDP,
	vipdv1.Protocol_PROTOCOL_SCTP: dataplane.SCTP,
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

// Backend validates and normalizes b in place for a service with context ctx,
// and returns its dataplane form.
func Backend(b *vipdv1.Backend, ctx BackendContext, field string) (dataplane.Backend, Violations) {
	var v Violations
	db, _ := backend(&v, b, ctx, field)
	return db, v
}

var backendStates = map[vipdv1.BackendState]dataplane.BackendState{
	vipdv1.BackendState_BACKEND_STATE_READY:       dataplane.BackendReady,
	vipdv1.BackendState_BACKEND_STATE_TERMINATING: dataplane.BackendTerminating,
	vipdv1.BackendState_BACKEND_STATE_NOT_SERVING: dataplane.BackendNotServing,
}

func backend(v *Violations, b *vipdv1.Backend, ctx BackendContext, field string) (dataplane.Backend, bool) {
	if b == nil {
		v.add(field, "is empty")
		return dataplane.Backend{}, false
	}
	before := len(*v)
	ip, ok := unicast(v, b.Ip, field+".ip")
	ok = ok && checkBackendIP(v, ip, field+".ip")
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
	if len(b.Ports) > 0 {
		names = slices.Sorted(maps.Keys(b.Ports))
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
	if len(b.Zone) > MaxZoneLength {
		v.add(field+".zone", "is %d characters long; at most %d are allowed", len(b.Zone), MaxZoneLength)
	} else if hasControl(b.Zone) {
		v.add(field+".zone", "%q has control characters", b.Zone)
	}
	if len(*v) > before {
		return dataplane.Backend{}, false
	}
	return dataplane.Backend{IP: ip, Ports: ports, OnlyNamedPorts: b.OnlyNamedPorts, State: state, Weight: uint16(b.Weight),
		NodeLocal: b.NodeLocal, Zone: b.Zone}, true
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

func affinity(v *Violations, out *vipdv1.Service, field string) dataplane.SessionAffinity {
	if out.SessionAffinity == nil {
		out.SessionAffinity = &vipdv1.SessionAffinityConfig{}
	}
	a := out.SessionAffinity
	f := field + ".session_affinity"
	switch a.Mode {
	case vipdv1.SessionAffinity_SESSION_AFFINITY_UNSPECIFIED, vipdv1.SessionAffinity_SESSION_AFFINITY_NONE:
		a.Mode = vipdv1.SessionAffinity_SESSION_AFFINITY_NONE
		if a.TimeoutSeconds != 0 {
			v.add(f+".timeout_seconds", "may be set only with SESSION_AFFINITY_CLIENT_IP")
		}
		return dataplane.SessionAffinity{}
	case vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP:
		if a.TimeoutSeconds == 0 {
			a.TimeoutSeconds = DefaultAffinityTimeout
		}
		if a.TimeoutSeconds > MaxAffinityTimeout {
			v.add(f+".timeout_seconds", "%d is out of range; 1 to %d are allowed, or 0 for %d", a.TimeoutSeconds, MaxAffinityTimeout, DefaultAffinityTimeout)
		}
		return dataplane.SessionAffinity{ClientIP: true, Timeout: time.Duration(a.TimeoutSeconds) * time.Second}
	default:
		v.add(f+".mode", "%d is not a known session affinity mode", a.Mode)
		return dataplane.SessionAffinity{}
	}
}

func trafficPolicy(v *Violations, out *vipdv1.Service, field string) dataplane.TrafficPolicy {
	switch out.InternalTrafficPolicy {
	case vipdv1.TrafficPolicy_TRAFFIC_POLICY_UNSPECIFIED, vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER:
		out.InternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER
		return dataplane.TrafficPolicyCluster
	case vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL:
		return dataplane.TrafficPolicyLocal
	}
	v.add(field+".internal_traffic_policy", "%d is not a known traffic policy", out.InternalTrafficPolicy)
	return 0
}

func loadBalancing(v *Violations, out *vipdv1.Service, field string) dataplane.LoadBalancing {
	switch out.LoadBalancing {
	case vipdv1.LoadBalancing_LOAD_BALANCING_UNSPECIFIED, vipdv1.LoadBalancing_LOAD_BALANCING_RANDOM:
		out.LoadBalancing = vipdv1.LoadBalancing_LOAD_BALANCING_RANDOM
		return dataplane.LoadBalancingRandom
	case vipdv1.LoadBalancing_LOAD_BALANCING_MAGLEV:
		return dataplane.LoadBalancingMaglev
	}
	v.add(field+".load_balancing", "%d is not a known load-balancing algorithm", out.LoadBalancing)
	return 0
}

func labels(v *Violations, out *vipdv1.Service, field string) {
	if len(out.Labels) > MaxLabels {
		v.add(field+".labels", "has %d labels; at most %d are allowed", len(out.Labels), MaxLabels)
	}
	for _, k := range slices.Sorted(maps.Keys(out.Labels)) {
		val := out.Labels[k]
		f := fmt.Sprintf("%s.labels[%q]", field, k)
		if k == "" || len(k) > MaxLabelLength {
			v.add(f, "keys must be 1 to %d characters long", MaxLabelLength)
		}
		if len(val) > MaxLabelLength {
			v.add(f, "values may be at most %d characters long", MaxLabelLength)
		}
		if hasControl(k) || hasControl(val) {
			v.add(f, "keys and values must not contain control characters")
		}
	}
}

// hasControl reports whether s has a control character, which free-form
// text may not: vipctl's YAML output cannot carry them, and they would
// garble tables and logs.
func hasControl(s string) bool { return strings.ContainsFunc(s, unicode.IsControl) }
