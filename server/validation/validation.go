package validation

import (
	"fmt"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
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
	// DefaultMaxPorts is the default of Limits.MaxPorts (--max-ports).
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

// Limits are the limits an operator may configure. They are admission
// policy: the store loads its state without them. Service checks the
// per-service ones; the store enforces the totals (MaxServices and
// MaxTotalBackends) when a change is staged, because only it sees every
// service.
type Limits struct {
	// MaxBackends is the most backends one service may have; 0 means no
	// limit.
	MaxBackends int
	// MaxPorts is the most ports one service may have; 0 means no limit.
	MaxPorts int
	// MaxServices is the most services the store may hold; 0 means no limit.
	MaxServices int
	// MaxTotalBackends is the most backends the store may hold, summed over
	// all services; 0 means no limit.
	MaxTotalBackends int
	// ServiceCIDRs, when not empty, are the only ranges VIPs may come from.
	ServiceCIDRs []netip.Prefix
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
	portNamePattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)
)

// Name checks a service or owner name as every vipd has: 1-253
// characters of [a-z0-9] and "-./_". It is the check for a name that is
// looked up or may already be stored (GetService, DeleteService, an owner
// to list); a name that a write creates must also pass NewName.
func Name(name, field string) Violations {
	var v Violations
	checkName(&v, name, field)
	return v
}

// NewName checks a service or owner name that a write creates: Name, and
// besides not starting with "-" and without an empty, "." or ".." segment
// between slashes (see unsafeName). Services and owners that an earlier
// vipd stored under such a name stay readable and writable: the API
// applies NewName only where the name is not stored yet.
func NewName(name, field string) Violations {
	v := Name(name, field)
	if len(v) == 0 {
		if why := unsafeName(name); why != "" {
			v.add(field, "%q %s", name, why)
		}
	}
	return v
}

// nameChars reports whether name is made only of the characters a name may
// have, [a-z0-9._/-], and has one at least. It is a loop rather than a
// regular expression because a big SyncServices checks 100,000 names twice.
func nameChars(name string) bool {
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '/' || c == '-') {
			return false
		}
	}
	return name != ""
}

func checkName(v *Violations, name, field string) {
	switch {
	case name == "":
		v.add(field, "is required")
	case len(name) > MaxNameLength:
		v.add(field, "is %d characters long; at most %d are allowed", len(name), MaxNameLength)
	case !nameChars(name):
		v.add(field, "%q may contain only lowercase letters, digits and \"-./_\"", name)
	}
}

// Service admits in, which is named field in the request: it checks the
// admission policy and converts it (ConvertService). On success it returns
// a normalized copy (defaults filled in, addresses canonical, backends
// sorted by IP, generation zero) and its dataplane form. in is not modified.
// Its name and owner get Name's check, not NewName's, because the service
// or owner may be stored already: the caller applies NewName to those the
// write creates.
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
	in.Generation = 0
	// The fields' names are built only for a violation, as the backends'
	// below.
	var probe Violations
	if checkName(&probe, in.Name, ""); len(probe) > 0 {
		checkName(&v, in.Name, field+".name")
	}
	if in.Owner != "" && len(Owner(in.Owner, "")) > 0 { // ConvertService fills in DefaultOwner
		v = append(v, Owner(in.Owner, field+".owner")...)
	}
	badVIPs := !vips(&v, in, lim, field)
	ports(&v, in, lim, field)
	if lim.MaxBackends > 0 && len(in.Backends) > lim.MaxBackends {
		v.add(field+".backends", "has %d backends; at most %d are allowed (--max-backends)", len(in.Backends), lim.MaxBackends)
	}
	for i, b := range in.Backends {
		// The field's name is built only for a violation: a big SyncServices
		// validates millions of valid backends.
		var probe Violations
		if !backend(&probe, b, "") {
			backend(&v, b, fmt.Sprintf("%s.backends[%d]", field, i))
		}
	}
	affinityPolicy(&v, in, field)
	labels(&v, in, field)
	healthCheck(&v, in, field)
	externalPolicy(&v, in, field)
	trafficDistribution(&v, in, field)

	dp, cv := convertService(in, field, badVIPs)
	v = v.withConversion(cv)
	if len(v) > 0 {
		return nil, nil, v
	}
	return in, dp, nil
}

// UpdatedBackends admits svc, a stored service whose backends a request
// changed, each new backend admitted by Backend already. The backend
// count is all that is new, so only --max-backends is checked; the rest
// was admitted when it was stored, under the policy of that time (which
// may have been looser), and is only converted. It normalizes svc in place
// and returns it, as ServiceInPlace does.
func UpdatedBackends(svc *vipdv1.Service, lim Limits, field string) (*vipdv1.Service, *dataplane.Service, Violations) {
	var v Violations
	if svc != nil && lim.MaxBackends > 0 && len(svc.Backends) > lim.MaxBackends {
		v.add(field+".backends", "has %d backends; at most %d are allowed (--max-backends)", len(svc.Backends), lim.MaxBackends)
		return nil, nil, v
	}
	if svc != nil {
		svc.Generation = 0
	}
	dp, v := ConvertService(svc, field)
	if len(v) > 0 {
		return nil, nil, v
	}
	return svc, dp, nil
}

// withConversion returns v, the policy's violations, with those of
// structural, the conversion's, for fields that v has none for: where the
// policy rejects a field already (an address that does not parse, say),
// the conversion's complaint about it says nothing new.
func (v Violations) withConversion(structural Violations) Violations {
	for _, s := range structural {
		if !slices.ContainsFunc(v, func(p Violation) bool { return p.Field == s.Field }) {
			v = append(v, s)
		}
	}
	return v
}

// indexed names element i of the list name in field: field.name[i].
func indexed(field, name string, i int) string {
	return field + "." + name + "[" + strconv.Itoa(i) + "]"
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
	case mapped(v, s, a, field):
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

// vips checks the VIPs, and reports whether each one passes.
func vips(v *Violations, in *vipdv1.Service, lim Limits, field string) bool {
	ok := true
	if n := len(in.Vips); n == 0 || n > MaxVIPs {
		v.add(field+".vips", "has %d addresses; 1 to %d are required", n, MaxVIPs)
	}
	for i, s := range in.Vips {
		// The field's name is built only for a violation: a big SyncServices
		// validates hundreds of thousands of valid VIPs.
		var probe Violations
		a, valid := unicast(&probe, s, "")
		switch {
		case !valid:
			unicast(v, s, indexed(field, "vips", i))
			ok = false
		case len(lim.ServiceCIDRs) > 0 && !slices.ContainsFunc(lim.ServiceCIDRs, func(p netip.Prefix) bool { return p.Contains(a) }):
			v.add(indexed(field, "vips", i), "%s is outside the service CIDRs %v (--service-cidr)", a, lim.ServiceCIDRs)
			ok = false
		}
	}
	return ok
}

func ports(v *Violations, in *vipdv1.Service, lim Limits, field string) {
	switch n := len(in.Ports); {
	case n == 0:
		v.add(field+".ports", "has no ports; at least 1 is required")
	case lim.MaxPorts > 0 && n > lim.MaxPorts:
		v.add(field+".ports", "has %d ports; at most %d are allowed (--max-ports)", n, lim.MaxPorts)
	}
	for i, p := range in.Ports {
		if p == nil {
			continue // ConvertService reports it
		}
		switch {
		case p.Name == "" && len(in.Ports) > 1:
			v.add(indexed(field, "ports", i)+".name", "is required when a service has more than one port")
		case p.Name != "" && (len(p.Name) > MaxPortNameLength || !portNamePattern.MatchString(p.Name)):
			v.add(indexed(field, "ports", i)+".name", "%q must be 1-%d lowercase letters, digits and '-', starting and ending with a letter or digit", p.Name, MaxPortNameLength)
		}
	}
}

// Backend admits b, for a service with context ctx: it checks the
// admission policy and converts it (ConvertBackend), normalizing b in
// place, and returns its dataplane form.
func Backend(b *vipdv1.Backend, ctx BackendContext, field string) (dataplane.Backend, Violations) {
	var v Violations
	backend(&v, b, field)
	db, cv := ConvertBackend(b, ctx, field)
	if v = v.withConversion(cv); len(v) > 0 {
		return dataplane.Backend{}, v
	}
	return db, nil
}

// backend checks the admission policy of b, and reports whether b passes.
func backend(v *Violations, b *vipdv1.Backend, field string) bool {
	if b == nil {
		return true // ConvertBackend reports it
	}
	before := len(*v)
	if ip, ok := unicast(v, b.Ip, field+".ip"); ok {
		checkBackendIP(v, ip, field+".ip")
	}
	if len(b.Zone) > MaxZoneLength {
		v.add(field+".zone", "is %d characters long; at most %d are allowed", len(b.Zone), MaxZoneLength)
	} else if hasControl(b.Zone) {
		v.add(field+".zone", "%q has control characters", b.Zone)
	}
	hints(v, b, field)
	return len(*v) == before
}

// affinityPolicy checks the session affinity's timeout.
func affinityPolicy(v *Violations, in *vipdv1.Service, field string) {
	a := in.SessionAffinity
	if a == nil {
		return
	}
	f := field + ".session_affinity.timeout_seconds"
	switch a.Mode {
	case vipdv1.SessionAffinity_SESSION_AFFINITY_UNSPECIFIED, vipdv1.SessionAffinity_SESSION_AFFINITY_NONE:
		if a.TimeoutSeconds != 0 {
			v.add(f, "may be set only with SESSION_AFFINITY_CLIENT_IP")
		}
	case vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP:
		if a.TimeoutSeconds > MaxAffinityTimeout {
			v.add(f, "%d is out of range; 1 to %d are allowed, or 0 for %d", a.TimeoutSeconds, MaxAffinityTimeout, DefaultAffinityTimeout)
		}
	}
}

func labels(v *Violations, out *vipdv1.Service, field string) {
	if len(out.Labels) > MaxLabels {
		v.add(field+".labels", "has %d labels; at most %d are allowed", len(out.Labels), MaxLabels)
	}
	if len(out.Labels) == 0 {
		return // no key list to sort: most services have no labels
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
