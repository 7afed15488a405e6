package server

import (
	"context"
	"sync"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/authz"
	"github.com/vipd/vipd/server/validation"
)

// Zone sources GetStatus reports in zone_source.
const (
	zoneSourceFlag = "flag"
	zoneSourceAPI  = "api"
)

// zoneSource remembers where the node's zone came from: the zone the
// reconciler started with (vipd run --zone) until a SetNodeTopology
// succeeds.
type zoneSource struct {
	mu     sync.Mutex
	setAPI bool
}

func (z *zoneSource) markAPI() {
	z.mu.Lock()
	z.setAPI = true
	z.mu.Unlock()
}

// of says where zone, the zone in force, came from.
func (z *zoneSource) of(zone string) string {
	z.mu.Lock()
	defer z.mu.Unlock()
	switch {
	case z.setAPI:
		return zoneSourceAPI
	case zone != "":
		return zoneSourceFlag
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
	a.zoneSource.markAPI()
	if previous != req.GetZone() {
		a.log.Info("node zone set", "zone", req.GetZone(), "previous_zone", previous)
	}
	return &vipdv1.SetNodeTopologyResponse{Zone: req.GetZone(), PreviousZone: previous}, nil
}
