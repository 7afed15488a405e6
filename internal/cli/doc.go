// Package cli is vipctl: the cobra command tree, its flags, the output
// formats (tables, JSON, YAML) and the mapping of errors to exit codes.
//
// vipctl exits with a code that scripts can rely on:
//
//	0  success
//	1  any other error
//	2  usage error: bad flags or arguments
//	3  NotFound: no such service, or no such backend to remove
//	4  InvalidArgument: vipd rejected the input, or an input file is invalid
//	5  conflict: AlreadyExists, Aborted (a stale generation), FailedPrecondition (another owner's service)
//	6  vipd unavailable: Unavailable or DeadlineExceeded
//	7  denied: PermissionDenied or Unauthenticated
//
// It owns presentation and argument handling only: it talks to vipd through
// package client and reads files through package manifest. It must not
// validate services (vipd does, with validate_only before apply writes
// anything; apply checks only what its own flags promise, such as --owner,
// and what vipd cannot see in one call: two services of the files that
// claim one VIP:port, external or load-balancer IP:port or node port, or
// that give one address roles that exclude each other, such as a backend
// of one that is a VIP of another) or keep state between runs.
package cli
