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
// It returns the live types to subscribe to (nil: all of them), whether
// FLOW_EVENT_TYPE_EXISTING was among them, and whether any live type is
// wanted at all: types that name only EXISTING ask for no live events.
func FlowTypes(in []vipdv1.FlowEventType, field string) (live []dataplane.FlowEventType, existing, watch bool, v Violations) {
	for i, t := range in {
		switch t {
		case vipdv1.FlowEventType_FLOW_EVENT_TYPE_NEW:
			live = append(live, dataplane.FlowNew)
		case vipdv1.FlowEventType_FLOW_EVENT_TYPE_CLOSED:
			live = append(live, dataplane.FlowClosed)
		case vipdv1.FlowEventType_FLOW_EVENT_TYPE_EXISTING:
			existing = true
		default:
			v.add(fmt.Sprintf("%s[%d]", field, i), "%v is not an event type to watch; use NEW, CLOSED or EXISTING", t)
		}
	}
	return live, existing, len(in) == 0 || len(live) > 0, v
}

// Explain validates an ExplainRequest and returns the connection it names.
func Explain(in *vipdv1.ExplainRequest) (dataplane.ExplainQuery, Violations) {
	var v Violations
	var q dataplane.ExplainQuery
	client, clientOK := explainAddr(&v, in.ClientIp, "client_ip")
	vip, vipOK := explainAddr(&v, in.Vip, "vip")
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

// explainAddr parses s as an address of an ExplainRequest: any IP address
// without a zone, an IPv4 one in its IPv4 form. An IPv4-mapped IPv6
// address is refused as everywhere else in the API (see unicast), rather
// than taken for its IPv4 address: Explain answers about the address it
// was given, and a VIP or a backend cannot be written that way.
func explainAddr(v *Violations, s, field string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil && a.Is4In6() {
		v.add(field, "%q is an IPv4-mapped IPv6 address; use the IPv4 form %s", s, a.Unmap())
		return netip.Addr{}, false
	}
	return anyAddr(v, s, field)
}

// anyAddr parses s as an IP address without a zone, unmapping an
// IPv4-mapped one.
func anyAddr(v *Violations, s, field string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(s)
	switch {
	case s == "":
		v.add(field, "is required")
	case err != nil:
		v.add(field, "%q is not an IP address", s)
	case a.Zone() != "":
		v.add(field, "%q has a zone; zones are not allowed", s)
	default:
		return a.Unmap(), true
	}
	return netip.Addr{}, false
}

// addrOrAddrPort parses an optional IP or IP:port ([IPv6]:port).
func addrOrAddrPort(v *Violations, s, field string) (netip.Addr, uint16) {
	if s == "" {
		return netip.Addr{}, 0
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		if ap.Addr().Zone() != "" {
			v.add(field, "%q has a zone; zones are not allowed", s)
			return netip.Addr{}, 0
		}
		if ap.Port() == 0 {
			v.add(field, "%q has port 0; give no port to match every port", s)
			return netip.Addr{}, 0
		}
		return ap.Addr().Unmap(), ap.Port()
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		v.add(field, "%q is neither an IP address nor IP:port", s)
		return netip.Addr{}, 0
	}
	return a.Unmap(), 0
}

// addrOrPrefix parses an IP, as a one-address prefix, or a CIDR.
func addrOrPrefix(v *Violations, s, field string) netip.Prefix {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			v.add(field, "%q is not a CIDR such as 10.0.0.0/8", s)
			return netip.Prefix{}
		}
		if p.Addr().Is4In6() {
			// Flows carry IPv4 clients unmapped, so an IPv4-mapped CIDR
			// stands for its IPv4 one; a shorter one would also cover
			// IPv6 addresses that are not mapped, which no IPv4 CIDR can.
			if p.Bits() < 96 {
				v.add(field, "%q is shorter than /96, so it is not all IPv4-mapped addresses; write an IPv4 CIDR or an IPv6 one without the IPv4 part", s)
				return netip.Prefix{}
			}
			return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96).Masked()
		}
		return p.Masked()
	}
	a, ok := anyAddr(v, s, field)
	if !ok {
		return netip.Prefix{}
	}
	return netip.PrefixFrom(a, a.BitLen())
}
