package validation

import (
	"fmt"
	"slices"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// Limits of a backend's topology hints, as Kubernetes' EndpointSlice has
// them (hints.forZones and hints.forNodes hold at most 8 entries).
const (
	// MaxHints is the most for_zones, and the most for_nodes, a backend
	// may have.
	MaxHints = 8
	// MaxNodeNameLength is the longest name in for_nodes (a Kubernetes
	// node name, a DNS subdomain).
	MaxNodeNameLength = 253
)

// NodeZone checks a node's topology zone, named field in the request:
// empty (no zone) or at most MaxZoneLength characters without control
// characters, the limits of a backend's zone.
func NodeZone(zone, field string) Violations {
	var v Violations
	switch {
	case len(zone) > MaxZoneLength:
		v.add(field, "is %d characters long; at most %d are allowed", len(zone), MaxZoneLength)
	case hasControl(zone):
		v.add(field, "%q has control characters", zone)
	}
	return v
}

// trafficDistribution checks svc's traffic_distribution. It has no
// dataplane form: the reconciler applies it (server/reconcile's topology).
func trafficDistribution(v *Violations, svc *vipdv1.Service, field string) {
	switch svc.TrafficDistribution {
	case vipdv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_UNSPECIFIED,
		vipdv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_PREFER_SAME_ZONE,
		vipdv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_PREFER_SAME_NODE:
		return
	}
	v.add(field+".traffic_distribution", "%d is not a known traffic distribution", svc.TrafficDistribution)
}

// hints checks a backend's for_zones and for_nodes (at most MaxHints
// distinct names each, of 1-MaxZoneLength and 1-MaxNodeNameLength
// characters without control characters), and sorts each list: their
// order means nothing.
func hints(v *Violations, b *vipdv1.Backend, field string) {
	hintList(v, b.ForZones, MaxZoneLength, field+".for_zones")
	hintList(v, b.ForNodes, MaxNodeNameLength, field+".for_nodes")
}

func hintList(v *Violations, names []string, maxLen int, field string) {
	if len(names) == 0 {
		return
	}
	before := len(*v)
	if len(names) > MaxHints {
		v.add(field, "has %d names; at most %d are allowed", len(names), MaxHints)
	}
	for i, n := range names {
		f := fmt.Sprintf("%s[%d]", field, i)
		switch {
		case n == "":
			v.add(f, "is empty")
		case len(n) > maxLen:
			v.add(f, "is %d characters long; at most %d are allowed", len(n), maxLen)
		case hasControl(n):
			v.add(f, "%q has control characters", n)
		case slices.Contains(names[:i], n):
			v.add(f, "%q appears more than once", n)
		}
	}
	if len(*v) == before {
		slices.Sort(names)
	}
}
