// Package reconcile turns desired-state changes into one ordered stream of
// dataplane applies. Callers submit mutations; a single goroutine runs them,
// in order, against the current snapshot, merges whatever is queued into one
// apply, saves the result, and only then tells each caller. A change that
// the dataplane or the state file refuses is rolled back, so the published
// snapshot is always the one the kernel has.
//
// It owns no gRPC types and no kernel handles: the server maps its errors to
// status codes, and the dataplane does the programming.
// It imports no metrics library either: it reports each sync, the
// programming time of each change, and the applied state's size to an
// optional Observer (WithObserver), which internal/metrics implements.
//
// WithDriftCheck makes it ask a dataplane that is a
// dataplane.DriftDetector, on a short period, whether the kernel still
// holds what it programmed, and repair any loss at once with a full sync,
// from the same goroutine that runs every other apply.
//
// WithHold starts it holding: nothing reaches the dataplane, and only
// changes submitted with Release are accepted, until one of them has been
// applied as a full sync. vipd --recover uses it so that an empty desired
// state never wipes the kernel before the control plane has re-synced.
//
// SetHealth takes health-check results (internal/health) through the same
// queue: a failing backend is handed to the dataplane as NOT_SERVING on
// top of the desired state, never saved and never promoting a backend.
//
// SetNode takes the node's network (internal/nodenet) the same way: every
// State carries the current dataplane.Node (WithNode for the first
// apply), a changed Node is applied at once, and it is never saved.
// WithTopology gives the node's name and zone for topology-aware routing
// (topology.go): before each apply, the services with a
// traffic_distribution or backend hints get the backends this node should
// not send new connections to lowered to NOT_SERVING, on top of health
// checks, so that the dataplanes need no notion of topology. Like health,
// this is not desired state: it is never saved, and TopologyLeftOut tells
// Explain what it left out.
// WithAppliedHook tells a follower (the health-check node port server)
// every State the dataplane accepted.
package reconcile
