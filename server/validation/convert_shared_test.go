package validation

import (
	"reflect"
	"testing"
	"unsafe"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// TestBackendsShareEqualPortsAndZones checks that the backends of a
// service that name the same ports share one map, and those of one zone
// one string, while each keeps exactly its own values.
func TestBackendsShareEqualPortsAndZones(t *testing.T) {
	svc := &vipdv1.Service{Name: "s", Vips: []string{"198.19.0.1"},
		Ports: []*vipdv1.Port{{Name: "http", Port: 80}, {Name: "dns", Protocol: vipdv1.Protocol_PROTOCOL_UDP, Port: 53}}}
	zone := func(s string) string { return string([]byte(s)) } // a string of its own
	for i, ports := range []map[string]uint32{
		{"http": 8080}, {"http": 8080}, {"http": 8081}, {"http": 8080, "dns": 5353}, {"http": 8080}, nil, {"http": 8081},
	} {
		svc.Backends = append(svc.Backends, &vipdv1.Backend{Ip: "198.18.0." + string(rune('1'+i)), Ports: ports, Zone: zone([]string{"zone-a", "zone-b"}[i%2])})
	}
	dp, v := ConvertService(svc, "service")
	if len(v) > 0 {
		t.Fatal(v)
	}
	mapOf := func(i int) uintptr { return reflect.ValueOf(dp.Backends[i].Ports).Pointer() }
	for i, b := range dp.Backends {
		want := svc.Backends[i].Ports
		if len(b.Ports) != len(want) {
			t.Errorf("backends[%d].ports = %v, want %v", i, b.Ports, want)
		}
		for k, p := range want {
			if uint32(b.Ports[k]) != p {
				t.Errorf("backends[%d].ports = %v, want %v", i, b.Ports, want)
			}
		}
		if b.Zone != svc.Backends[i].Zone {
			t.Errorf("backends[%d].zone = %q, want %q", i, b.Zone, svc.Backends[i].Zone)
		}
	}
	for _, same := range [][2]int{{0, 1}, {0, 4}, {2, 6}} {
		if mapOf(same[0]) != mapOf(same[1]) {
			t.Errorf("backends[%d] and [%d] name the same ports in two maps", same[0], same[1])
		}
	}
	for _, other := range [][2]int{{0, 2}, {0, 3}} {
		if mapOf(other[0]) == mapOf(other[1]) {
			t.Errorf("backends[%d] and [%d] share a map of different ports", other[0], other[1])
		}
	}
	if unsafeData(dp.Backends[0].Zone) != unsafeData(dp.Backends[2].Zone) {
		t.Error("backends[0] and [2] keep their zone in two strings")
	}
	// The dataplane form shares nothing with the API form.
	svc.Backends[0].Ports["http"] = 1
	if dp.Backends[0].Ports["http"] != 8080 {
		t.Error("the dataplane form shares the request's ports map")
	}
}

// unsafeData is where s's bytes are.
func unsafeData(s string) *byte { return unsafe.StringData(s) }
