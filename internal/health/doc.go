// Package health runs vipd's active health checks: it probes every backend
// of every service that has a health_check (TCP connect, HTTP GET, gRPC
// health Check) from the node's network namespace, with bounded
// concurrency and jittered schedules, keeps each backend's result (passing,
// failing or unknown, since when, the last error, how many in a row), and
// submits each change of a backend's effective state to the reconciler
// (reconcile.Reconciler.SetHealth), in batches, which hands failing
// backends to the dataplane as NOT_SERVING. It tells a listener of every
// transition (WithTransitions: the daemon hands them to the flow hub, for
// WatchFlows).
//
// One goroutine schedules every check (a min-heap by due time) and runs
// the TCP checks itself on raw, reused non-blocking sockets collected with
// one epoll set; HTTP and gRPC checks run on a goroutine each.
//
// It never changes desired state and never promotes a backend: a backend
// the control plane marked NOT_SERVING is not probed at all. It programs
// nothing itself.
package health
