package cli

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vipd/vipd/internal/manifest"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// servicesView is the table of "service list".
func servicesView(svcs []*vipdv1.Service) func(*table) {
	return func(t *table) {
		t.row("NAME", "OWNER", "VIPS", "PORTS", "BACKENDS", "AFFINITY", "GEN")
		for _, s := range svcs {
			ports := make([]string, len(s.GetPorts()))
			for i, p := range s.GetPorts() {
				ports[i] = portString(p, s.GetBackends())
			}
			t.row(s.GetName(), s.GetOwner(), strings.Join(s.GetVips(), ","), strings.Join(ports, ","),
				fmt.Sprintf("%d/%d", readyBackends(s), len(s.GetBackends())),
				affinityString(s.GetSessionAffinity()), strconv.FormatUint(s.GetGeneration(), 10))
		}
	}
}

// serviceView is the detail view of "service get".
func serviceView(s *vipdv1.Service, health ...*vipdv1.BackendHealth) func(*table) {
	return func(t *table) {
		ports := make([]string, len(s.GetPorts()))
		for i, p := range s.GetPorts() {
			ports[i] = strings.TrimSpace(p.GetName() + " " + portString(p, s.GetBackends()))
		}
		t.field("Name", s.GetName())
		t.field("Owner", s.GetOwner())
		t.field("Generation", strconv.FormatUint(s.GetGeneration(), 10))
		t.field("VIPs", strings.Join(s.GetVips(), ", "))
		t.field("Ports", strings.Join(ports, ", "))
		t.field("Session affinity", affinityString(s.GetSessionAffinity()))
		t.field("Internal traffic policy", enumString(s.GetInternalTrafficPolicy()))
		externalFields(t, s)
		t.field("Load balancing", enumString(s.GetLoadBalancing()))
		if d := s.GetTrafficDistribution(); d != vipdv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_UNSPECIFIED {
			t.field("Traffic distribution", enumString(d))
		}
		t.field("Labels", mapString(s.GetLabels()))
		t.field("Backends", fmt.Sprintf("%d ready of %d", readyBackends(s), len(s.GetBackends())))
		if len(s.GetBackends()) > 0 {
			t.section()
			backendRows(t, s.GetBackends(), s.GetPorts(), "  ")
		}
		if hc := s.GetHealthCheck(); hc != nil {
			t.section()
			t.field("Health check", healthCheckString(hc))
			t.section()
			t.row("  IP", "HEALTH", "SINCE", "IN-A-ROW", "DETAIL")
			for _, h := range health {
				since := "-"
				if h.GetSinceUnixMs() > 0 {
					since = time.UnixMilli(h.GetSinceUnixMs()).UTC().Format(time.RFC3339)
				}
				t.row("  "+h.GetIp(), enumString(h.GetState()), since, strconv.FormatUint(uint64(h.GetConsecutive()), 10), h.GetDetail())
			}
		}
	}
}

// externalFields adds the external half of s to a "service get" view:
// each of its external fields that is set, and the external traffic
// policy when the service takes external traffic (a node port, an
// external or a load-balancer IP) or has a policy other than cluster. A
// ClusterIP-only service shows none of them. The node ports are shown with
// the ports (portString).
func externalFields(t *table, s *vipdv1.Service) {
	hasNodePort := slices.ContainsFunc(s.GetPorts(), func(p *vipdv1.Port) bool { return p.GetNodePort() != 0 })
	if len(s.GetExternalIps()) > 0 {
		t.field("External IPs", strings.Join(s.GetExternalIps(), ", "))
	}
	if len(s.GetLoadBalancerIps()) > 0 {
		t.field("Load-balancer IPs", strings.Join(s.GetLoadBalancerIps(), ", "))
	}
	if len(s.GetLoadBalancerSourceRanges()) > 0 {
		t.field("Source ranges", strings.Join(s.GetLoadBalancerSourceRanges(), ", "))
	}
	etp := s.GetExternalTrafficPolicy()
	if hasNodePort || len(s.GetExternalIps()) > 0 || len(s.GetLoadBalancerIps()) > 0 ||
		etp != vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER && etp != vipdv1.TrafficPolicy_TRAFFIC_POLICY_UNSPECIFIED {
		t.field("External traffic policy", enumString(etp))
	}
	if hc := s.GetHealthCheckNodePort(); hc != 0 {
		t.field("Health-check node port", strconv.FormatUint(uint64(hc), 10)+"/TCP")
	}
}

// healthCheckString is a health check in one line, defaults filled in:
// "tcp port http every 2000ms (timeout 1000ms, up 2, down 3)".
func healthCheckString(hc *vipdv1.HealthCheck) string {
	// The API's defaults (vipd.v1.HealthCheck), as vipd applies them.
	d := proto.Clone(hc).(*vipdv1.HealthCheck)
	if d.IntervalMs == 0 {
		d.IntervalMs = 2000
	}
	if d.TimeoutMs == 0 {
		d.TimeoutMs = min(1000, d.IntervalMs)
	}
	if d.HealthyThreshold == 0 {
		d.HealthyThreshold = 2
	}
	if d.UnhealthyThreshold == 0 {
		d.UnhealthyThreshold = 3
	}
	if d.Protocol == vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_HTTP && d.Path == "" {
		d.Path = "/"
	}
	port := "first port"
	switch {
	case d.GetPort() != 0:
		port = "port " + strconv.FormatUint(uint64(d.GetPort()), 10)
	case d.GetPortName() != "":
		port = "port " + d.GetPortName()
	}
	what := enumString(d.GetProtocol())
	switch d.GetProtocol() {
	case vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_HTTP:
		what += " GET " + d.GetPath()
	case vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_GRPC:
		what += " service " + strconv.Quote(d.GetGrpcService())
	}
	return fmt.Sprintf("%s, %s, every %dms (timeout %dms, up after %d passes, down after %d failures)",
		what, port, d.GetIntervalMs(), d.GetTimeoutMs(), d.GetHealthyThreshold(), d.GetUnhealthyThreshold())
}

// backendsView is the table of "backends list". ports are the service's
// ports, if known: they let the PORTS column name each port a backend does
// not serve.
func backendsView(backends []*vipdv1.Backend, ports ...*vipdv1.Port) func(*table) {
	return func(t *table) { backendRows(t, backends, ports, "") }
}

// backendRows writes a table of backends of a service with ports, each row
// starting with indent.
// A HINTS column (topology hints, hintsString) is added only when a
// backend has hints.
func backendRows(t *table, backends []*vipdv1.Backend, ports []*vipdv1.Port, indent string) {
	hints := slices.ContainsFunc(backends, func(b *vipdv1.Backend) bool { return hintsString(b) != "" })
	head := []string{indent + "IP", "STATE", "WEIGHT", "NODE-LOCAL", "ZONE", "PORTS"}
	if hints {
		head = append(head, "HINTS")
	}
	t.row(head...)
	for _, b := range backends {
		row := []string{indent + b.GetIp(), enumString(b.GetState()), strconv.FormatUint(uint64(b.GetWeight()), 10),
			strconv.FormatBool(b.GetNodeLocal()), b.GetZone(), backendPortsString(b, ports)}
		if hints {
			row = append(row, hintsString(b))
		}
		t.row(row...)
	}
}

// hintsString is the HINTS cell of backend b: its topology hints as
// "zones=a,b nodes=n1", "" without any.
func hintsString(b *vipdv1.Backend) string {
	var parts []string
	if z := b.GetForZones(); len(z) > 0 {
		parts = append(parts, "zones="+strings.Join(z, ","))
	}
	if n := b.GetForNodes(); len(n) > 0 {
		parts = append(parts, "nodes="+strings.Join(n, ","))
	}
	return strings.Join(parts, " ")
}

// backendPortsString is the PORTS cell of backend b of a service with
// ports: its target-port overrides as "http=8081", sorted by name (the
// empty name, of a service's only, unnamed port, shown as ""), then, for
// a backend that serves only the ports it names, every other port as not
// served: "metrics=-" for each when ports are known, else "*=-".
func backendPortsString(b *vipdv1.Backend, ports []*vipdv1.Port) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(b.GetPorts())) {
		parts = append(parts, fmt.Sprintf("%s=%d", portKeyString(k), b.GetPorts()[k]))
	}
	if b.GetOnlyNamedPorts() {
		if len(ports) == 0 {
			parts = append(parts, "*=-")
		}
		for _, p := range ports {
			if _, ok := b.GetPorts()[p.GetName()]; !ok {
				parts = append(parts, portKeyString(p.GetName())+"=-")
			}
		}
	}
	return strings.Join(parts, ",")
}

// portKeyString is a port name as the PORTS column shows it: `""` for the
// empty name.
func portKeyString(name string) string {
	if name == "" {
		return `""`
	}
	return name
}

// statusView is the key/value view of "status".
func statusView(st *vipdv1.GetStatusResponse) func(*table) {
	return func(t *table) {
		lastSync := "never"
		if st.GetLastSyncTime() != nil {
			lastSync = st.GetLastSyncTime().AsTime().UTC().Format(time.RFC3339)
			if st.GetLastSyncDuration() != nil {
				lastSync += fmt.Sprintf(" (took %v)", st.GetLastSyncDuration().AsDuration())
			}
		}
		lb := make([]string, len(st.GetSupportedLoadBalancing()))
		for i, x := range st.GetSupportedLoadBalancing() {
			lb[i] = enumString(x)
		}
		protocols := make([]string, len(st.GetSupportedProtocols()))
		for i, x := range st.GetSupportedProtocols() {
			protocols[i] = protocolString(x)
		}
		t.field("Dataplane", st.GetDataplane())
		t.field("Version", st.GetVersion())
		t.field("Instance ID", st.GetInstanceId())
		t.field("Ready", strconv.FormatBool(st.GetReady()))
		t.field("Node", st.GetNodeName())
		zone := st.GetZone()
		if src := st.GetZoneSource(); src != "" {
			zone += " (" + zoneSourceText[src] + ")"
		}
		t.field("Zone", zone)
		t.field("Services", strconv.FormatUint(uint64(st.GetServices()), 10))
		t.field("Backends", strconv.FormatUint(uint64(st.GetBackends()), 10))
		t.field("Applied generation", strconv.FormatUint(st.GetAppliedGeneration(), 10))
		t.field("Last sync", lastSync)
		t.field("Last error", st.GetLastError())
		t.field("Load balancing", strings.Join(lb, ", "))
		t.field("Protocols", strings.Join(protocols, ", "))
		warningsView(t, st.GetWarnings())
	}
}

// zoneSourceText says where GetStatus's zone_source came from.
var zoneSourceText = map[string]string{"flag": "--zone", "api": "set through the API"}

// portString is a port of a service with backends as "80/TCP→8080", or
// "53/UDP" when the target port is the same; a node port follows the port
// as kubectl shows it: "80:30080/TCP→8080". The target is what
// targetString says.
func portString(p *vipdv1.Port, backends []*vipdv1.Backend) string {
	port := strconv.FormatUint(uint64(p.GetPort()), 10)
	if np := p.GetNodePort(); np != 0 {
		port += ":" + strconv.FormatUint(uint64(np), 10)
	}
	s := fmt.Sprintf("%s/%s", port, protocolString(p.GetProtocol()))
	if tp := targetString(p, backends); tp != "" {
		s += "→" + tp
	}
	return s
}

// perBackend is the target of a port whose backends listen on different
// numbers for it.
const perBackend = "per-backend"

// targetString is where the backends of port p listen, for portString:
// the port's target_port while a backend uses it (one that serves the
// port without a number of its own in Backend.ports), or while no backend
// serves the port; otherwise the one number the backends name, or
// "per-backend" when they name several. A Kubernetes Service's backends
// all name their own (a named targetPort resolves per pod), and its
// target_port, which vipd fills in with the port when the adapter leaves
// it 0, would mislead. It is "" when the target is the port itself.
func targetString(p *vipdv1.Port, backends []*vipdv1.Backend) string {
	own := p.GetTargetPort()
	if own == 0 {
		own = p.GetPort()
	}
	named := map[uint32]bool{}
	usesOwn := false
	for _, b := range backends {
		if n, ok := b.GetPorts()[p.GetName()]; ok {
			named[n] = true
		} else if !b.GetOnlyNamedPorts() {
			usesOwn = true
		}
	}
	target := own
	switch {
	case usesOwn || len(named) == 0:
	case len(named) > 1:
		return perBackend
	default:
		for n := range named {
			target = n
		}
	}
	if target == p.GetPort() {
		return ""
	}
	return strconv.FormatUint(uint64(target), 10)
}

func protocolString(p vipdv1.Protocol) string {
	return strings.ToUpper(enumString(p))
}

// affinityString is "none", or "client-ip:10800s" with the timeout.
func affinityString(a *vipdv1.SessionAffinityConfig) string {
	s := enumString(a.GetMode())
	if a.GetTimeoutSeconds() != 0 {
		s += fmt.Sprintf(":%ds", a.GetTimeoutSeconds())
	}
	return s
}

// enumString is the short name that vipctl also accepts as input, such as
// "not-serving". vipd fills in defaults, so the zero value, shown as
// "unspecified", is rare.
func enumString(e protoreflect.Enum) string {
	return manifest.ShortEnumName(e.Descriptor(), e.Number())
}

// readyBackends counts the backends that get new connections.
func readyBackends(s *vipdv1.Service) int {
	n := 0
	for _, b := range s.GetBackends() {
		switch b.GetState() {
		case vipdv1.BackendState_BACKEND_STATE_READY, vipdv1.BackendState_BACKEND_STATE_UNSPECIFIED:
			n++
		}
	}
	return n
}

// mapString is a map as "k1=v1,k2=v2", sorted by key.
func mapString[V any](m map[string]V) string {
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%v", k, m[k]))
	}
	return strings.Join(parts, ",")
}
