// Package dataplane defines the contract between vipd's control logic and the
// kernel programmers that forward traffic: the Dataplane interface, the State
// it consumes (plain Go types, not the wire protos), and the sentinel errors a
// dataplane reports.
//
// Nothing here touches the kernel. The implementations live in subpackages:
// iptables, ebpf and none (programs nothing). The recording, transactional
// fake in dataplane/fake is test harness: only tests import it.
package dataplane
