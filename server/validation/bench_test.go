package validation_test

import (
	"fmt"
	"testing"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/protobuf/proto"
)

// BenchmarkServiceInPlace admits the service shape of the 100,000 × 10
// full-programming bench: one VIP, one port, ten backends. Its allocations
// per op are what a big SyncServices pays per service.
func BenchmarkServiceInPlace(b *testing.B) {
	in := &vipdv1.Service{Name: "svc-1", Vips: []string{"198.19.0.1"}, Ports: []*vipdv1.Port{{Port: 80}}}
	for i := range 10 {
		in.Backends = append(in.Backends, &vipdv1.Backend{Ip: fmt.Sprintf("198.18.%d.%d", i/250, i%250+1)})
	}
	copies := make([]*vipdv1.Service, b.N)
	for i := range copies {
		copies[i] = proto.Clone(in).(*vipdv1.Service)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, _, v := validation.ServiceInPlace(copies[i], validation.Limits{}, "services[0]"); len(v) > 0 {
			b.Fatal(v)
		}
	}
}
