package hcnodeport

import (
	"net/netip"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
)

func localSvc(port uint16, backends ...string) *dataplane.Service {
	svc := &dataplane.Service{
		Ports:                 []dataplane.Port{{Protocol: dataplane.TCP, Port: 80, TargetPort: 8080}},
		ExternalTrafficPolicy: dataplane.TrafficPolicyLocal, HealthCheckNodePort: port,
	}
	for _, b := range backends {
		svc.Backends = append(svc.Backends, dataplane.Backend{IP: netip.MustParseAddr(b), NodeLocal: true, State: dataplane.BackendReady})
	}
	return svc
}

// TestUpdateMergesChanges: states handed over faster than Run takes them
// are merged: the newest state, with every service any of them named as
// changed, so that following them costs what changed; a state without a
// change hint makes the next take a full one.
func TestUpdateMergesChanges(t *testing.T) {
	s := New(hclog.NewNullLogger(), "")
	full := &dataplane.State{Services: map[string]*dataplane.Service{
		"a": localSvc(30100, "198.18.1.10"), "b": localSvc(30101), "c": localSvc(30102, "198.18.1.11"),
	}}
	s.Update(full)
	s.follow(s.take())
	if len(s.wanted) != 3 || s.wanted["a"].answer.LocalEndpoints != 1 {
		t.Fatalf("after a full state: %+v", s.wanted)
	}

	// a gains a backend, then b goes; c changes too but is not named, as
	// if the dataplane had been told nothing about it: it is left alone,
	// which shows that only named services are looked at.
	one := &dataplane.State{Changed: []string{"a"}, Services: map[string]*dataplane.Service{
		"a": localSvc(30100, "198.18.1.10", "198.18.1.12"), "b": localSvc(30101), "c": localSvc(30102, "198.18.1.11"),
	}}
	two := &dataplane.State{Changed: []string{"b"}, Node: dataplane.Node{NodePortAddresses: []netip.Addr{netip.MustParseAddr("198.18.0.3")}},
		Services: map[string]*dataplane.Service{"a": one.Services["a"], "c": localSvc(30102)}}
	s.Update(one)
	s.Update(two)
	p := s.take()
	if p.full || p.names != 2 || len(p.changed) != 2 || p.st != two {
		t.Fatalf("merged pending: full %v, names %v, newest %v", p.full, p.changed, p.st == two)
	}
	s.follow(p)
	if len(s.wanted) != 2 || s.wanted["a"].answer.LocalEndpoints != 2 || s.wanted["c"].answer.LocalEndpoints != 1 {
		t.Errorf("after merged changes: %+v", s.wanted)
	}
	if _, ok := s.wanted["b"]; ok {
		t.Error("b is still followed after it went")
	}
	if len(s.node.NodePortAddresses) != 1 {
		t.Errorf("node %+v, want the newest state's", s.node)
	}

	// A full state in between makes the take full.
	s.Update(&dataplane.State{Changed: []string{"a"}, Services: one.Services})
	s.Update(&dataplane.State{Services: map[string]*dataplane.Service{"c": localSvc(30102)}})
	s.Update(&dataplane.State{Changed: []string{"x"}, Services: map[string]*dataplane.Service{"c": localSvc(30102)}})
	p = s.take()
	if !p.full {
		t.Fatal("a state without a change hint did not make the take full")
	}
	s.follow(p)
	if len(s.wanted) != 1 || s.wanted["c"].answer.LocalEndpoints != 0 {
		t.Errorf("after a full take: %+v", s.wanted)
	}
}

// TestUpdateFullWhenNamesOutnumberServices: changes pending that name more
// services than the newest state has make the take full, a walk of the
// state being cheaper than following them; Update keeps the Changed lists
// it merges and allocates nothing for their names.
func TestUpdateFullWhenNamesOutnumberServices(t *testing.T) {
	s := New(hclog.NewNullLogger(), "")
	s.take()
	svcs := map[string]*dataplane.Service{"a": localSvc(30100), "b": localSvc(30101)}
	changed := make([]string, 1000)
	for i := range changed {
		changed[i] = "a"
	}
	big := &dataplane.State{Changed: changed[:2], Services: svcs}
	if allocs := testing.AllocsPerRun(100, func() {
		s.Update(big)
		s.take()
	}); allocs > 1 {
		t.Errorf("Update of %d changed names allocates %.0f times, want at most 1 (the list of lists)", len(big.Changed), allocs)
	}
	s.Update(&dataplane.State{Changed: []string{"a"}, Services: svcs})
	s.Update(&dataplane.State{Changed: []string{"a"}, Services: svcs})
	if p := s.take(); p.full || p.names != 2 {
		t.Fatalf("two names of two services: full %v, %d names", p.full, p.names)
	}
	s.Update(&dataplane.State{Changed: []string{"a", "b"}, Services: svcs})
	s.Update(&dataplane.State{Changed: []string{"a"}, Services: svcs})
	p := s.take()
	if !p.full || p.changed != nil {
		t.Fatalf("three names of two services: full %v, changed %v", p.full, p.changed)
	}
	// One state alone may name more services than it has.
	s.Update(&dataplane.State{Changed: changed, Services: map[string]*dataplane.Service{}})
	if p := s.take(); !p.full {
		t.Error("1,000 names of no service did not make the take full")
	}
}
