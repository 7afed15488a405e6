// Package daemon wires vipd together: it restores the desired state, opens
// the dataplane, starts the reconciler and the gRPC server, and shuts them
// down in order. Beyond that order it owns only the checks that must pass
// before anything opens (Config.Check: limits, periods and the socket
// mode; a TCP listener needs mutual TLS unless it is a plaintext loopback
// one; the authz file and certificates must load), the reload of those
// files on a signal (reload.go), the state directory's lock as seen by
// vipd cleanup (statelock.go), and --recover's handling of an unreadable
// state directory (recover.go). cmd/vipd only turns flags into a Config.
package daemon
