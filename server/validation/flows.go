package validation

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/vipd/vipd/dataplane"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/flowhub"
)

// FlowFilter validates a flow filter, named field in the request, and
// returns it as the hub filters flows. A nil filter matches everything.
func FlowFilter(in *vipdv1.FlowFilter, field string) (flowhub.Filter, Violations) {
	var v Violations
	var f flowhub.Filter
	if in == nil {
		return f, nil
	}
	if in.Service != "" {
		checkName(&v, in.Service, field+".service")
		f.Service = in.Service
	}
	f.VIP, f.VIPPort = addrOrAddrPort(&v, in.Vip, field+".vip")
	f.Backend, f.BackendPort = addrOrAddrPort(&v, in.Backend, field+".backend")
	if in.Client != "" {
		f.Client = addrOrPrefix(&v, in.Client, field+".client")
	}
	if in.Protocol != vipdv1.Protocol_PROTOCOL_UNSPECIFIED {
		p, ok := protocols[in.Protocol]
		if !ok {
			v.add(field+".protocol", "%d is not a known protocol", in.Protocol)
		}
		f.Protocol = p
	}
	return f, v
}

// FlowTypes validates the event types of a WatchFlowsRequest, named field.
// It returns the live types to subscribe to (nil: all of them, health
// transitions included; FLOW_EVENT_TYPE_HEALTH is flowhub.HealthTransition),
// whether FLOW_EVENT_TYPE_EXISTING was among them, and whether any live
// type is wanted at all: types that name only EXISTING ask for no live
// events.
func FlowTypes(in []vipdv1.FlowEventType, field string) (live []dataplane.FlowEventType, existing, watch bool, v Violations) {
	for i, t := range in {
		switch t {
		case vipdv1.FlowEventType_FLOW_EVENT_TYPE_NEW:
			live = append(live, dataplane.FlowNew)
		case vipdv1.FlowEventType_FLOW_EVENT_TYPE_CLOSED:
			live = append(live, dataplane.FlowClosed)
		case vipdv1.FlowEventType_FLOW_EVENT_TYPE_HEALTH:
			live = append(live, flowhub.HealthTransition)
		case vipdv1.FlowEventType_FLOW_EVENT_TYPE_EXISTING:
			existing = true
		default:
			v.add(fmt.Sprintf("%s[%d]", field, i), "%v is not an event type to watch; use NEW, CLOSED, HEALTH or EXISTING", t)
		}
	}
	return live, existing, len(in) == 0 || len(live) > 0, v
}

// Explain validates an ExplainRequest and returns the connection it names.
func Explain(in *vipdv1.ExplainRequest) (dataplane.ExplainQuery, Violations) {
	var v Violations
	var q dataplane.ExplainQuery
	client, clientOK := anyAddr(&v, in.ClientIp, "client_ip")
	vip, vipOK := anyAddr(&v, in.Vip, "vip")
	if in.ClientPort > 65535 {
		v.add("client_port", "%d is out of range; 1 to 65535 are allowed, or 0 when unknown", in.ClientPort)
	}
	if in.Port == 0 || in.Port > 65535 {
		v.add("port", "%d is out of range; 1 to 65535 are allowed", in.Port)
	}
	q.Protocol = dataplane.TCP
	if in.Protocol != vipdv1.Protocol_PROTOCOL_UNSPECIFIED {
		p, ok := protocols[in.Protocol]
		if !ok {
			v.add("protocol", "%d is not a known protocol", in.Protocol)
		}
		q.Protocol = p
	}
	if clientOK && vipOK && client.Is4() != vip.Is4() {
		v.add("client_ip", "%s is %s but vip %s is %s", client, family(client), vip, family(vip))
	}
	if len(v) > 0 {
		return dataplane.ExplainQuery{}, v
	}
	q.Client = netip.AddrPortFrom(client, uint16(in.ClientPort))
	q.VIP = netip.AddrPortFrom(vip, uint16(in.Port))
	return q, nil
}

// mapped adds the API's one violation for an IPv4-mapped IPv6 address a,
// written s, in field, and reports whether a is one. The API refuses the
// mapped form wherever it takes an address (VIPs and backends, see
// unicast; UpdateBackends' remove; Explain; flow filters) rather than take
// it for its IPv4 address: no VIP or backend can be written that way, and
// vipd's flows carry IPv4 addresses in their IPv4 form, so a mapped
// address would only ever stand for another one.
func mapped(v *Violations, s string, a netip.Addr, field string) bool {
	if !a.Is4In6() {
		return false
	}
	v.add(field, "%q is an IPv4-mapped IPv6 address; use the IPv4 form %s", s, a.Unmap())
	return true
}

// RemovedBackendIP parses s, an address to remove from a service's
// backends (UpdateBackends' remove), named field: any IP address, an IPv4
// one in its IPv4 form (see mapped). A zone is allowed, as it always was;
// no backend has one, so such an address is absent.
func RemovedBackendIP(s, field string) (netip.Addr, Violations) {
	var v Violations
	a, err := netip.ParseAddr(s)
	switch {
	case err != nil:
		v.add(field, "%q is not an IP address", s)
	case mapped(&v, s, a, field):
	default:
		return a, nil
	}
	return netip.Addr{}, v
}

// anyAddr parses s as an IP address without a zone, an IPv4 one in its
// IPv4 form (see mapped).
func anyAddr(v *Violations, s, field string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(s)
	switch {
	case s == "":
		v.add(field, "is required")
	case err != nil:
		v.add(field, "%q is not an IP address", s)
	case a.Zone() != "":
		v.add(field, "%q has a zone; zones are not allowed", s)
	case mapped(v, s, a, field):
	default:
		return a, true
	}
	return netip.Addr{}, false
}

// addrOrAddrPort parses an optional IP or IP:port ([IPv6]:port), an IPv4
// address in its IPv4 form (see mapped).
func addrOrAddrPort(v *Violations, s, field string) (netip.Addr, uint16) {
	if s == "" {
		return netip.Addr{}, 0
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		switch {
		case ap.Addr().Zone() != "":
			v.add(field, "%q has a zone; zones are not allowed", s)
		case ap.Port() == 0:
			v.add(field, "%q has port 0; give no port to match every port", s)
		case mapped(v, s, ap.Addr(), field):
		default:
			return ap.Addr(), ap.Port()
		}
		return netip.Addr{}, 0
	}
	a, err := netip.ParseAddr(s)
	switch {
	case err != nil || a.Zone() != "":
		v.add(field, "%q is neither an IP address nor IP:port", s)
	case mapped(v, s, a, field):
	default:
		return a, 0
	}
	return netip.Addr{}, 0
}

// addrOrPrefix parses an IP, as a one-address prefix, or a CIDR. A CIDR of
// IPv4-mapped addresses is refused as a mapped address is (see mapped):
// flows carry IPv4 clients in their IPv4 form, so it would match no
// client as written.
func addrOrPrefix(v *Violations, s, field string) netip.Prefix {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		switch {
		case err != nil:
			v.add(field, "%q is not a CIDR such as 10.0.0.0/8", s)
		case p.Addr().Is4In6() && p.Bits() < 96:
			// It also covers IPv6 addresses that are not mapped, which
			// no IPv4 CIDR can.
			v.add(field, "%q is an IPv4-mapped IPv6 CIDR shorter than /96, so it is not all IPv4-mapped addresses; write an IPv4 CIDR or an IPv6 one without the IPv4 part", s)
		case p.Addr().Is4In6():
			v.add(field, "%q is an IPv4-mapped IPv6 CIDR; use the IPv4 form %s", s, netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96).Masked())
		default:
			return p.Masked()
		}
		return netip.Prefix{}
	}
	a, ok := anyAddr(v, s, field)
	if !ok {
		return netip.Prefix{}
	}
	return netip.PrefixFrom(a, a.BitLen())
}
