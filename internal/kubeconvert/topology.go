package kubeconvert

import (
	"slices"
	"strings"
	"unicode"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/validation"
)

// trafficDistribution maps spec.trafficDistribution: PreferClose (the
// original name) and PreferSameZone to PREFER_SAME_ZONE, PreferSameNode
// to PREFER_SAME_NODE, anything else (unset, or a value this version does
// not know) to no preference, as kube-proxy ignores a value it does not
// know.
func trafficDistribution(svc *corev1.Service) vipdv1.TrafficDistribution {
	if svc.Spec.TrafficDistribution == nil {
		return vipdv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_UNSPECIFIED
	}
	switch *svc.Spec.TrafficDistribution {
	case corev1.ServiceTrafficDistributionPreferClose, corev1.ServiceTrafficDistributionPreferSameZone:
		return vipdv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_PREFER_SAME_ZONE
	case corev1.ServiceTrafficDistributionPreferSameNode:
		return vipdv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_PREFER_SAME_NODE
	}
	return vipdv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_UNSPECIFIED
}

// setTopology copies an endpoint's zone and hints to b. A hint list that
// vipd would refuse (more than validation.MaxHints names, an empty,
// overlong or repeated one; the apiserver refuses these too) is left out
// whole: a backend without hints makes the service fall back to every
// backend, which is always safe, where refusing the service would not be.
func setTopology(b *vipdv1.Backend, ep *discoveryv1.Endpoint) {
	if ep.Zone != nil {
		b.Zone = *ep.Zone
	}
	if ep.Hints == nil {
		return
	}
	zones := make([]string, 0, len(ep.Hints.ForZones))
	for _, z := range ep.Hints.ForZones {
		zones = append(zones, z.Name)
	}
	nodes := make([]string, 0, len(ep.Hints.ForNodes))
	for _, n := range ep.Hints.ForNodes {
		nodes = append(nodes, n.Name)
	}
	b.ForZones = hintNames(zones, validation.MaxZoneLength)
	b.ForNodes = hintNames(nodes, validation.MaxNodeNameLength)
}

// hintNames returns names sorted, or nil when vipd would refuse them.
func hintNames(names []string, maxLen int) []string {
	if len(names) == 0 || len(names) > validation.MaxHints {
		return nil
	}
	for i, n := range names {
		if n == "" || len(n) > maxLen || strings.ContainsFunc(n, unicode.IsControl) || slices.Contains(names[:i], n) {
			return nil
		}
	}
	slices.Sort(names)
	return names
}

// mergeTopology completes better, the listing of an address that wins,
// with other's zone and hints where better has none.
func mergeTopology(better, other *vipdv1.Backend) {
	if better.Zone == "" {
		better.Zone = other.Zone
	}
	if len(better.ForZones) == 0 {
		better.ForZones = other.ForZones
	}
	if len(better.ForNodes) == 0 {
		better.ForNodes = other.ForNodes
	}
}
