package kubeconvert

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Owner is the vipd owner of every service converted from Kubernetes.
const Owner = "kubernetes"

// ServiceProxyNameLabel on a Service hands it to another proxy: kube-proxy
// leaves every Service that has it alone, whatever its value, and the
// proxy whose name is the value programs it. vipd does as kube-proxy
// unless Options.ServiceProxyName names it: then it programs only the
// Services whose label has that value.
const ServiceProxyNameLabel = "service.kubernetes.io/service-proxy-name"

// ErrSkipped is wrapped by Convert's error for a Service that kube-proxy
// would not program (see Skipped).
var ErrSkipped = errors.New("not programmed")

// Options are the node-specific inputs of a conversion.
type Options struct {
	// NodeName is this node's name: endpoints whose nodeName equals it are
	// node-local (what internalTrafficPolicy: Local keeps). Empty means no
	// endpoint is node-local.
	NodeName string
	// ServiceProxyName, when not empty, makes the conversion that of an
	// alternative proxy of this name: only Services labelled
	// ServiceProxyNameLabel=ServiceProxyName are programmed, and every
	// other Service, with another value or without the label (kube-proxy
	// serves those), is skipped. Empty is kube-proxy's choice: every
	// Service with the label, of any value, is skipped.
	ServiceProxyName string
}

// Name is the vipd service name of the Kubernetes Service namespace/name.
func Name(namespace, name string) string { return namespace + "/" + name }

// Skipped says why kube-proxy would not program svc, or returns "" when
// it would: Services handed to another proxy by ServiceProxyNameLabel,
// ExternalName Services, headless Services (clusterIP: None), and
// Services without a cluster IP yet. It is Options{}.Skipped.
func Skipped(svc *corev1.Service) string { return Options{}.Skipped(svc) }

// Skipped says why a conversion with o does not program svc, or returns ""
// when it does: as the package-level Skipped, except that with a
// ServiceProxyName only the Services labelled with that name pass the
// label check.
func (o Options) Skipped(svc *corev1.Service) string {
	value, labelled := svc.Labels[ServiceProxyNameLabel]
	switch {
	case o.ServiceProxyName == "" && labelled:
		return fmt.Sprintf("it has the label %s=%q: another proxy serves it", ServiceProxyNameLabel, value)
	case o.ServiceProxyName != "" && !labelled:
		return fmt.Sprintf("it lacks the label %s=%s: only Services so labelled are programmed here, and kube-proxy serves the others",
			ServiceProxyNameLabel, o.ServiceProxyName)
	case o.ServiceProxyName != "" && value != o.ServiceProxyName:
		return fmt.Sprintf("it has the label %s=%q: that proxy serves it, not %q", ServiceProxyNameLabel, value, o.ServiceProxyName)
	}
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return "it is of type ExternalName: DNS serves it"
	}
	ips := clusterIPs(svc)
	if len(ips) == 1 && ips[0] == corev1.ClusterIPNone {
		return "it is headless (clusterIP: None): DNS serves its endpoints directly"
	}
	if len(ips) == 0 {
		return "it has no cluster IP yet"
	}
	return ""
}

func clusterIPs(svc *corev1.Service) []string {
	if len(svc.Spec.ClusterIPs) > 0 {
		return svc.Spec.ClusterIPs
	}
	if svc.Spec.ClusterIP != "" {
		return []string{svc.Spec.ClusterIP}
	}
	return nil
}

// Convert returns the vipd service for svc, whose EndpointSlices are
// slices. Slices that do not belong to svc (by namespace and the
// kubernetes.io/service-name label) are ignored, so callers may pass a
// superset. The result is deterministic: the same objects, in any order,
// give the same service.
//
// Its backends follow kube-proxy:
//   - an endpoint is a backend for the service ports whose name and
//     protocol its slice lists, with the slice's port number (so a named
//     targetPort may resolve differently per slice); it never serves the
//     others (Backend.only_named_ports);
//   - READY when ready (unset counts as ready), TERMINATING when not ready
//     but serving and terminating, NOT_SERVING otherwise;
//   - node-local when its nodeName is Options.NodeName;
//   - an address listed by several slices appears once: with the best
//     state any of them gives it, and the ports of all of them (where two
//     slices disagree on a port's number, the slice with the better state
//     wins, then the first by slice name);
//   - only the first address of an endpoint counts (the API allows one),
//     FQDN slices are ignored, and so are addresses of a family that
//     has no cluster IP.
//
// Its external half follows kube-proxy too (see ConvertWithOmissions for
// what is left out):
//   - spec.ports[].nodePort → node_port, for NodePort and LoadBalancer
//     Services (with allocateLoadBalancerNodePorts: false, the ones set
//     explicitly);
//   - spec.externalIPs → external_ips, and the ingress IPs of
//     status.loadBalancer whose ipMode is VIP or unset → load_balancer_ips,
//     each only when the Service has a cluster IP of its family, and once;
//   - spec.loadBalancerSourceRanges → load_balancer_source_ranges (masked;
//     with load-balancer IPs only; a family with load-balancer IPs but no
//     range of its own gets 0.0.0.0/0 or ::/0, as kube-proxy filters each
//     family by its own ranges only);
//   - externalTrafficPolicy: Local → TRAFFIC_POLICY_LOCAL on Services that
//     are externally accessible (NodePort, LoadBalancer, or with external
//     IPs), and a LoadBalancer Service's healthCheckNodePort then →
//     health_check_node_port.
//
// A Service that opts.Skipped names is an error wrapping ErrSkipped; a Service
// vipd could not represent (an unparsable cluster IP) is an error too.
func Convert(svc *corev1.Service, slices []*discoveryv1.EndpointSlice, opts Options) (*vipdv1.Service, error) {
	out, _, err := ConvertWithOmissions(svc, slices, opts)
	return out, err
}

// ConvertWithOmissions is Convert, and also says which parts of svc the
// service leaves out, in the order of svc's fields, as kube-proxy leaves
// them out: external or load-balancer IPs of a family the Service has no
// cluster IP of, unparsable or repeated ones, load-balancer ingress
// hostnames and ingress IPs of ipMode Proxy, source ranges of such a
// family or with no load-balancer IP to restrict, the
// service.beta.kubernetes.io/load-balancer-source-ranges annotation
// (which only cloud load balancers read), and node ports on a type of
// Service the apiserver gives none. Omissions are not errors: the
// service is what kube-proxy would program.
func ConvertWithOmissions(svc *corev1.Service, slices []*discoveryv1.EndpointSlice, opts Options) (*vipdv1.Service, []Omission, error) {
	name := Name(svc.Namespace, svc.Name)
	if reason := opts.Skipped(svc); reason != "" {
		return nil, nil, fmt.Errorf("service %s: %w: %s", name, ErrSkipped, reason)
	}
	var omitted []Omission
	omit := func(field, format string, args ...any) {
		omitted = append(omitted, Omission{Field: field, Reason: fmt.Sprintf(format, args...)})
	}
	out := &vipdv1.Service{Name: name, Owner: Owner}
	var fam families
	for _, s := range clusterIPs(svc) {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			return nil, nil, fmt.Errorf("service %s: cluster IP %q: %w", name, s, err)
		}
		fam.v4, fam.v6 = fam.v4 || ip.Is4(), fam.v6 || ip.Is6()
		out.Vips = append(out.Vips, ip.String())
	}
	for i, p := range svc.Spec.Ports {
		port := &vipdv1.Port{Name: p.Name, Protocol: protocol(p.Protocol), Port: uint32(p.Port)}
		if p.TargetPort.IntVal > 0 && p.TargetPort.StrVal == "" {
			// Informational: every backend names its own number. A named
			// target port has no one number: it stays 0 (see
			// unsetContradictedTargets for a number the backends deny).
			port.TargetPort = uint32(p.TargetPort.IntVal)
		}
		port.NodePort = nodePort(svc, i, omit)
		out.Ports = append(out.Ports, port)
	}
	external(svc, out, fam, omit)
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		timeout := corev1.DefaultClientIPServiceAffinitySeconds
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			timeout = *c.ClientIP.TimeoutSeconds
		}
		out.SessionAffinity = &vipdv1.SessionAffinityConfig{
			Mode:           vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP,
			TimeoutSeconds: uint32(max(timeout, 0)),
		}
	}
	if p := svc.Spec.InternalTrafficPolicy; p != nil && *p == corev1.ServiceInternalTrafficPolicyLocal {
		out.InternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	}
	out.TrafficDistribution = trafficDistribution(svc)
	out.Backends = backends(svc, slices, opts, fam.v4, fam.v6)
	unsetContradictedTargets(out)
	return out, omitted, nil
}

// unsetContradictedTargets leaves a port's target_port 0 when a backend
// listens for that port on another number (hand-written EndpointSlices
// may say so): the service then has no one target port, and each
// backend's own (Backend.ports, which every backend of a Service has for
// the ports it serves) is what vipd forwards to. vipctl shows such a
// port's target as "per-backend".
func unsetContradictedTargets(out *vipdv1.Service) {
	for _, p := range out.Ports {
		if p.TargetPort == 0 {
			continue
		}
		for _, b := range out.Backends {
			if n, ok := b.Ports[p.Name]; ok && n != p.TargetPort {
				p.TargetPort = 0
				break
			}
		}
	}
}

func protocol(p corev1.Protocol) vipdv1.Protocol {
	switch p {
	case corev1.ProtocolUDP:
		return vipdv1.Protocol_PROTOCOL_UDP
	case corev1.ProtocolSCTP:
		return vipdv1.Protocol_PROTOCOL_SCTP
	default: // "" is TCP, as the apiserver defaults it
		return vipdv1.Protocol_PROTOCOL_TCP
	}
}

// backendRank orders states from best: READY first.
var backendRank = map[vipdv1.BackendState]int{
	vipdv1.BackendState_BACKEND_STATE_READY:       0,
	vipdv1.BackendState_BACKEND_STATE_TERMINATING: 1,
	vipdv1.BackendState_BACKEND_STATE_NOT_SERVING: 2,
}

func backends(svc *corev1.Service, all []*discoveryv1.EndpointSlice, opts Options, has4, has6 bool) []*vipdv1.Backend {
	own := make([]*discoveryv1.EndpointSlice, 0, len(all))
	for _, s := range all {
		if s != nil && s.Namespace == svc.Namespace && s.Labels[discoveryv1.LabelServiceName] == svc.Name {
			own = append(own, s)
		}
	}
	slices.SortFunc(own, func(a, b *discoveryv1.EndpointSlice) int { return cmp.Compare(a.Name, b.Name) })

	byIP := map[netip.Addr]*vipdv1.Backend{}
	for _, s := range own {
		if s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		ports := slicePorts(svc, s)
		for _, ep := range s.Endpoints {
			if len(ep.Addresses) == 0 {
				continue
			}
			ip, err := netip.ParseAddr(ep.Addresses[0])
			if err != nil || ip.Is4() && !has4 || ip.Is6() && !has6 {
				continue
			}
			ip = ip.Unmap()
			b := &vipdv1.Backend{
				Ip:             ip.String(),
				State:          state(ep.Conditions),
				NodeLocal:      opts.NodeName != "" && ep.NodeName != nil && *ep.NodeName == opts.NodeName,
				OnlyNamedPorts: true,
				Ports:          map[string]uint32{},
			}
			setTopology(b, &ep)
			for name, number := range ports {
				b.Ports[name] = number
			}
			prev, dup := byIP[ip]
			if !dup {
				byIP[ip] = b
				continue
			}
			byIP[ip] = merge(prev, b)
		}
	}
	out := make([]*vipdv1.Backend, 0, len(byIP))
	for _, ip := range slices.SortedFunc(maps.Keys(byIP), netip.Addr.Compare) {
		// An endpoint whose slices list none of the service's ports serves
		// nothing: kube-proxy has no endpoint for it.
		if b := byIP[ip]; len(b.Ports) > 0 {
			out = append(out, b)
		}
	}
	return out
}

// merge combines two listings of one address: first came from an earlier
// slice than second.
func merge(first, second *vipdv1.Backend) *vipdv1.Backend {
	better, other := first, second
	if backendRank[second.State] < backendRank[first.State] {
		better, other = second, first
	}
	for name, number := range other.Ports {
		if _, ok := better.Ports[name]; !ok {
			better.Ports[name] = number
		}
	}
	better.NodeLocal = better.NodeLocal || other.NodeLocal
	mergeTopology(better, other)
	return better
}

// slicePorts maps the names of svc's ports that slice s lists (by name
// and protocol) to the number s gives them.
func slicePorts(svc *corev1.Service, s *discoveryv1.EndpointSlice) map[string]uint32 {
	ports := map[string]uint32{}
	for _, sp := range s.Ports {
		if sp.Port == nil || *sp.Port <= 0 || *sp.Port > 65535 {
			continue
		}
		name := ""
		if sp.Name != nil {
			name = *sp.Name
		}
		proto := corev1.ProtocolTCP
		if sp.Protocol != nil {
			proto = *sp.Protocol
		}
		for _, p := range svc.Spec.Ports {
			if p.Name == name && cmp.Or(p.Protocol, corev1.ProtocolTCP) == proto {
				ports[name] = uint32(*sp.Port)
			}
		}
	}
	return ports
}

// state maps an endpoint's conditions as kube-proxy reads them: unset
// ready and serving count as true, unset terminating as false.
func state(c discoveryv1.EndpointConditions) vipdv1.BackendState {
	ready := c.Ready == nil || *c.Ready
	serving := c.Serving == nil || *c.Serving
	terminating := c.Terminating != nil && *c.Terminating
	switch {
	case ready:
		return vipdv1.BackendState_BACKEND_STATE_READY
	case serving && terminating:
		return vipdv1.BackendState_BACKEND_STATE_TERMINATING
	default:
		return vipdv1.BackendState_BACKEND_STATE_NOT_SERVING
	}
}
