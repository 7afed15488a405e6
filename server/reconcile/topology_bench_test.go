package reconcile

import (
	"fmt"
	"testing"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
)

// BenchmarkTopologyFullSync measures what topology adds to a full sync
// of 10,000 services with 10 backends each: reading every stored spec
// for a distribution or hints, and filtering those that have them
// (hinted: every tenth service has zone hints on every backend).
func BenchmarkTopologyFullSync(b *testing.B) {
	for _, hinted := range []bool{false, true} {
		b.Run(fmt.Sprintf("hinted=%v", hinted), func(b *testing.B) {
			snap := benchSnapshot(b, 10_000, hinted)
			s := snap.DataplaneState(nil)
			tp := Topology{NodeName: "node-1", Zone: "zone-a"}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := (*topoState)(nil).next(tp, snap, s.ServiceSet(), nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func benchSnapshot(b *testing.B, n int, hinted bool) *store.Snapshot {
	b.Helper()
	tx := store.Empty().Begin()
	for i := range n {
		v := i%65535 + 1
		svc := &vipdv1.Service{Name: fmt.Sprintf("bench/w%06d", i), Vips: []string{fmt.Sprintf("198.19.%d.%d", v>>8, v&255)},
			Ports: []*vipdv1.Port{{Port: uint32(80 + i/65535)}}}
		for k := range 10 {
			a := (i*10 + k) % 65536
			be := &vipdv1.Backend{Ip: fmt.Sprintf("198.18.%d.%d", a>>8, a&255), Zone: "zone-a"}
			if hinted && i%10 == 0 {
				be.ForZones = []string{[]string{"zone-a", "zone-b"}[k%2]}
			}
			svc.Backends = append(svc.Backends, be)
		}
		out, dp, viol := validation.Service(svc, validation.Limits{}, "service")
		if viol != nil {
			b.Fatal(viol)
		}
		if _, err := tx.Put(out, dp); err != nil {
			b.Fatal(err)
		}
	}
	return tx.Commit()
}

// BenchmarkZoneChange measures what a new zone costs the reconciler at
// 10,000 services with 10 backends each, every tenth with zone hints:
// every spec is read again, the hinted ones filtered, and the services
// either zone selects for named as changed (the dataplane's own cost for
// them is not included).
func BenchmarkZoneChange(b *testing.B) {
	snap := benchSnapshot(b, 10_000, true)
	s := snap.DataplaneState(nil)
	zones := [2]Topology{{NodeName: "node-1", Zone: "zone-a"}, {NodeName: "node-1", Zone: "zone-b"}}
	ts, err := (*topoState)(nil).next(zones[0], snap, s.ServiceSet(), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		next, err := ts.next(zones[(i+1)%2], snap, s.ServiceSet(), []string{})
		if err != nil {
			b.Fatal(err)
		}
		if changed := next.changedSince(ts, []string{}); len(changed) != 1000 {
			b.Fatalf("%d services changed, want the 1,000 hinted", len(changed))
		}
		ts = next
	}
}
