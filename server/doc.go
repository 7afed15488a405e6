// Package server is vipd's gRPC front: the vipd.v1 handlers (API), which
// validate requests and hand changes to the reconciler, and the daemon's
// shell (Server), which owns the listeners, health, reflection and
// interceptors. It turns errors into gRPC statuses; it never touches the
// kernel directly.
package server
