// Package metrics owns vipd's Prometheus metrics and the small HTTP
// listener that serves them with /healthz and /readyz.
//
// A Metrics has its own registry: nothing is registered globally, so tests
// and several instances in one process do not collide. Producers call its
// methods: the reconciler through reconcile.Observer (ObserveSync,
// ObserveProgramming, SetState, ObserveDriftRepair), the flow hub through Flow and Lost, and
// the gRPC server through the interceptors of go-grpc-middleware's
// Prometheus provider. It must not call back into any of them, and it
// never decides readiness itself: the daemon passes a ready func.
package metrics
