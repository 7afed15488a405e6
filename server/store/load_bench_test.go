package store_test

import (
	"fmt"
	"runtime"
	"testing"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/store"
)

// bigServices returns n services of 10 backends each, every VIP and
// backend address distinct: the most entries the address index can have.
func bigServices(n int) []*vipdv1.Service {
	out := make([]*vipdv1.Service, n)
	for i := range n {
		s := svc(fmt.Sprintf("bench/w%06d", i), fmt.Sprintf("10.%d.%d.%d", 100+i>>16, i>>8&255, i&255), 0, tcp(80))
		for j := range 10 {
			k := i*10 + j + 1
			s.Backends = append(s.Backends, &vipdv1.Backend{Ip: fmt.Sprintf("11.%d.%d.%d", k>>16, k>>8&255, k&255)})
		}
		out[i] = s
	}
	return out
}

// heapInUse is the live heap after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkStoreLarge measures, for 100,000 services of 10 backends, a
// state file's Load and one transaction that stores them all (a first
// SyncServices), with the heap the loaded snapshot keeps (MiB-live).
func BenchmarkStoreLarge(b *testing.B) {
	const n = 100_000
	svcs := bigServices(n)
	b.Run("commit-all", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			tx := store.Empty().Begin()
			for _, s := range svcs {
				put(b, tx, s)
			}
			if s := tx.Commit(); s.Len() != n {
				b.Fatal(s.Len())
			}
		}
	})
	path := b.TempDir()
	dir, err := store.OpenDir(path)
	if err != nil {
		b.Fatal(err)
	}
	tx := store.Empty().Begin()
	for _, s := range svcs {
		put(b, tx, s)
	}
	if err := dir.Save(tx.Commit()); err != nil {
		b.Fatal(err)
	}
	dir.Close()
	tx, svcs = nil, nil
	b.Run("load", func(b *testing.B) {
		b.ReportAllocs()
		var live float64
		for range b.N {
			before := heapInUse()
			d, err := store.OpenDir(path)
			if err != nil {
				b.Fatal(err)
			}
			s, err := d.Load()
			if err != nil || s.Len() != n {
				b.Fatal(s.Len(), err)
			}
			b.StopTimer()
			live = float64(heapInUse()-before) / (1 << 20)
			runtime.KeepAlive(s)
			d.Close()
			b.StartTimer()
		}
		b.ReportMetric(live, "MiB-live")
	})
}
