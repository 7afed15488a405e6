// Package cgroup2 finds and mounts the cgroup v2 hierarchy, to which vipd's
// eBPF dataplane attaches its socket hooks, and reads which processes are in
// a cgroup.
//
// The package never moves an existing process between cgroups, never
// creates or changes a cgroup, and never changes the mount options of the
// hierarchy: a cgroup2 mount reapplies its options (nsdelegate,
// memory_recursiveprot, ...) to the whole hierarchy, so Mount copies them
// from a cgroup2 mount that already exists.
//
// The throwaway cgroups that tests (and the demo and benchmarks) start their
// client processes in are test harness, in internal/testkit/cgroup2test.
package cgroup2
