// Package daemon wires vipd together: it restores the desired state, opens
// the dataplane, starts the reconciler and the gRPC server, and shuts them
// down in order. It holds no logic of its own beyond that order; cmd/vipd
// only turns flags into a Config.
package daemon
