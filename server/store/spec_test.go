package store

import (
	"bytes"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/vipd/vipd/dataplane"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
)

// specCases are services whose backends use every field of vipd.v1.Backend.
func specCases() []*vipdv1.Service {
	many := &vipdv1.Service{Name: "many", Vips: []string{"198.19.0.9"}, Ports: []*vipdv1.Port{{Port: 80}}}
	for i := range 40 {
		many.Backends = append(many.Backends, &vipdv1.Backend{Ip: fmt.Sprintf("198.18.%d.%d", i, 255-i), Weight: uint32(i*1000 + 1)})
	}
	return []*vipdv1.Service{
		{Name: "none", Vips: []string{"198.19.0.1"}, Ports: []*vipdv1.Port{{Port: 80}}},
		{Name: "plain", Vips: []string{"198.19.0.2"}, Ports: []*vipdv1.Port{{Port: 80}},
			Backends: []*vipdv1.Backend{{Ip: "198.18.0.3"}, {Ip: "198.18.0.2"}}},
		{Name: "everything", Owner: "o", Vips: []string{"198.19.0.3", "fd00:198::3"},
			Ports: []*vipdv1.Port{{Name: "http", Port: 80, NodePort: 30080}, {Name: "dns", Protocol: vipdv1.Protocol_PROTOCOL_UDP, Port: 53, TargetPort: 5353}},
			Backends: []*vipdv1.Backend{
				{Ip: "198.18.0.4", Ports: map[string]uint32{"http": 8080, "dns": 65535}, State: vipdv1.BackendState_BACKEND_STATE_TERMINATING,
					Weight: 65535, NodeLocal: true, Zone: "zone-a", OnlyNamedPorts: true},
				{Ip: "fd00:198::4", State: vipdv1.BackendState_BACKEND_STATE_NOT_SERVING, Zone: "zone-b"},
				// A message of more than 127 bytes: a 2-byte length.
				{Ip: "fd00:198:ffff:ffff:ffff:ffff:ffff:fff4", Ports: map[string]uint32{"http": 8080, "dns": 5353}, Weight: 300,
					Zone: strings.Repeat("z", 63), NodeLocal: true, OnlyNamedPorts: true},
				{Ip: "198.18.0.5", Ports: map[string]uint32{"dns": 1}},
			},
			SessionAffinity: &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP},
			Labels:          map[string]string{"a": "b"},
			HealthCheck:     &vipdv1.HealthCheck{Protocol: vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_TCP},
			ExternalIps:     []string{"198.19.1.3"}, LoadBalancerIps: []string{"198.19.2.3"}, LoadBalancerSourceRanges: []string{"198.18.0.0/16"},
			ExternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL, HealthCheckNodePort: 30999},
		{Name: "unnamed", Vips: []string{"198.19.0.4"}, Ports: []*vipdv1.Port{{Port: 80}},
			Backends: []*vipdv1.Backend{{Ip: "198.18.0.6", Ports: map[string]uint32{"": 8080}}}},
		many,
	}
}

// TestEntryKeepsBackendsOnce checks that an entry keeps the backends only
// in dataplane form, and that everything read from it (the state file's
// record, Service, SameSpec, HealthCheck) is what it was given.
func TestEntryKeepsBackendsOnce(t *testing.T) {
	for _, in := range specCases() {
		t.Run(in.Name, func(t *testing.T) {
			svc, dp, v := validation.Service(in, validation.Limits{}, "service")
			if len(v) > 0 {
				t.Fatal(v)
			}
			want := proto.Clone(svc).(*vipdv1.Service)
			e, err := NewEntry(svc, dp, 7)
			if err != nil {
				t.Fatal(err)
			}
			// The record is the deterministic encoding without the
			// generation, then the generation.
			wantRec, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
			if err != nil {
				t.Fatal(err)
			}
			wantRec = protowire.AppendVarint(protowire.AppendTag(wantRec, generationField, protowire.VarintType), 7)
			want.Generation = 7
			if len(want.Backends) > 0 {
				if e.backendsAt < 0 {
					t.Errorf("the entry keeps its backends encoded too")
				}
				if got, whole := len(e.spec)+backendsSize(dp.Backends), len(wantRec)-2; got != whole {
					t.Errorf("kept spec + backends = %d bytes, the whole spec is %d", got, whole)
				}
			}
			if rec := e.appendEncoded(nil); !bytes.Equal(rec, wantRec) {
				t.Errorf("record differs from the deterministic encoding:\n got %x\nwant %x", rec, wantRec)
			}
			if n := e.encodedLen(); n != len(wantRec) {
				t.Errorf("encodedLen = %d, want %d", n, len(wantRec))
			}
			if d := cmp.Diff(want, e.Service(), protocmp.Transform()); d != "" {
				t.Errorf("Service() (-want +got):\n%s", d)
			}
			if !e.SameSpec(proto.Clone(want).(*vipdv1.Service)) {
				t.Error("SameSpec of the stored service is false")
			}
			if d := cmp.Diff(want.GetHealthCheck(), e.HealthCheck(), protocmp.Transform()); d != "" {
				t.Errorf("HealthCheck() (-want +got):\n%s", d)
			}
			same := func(svc *vipdv1.Service) (bool, bool) {
				t.Helper()
				svc.Generation = 0
				out, dp, v := validation.Service(svc, validation.Limits{}, "service")
				if len(v) > 0 {
					t.Fatal(v)
				}
				spec, err := NewSpec(out, dp)
				if err != nil {
					t.Fatal(err)
				}
				return e.SameSpec(out), e.SameEncodedSpec(spec)
			}
			if a, b := same(proto.Clone(want).(*vipdv1.Service)); !a || !b {
				t.Errorf("SameSpec, SameEncodedSpec of the stored service = %v, %v", a, b)
			}
			for i := range want.Backends {
				other := proto.Clone(want).(*vipdv1.Service)
				other.Backends[i].Weight = other.Backends[i].Weight%65535 + 1
				if a, b := same(other); a || b {
					t.Errorf("SameSpec, SameEncodedSpec with backends[%d].weight changed = %v, %v", i, a, b)
				}
			}
			other := proto.Clone(want).(*vipdv1.Service)
			other.Labels = map[string]string{"changed": "yes"}
			if a, b := same(other); a || b {
				t.Errorf("SameSpec, SameEncodedSpec with labels changed = %v, %v", a, b)
			}
		})
	}
}

// TestEntryKeepsSpecThatBackendsDoNotGiveBack checks that when the
// dataplane form does not give back the encoded backends (a field that
// only the API form has), the entry keeps the whole spec, unchanged.
func TestEntryKeepsSpecThatBackendsDoNotGiveBack(t *testing.T) {
	svc, dp, v := validation.Service(specCases()[2], validation.Limits{}, "service")
	if len(v) > 0 {
		t.Fatal(v)
	}
	spec, err := EncodeSpec(svc)
	if err != nil {
		t.Fatal(err)
	}
	bs := append([]dataplane.Backend(nil), dp.Backends...)
	bs[1].Zone = "not-in-the-spec"
	rest, at := slimSpec(spec, bs)
	if at >= 0 || !bytes.Equal(rest, spec) {
		t.Errorf("slimSpec cut backends that it cannot give back: at %d", at)
	}
	bs[1].Zone, bs[1].State = dp.Backends[1].Zone, 0
	if rest, at := slimSpec(spec, bs); at >= 0 || !bytes.Equal(rest, spec) {
		t.Errorf("slimSpec cut backends of an unknown state: at %d", at)
	}
	if _, at := slimSpec(spec, dp.Backends); at < 0 {
		t.Errorf("slimSpec kept backends it can give back")
	}
}

// TestStoredServiceNotMutated checks the contract that a stored service's
// dataplane form never changes: not by a later Put of the same service,
// by reading it, nor by changing what Service returned.
func TestStoredServiceNotMutated(t *testing.T) {
	svc, dp, v := validation.Service(specCases()[2], validation.Limits{}, "service")
	if len(v) > 0 {
		t.Fatal(v)
	}
	spec, err := NewSpec(svc, dp)
	if err != nil {
		t.Fatal(err)
	}
	tx := Empty().Begin()
	e, err := tx.PutSpec(spec, dp)
	if err != nil {
		t.Fatal(err)
	}
	snap := tx.Commit()
	before := cloneService(e.Dataplane)
	got := e.Service()
	got.Backends[0].Zone, got.Backends[0].Ports["http"] = "changed", 1
	got.Vips[0] = "198.19.9.9"
	if e.Dataplane != dp {
		t.Error("the store copied a service never stored before rather than keep it")
	}
	// A retried mutation puts the same service again: the store must
	// copy it rather than stamp the stored one with a new generation.
	tx = snap.Begin()
	again, err := tx.PutSpec(spec, dp)
	if err != nil {
		t.Fatal(err)
	}
	tx.Commit()
	if again.Dataplane == dp || again.Generation() == e.Generation() {
		t.Errorf("the second Put shares the stored service (generation %d, first %d)", again.Generation(), e.Generation())
	}
	e.appendEncoded(nil)
	e.SameSpec(got)
	if d := cmp.Diff(before, e.Dataplane, equateAddrs); d != "" {
		t.Errorf("stored service changed (-before +after):\n%s", d)
	}
	if d := cmp.Diff(before, mustGet(t, snap, "everything").Dataplane, equateAddrs); d != "" {
		t.Errorf("snapshot's service changed (-before +after):\n%s", d)
	}
}

func mustGet(t *testing.T, s *Snapshot, name string) *Entry {
	t.Helper()
	e, ok := s.Get(name)
	if !ok {
		t.Fatalf("%s is not stored", name)
	}
	return e
}

// cloneService is a deep copy of s.
func cloneService(s *dataplane.Service) *dataplane.Service {
	c := *s
	c.VIPs = append(c.VIPs[:0:0], s.VIPs...)
	c.Ports = append(c.Ports[:0:0], s.Ports...)
	c.Backends = append(c.Backends[:0:0], s.Backends...)
	for i, b := range c.Backends {
		if b.Ports != nil {
			c.Backends[i].Ports = map[string]uint16{}
			for k, v := range b.Ports {
				c.Backends[i].Ports[k] = v
			}
		}
	}
	c.ExternalIPs = append(c.ExternalIPs[:0:0], s.ExternalIPs...)
	c.LoadBalancerIPs = append(c.LoadBalancerIPs[:0:0], s.LoadBalancerIPs...)
	c.LoadBalancerSourceRanges = append(c.LoadBalancerSourceRanges[:0:0], s.LoadBalancerSourceRanges...)
	return &c
}

var equateAddrs = cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{})
