// Package daemon wires vipd together, in one place: Assemble restores the
// desired state, opens the dataplane, reads the node's network
// (internal/nodenet) for the first apply, and builds the reconciler, flow
// hub, node checks, the node's network watcher, the health-check node port
// server (internal/hcnodeport), API, gRPC server and metrics; (*Node).Start runs them and
// (*Node).Stop shuts them down in order. Run, what vipd run does, is
// Assemble, Start and Stop; tests build the same Node, with a dataplane
// they script (WithDataplane), so that they exercise the daemon's wiring.
//
// Beyond that order it owns only the checks that must pass before anything
// opens (Config.Check: limits, periods and the socket mode; a TCP listener
// needs mutual TLS unless it is a plaintext loopback one; the authz file
// and certificates must load), the reload of those files on a signal
// (reload.go), the state directory's lock as seen by vipd cleanup
// (statelock.go), and --recover's handling of an unreadable state
// directory (recover.go). cmd/vipd only turns flags into a Config. It must
// not import a test fake: the dataplane that programs nothing is
// dataplane/none.
package daemon
