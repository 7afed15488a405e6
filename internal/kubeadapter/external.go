package kubeadapter

// The external part of a service (node ports, external IPs, load-balancer
// IPs and what goes with them) and its fallback: when vipd refuses a
// service for that part alone, the ClusterIP part is programmed without
// it, and the external part is recorded as left out, so that a
// NodePort or LoadBalancer Service never loses its cluster IP to its
// external half (a dataplane without external traffic, a node port
// another owner holds, an external IP vipd finds invalid).

import (
	"regexp"
	"strings"

	"github.com/vipd/vipd/internal/kubeconvert"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// hasExternalPart reports whether s has any of the fields withoutExternal
// clears.
func hasExternalPart(s *vipdv1.Service) bool {
	if len(s.ExternalIps) > 0 || len(s.LoadBalancerIps) > 0 || len(s.LoadBalancerSourceRanges) > 0 ||
		s.ExternalTrafficPolicy != vipdv1.TrafficPolicy_TRAFFIC_POLICY_UNSPECIFIED || s.HealthCheckNodePort != 0 {
		return true
	}
	for _, p := range s.Ports {
		if p.NodePort != 0 {
			return true
		}
	}
	return false
}

// servesExternal reports whether s asks vipd's dataplane for external
// traffic: a node port, an external IP or a load-balancer IP (what a
// dataplane without external traffic refuses).
func servesExternal(s *vipdv1.Service) bool {
	if len(s.ExternalIps) > 0 || len(s.LoadBalancerIps) > 0 {
		return true
	}
	for _, p := range s.Ports {
		if p.NodePort != 0 {
			return true
		}
	}
	return false
}

// withoutExternal returns a copy of s with its ClusterIP part only: no node
// ports, external or load-balancer IPs, source ranges, external traffic
// policy or health-check node port (a health check that answers 200 for
// a node that does not serve the node port would steer a load balancer
// to it). s is not changed.
func withoutExternal(s *vipdv1.Service) *vipdv1.Service {
	out := proto.CloneOf(s)
	out.ExternalIps, out.LoadBalancerIps, out.LoadBalancerSourceRanges = nil, nil, nil
	out.ExternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_UNSPECIFIED
	out.HealthCheckNodePort = 0
	for _, p := range out.Ports {
		p.NodePort = 0
	}
	return out
}

// externalFieldRE matches the rest of a field violation's path, after
// "service" or "services[i]", that names a field of the external part.
var externalFieldRE = regexp.MustCompile(`^\.(external_ips|load_balancer_ips|load_balancer_source_ranges|external_traffic_policy|health_check_node_port|ports\[\d+\]\.node_port)\b`)

// externalField reports whether rest, a field path after the service's
// own ("services[3]"), is in the external part.
func externalField(rest string) bool { return externalFieldRE.MatchString(rest) }

// fallbackReason is the reason to record when vipd refused a service with
// err and may take it without its external part: what a write without it
// can fix. It is "" for refusals that the external part cannot cause
// (a limit on services or backends) and for errors worth a plain retry.
func fallbackReason(err error) string {
	switch status.Code(err) {
	case codes.FailedPrecondition:
		return ReasonUnsupported
	case codes.AlreadyExists:
		return ReasonConflict
	case codes.InvalidArgument:
		return ReasonInvalid
	}
	return ""
}

// leaveExternal records that name is programmed without its external
// part, and why. A dataplane without external traffic is said once, when
// it is found (see noExternal), not for each service.
func (a *Adapter) leaveExternal(name, reason string, err error) {
	if a.externalLeft[name] != reason && a.prevExternalLeft[name] != reason && reason != ReasonUnsupported {
		a.log.Warn("service programmed without its node ports, external and load-balancer IPs", "service", name, "reason", reason, "error", err)
	}
	a.externalLeft[name] = reason
}

// keepExternal records that name is programmed whole.
func (a *Adapter) keepExternal(name string) {
	if r, ok := a.externalLeft[name]; ok {
		a.log.Info("service's node ports, external and load-balancer IPs programmed", "service", name, "left_out_before", r)
		delete(a.externalLeft, name)
	}
}

// setNoExternal records whether vipd's dataplane serves external traffic,
// as last found: it refused a service for its external part alone
// (FailedPrecondition), or took one with an external part. While it does
// not, the per-service passes send only the ClusterIP part; each full
// sync tries the whole again, so a vipd restarted with a dataplane that
// serves external traffic gets it.
func (a *Adapter) setNoExternal(no bool, err error) {
	if no == a.noExternal {
		return
	}
	a.noExternal = no
	if no {
		a.log.Warn("vipd's dataplane does not serve external traffic: NodePort, LoadBalancer and external-IP Services get their cluster IPs only",
			"error", err)
		return
	}
	a.log.Info("vipd's dataplane serves external traffic: node ports, external and load-balancer IPs are programmed")
}

// logOmissions logs, once for each change, what the conversion of name
// leaves out of its Service (as kube-proxy leaves it out); omitted is
// empty when nothing is.
func (a *Adapter) logOmissions(name string, omitted []string) {
	joined := strings.Join(omitted, "; ")
	if a.omitted[name] == joined {
		return
	}
	if joined == "" {
		delete(a.omitted, name)
		return
	}
	a.omitted[name] = joined
	a.log.Info("parts of the Service not programmed, as by kube-proxy", "service", name, "omitted", joined)
}

// logAllOmissions is logOmissions for a full conversion: svcs, with what
// each leaves out by name. Names no longer converted are forgotten.
func (a *Adapter) logAllOmissions(svcs []*vipdv1.Service, omitted map[string][]kubeconvert.Omission) {
	now := make(map[string]bool, len(svcs))
	for _, s := range svcs {
		now[s.Name] = true
		a.logOmissions(s.Name, omissionStrings(omitted[s.Name]))
	}
	for name := range a.omitted {
		if !now[name] {
			delete(a.omitted, name)
		}
	}
}
