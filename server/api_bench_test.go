package server_test

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server"
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

// BenchmarkSyncServices measures one SyncServices of n services with 10
// backends each, from empty, over the fake dataplane: the server's own
// share of a big sync (gRPC, validation, store, state file). It reports
// the heap the stored state keeps (heap-MiB, after a GC) and the Go
// runtime's peak memory from the OS (sys-MiB). With VIPD_HEAP_PROFILE set
// it writes a heap profile of the stored state there.
func BenchmarkSyncServices(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			var total time.Duration
			for range b.N {
				b.StopTimer()
				in := start(b, config{serverOps: []server.Option{server.WithMaxRecvMsgSize(256 << 20)}})
				svcs := make([]*vipdv1.Service, n)
				for i := range n {
					v := i%65535 + 1
					svc := web(fmt.Sprintf("bench/w%06d", i), fmt.Sprintf("198.19.%d.%d", v>>8, v&255))
					svc.Ports[0].Port = uint32(80 + i/65535)
					for k := range 10 {
						a := (i*10 + k) % 65536
						svc.Backends = append(svc.Backends, &vipdv1.Backend{Ip: fmt.Sprintf("198.18.%d.%d", a>>8, a&255)})
					}
					svcs[i] = svc
				}
				runtime.GC()
				b.StartTimer()
				start := time.Now()
				if _, err := in.lb.SyncServices(b.Context(), &vipdv1.SyncServicesRequest{Owner: "bench", Services: svcs}); err != nil {
					b.Fatal(err)
				}
				total += time.Since(start)
				b.StopTimer()
				svcs = nil
				runtime.GC()
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				b.ReportMetric(float64(ms.HeapAlloc)/(1<<20), "heap-MiB")
				if p := os.Getenv("VIPD_HEAP_PROFILE"); p != "" {
					if f, err := os.Create(p); err == nil {
						pprof.Lookup("heap").WriteTo(f, 0)
						f.Close()
					}
				}
				b.ReportMetric(float64(ms.Sys)/(1<<20), "sys-MiB")
				in.stop()
				b.StartTimer()
			}
			b.ReportMetric(total.Seconds()/float64(b.N), "sync-s")
		})
	}
}
