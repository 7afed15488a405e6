package server_test

import (
	"fmt"
	"testing"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// BenchmarkUpsertService measures one UpsertService round trip (validate,
// apply to the fake dataplane, save the state file with fsync) with n other
// services present.
func BenchmarkUpsertService(b *testing.B) {
	for _, n := range []int{1, 1000, 10000} {
		b.Run(fmt.Sprintf("present=%d", n), func(b *testing.B) {
			in := start(b, config{})
			svcs := make([]*vipdv1.Service, n)
			for i := range n {
				svcs[i] = web(fmt.Sprintf("bench/s%d", i), fmt.Sprintf("198.19.%d.%d", i/250, i%250+1),
					"198.18.1.10", "198.18.1.11", "198.18.1.12", "198.18.1.13", "198.18.1.14")
			}
			if _, err := in.lb.SyncServices(b.Context(), &vipdv1.SyncServicesRequest{Owner: "bench", Services: svcs}); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				svc := web("bench/changing", "198.19.250.1", fmt.Sprintf("198.18.2.%d", i%200+1))
				if _, err := in.lb.UpsertService(b.Context(), &vipdv1.UpsertServiceRequest{Service: svc}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
