// Package soak proves, on real traffic, that vipd survives faults: kill -9
// in the middle of applies, concurrent control planes, backend churn under
// load, a failing dataplane, and overload. Each test builds its own netlab
// network namespaces, runs the real vipd binary (built by internal/testkit/testbin)
// against them for every dataplane (eBPF and iptables), and removes
// everything it created, namespaces, processes, mounts and pinned objects,
// also when it fails.
//
// The helpers here are what the tests share:
//   - Vipd starts one vipd process on a private socket, state directory and
//     bpffs, kills it with SIGKILL, restarts it over the same state, and
//     reads its JSON log, its /metrics and its peak memory;
//   - Traffic makes new connections through VIPs from a pod, all along,
//     and counts those that failed or reached a backend they must not;
//   - Env puts a lab, a vipd and an API client together;
//   - CheckKernel compares what the kernel holds with vipd's desired state
//     (ListServices), through the dataplane packages' own code: the
//     iptables renderer against iptables-save, and ebpf.VerifyPinned
//     against the pinned maps.
//
// # Forms
//
// The tests run in a short form by default, which CI runs (make test-soak;
// all of it within 5 minutes on two cores), and in a full form with
// VIPD_SOAK=full (make test-soak-full): 30-second runs. Form says how long
// and how hard. VIPD_SOAK_DATAPLANES (comma-separated) limits the
// dataplanes; the default is both.
//
// Like every netlab user, soak never changes the root network namespace:
// traffic stays between lab namespaces, and vipd programs only the lab's
// node namespace (--netns), a bpffs of its own and a test cgroup. The only
// root-namespace socket is vipd's metrics listener on 127.0.0.1, on a port
// the kernel picks.
package soak
