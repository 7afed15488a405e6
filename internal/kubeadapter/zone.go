package kubeadapter

// The node's zone: with WithZoneFromNode the adapter watches its own Node
// object (a field selector on its name, so it never lists the cluster's
// nodes) and hands the value of its topology.kubernetes.io/zone label to
// vipd (NodeService.SetNodeTopology), so that topology-aware routing
// (trafficDistribution, the EndpointSlice hints) prefers this node's zone
// as kube-proxy does. vipd does not keep the zone across a restart, so
// every full sync, which follows any vipd restart, sets it again before
// the services are written.

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// WithZoneFromNode makes the adapter set vipd's zone from the
// topology.kubernetes.io/zone label of this node's Node object (see
// WithNodeName, which it needs): at every change of the label, and before
// every full sync. A node without the label has no zone, which the
// adapter sets too; while the Node object is not found, vipd keeps the
// zone it has (its --zone flag). It needs get, list and watch on nodes.
func WithZoneFromNode() Option {
	return func(c *config) error { c.zoneFromNode = true; return nil }
}

// nodeZone is what the adapter knows of the node's zone, guarded by
// Adapter.mu.
type nodeZone struct {
	// seen: the Node object was found, and want is its zone.
	seen bool
	want string
	// pending: want is yet to be handed to vipd.
	pending bool
}

// nodeInformer watches this node's Node object only.
func (a *Adapter) nodeInformer(kube kubernetes.Interface) error {
	f := informers.NewSharedInformerFactoryWithOptions(kube, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector(metav1.ObjectNameField, a.cfg.nodeName).String()
		}),
		informers.WithTransform(stripManagedFields))
	a.factories = append(a.factories, f)
	a.node = f.Core().V1().Nodes().Informer()
	if _, err := a.node.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    a.nodeChanged,
		UpdateFunc: func(_, obj any) { a.nodeChanged(obj) },
		// A deleted Node keeps the last zone: the node is going away.
	}); err != nil {
		return fmt.Errorf("watch node %s: %w", a.cfg.nodeName, err)
	}
	return nil
}

// nodeChanged marks the Node's zone for vipd when it differs from the
// last one seen.
func (a *Adapter) nodeChanged(obj any) {
	n, ok := obj.(*corev1.Node)
	if !ok || n.Name != a.cfg.nodeName {
		return
	}
	zone := n.Labels[corev1.LabelTopologyZone]
	a.mu.Lock()
	changed := !a.zone.seen || a.zone.want != zone
	if changed {
		a.zone = nodeZone{seen: true, want: zone, pending: true}
	}
	a.mu.Unlock()
	if changed {
		a.log.Info("node zone label", "node", n.Name, "label", corev1.LabelTopologyZone, "zone", zone)
		a.poke()
	}
}

// takeZone returns the zone to hand to vipd in a pass (full says it is a
// full one, which hands it whenever the Node was seen), and whether there
// is one. The caller holds a.mu.
func (a *Adapter) takeZone(full bool) (zone string, ok bool) {
	if !a.zone.seen || !(a.zone.pending || full) {
		return "", false
	}
	a.zone.pending = false
	return a.zone.want, true
}

// sendZone hands zone to vipd. On failure the zone is pending again, so
// that the next pass retries it (after the loop's backoff).
func (a *Adapter) sendZone(ctx context.Context, zone string) error {
	prev, err := a.vipd.SetNodeTopology(ctx, zone)
	if err != nil {
		a.m.zoneUpdates.WithLabelValues("error").Inc()
		a.mu.Lock()
		a.zone.pending = true
		a.mu.Unlock()
		return fmt.Errorf("set vipd's zone to %q: %w", zone, err)
	}
	a.m.zoneUpdates.WithLabelValues("ok").Inc()
	if prev != zone {
		a.log.Info("vipd's zone set from the node's label", "zone", zone, "previous_zone", prev)
	}
	return nil
}
