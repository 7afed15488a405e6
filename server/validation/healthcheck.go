package validation

import (
	"strings"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/protobuf/proto"
)

// Health-check defaults and limits (vipd.v1.HealthCheck).
const (
	DefaultHealthInterval      = 2000 // ms
	DefaultHealthTimeout       = 1000 // ms
	DefaultHealthyThreshold    = 2
	DefaultUnhealthyThreshold  = 3
	MinHealthInterval          = 50 // ms
	MinHealthTimeout           = 10 // ms
	MaxHealthInterval          = 3600000
	MaxHealthThreshold         = 100
	MaxHealthPathLength        = 1024
	MaxHealthGRPCServiceLength = 253
)

// healthCheck checks in.health_check, naming each field it refuses.
func healthCheck(v *Violations, in *vipdv1.Service, field string) {
	hc := in.HealthCheck
	if hc == nil {
		return
	}
	field += ".health_check"
	switch hc.Protocol {
	case vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_TCP, vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_HTTP,
		vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_GRPC:
	case vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_UNSPECIFIED:
		v.add(field+".protocol", "is required: HEALTH_CHECK_PROTOCOL_TCP, _HTTP or _GRPC")
	default:
		v.add(field+".protocol", "%d is not a HealthCheckProtocol", int32(hc.Protocol))
	}
	if hc.PortName != "" && hc.Port != 0 {
		v.add(field+".port", "may not be set together with port_name")
	}
	if hc.Port > 65535 {
		v.add(field+".port", "%d is out of range; 1 to 65535 are allowed, or 0 for port_name's target port", hc.Port)
	}
	if hc.PortName != "" {
		found := false
		for _, p := range in.Ports {
			if p.GetName() == hc.PortName {
				found = true
			}
		}
		if !found {
			v.add(field+".port_name", "%q names no port of the service", hc.PortName)
		}
	}
	if hc.Path != "" {
		switch {
		case hc.Protocol != vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_HTTP:
			v.add(field+".path", "may be set only with HEALTH_CHECK_PROTOCOL_HTTP")
		case !strings.HasPrefix(hc.Path, "/") || len(hc.Path) > MaxHealthPathLength || strings.ContainsAny(hc.Path, " #") || hasControl(hc.Path):
			v.add(field+".path", "must start with \"/\", be at most %d characters long and hold no space, \"#\" or control character", MaxHealthPathLength)
		}
	}
	if hc.GrpcService != "" {
		switch {
		case hc.Protocol != vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_GRPC:
			v.add(field+".grpc_service", "may be set only with HEALTH_CHECK_PROTOCOL_GRPC")
		case len(hc.GrpcService) > MaxHealthGRPCServiceLength || hasControl(hc.GrpcService):
			v.add(field+".grpc_service", "must be at most %d characters long without control characters", MaxHealthGRPCServiceLength)
		}
	}
	if hc.IntervalMs != 0 && (hc.IntervalMs < MinHealthInterval || hc.IntervalMs > MaxHealthInterval) {
		v.add(field+".interval_ms", "%d is out of range; %d to %d are allowed, or 0 for %d", hc.IntervalMs, MinHealthInterval, MaxHealthInterval, DefaultHealthInterval)
	}
	switch {
	case hc.TimeoutMs != 0 && (hc.TimeoutMs < MinHealthTimeout || hc.TimeoutMs > MaxHealthInterval):
		v.add(field+".timeout_ms", "%d is out of range; %d to %d are allowed, or 0 for %d", hc.TimeoutMs, MinHealthTimeout, MaxHealthInterval, DefaultHealthTimeout)
	case hc.TimeoutMs != 0 && hc.TimeoutMs > HealthDefaults(hc).IntervalMs:
		v.add(field+".timeout_ms", "%d is longer than the interval, %d ms", hc.TimeoutMs, HealthDefaults(hc).IntervalMs)
	}
	if hc.HealthyThreshold > MaxHealthThreshold {
		v.add(field+".healthy_threshold", "%d is out of range; 1 to %d are allowed, or 0 for %d", hc.HealthyThreshold, MaxHealthThreshold, DefaultHealthyThreshold)
	}
	if hc.UnhealthyThreshold > MaxHealthThreshold {
		v.add(field+".unhealthy_threshold", "%d is out of range; 1 to %d are allowed, or 0 for %d", hc.UnhealthyThreshold, MaxHealthThreshold, DefaultUnhealthyThreshold)
	}
}

// HealthDefaults returns a copy of hc with every zero default filled in:
// interval, timeout (at most the interval), thresholds and the HTTP path.
// The port stays as given: it depends on the backend.
func HealthDefaults(hc *vipdv1.HealthCheck) *vipdv1.HealthCheck {
	out := proto.Clone(hc).(*vipdv1.HealthCheck)
	if out.IntervalMs == 0 {
		out.IntervalMs = DefaultHealthInterval
	}
	if out.TimeoutMs == 0 {
		out.TimeoutMs = min(DefaultHealthTimeout, out.IntervalMs)
	}
	if out.HealthyThreshold == 0 {
		out.HealthyThreshold = DefaultHealthyThreshold
	}
	if out.UnhealthyThreshold == 0 {
		out.UnhealthyThreshold = DefaultUnhealthyThreshold
	}
	if out.Protocol == vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_HTTP && out.Path == "" {
		out.Path = "/"
	}
	return out
}
