package iptables

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"

	"github.com/vipd/vipd/dataplane"
)

// benchState is n services, one VIP each in 10.96.0.0/12, with k ready backends.
func benchState(n, k int) *dataplane.State {
	s := &dataplane.State{Generation: 1, Services: map[string]*dataplane.Service{}}
	for i := range n {
		vip := netip.AddrFrom4([4]byte{10, byte(96 + i>>16), byte(i >> 8), byte(i)})
		var bs []dataplane.Backend
		for j := range k {
			bs = append(bs, ready(fmt.Sprintf("10.%d.%d.%d", 128+j, i>>8, i&0xff)))
		}
		svc := service(fmt.Sprintf("svc-%05d", i), []string{vip.String()}, []dataplane.Port{port("http", dataplane.TCP, 80, 8080)}, bs...)
		s.Services[svc.Name] = svc
	}
	return s
}

func reportPayload(b *testing.B, us []Update) {
	n := 0
	for _, u := range us {
		n += len(u.Restore)
	}
	b.ReportMetric(float64(n), "payload-bytes")
	b.ReportMetric(float64(us[IPv4].ChainsRewritten), "chains-rewritten")
	b.ReportMetric(float64(us[IPv4].RulesWritten), "rules-written")
}

// BenchmarkSyncFull is Render and a full Payload for 10,000 services with 5
// backends each.
func BenchmarkSyncFull(b *testing.B) {
	s := benchState(10000, 5)
	var us []Update
	for b.Loop() {
		rs, err := Render(s, Options{}, nil)
		if err != nil {
			b.Fatal(err)
		}
		us = Payload(nil, rs, true, nil)
	}
	reportPayload(b, us)
}

// BenchmarkSyncPartial is Render (reusing the previous Ruleset), a partial
// Payload and the restores planned from it after one service of 10,000
// gained a backend: a change to the nat table alone, one restore.
func BenchmarkSyncPartial(b *testing.B) { benchOneBackendAdded(b, benchState(10000, 5)) }

// benchOneBackendAdded measures benchApply after service svc-05000 of s
// gained a backend.
func benchOneBackendAdded(b *testing.B, s *dataplane.State) {
	old, err := Render(s, Options{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	next := &dataplane.State{Generation: 2, Services: maps.Clone(s.Services), Node: s.Node, Changed: []string{"svc-05000"}}
	changed := *s.Services["svc-05000"]
	changed.Backends = append(changed.Backends[:len(changed.Backends):len(changed.Backends)], ready("10.200.0.1"))
	next.Services[changed.Name] = &changed
	benchApply(b, old, next)
}

// benchApply measures what an Apply from old to next computes before it
// runs anything: Render (reusing old), a partial Payload, and the restores
// that commitSteps plans from it, whose number and total size it reports.
func benchApply(b *testing.B, old *Ruleset, next *dataplane.State) {
	var us []Update
	var steps []restoreStep
	for b.Loop() {
		rs, err := Render(next, Options{}, old)
		if err != nil {
			b.Fatal(err)
		}
		us = Payload(old, rs, false, nil)
		steps = steps[:0]
		for _, u := range us {
			steps = append(steps, commitSteps(old, rs, u, [2]bool{})...)
		}
	}
	reportPayload(b, us)
	n := 0
	for _, s := range steps {
		n += len(s.payload)
	}
	b.ReportMetric(float64(len(steps)), "restores")
	b.ReportMetric(float64(n), "restore-bytes")
}

// externalBenchState is benchState with the external half on every
// service: a node port, an LB IP, and a node with a node-port address and
// an external interface.
func externalBenchState(n, k int) *dataplane.State {
	s := benchState(n, k)
	for i, name := range slices.Sorted(maps.Keys(s.Services)) {
		svc := *s.Services[name]
		svc.Ports = []dataplane.Port{nodePort(svc.Ports[0], uint16(30000+i))}
		svc.LoadBalancerIPs = []netip.Addr{netip.AddrFrom4([4]byte{192, 168 + byte(i>>16), byte(i >> 8), byte(i)})}
		s.Services[name] = &svc
	}
	s.Node = testNode()
	return s
}

// BenchmarkSyncPartialExternal is BenchmarkSyncPartial with every service
// external (a node port and an LB IP).
func BenchmarkSyncPartialExternal(b *testing.B) {
	benchOneBackendAdded(b, externalBenchState(10000, 5))
}

// BenchmarkSyncNodeAddress is Render and a partial Payload after the node
// got another node-port address, with 10,000 external services.
func BenchmarkSyncNodeAddress(b *testing.B) {
	s := externalBenchState(10000, 5)
	old, err := Render(s, Options{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	next := &dataplane.State{Generation: 2, Services: s.Services, Node: s.Node}
	next.Node.NodePortAddresses = append(slices.Clone(s.Node.NodePortAddresses), netip.MustParseAddr("192.168.1.7"))
	var us []Update
	for b.Loop() {
		rs, err := Render(next, Options{}, old)
		if err != nil {
			b.Fatal(err)
		}
		us = Payload(old, rs, false, nil)
	}
	reportPayload(b, us)
}

// BenchmarkSyncBackendsGone is benchApply after one service of 10,000
// lost its last backend: a change to both tables, two restores (the new
// filter table holds the old one's rules, so it is the union).
func BenchmarkSyncBackendsGone(b *testing.B) {
	s := benchState(10000, 5)
	old, err := Render(s, Options{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	benchApply(b, old, withBackends(s, "svc-05000", nil))
}

// BenchmarkSyncBackendsSwapped is benchApply after one service of 10,000
// lost its last backend while another, in the same reject chain, got one:
// three restores.
func BenchmarkSyncBackendsSwapped(b *testing.B) {
	s := withBackends(benchState(10000, 5), "svc-05001", nil)
	old, err := Render(s, Options{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	benchApply(b, old, withBackends(withBackends(s, "svc-05000", nil), "svc-05001", []dataplane.Backend{ready("10.200.0.1")}))
}

// withBackends is s with service name's backends replaced by backends.
func withBackends(s *dataplane.State, name string, backends []dataplane.Backend) *dataplane.State {
	next := &dataplane.State{Generation: s.Generation + 1, Services: maps.Clone(s.Services), Node: s.Node,
		Changed: append(slices.Clone(s.Changed), name)}
	changed := *s.Services[name]
	changed.Backends = backends
	next.Services[name] = &changed
	return next
}

// BenchmarkSyncMove is benchApply after one backend of one service of
// 10,000 moved to another address: the programming benchmark's change.
func BenchmarkSyncMove(b *testing.B) {
	s := benchState(10000, 5)
	old, err := Render(s, Options{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	moved := slices.Clone(s.Services["svc-05000"].Backends)
	moved[0] = ready("10.200.0.1")
	benchApply(b, old, withBackends(s, "svc-05000", moved))
}
