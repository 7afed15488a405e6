// Package none is the dataplane that programs nothing: vipd --dataplane none,
// for control-plane tests and demos that need the real daemon but no kernel
// rules. It checks each State against its capabilities as a real dataplane
// does and keeps only the last one it applied. It reports no flows, explains
// no picks beyond the desired state, and cannot drift.
//
// It must not record history or offer hooks for tests: the recording fake
// that tests script is dataplane/fake, which the daemon never links.
package none
