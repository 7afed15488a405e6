// Package client is a small typed Go client for vipd's gRPC API, for control
// planes and for vipctl.
//
// It owns the connection to one vipd: the target forms (Unix socket or TCP)
// and the default target (DefaultSocket, SocketEnv), transport security
// (WithTLS, TLSConfigFromFiles: mutual TLS for vipd --listen), the default
// per-call deadline, and the retry policy that rides over a daemon restart.
// Its methods are thin: they send one request and return the server's
// answer, and they return gRPC status errors unchanged, so status.Code(err)
// and FieldViolations(err) work on them.
//
// It must not validate services (vipd does that and names the offending
// field), keep any state beyond the connection, or depend on vipd's server
// packages.
package client
