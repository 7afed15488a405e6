package store_test

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"testing"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
)

// BenchmarkRetainedPerService reports the heap a committed snapshot keeps
// per stored service of 10 backends (B/service: HeapInuse after a GC, less
// the same before the services were stored; B-live/service is the same of
// HeapAlloc, without the fragmentation that HeapInuse counts), as the server stores them:
// validated, then put in one transaction, the API message dropped. A rise
// here is the store keeping more of each service; the memory targets at
// 100,000 services live in bench/. With VIPD_HEAP_PROFILE set it writes a
// heap profile of the retained state there.
//
// The kubernetes case has backends as vipd's Kubernetes adapter writes
// them: each names its port (ports {"http": 8080}, only_named_ports) and
// has a zone.
func BenchmarkRetainedPerService(b *testing.B) {
	b.Run("plain", func(b *testing.B) { benchmarkRetained(b, bigServices) })
	b.Run("kubernetes", func(b *testing.B) {
		benchmarkRetained(b, func(n int) []*vipdv1.Service {
			svcs := bigServices(n)
			for i, s := range svcs {
				s.Ports[0].Name = "http"
				for _, be := range s.Backends {
					be.Ports = map[string]uint32{"http": 8080}
					be.OnlyNamedPorts = true
					be.Zone = fmt.Sprintf("zone-%c", 'a'+i%3)
				}
			}
			return svcs
		})
	})
}

func benchmarkRetained(b *testing.B, services func(n int) []*vipdv1.Service) {
	const n = 20_000
	var perService, livePerService float64
	for range b.N {
		b.StopTimer()
		before, beforeLive := heapInuse()
		svcs := services(n)
		b.StartTimer()
		tx := store.Empty().Begin()
		for i, s := range svcs {
			out, dp, v := validation.Service(s, validation.Limits{}, "service")
			if len(v) > 0 {
				b.Fatal(v)
			}
			spec, err := store.NewSpec(out, dp)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := tx.PutSpec(spec, dp); err != nil {
				b.Fatal(err)
			}
			svcs[i] = nil
		}
		snap := tx.Commit()
		b.StopTimer()
		tx, svcs = nil, nil
		after, afterLive := heapInuse()
		perService = (float64(after) - float64(before)) / n
		livePerService = (float64(afterLive) - float64(beforeLive)) / n
		if p := os.Getenv("VIPD_HEAP_PROFILE"); p != "" {
			writeHeapProfile(b, p)
		}
		runtime.KeepAlive(snap)
		b.StartTimer()
	}
	b.ReportMetric(perService, "B/service")
	b.ReportMetric(livePerService, "B-live/service")
}

// heapInuse is the heap in use (spans holding any live object) after a
// collection, and the live objects' bytes.
func heapInuse() (inuse, live uint64) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse, m.HeapAlloc
}

func writeHeapProfile(b *testing.B, path string) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		b.Fatal(err)
	}
}
