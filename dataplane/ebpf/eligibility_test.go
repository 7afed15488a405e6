package ebpf

import (
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/vipd/vipd/dataplane"
)

// TestEligibilityMatchesExternalBackends checks that eligibility picks
// exactly the backends, in the same order, that the shared
// dataplane.Service.ExternalBackends (and so EligibleBackends) returns, for
// random mixes of families, states, node-locality and served ports.
func TestEligibilityMatchesExternalBackends(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	ports := []dataplane.Port{
		{Name: "http", Protocol: dataplane.TCP, Port: 80, TargetPort: 8080},
		{Name: "dns", Protocol: dataplane.UDP, Port: 53, TargetPort: 53},
	}
	states := []dataplane.BackendState{dataplane.BackendReady, dataplane.BackendTerminating, 0}
	for n := range 2000 {
		svc := &dataplane.Service{Name: "ns/svc", Ports: ports}
		for i := range rng.IntN(8) {
			ip := netip.AddrFrom4([4]byte{10, 0, byte(n), byte(i)})
			if rng.IntN(3) == 0 {
				ip = netip.AddrFrom16([16]byte{0xfd, 15: byte(i)})
			}
			b := dataplane.Backend{IP: ip, State: states[rng.IntN(len(states))], NodeLocal: rng.IntN(2) == 0, Weight: 1}
			if rng.IntN(4) == 0 {
				b.Ports = map[string]uint16{"http": 9090}
				b.OnlyNamedPorts = rng.IntN(2) == 0
			}
			svc.Backends = append(svc.Backends, b)
		}
		for _, p := range ports {
			for _, is6 := range []bool{false, true} {
				for _, pol := range []dataplane.TrafficPolicy{dataplane.TrafficPolicyCluster, dataplane.TrafficPolicyLocal} {
					want := svc.ExternalBackends(p, is6, pol)
					e := eligibilityOf(svc, p, is6, pol)
					var got []*dataplane.Backend
					for i := range svc.Backends {
						if e.has(&svc.Backends[i]) {
							got = append(got, &svc.Backends[i])
						}
					}
					if len(got) != len(want) {
						t.Fatalf("service %d port %d is6=%v policy %v: %d eligible, want %d", n, p.Port, is6, pol, len(got), len(want))
					}
					for i := range got {
						if got[i] != want[i] {
							t.Fatalf("service %d port %d is6=%v policy %v: eligible %d is %v, want %v", n, p.Port, is6, pol, i, got[i].IP, want[i].IP)
						}
					}
				}
			}
		}
	}
}
