package daemon

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
)

// TestListVIPsAllocs: the node check's VIP list of a big snapshot is sorted,
// lists each VIP once, and costs two allocations (the list, sized up
// front, and its copy without the repeats), not an append's regrowths.
func TestListVIPsAllocs(t *testing.T) {
	const n, distinct = 10_000, 6_500 // the bench's fillers share VIPs too
	tx := store.Empty().Begin()
	for i := range n {
		v := i % distinct
		svc := &vipdv1.Service{Name: fmt.Sprintf("svc-%05d", i), Vips: []string{fmt.Sprintf("10.96.%d.%d", v>>8, v&255)},
			Ports:    []*vipdv1.Port{{Port: uint32(80 + i/distinct), TargetPort: 8080}},
			Backends: []*vipdv1.Backend{{Ip: "10.1.0.1"}}}
		dp, v2 := validation.ConvertService(svc, "service")
		if v2 != nil {
			t.Fatal(v2)
		}
		if _, err := tx.Put(svc, dp); err != nil {
			t.Fatal(err)
		}
	}
	snap := tx.Commit()
	vips := listVIPs(snap)
	if len(vips) != distinct || !slices.IsSortedFunc(vips, netip.Addr.Compare) || len(slices.Compact(slices.Clone(vips))) != distinct {
		t.Fatalf("%d VIPs listed, want %d, sorted, each once", len(vips), distinct)
	}
	if cap(vips) != len(vips) {
		t.Errorf("the list keeps room for %d VIPs, holding %d", cap(vips), len(vips))
	}
	if allocs := testing.AllocsPerRun(5, func() { listVIPs(snap) }); allocs > 2 {
		t.Errorf("listing the VIPs of %d services allocates %.0f times, want 2", n, allocs)
	}
}
