// Package store holds vipd's desired state: the services, their generations,
// the index of which service claims each VIP:port/protocol, external or
// load-balancer IP:port/protocol and node port/protocol (health-check node
// ports among the TCP ones), the count of services using each address as a
// VIP, as a backend and as an external or load-balancer IP (no address may
// have two of these roles), and the state file that makes it all survive
// restarts.
//
// A Snapshot is immutable and safe to share between goroutines. Changes are
// staged in a Txn on top of a Snapshot and become a new Snapshot on Commit;
// nothing is visible to readers until the caller publishes that Snapshot.
// A Snapshot remembers which services its last commits touched, so that a
// reader that follows the published snapshots learns what changed since
// the one it saw last without walking every service (ChangedSince).
// The store never talks to a dataplane: the reconciler decides when a
// Snapshot is applied and saved. It enforces the totals that only it can
// see (Snapshot.WithLimits): a Put past them fails and stages nothing.
//
// Load turns stored records into entries by validation's structural
// conversion alone, never its admission policy, so that a state directory
// written by any earlier vipd loads (testdata/formats holds one of each
// on-disk format).
package store
