package server

import (
	"maps"
	"net/netip"
	"slices"

	"github.com/vipd/vipd/dataplane"
)

// topologyLeftOut is Explain's reason for a backend that topology-aware
// routing leaves out.
const topologyLeftOut = "left out by topology-aware routing: this node sends new connections to the backends its zone or node prefers (traffic_distribution, zone, for_zones, for_nodes)"

// withTopology returns svc and failing (withHealth's) with the backends
// that the reconciler's topology filter left out of the applied state
// lowered to NOT_SERVING, each with topologyLeftOut as its reason. It
// changes neither argument.
func (a *API) withTopology(svc *dataplane.Service, failing map[netip.Addr]string) (*dataplane.Service, map[netip.Addr]string) {
	left := a.rec.TopologyLeftOut(svc.Name)
	if len(left) == 0 {
		return svc, failing
	}
	c := *svc
	c.Backends = slices.Clone(svc.Backends)
	failing = maps.Clone(failing)
	if failing == nil {
		failing = map[netip.Addr]string{}
	}
	for i, b := range c.Backends {
		if b.State == dataplane.BackendReady && slices.Contains(left, b.IP) {
			c.Backends[i].State = dataplane.BackendNotServing
			failing[b.IP] = topologyLeftOut
		}
	}
	return &c, failing
}
