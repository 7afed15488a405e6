// Package labnode runs one Kubernetes node whose Services carry real
// traffic: a netlab lab (internal/testkit/netlab) whose node 1 stands for
// the Kubernetes node, the real vipd on a real dataplane (ebpf or
// iptables) programming that node's network namespace (test/soak's Env:
// its own socket, state directory, bpffs and test cgroup), and vipd-k8s
// in the root namespace with deploy/kubernetes/rbac.yaml's rights
// (vipdnode.StartAdapter), talking to a test cluster (package cluster)
// over loopback and to vipd over its Unix socket.
//
// Pods are netlab pods running echo servers; a test gives their addresses
// to Pod objects as a kubelet would. labnode never changes the root
// network namespace: traffic stays between the lab's namespaces, and
// everything it starts or creates is removed by the test's cleanups, also
// when the test fails.
package labnode
