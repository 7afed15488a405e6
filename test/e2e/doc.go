// Package e2e holds end-to-end tests that run the real vipd and vipctl
// binaries and drive them with the pinned grpcurl, as a user would.
package e2e
