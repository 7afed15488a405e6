package server

import (
	"context"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/authz"
	"github.com/vipd/vipd/server/validation"
)

// zoneSource says where zone, the zone in force, came from, for
// GetStatus's zone_source: "api" once a SetNodeTopology succeeded, else
// "flag" when vipd started with one (vipd run --zone), else "".
func (a *API) zoneSource(zone string) string {
	switch {
	case a.zoneSetByAPI.Load():
		return "api"
	case zone != "":
		return "flag"
	}
	return ""
}

// SetNodeTopology implements vipdv1.NodeServiceServer: it checks the zone
// and the caller's right to change every owner's services, then hands the
// zone to the reconciler, which applies it to the services topology-aware
// routing selects for (reconcile.Reconciler.SetZone).
func (a *API) SetNodeTopology(ctx context.Context, req *vipdv1.SetNodeTopologyRequest) (*vipdv1.SetNodeTopologyResponse, error) {
	if v := validation.NodeZone(req.GetZone(), "zone"); v != nil {
		return nil, invalid(v)
	}
	if err := authz.FromContext(ctx).CheckAllOwners(); err != nil {
		return nil, a.fail(ctx, err)
	}
	a.zoneMu.Lock()
	defer a.zoneMu.Unlock()
	previous := a.rec.Status().Topology.Zone
	if err := a.rec.SetZone(ctx, req.GetZone()); err != nil {
		return nil, a.fail(ctx, err)
	}
	a.zoneSetByAPI.Store(true)
	if previous != req.GetZone() {
		a.log.Info("node zone set", "zone", req.GetZone(), "previous_zone", previous)
	}
	return &vipdv1.SetNodeTopologyResponse{Zone: req.GetZone(), PreviousZone: previous}, nil
}
