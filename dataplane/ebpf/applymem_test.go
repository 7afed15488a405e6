package ebpf

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"unsafe"

	"github.com/vipd/vipd/dataplane"
)

// memServices returns n services of k backends each, every VIP:port and
// backend distinct, as a sync of many services brings them.
func memServices(n, k int) map[string]*dataplane.Service {
	out := make(map[string]*dataplane.Service, n)
	for i := range n {
		j := i * k
		svc := &dataplane.Service{
			Name:          fmt.Sprintf("mem/s%06d", i),
			Generation:    uint64(i + 1),
			VIPs:          []netip.Addr{netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)})},
			Ports:         []dataplane.Port{{Protocol: dataplane.TCP, Port: uint16(80 + i>>16), TargetPort: 8080}},
			TrafficPolicy: dataplane.TrafficPolicyCluster,
			LoadBalancing: dataplane.LoadBalancingRandom,
		}
		for b := range k {
			a := j + b
			svc.Backends = append(svc.Backends, dataplane.Backend{
				IP: netip.AddrFrom4([4]byte{10, byte(a >> 16), byte(a >> 8), byte(a)}), State: dataplane.BackendReady, Weight: 1,
			})
		}
		out[svc.Name] = svc
	}
	return out
}

// liveHeap returns the bytes of live heap, after a collection.
func liveHeap() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// allocated returns the bytes f allocates on the Go heap, and the bytes of
// live heap it leaves (after a collection).
func allocated(f func()) (alloc, retained int64) {
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	f()
	runtime.ReadMemStats(&m1)
	alloc = int64(m1.TotalAlloc - m0.TotalAlloc)
	runtime.GC()
	runtime.ReadMemStats(&m1)
	return alloc, int64(m1.HeapAlloc) - int64(m0.HeapAlloc)
}

// TestApplyMemoryBudget guards vipd's peak memory at a large sync: no
// collection runs during an apply, so that everything the apply allocates
// adds to the peak. It applies 100,000 services × 10 backends the way a
// sync does (an incremental apply naming every service, after the empty
// apply of the start), then restarts (New on the pinned maps, restore, and
// a full apply), and checks the bytes each allocates, and the heap the
// dataplane keeps, per backend against budgets. At 100,000 × 10 the sync's
// apply allocated 205 bytes a backend and kept 103 before the budgets
// (backend table maps grown step by step, eligible-backend lists,
// write buffers grown an entry at a time), and the restart 214; later
// the sync's allocated 113 and kept 92, the restart's 148 and 91 (a map
// of every desired frontend built per apply, every reverse-NAT ID kept
// twice, a slice per service in the service index and per rendered
// service, frontends in the 144-byte size class, a programmed frontend's
// slot IDs a slice of their own), and with those gone 92 and 79, 133 and
// 79.
func TestApplyMemoryBudget(t *testing.T) {
	const n, k = 100_000, 10
	const (
		syncAllocBudget       = 102 // bytes per backend
		syncRetainedBudget    = 85
		restartAllocBudget    = 143
		restartRetainedBudget = 85
	)
	svcs := memServices(n, k)
	names := make([]string, 0, n)
	for name := range svcs {
		names = append(names, name)
	}
	base := liveHeap()
	e := newDPEnv(t, nil, MapSizes{})
	e.open(nil)
	e.apply(&dataplane.State{Generation: 1, Services: map[string]*dataplane.Service{}})
	alloc, retained := allocated(func() {
		e.apply(&dataplane.State{Generation: 2, Services: svcs, Changed: names})
	})
	per := func(b int64) int64 { return b / (n * k) }
	t.Logf("sync apply: %d B allocated, %d B kept per backend", per(alloc), per(retained))
	if per(alloc) > syncAllocBudget {
		t.Errorf("the apply of a sync allocates %d bytes per backend, budget %d", per(alloc), syncAllocBudget)
	}
	if per(retained) > syncRetainedBudget {
		t.Errorf("the dataplane keeps %d bytes per backend after a sync, budget %d", per(retained), syncRetainedBudget)
	}
	e.close()
	// The heap the restarted dataplane keeps is measured from before the
	// first one opened: the closed one's heap goes only once its maps'
	// finalizers ran.
	alloc, _ = allocated(func() {
		e.open(nil)
		e.apply(&dataplane.State{Generation: 3, Services: svcs})
	})
	retained = liveHeap() - base
	runtime.KeepAlive(svcs) // in base
	runtime.KeepAlive(names)
	t.Logf("restart: %d B allocated, %d B kept per backend", per(alloc), per(retained))
	if per(alloc) > restartAllocBudget {
		t.Errorf("a restart (New and its full apply) allocates %d bytes per backend, budget %d", per(alloc), restartAllocBudget)
	}
	if per(retained) > restartRetainedBudget {
		t.Errorf("the dataplane keeps %d bytes per backend after a restart, budget %d", per(retained), restartRetainedBudget)
	}
	if s := unsafe.Sizeof(frontend{}); s > frontendSizeMax {
		t.Errorf("a frontend takes %d bytes, more than the %d of its size class", s, frontendSizeMax)
	}
}
