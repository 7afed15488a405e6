// Package e2e runs vipd-k8s and vipd (none dataplane) against a real
// etcd, kube-apiserver and EndpointSlice controller (package cluster),
// with vipd-k8s holding only deploy/kubernetes/rbac.yaml's rights
// (package vipdnode), and checks vipd's state through its API after each
// change a cluster makes: pods created, scaled, rolled and deleted,
// Services changing type, the apiserver and etcd restarting, watches
// expiring, and 1,000 Services at once. TestTraffic runs vipd on the
// real dataplanes instead (ebpf and iptables, in a netlab node: package
// labnode) and checks the same life of a Service with real connections.
// `make kube-e2e` runs it.
package e2e
