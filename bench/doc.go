// Package bench holds vipd's benchmarks.
//
// `make bench` runs cmd/vipd-bench, which measures network programming
// latency, full programming, the data path (from a pod, and from outside
// through a node port), flow events and API throughput
// for both dataplanes, side by side with the direct path and a
// kube-proxy-shaped iptables ruleset (package kubeproxy), and writes
// RESULTS.md; `make bench-quick` runs small sizes of the same. The load
// generators and backend servers are in package load (with a C generator
// that cross-checks the TCP connection rate), the data path's reference, a
// stateless tcx DNAT, in package statelessdnat, and the BPF run-time
// statistics in package bpfstats. The go test
// benchmarks in this package measure single pieces:
// `go test ./bench/ -run=^$ -bench=.`. They all run the real vipd binary
// against netlab namespaces, never the root namespace. Nothing here is a
// pass/fail test of speed.
package bench
