// Package cgroup2 mounts the cgroup v2 hierarchy and manages the throwaway
// cgroups that tests put their client processes in.
//
// vipd's eBPF dataplane attaches its socket hooks to a cgroup v2 directory.
// Tests must never attach anything to the machine's root cgroup: they make a
// child cgroup with NewTestGroup and start only their own processes in it.
// NewTestGroup mounts cgroup2 at a private temporary directory, so it works
// whether or not the machine mounts cgroup2 somewhere (every cgroup2 mount
// shows the same single hierarchy, so a child made there is a real child of
// the cgroup2 root).
//
// The package never moves an existing process between cgroups, never
// changes a cgroup it did not create, and never changes the mount options of
// the hierarchy: a cgroup2 mount reapplies its options (nsdelegate,
// memory_recursiveprot, ...) to the whole hierarchy, so Mount copies them
// from a cgroup2 mount that already exists.
package cgroup2
