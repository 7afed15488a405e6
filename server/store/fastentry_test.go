package store

import (
	"fmt"
	"reflect"
	"testing"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// slowDecode is decodeEntry as it was before recordDecoder: a new message
// decoded whole, converted, and encoded again by NewEntry.
func slowDecode(rec []byte) (*Entry, error) {
	stored := &vipdv1.Service{}
	if err := proto.Unmarshal(rec, stored); err != nil {
		return nil, err
	}
	gen := stored.Generation
	stored.Generation = 0
	dp, v := validation.ConvertService(stored, "service")
	if len(v) > 0 {
		return nil, v
	}
	return NewEntry(stored, dp, gen)
}

// record is a state record of svc as written: its encoding, normalized or
// not, with generation gen, and extra bytes appended to the service.
func record(t *testing.T, svc *vipdv1.Service, gen uint64, extra []byte) []byte {
	t.Helper()
	svc = proto.Clone(svc).(*vipdv1.Service)
	svc.Generation = 0
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(svc)
	if err != nil {
		t.Fatal(err)
	}
	b = append(b, extra...)
	b = protowire.AppendTag(b, generationField, protowire.VarintType)
	return protowire.AppendVarint(b, gen)
}

// TestRecordDecoderFastEntry checks that recordDecoder, whose fastEntry
// encodes a record's service without its backends, decodes every kind of
// record to the entry that decoding it whole and encoding it again gives
// (same spec, same cut, same dataplane form), and that it takes the fast
// way for records as today's vipd writes them: fastEntry relies on the
// record's backend fields for what it does not encode.
func TestRecordDecoderFastEntry(t *testing.T) {
	ready := vipdv1.BackendState_BACKEND_STATE_READY
	base := func() *vipdv1.Service {
		return &vipdv1.Service{
			Name: "ns/web", Owner: "ns", Vips: []string{"198.19.0.10", "fd00::10"},
			Ports: []*vipdv1.Port{
				{Name: "http", Protocol: vipdv1.Protocol_PROTOCOL_TCP, Port: 80, TargetPort: 8080},
				{Name: "dns", Protocol: vipdv1.Protocol_PROTOCOL_UDP, Port: 53},
			},
			Labels:          map[string]string{"app": "web", "tier": "front"},
			ExternalIps:     []string{"203.0.113.7"},
			LoadBalancerIps: []string{"203.0.113.8"},
			Backends: []*vipdv1.Backend{
				{Ip: "10.0.0.1"}, {Ip: "10.0.0.2", Weight: 3}, {Ip: "fd00::1", State: ready, Zone: "z1"},
				{Ip: "10.0.0.3", Ports: map[string]uint32{"http": 9090}, OnlyNamedPorts: true, NodeLocal: true},
			},
		}
	}
	normalized := func(mod func(*vipdv1.Service)) *vipdv1.Service {
		s := base()
		mod(s)
		if _, v := validation.ConvertService(s, "service"); len(v) > 0 {
			t.Fatal(v)
		}
		return s
	}
	var unknown []byte
	unknown = protowire.AppendTag(unknown, 99, protowire.VarintType)
	unknown = protowire.AppendVarint(unknown, 7)
	type recordCase struct {
		name string
		rec  []byte
		fast bool // fastEntry must take it
	}
	cases := []recordCase{
		{name: "normalized", rec: record(t, normalized(func(*vipdv1.Service) {}), 5, nil), fast: true},
		{name: "normalized, one backend", rec: record(t, normalized(func(s *vipdv1.Service) { s.Backends = s.Backends[:1] }), 1, nil), fast: true},
		{name: "normalized, no fields above backends", rec: record(t, normalized(func(s *vipdv1.Service) {
			s.Labels, s.ExternalIps, s.LoadBalancerIps = nil, nil, nil
		}), 2, nil), fast: true},
		{name: "not normalized", rec: record(t, base(), 3, nil)},
		{name: "unsorted backends", rec: record(t, normalized(func(s *vipdv1.Service) {
			s.Backends[0], s.Backends[1] = s.Backends[1], s.Backends[0]
		}), 3, nil)},
		{name: "mapped address", rec: record(t, normalized(func(s *vipdv1.Service) { s.Backends[0].Ip = "::ffff:10.0.0.9" }), 3, nil)},
		{name: "for_zones", rec: record(t, normalized(func(s *vipdv1.Service) { s.Backends[0].ForZones = []string{"z1"} }), 3, nil)},
		{name: "no backends", rec: record(t, normalized(func(s *vipdv1.Service) { s.Backends = nil }), 3, nil)},
		{name: "unknown service field", rec: record(t, normalized(func(*vipdv1.Service) {}), 4, unknown)},
	}
	// A backend with a field this vipd does not know.
	withUnknownBackend := record(t, normalized(func(*vipdv1.Service) {}), 6, nil)
	{
		var b []byte
		b = protowire.AppendTag(b, backendsField, protowire.BytesType)
		inner := protowire.AppendTag(protowire.AppendString(protowire.AppendTag(nil, backendIPField, protowire.BytesType), "10.0.0.99"), 42, protowire.VarintType)
		inner = protowire.AppendVarint(inner, 1)
		b = protowire.AppendBytes(b, inner)
		cases = append(cases, recordCase{name: "unknown backend field", rec: append(b, withUnknownBackend...)})
	}
	for i := range 50 {
		s := &vipdv1.Service{Name: fmt.Sprintf("bench/w%03d", i), Vips: []string{fmt.Sprintf("10.200.0.%d", i+1)},
			Ports: []*vipdv1.Port{{Protocol: vipdv1.Protocol_PROTOCOL_TCP, Port: 80}}}
		for j := range i % 13 {
			s.Backends = append(s.Backends, &vipdv1.Backend{Ip: fmt.Sprintf("11.0.%d.%d", i, j+1), Weight: uint32(j % 3)})
		}
		if _, v := validation.ConvertService(s, "service"); len(v) > 0 {
			t.Fatal(v)
		}
		cases = append(cases, recordCase{name: s.Name, rec: record(t, s, uint64(i+1), nil), fast: len(s.Backends) > 0})
	}
	var d recordDecoder // shared, as a decoding goroutine shares it
	for _, c := range cases {
		want, werr := slowDecode(c.rec)
		got, gerr := d.decode(c.rec)
		if (werr != nil) != (gerr != nil) {
			t.Fatalf("%s: error %v, want %v", c.name, gerr, werr)
		}
		if werr != nil {
			continue
		}
		if string(got.spec) != string(want.spec) || got.backendsAt != want.backendsAt || !reflect.DeepEqual(got.Dataplane, want.Dataplane) {
			t.Errorf("%s: decoded\n%+v (spec %x at %d)\nwant\n%+v (spec %x at %d)", c.name,
				got.Dataplane, got.spec, got.backendsAt, want.Dataplane, want.spec, want.backendsAt)
		}
		if fast := d.fastEntry(got.Dataplane, got.Generation()) != nil; c.fast && !fast {
			t.Errorf("%s: fastEntry did not take a record as today's vipd writes it", c.name)
		}
	}
}
