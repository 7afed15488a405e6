// Package bench holds vipd's benchmarks. They run the real vipd binary
// against netlab namespaces, never the root namespace, and report their
// figures through testing.B; `go test ./bench/ -run=^$ -bench=.` runs them.
// Nothing here is a pass/fail test of speed.
package bench
