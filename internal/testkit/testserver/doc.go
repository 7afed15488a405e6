// Package testserver runs the real vipd API in-process for tests of the
// packages that talk to vipd, such as client and vipctl's cli: a node built
// by daemon.Assemble, the daemon's own wiring (state directory and its
// recovery, reconciler, flow hub, API, gRPC server with health,
// reflection, metrics and call logging, limits), serving on a temporary
// Unix socket, over the recording fake dataplane.
//
// Tests script failures through the dataplane (Server.Dataplane) and read
// what was applied there. testserver owns the socket, the state directory
// and the goroutines it starts, and stops them all on cleanup. It must not
// reimplement any part of the API or of the daemon's wiring, program a
// kernel, or be imported by anything but tests and examples.
package testserver
