package iptables

import (
	"fmt"
	"net/netip"
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

// BenchmarkSyncPartial is Render (reusing the previous Ruleset) and a partial
// Payload after one service of 10,000 gained a backend.
func BenchmarkSyncPartial(b *testing.B) {
	s := benchState(10000, 5)
	old, err := Render(s, Options{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	next := &dataplane.State{Generation: 2, Services: map[string]*dataplane.Service{}}
	for name, svc := range s.Services {
		next.Services[name] = svc
	}
	changed := *s.Services["svc-05000"]
	changed.Backends = append(changed.Backends[:len(changed.Backends):len(changed.Backends)], ready("10.200.0.1"))
	next.Services[changed.Name] = &changed
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
