package store_test

import (
	"os"
	"runtime"
	"runtime/pprof"
	"testing"

	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
)

// BenchmarkRetainedPerService reports the heap a committed snapshot keeps
// per stored service of 10 backends (B/service: HeapInuse after a GC, less
// the same before the services were stored), as the server stores them:
// validated, then put in one transaction, the API message dropped. A rise
// here is the store keeping more of each service; the memory targets at
// 100,000 services live in bench/. With VIPD_HEAP_PROFILE set it writes a
// heap profile of the retained state there.
func BenchmarkRetainedPerService(b *testing.B) {
	const n = 20_000
	var perService float64
	for range b.N {
		b.StopTimer()
		before := heapInuse()
		svcs := bigServices(n)
		b.StartTimer()
		tx := store.Empty().Begin()
		for i, s := range svcs {
			out, dp, v := validation.Service(s, validation.Limits{}, "service")
			if len(v) > 0 {
				b.Fatal(v)
			}
			spec, err := store.EncodeSpec(out)
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
		perService = (float64(heapInuse()) - float64(before)) / n
		if p := os.Getenv("VIPD_HEAP_PROFILE"); p != "" {
			writeHeapProfile(b, p)
		}
		runtime.KeepAlive(snap)
		b.StartTimer()
	}
	b.ReportMetric(perService, "B/service")
}

// heapInuse is the heap in use after a collection.
func heapInuse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
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
