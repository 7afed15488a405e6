package store_test

import (
	"net/netip"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vipd/vipd/dataplane"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/store"
	"google.golang.org/protobuf/testing/protocmp"
)

// kubeShaped is a service as a Kubernetes adapter writes it: its only
// port unnamed, named "" in a backend's ports, and backends that serve
// only the ports they name (one of them none).
func kubeShaped(name, vip string) *vipdv1.Service {
	return &vipdv1.Service{
		Name:  name,
		Vips:  []string{vip},
		Ports: []*vipdv1.Port{{Port: 80, TargetPort: 8080}},
		Backends: []*vipdv1.Backend{
			{Ip: "10.0.0.1", Ports: map[string]uint32{"": 8081}, OnlyNamedPorts: true},
			{Ip: "10.0.0.2", OnlyNamedPorts: true},
			{Ip: "10.0.0.3"},
		},
	}
}

// TestBackendPortFieldsSurvive checks that a backend's only_named_ports and
// its "" port key are kept, in the API form (what GetService returns) and
// the dataplane form, by an entry, by the state file and by the journal.
func TestBackendPortFieldsSurvive(t *testing.T) {
	wantAPI := []*vipdv1.Backend{
		{Ip: "10.0.0.1", Ports: map[string]uint32{"": 8081}, OnlyNamedPorts: true, State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 1},
		{Ip: "10.0.0.2", OnlyNamedPorts: true, State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 1},
		{Ip: "10.0.0.3", State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 1},
	}
	a := netip.MustParseAddr
	wantDP := []dataplane.Backend{
		{IP: a("10.0.0.1"), Ports: map[string]uint16{"": 8081}, OnlyNamedPorts: true, State: dataplane.BackendReady, Weight: 1},
		{IP: a("10.0.0.2"), OnlyNamedPorts: true, State: dataplane.BackendReady, Weight: 1},
		{IP: a("10.0.0.3"), State: dataplane.BackendReady, Weight: 1},
	}
	check := func(t *testing.T, what string, s *store.Snapshot, name string) {
		t.Helper()
		e, ok := s.Get(name)
		if !ok {
			t.Fatalf("%s: no service %s", what, name)
		}
		if diff := cmp.Diff(wantAPI, e.Service().GetBackends(), protocmp.Transform()); diff != "" {
			t.Errorf("%s: %s's backends, API form (-want +got):\n%s", what, name, diff)
		}
		if diff := cmp.Diff(wantDP, e.Dataplane.Backends, addrCmp); diff != "" {
			t.Errorf("%s: %s's backends, dataplane form (-want +got):\n%s", what, name, diff)
		}
	}

	// started has saved a state file: the next change goes to the journal.
	d, s := started(t)
	tx := s.Begin()
	put(t, tx, kubeShaped("kube", "10.96.3.1"))
	s = tx.Commit()
	check(t, "entry", s, "kube")
	if err := d.Save(s); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(journalPath(d)); err != nil || fi.Size() == 0 {
		t.Fatalf("journal after a change: %v, %v; want it written", fi, err)
	}
	d = reopen(t, d)
	fromJournal, err := d.Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	check(t, "replayed from the journal", fromJournal, "kube")

	// The same in a whole state file.
	path := t.TempDir()
	d2, err := store.OpenDir(path)
	if err != nil {
		t.Fatal(err)
	}
	save(t, d2, s)
	d2.Close()
	d2, err = store.OpenDir(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	fromFile, err := d2.Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	check(t, "loaded from the state file", fromFile, "kube")
}
