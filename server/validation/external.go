package validation

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/vipd/vipd/dataplane"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// Limits of the external half of a service (issue 17), fixed by the API
// contract.
const (
	// MaxExternalIPs is the most external_ips a service may have, and
	// the most load_balancer_ips.
	MaxExternalIPs = 8
	// MaxSourceRanges is the most load_balancer_source_ranges a service
	// may have.
	MaxSourceRanges = 64
)

// This file holds both halves (see doc.go) for the fields of external
// traffic: node_port, external_ips, load_balancer_ips,
// load_balancer_source_ranges, external_traffic_policy and
// health_check_node_port.
//
// Structural (convertExternal, and convertPorts for node_port): an address
// or CIDR that does not parse; a node port or health-check node port above
// 65535; a key given twice (a (protocol, node_port) twice in the service,
// an address twice in external_ips and load_balancer_ips together, an
// external or load-balancer IP that is also a VIP of the service, a source
// range twice once masked, a health_check_node_port that is also a TCP
// node_port of the service); an external or load-balancer IP of a family
// that no VIP of the service has; an unknown external_traffic_policy.
//
// Admission policy (externalPolicy): at most MaxExternalIPs of each list
// and MaxSourceRanges ranges; the address classes of VIPs (unicast, no
// IPv4-mapped form); no IPv4-mapped CIDR; health_check_node_port only
// with external_traffic_policy TRAFFIC_POLICY_LOCAL.
//
// Whether an external or load-balancer IP is a backend (of this or any
// service) or another service's VIP, and which node ports other services
// hold, is the store's check, made in the write's transaction.

// externalPolicy checks the admission policy of in's external fields.
func externalPolicy(v *Violations, in *vipdv1.Service, field string) {
	for _, l := range []struct {
		name  string
		addrs []string
	}{{"external_ips", in.ExternalIps}, {"load_balancer_ips", in.LoadBalancerIps}} {
		if n := len(l.addrs); n > MaxExternalIPs {
			v.add(field+"."+l.name, "has %d addresses; at most %d are allowed", n, MaxExternalIPs)
		}
		for i, s := range l.addrs {
			unicast(v, s, fmt.Sprintf("%s.%s[%d]", field, l.name, i))
		}
	}
	if n := len(in.LoadBalancerSourceRanges); n > MaxSourceRanges {
		v.add(field+".load_balancer_source_ranges", "has %d CIDRs; at most %d are allowed", n, MaxSourceRanges)
	}
	for i, s := range in.LoadBalancerSourceRanges {
		f := fmt.Sprintf("%s.load_balancer_source_ranges[%d]", field, i)
		p, err := netip.ParsePrefix(s)
		switch {
		case err != nil: // the conversion reports it
		case p.Addr().Is4In6() && p.Bits() < 96:
			v.add(f, "%q is an IPv4-mapped IPv6 CIDR shorter than /96, so it is not all IPv4-mapped addresses; write an IPv4 CIDR or an IPv6 one without the IPv4 part", s)
		case p.Addr().Is4In6():
			v.add(f, "%q is an IPv4-mapped IPv6 CIDR; use the IPv4 form %s", s, netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96).Masked())
		}
	}
	if in.HealthCheckNodePort != 0 && in.ExternalTrafficPolicy != vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL {
		v.add(field+".health_check_node_port", "may be set only with external_traffic_policy TRAFFIC_POLICY_LOCAL")
	}
}

// convertExternal converts svc's external fields into dp, whose VIPs and
// Ports are converted already, normalizing svc in place: addresses and
// CIDRs in canonical text (a CIDR masked: "10.0.0.1/8" is stored as
// "10.0.0.0/8"), in the order given, and external_traffic_policy
// TRAFFIC_POLICY_CLUSTER when unspecified. With badVIPs (see
// convertService) the families are not checked.
func convertExternal(v *Violations, svc *vipdv1.Service, dp *dataplane.Service, field string, badVIPs bool) {
	var has4, has6 bool
	for _, a := range dp.VIPs {
		has4, has6 = has4 || a.Is4(), has6 || a.Is6()
	}
	checkFamily := !badVIPs && (has4 || has6)
	type where struct {
		list string
		i    int
	}
	seen := map[netip.Addr]where{}
	convert := func(list string, addrs []string) []netip.Addr {
		var res []netip.Addr
		for i, s := range addrs {
			f := fmt.Sprintf("%s.%s[%d]", field, list, i)
			a, ok := parseAddr(v, s, f)
			if !ok {
				continue
			}
			addrs[i] = canonical(a, s)
			if w, dup := seen[a]; dup {
				v.add(f, "%s is also %s[%d]; an address may be listed once in external_ips and load_balancer_ips together", a, w.list, w.i)
				continue
			}
			seen[a] = where{list, i}
			if j := slices.Index(dp.VIPs, a); j >= 0 {
				v.add(f, "%s is also vips[%d]; an external or load-balancer IP is never a VIP of the service", a, j)
				continue
			}
			if checkFamily && (a.Is4() && !has4 || a.Is6() && !has6) {
				v.add(f, "%s is %s, but the service has no VIP of that family", a, family(a))
				continue
			}
			res = append(res, a)
		}
		return res
	}
	dp.ExternalIPs = convert("external_ips", svc.ExternalIps)
	dp.LoadBalancerIPs = convert("load_balancer_ips", svc.LoadBalancerIps)

	ranges := map[netip.Prefix]int{}
	for i, s := range svc.LoadBalancerSourceRanges {
		f := fmt.Sprintf("%s.load_balancer_source_ranges[%d]", field, i)
		p, err := netip.ParsePrefix(s)
		if err != nil {
			v.add(f, "%q is not a CIDR such as 10.0.0.0/8 or fd00::/64", s)
			continue
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		p = p.Masked()
		svc.LoadBalancerSourceRanges[i] = p.String()
		if j, dup := ranges[p]; dup {
			v.add(f, "%s is also load_balancer_source_ranges[%d]", p, j)
			continue
		}
		ranges[p] = i
		dp.LoadBalancerSourceRanges = append(dp.LoadBalancerSourceRanges, p)
	}

	switch svc.ExternalTrafficPolicy {
	case vipdv1.TrafficPolicy_TRAFFIC_POLICY_UNSPECIFIED, vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER:
		svc.ExternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER
		dp.ExternalTrafficPolicy = dataplane.TrafficPolicyCluster
	case vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL:
		dp.ExternalTrafficPolicy = dataplane.TrafficPolicyLocal
	default:
		v.add(field+".external_traffic_policy", "%d is not a known traffic policy", svc.ExternalTrafficPolicy)
	}

	f := field + ".health_check_node_port"
	switch hc := svc.HealthCheckNodePort; {
	case hc > 65535:
		v.add(f, "%d is out of range; 1 to 65535 are allowed, or 0 for none", hc)
	case hc != 0:
		for i, p := range svc.Ports {
			if p != nil && p.NodePort == hc && p.Protocol == vipdv1.Protocol_PROTOCOL_TCP {
				v.add(f, "%d is also the TCP node_port of ports[%d]; the health check needs a TCP node port of its own", hc, i)
				return
			}
		}
		dp.HealthCheckNodePort = uint16(hc)
	}
}
