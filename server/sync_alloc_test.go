package server_test

import (
	"fmt"
	"runtime"
	"testing"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server"
)

// syncAllocBudget bounds what one SyncServices of syncAllocServices
// services × 10 backends, from empty, allocates per service in the whole
// process (the client's encoding, gRPC, validation, the store, the state
// file and the fake dataplane): bytes and objects. The 100,000 × 10 full
// programming pays it a hundred thousand times, and the collector's work
// follows it.
const (
	syncAllocServices     = 20_000
	syncAllocBytesBudget  = 7500
	syncAllocObjectBudget = 55
)

// TestSyncServicesAllocBudget fails when a big sync allocates more per
// service than syncAllocBudget allows.
func TestSyncServicesAllocBudget(t *testing.T) {
	in := start(t, config{serverOps: []server.Option{server.WithMaxRecvMsgSize(256 << 20)}})
	svcs := make([]*vipdv1.Service, syncAllocServices)
	for i := range svcs {
		v := i%65535 + 1
		svc := web(fmt.Sprintf("alloc/w%06d", i), fmt.Sprintf("198.19.%d.%d", v>>8, v&255))
		for k := range 10 {
			a := (i*10 + k) % 65536
			svc.Backends = append(svc.Backends, &vipdv1.Backend{Ip: fmt.Sprintf("198.18.%d.%d", a>>8, a&255)})
		}
		svcs[i] = svc
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, err := in.lb.SyncServices(t.Context(), &vipdv1.SyncServicesRequest{Owner: "alloc", Services: svcs}); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	checkAllocBudget(t, "a sync", syncAllocServices, &before, &after, syncAllocBytesBudget, syncAllocObjectBudget)
}

// checkAllocBudget fails t when what, of n services, allocated more per
// service between before and after than bytesBudget and objectBudget
// allow (a budget of 0 is none).
func checkAllocBudget(t *testing.T, what string, n int, before, after *runtime.MemStats, bytesBudget, objectBudget float64) {
	t.Helper()
	bytes := float64(after.TotalAlloc-before.TotalAlloc) / float64(n)
	objects := float64(after.Mallocs-before.Mallocs) / float64(n)
	t.Logf("per service: %.0f bytes, %.1f objects", bytes, objects)
	if bytesBudget > 0 && bytes > bytesBudget {
		t.Errorf("%s of %d services allocates %.0f bytes per service, over the budget of %.0f", what, n, bytes, bytesBudget)
	}
	if objectBudget > 0 && objects > objectBudget {
		t.Errorf("%s of %d services allocates %.1f objects per service, over the budget of %.1f", what, n, objects, objectBudget)
	}
}
