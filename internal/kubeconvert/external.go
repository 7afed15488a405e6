package kubeconvert

// The external half of a Service: node ports, external IPs, load-balancer
// ingress IPs, their source ranges, the external traffic policy and the
// health-check node port, read as kube-proxy reads them
// (pkg/proxy/serviceport.go, newBaseServiceInfo; pkg/api/v1/service).

import (
	"fmt"
	"net"
	"net/netip"
	"strings"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	corev1 "k8s.io/api/core/v1"
	netutils "k8s.io/utils/net"
)

// Omission is a part of a Service that a conversion leaves out, as
// kube-proxy does (or, where kube-proxy would program something the
// apiserver never lets a Service have, as the apiserver means it).
type Omission struct {
	// Field is the path of what is left out in the Service, such as
	// "spec.externalIPs[1]" or "status.loadBalancer.ingress[0]".
	Field string
	// Reason says why, in a phrase.
	Reason string
}

func (o Omission) String() string { return o.Field + ": " + o.Reason }

// LoadBalancerSourceRangesAnnotation is the annotation that cloud load
// balancers read when spec.loadBalancerSourceRanges is empty. kube-proxy
// does not read it, and neither does the conversion.
const LoadBalancerSourceRangesAnnotation = corev1.AnnotationLoadBalancerSourceRangesKey

// families is which address families a Service has a cluster IP of:
// kube-proxy programs each family on its own, and a family without a
// cluster IP gets nothing at all.
type families struct{ v4, v6 bool }

func (f families) has(a netip.Addr) bool { return a.Is4() && f.v4 || a.Is6() && f.v6 }

func familyName(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// externallyAccessible is kube-proxy's ExternallyAccessible: the Services
// whose externalTrafficPolicy means anything.
func externallyAccessible(svc *corev1.Service) bool {
	switch svc.Spec.Type {
	case corev1.ServiceTypeLoadBalancer, corev1.ServiceTypeNodePort:
		return true
	case corev1.ServiceTypeClusterIP, "":
		return len(svc.Spec.ExternalIPs) > 0
	}
	return false
}

// hasNodePorts reports whether svc's type is one that the apiserver gives
// node ports to.
func hasNodePorts(svc *corev1.Service) bool {
	return svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer
}

// nodePort returns the node port of svc's port i, or 0 with an omission.
// kube-proxy serves whatever nodePort a port has; the apiserver gives one
// only to NodePort and LoadBalancer Services (to a LoadBalancer Service
// with allocateLoadBalancerNodePorts: false, only the ones set
// explicitly), and refuses one on any other type.
func nodePort(svc *corev1.Service, i int, omit func(field, format string, args ...any)) uint32 {
	p := svc.Spec.Ports[i].NodePort
	switch {
	case p == 0:
		return 0
	case !hasNodePorts(svc):
		omit(fmt.Sprintf("spec.ports[%d].nodePort", i), "a Service of type %s has no node ports", svc.Spec.Type)
		return 0
	case p < 0 || p > 65535:
		omit(fmt.Sprintf("spec.ports[%d].nodePort", i), "%d is not a port", p)
		return 0
	}
	return uint32(p)
}

// parseIP parses an address as kube-proxy does (leading zeros allowed, an
// IPv4-mapped IPv6 address is IPv4).
func parseIP(s string) (netip.Addr, bool) {
	ip := netutils.ParseIPSloppy(strings.TrimSpace(s))
	if ip == nil {
		return netip.Addr{}, false
	}
	a, ok := netip.AddrFromSlice(ip)
	return a.Unmap(), ok
}

// parseCIDR parses a source range as kube-proxy does (surrounding blanks
// and leading zeros allowed), masked.
func parseCIDR(s string) (netip.Prefix, bool) {
	_, n, err := netutils.ParseCIDRSloppy(strings.TrimSpace(s))
	if err != nil {
		return netip.Prefix{}, false
	}
	return netipPrefix(n)
}

func netipPrefix(n *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, bits := n.Mask.Size()
	if bits == 32 {
		a = a.Unmap()
	}
	p, err := a.Prefix(ones)
	return p, err == nil
}

// external fills in out's external fields from svc: out.Vips and
// out.Ports are set already, fam says which families have a cluster IP.
// What kube-proxy would not program is left out through omit.
func external(svc *corev1.Service, out *vipdv1.Service, fam families, omit func(field, format string, args ...any)) {
	// An address is served once: kube-proxy would write the same rules
	// twice, vipd wants each address once per service.
	seen := map[netip.Addr]string{}
	for _, v := range out.Vips {
		if a, err := netip.ParseAddr(v); err == nil {
			seen[a] = "a cluster IP of the Service"
		}
	}
	// address says whether s, at field, is an address to serve.
	address := func(field, s string) (netip.Addr, bool) {
		a, ok := parseIP(s)
		switch {
		case !ok:
			if strings.TrimSpace(s) != "" {
				omit(field, "%q is not an IP address", s)
			}
			return netip.Addr{}, false
		case !fam.has(a):
			omit(field, "%s is %s, and the Service has no %s cluster IP", a, familyName(a), familyName(a))
			return netip.Addr{}, false
		case seen[a] != "":
			omit(field, "%s is %s already", a, seen[a])
			return netip.Addr{}, false
		}
		return a, true
	}

	for i, s := range svc.Spec.ExternalIPs {
		field := fmt.Sprintf("spec.externalIPs[%d]", i)
		if a, ok := address(field, s); ok {
			seen[a] = "an external IP (" + field + ")"
			out.ExternalIps = append(out.ExternalIps, a.String())
		}
	}

	lbFamilies := families{}
	for i, ing := range svc.Status.LoadBalancer.Ingress {
		field := fmt.Sprintf("status.loadBalancer.ingress[%d]", i)
		switch {
		case ing.IP == "" && ing.Hostname != "":
			omit(field, "hostname %q, not an IP: kube-proxy programs only IPs", ing.Hostname)
			continue
		case ing.IP == "":
			continue
		case ing.IPMode != nil && *ing.IPMode != corev1.LoadBalancerIPModeVIP:
			omit(field, "ipMode %s: the load balancer does not send to %s itself (as kube-proxy, only ipMode VIP or unset is served)", *ing.IPMode, ing.IP)
			continue
		}
		if a, ok := address(field+".ip", ing.IP); ok {
			seen[a] = "a load-balancer IP (" + field + ")"
			out.LoadBalancerIps = append(out.LoadBalancerIps, a.String())
			lbFamilies.v4, lbFamilies.v6 = lbFamilies.v4 || a.Is4(), lbFamilies.v6 || a.Is6()
		}
	}

	sourceRanges(svc, out, fam, lbFamilies, omit)

	if externallyAccessible(svc) && svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
		out.ExternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
		// kube-proxy's NeedsHealthCheck: only a LoadBalancer Service's.
		if p := svc.Spec.HealthCheckNodePort; svc.Spec.Type == corev1.ServiceTypeLoadBalancer && p > 0 && p <= 65535 {
			out.HealthCheckNodePort = uint32(p)
		}
	}
}

// sourceRanges fills in out's load_balancer_source_ranges. kube-proxy
// filters the load-balancer IPs of each family by the ranges of that
// family only: a family with load-balancer IPs and no range of its own
// is not filtered at all. vipd's ranges apply to every load-balancer IP,
// so such a family gets its whole address space (0.0.0.0/0 or ::/0) as a
// range, which keeps it open as kube-proxy does.
func sourceRanges(svc *corev1.Service, out *vipdv1.Service, fam, lbFamilies families, omit func(field, format string, args ...any)) {
	if len(svc.Spec.LoadBalancerSourceRanges) == 0 {
		if v := svc.Annotations[LoadBalancerSourceRangesAnnotation]; strings.TrimSpace(v) != "" {
			omit("metadata.annotations["+LoadBalancerSourceRangesAnnotation+"]",
				"cloud load balancers read it, kube-proxy does not: spec.loadBalancerSourceRanges is what restricts the load-balancer IPs on the node")
		}
		return
	}
	if len(out.LoadBalancerIps) == 0 {
		omit("spec.loadBalancerSourceRanges", "the Service has no load-balancer IP (yet) for them to restrict")
		return
	}
	seen := map[netip.Prefix]bool{}
	rangeFamilies := families{}
	var ranges []string
	for i, s := range svc.Spec.LoadBalancerSourceRanges {
		field := fmt.Sprintf("spec.loadBalancerSourceRanges[%d]", i)
		p, ok := parseCIDR(s)
		switch {
		case !ok:
			omit(field, "%q is not a CIDR", s)
			continue
		case !fam.has(p.Addr()):
			omit(field, "%s is %s, and the Service has no %s cluster IP", p, familyName(p.Addr()), familyName(p.Addr()))
			continue
		case seen[p]:
			continue
		}
		seen[p] = true
		rangeFamilies.v4, rangeFamilies.v6 = rangeFamilies.v4 || p.Addr().Is4(), rangeFamilies.v6 || p.Addr().Is6()
		ranges = append(ranges, p.String())
	}
	if len(ranges) == 0 {
		// kube-proxy: no range of a family, no filter for that family.
		return
	}
	if lbFamilies.v4 && !rangeFamilies.v4 {
		ranges = append(ranges, "0.0.0.0/0")
	}
	if lbFamilies.v6 && !rangeFamilies.v6 {
		ranges = append(ranges, "::/0")
	}
	out.LoadBalancerSourceRanges = ranges
}
