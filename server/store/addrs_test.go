package store_test

import (
	"errors"
	"net/netip"
	"testing"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/store"
)

// with returns a one-port service on vip with backends.
func with(name, vip string, backends ...string) *vipdv1.Service {
	s := &vipdv1.Service{Name: name, Vips: []string{vip}, Ports: []*vipdv1.Port{tcp(80)}}
	for _, b := range backends {
		s.Backends = append(s.Backends, &vipdv1.Backend{Ip: b})
	}
	return s
}

// addrConflict stages in on tx and returns the *AddressConflictError it
// must fail with, checking that it staged nothing.
func addrConflict(t *testing.T, tx *store.Txn, in *vipdv1.Service) *store.AddressConflictError {
	t.Helper()
	before, hadBefore := tx.Get(in.Name)
	_, err := tx.Put(normalize(t, in))
	var c *store.AddressConflictError
	if !errors.As(err, &c) {
		t.Fatalf("Put %s: %v; want an AddressConflictError", in.Name, err)
	}
	if after, has := tx.Get(in.Name); has != hadBefore || after != before {
		t.Fatalf("a refused Put %s staged a change", in.Name)
	}
	return c
}

func wantAddrConflict(t *testing.T, c *store.AddressConflictError, want store.AddressConflictError) {
	t.Helper()
	if *c != want {
		t.Fatalf("conflict %+v; want %+v", *c, want)
	}
}

// TestVIPIsNeverABackend: a Put fails with an *AddressConflictError, and
// stages nothing, when it would add a backend that is a VIP of any
// service, its own included, or a VIP that is a backend of any service;
// the index follows every Put, Delete, Sub and Commit.
func TestVIPIsNeverABackend(t *testing.T) {
	a := netip.MustParseAddr
	base := snapshot(t, with("web", "198.19.0.1", "198.18.1.1", "198.18.1.2"), with("db", "198.19.0.2", "198.18.2.1"))

	t.Run("a backend that is another service's VIP", func(t *testing.T) {
		c := addrConflict(t, base.Begin(), with("new", "198.19.0.3", "198.18.3.1", "198.19.0.2"))
		wantAddrConflict(t, c, store.AddressConflictError{Service: "new", Addr: a("198.19.0.2"), Role: store.RoleBackend, Holder: "db", HolderRole: store.RoleVIP})
	})
	t.Run("a backend added to a service that is another's VIP", func(t *testing.T) {
		c := addrConflict(t, base.Begin(), with("web", "198.19.0.1", "198.18.1.1", "198.19.0.2"))
		wantAddrConflict(t, c, store.AddressConflictError{Service: "web", Addr: a("198.19.0.2"), Role: store.RoleBackend, Holder: "db", HolderRole: store.RoleVIP})
	})
	t.Run("a VIP that is another service's backend", func(t *testing.T) {
		c := addrConflict(t, base.Begin(), with("new", "198.18.1.2"))
		wantAddrConflict(t, c, store.AddressConflictError{Service: "new", Addr: a("198.18.1.2"), Role: store.RoleVIP, Holder: "web", HolderRole: store.RoleBackend})
	})
	t.Run("a service's own VIP as its backend", func(t *testing.T) {
		c := addrConflict(t, base.Begin(), with("new", "198.19.0.3", "198.19.0.3"))
		wantAddrConflict(t, c, store.AddressConflictError{Service: "new", Addr: a("198.19.0.3"), Role: store.RoleBackend, Holder: "new", HolderRole: store.RoleVIP})
	})
	t.Run("a service's own backend as a new VIP", func(t *testing.T) {
		s := with("web", "198.19.0.1", "198.18.1.1", "198.18.1.2")
		s.Vips = append(s.Vips, "198.18.1.1")
		c := addrConflict(t, base.Begin(), s)
		wantAddrConflict(t, c, store.AddressConflictError{Service: "web", Addr: a("198.18.1.1"), Role: store.RoleVIP, Holder: "web", HolderRole: store.RoleBackend})
	})
	t.Run("a VIP taken in the same transaction", func(t *testing.T) {
		tx := base.Begin()
		put(t, tx, with("new", "198.19.0.3"))
		c := addrConflict(t, tx, with("other", "198.19.0.4", "198.19.0.3"))
		wantAddrConflict(t, c, store.AddressConflictError{Service: "other", Addr: a("198.19.0.3"), Role: store.RoleBackend, Holder: "new", HolderRole: store.RoleVIP})
	})
	t.Run("an address freed by a delete or a change", func(t *testing.T) {
		tx := base.Begin()
		tx.Delete("db")
		put(t, tx, with("web", "198.19.0.9", "198.18.1.1"))
		// db's VIP and web's old VIP and backend 198.18.1.2 are free now,
		// both ways round.
		put(t, tx, with("new", "198.18.1.2", "198.19.0.2", "198.19.0.1"))
		snap := tx.Commit()
		// The committed index, as a new transaction sees it.
		c := addrConflict(t, snap.Begin(), with("x", "198.19.0.7", "198.18.1.2"))
		wantAddrConflict(t, c, store.AddressConflictError{Service: "x", Addr: a("198.18.1.2"), Role: store.RoleBackend, Holder: "new", HolderRole: store.RoleVIP})
		c = addrConflict(t, snap.Begin(), with("x", "198.19.0.2"))
		wantAddrConflict(t, c, store.AddressConflictError{Service: "x", Addr: a("198.19.0.2"), Role: store.RoleVIP, Holder: "new", HolderRole: store.RoleBackend})
		put(t, snap.Begin(), with("x", "198.19.0.7", "198.18.1.9"))
		// The base did not change.
		addrConflict(t, base.Begin(), with("x", "198.19.0.7", "198.19.0.2"))
	})
	t.Run("a VIP and a backend swapped in one transaction, as SyncServices does", func(t *testing.T) {
		tx := base.Begin()
		tx.Delete("web")
		tx.Delete("db")
		put(t, tx, with("web", "198.18.2.1", "198.18.1.1"))
		put(t, tx, with("db", "198.19.0.2", "198.19.0.1"))
	})
	t.Run("a dropped Sub leaves no count behind, a merged one does", func(t *testing.T) {
		tx := base.Begin()
		sub := tx.Sub()
		put(t, sub, with("new", "198.19.0.3"))
		put(t, tx, with("other", "198.19.0.4", "198.19.0.3"))
		tx = base.Begin()
		sub = tx.Sub()
		put(t, sub, with("new", "198.19.0.3"))
		sub.Merge()
		c := addrConflict(t, tx, with("other", "198.19.0.4", "198.19.0.3"))
		wantAddrConflict(t, c, store.AddressConflictError{Service: "other", Addr: a("198.19.0.3"), Role: store.RoleBackend, Holder: "new", HolderRole: store.RoleVIP})
	})
	t.Run("an address moves between a service's roles", func(t *testing.T) {
		tx := base.Begin()
		put(t, tx, with("web", "198.19.0.9", "198.18.1.1", "198.19.0.1"))
		put(t, tx, with("db", "198.18.2.1", "198.18.2.2"))
		snap := tx.Commit()
		c := addrConflict(t, snap.Begin(), with("x", "198.19.0.1"))
		wantAddrConflict(t, c, store.AddressConflictError{Service: "x", Addr: a("198.19.0.1"), Role: store.RoleVIP, Holder: "web", HolderRole: store.RoleBackend})
		c = addrConflict(t, snap.Begin(), with("x", "198.19.0.7", "198.18.2.1"))
		wantAddrConflict(t, c, store.AddressConflictError{Service: "x", Addr: a("198.18.2.1"), Role: store.RoleBackend, Holder: "db", HolderRole: store.RoleVIP})
		put(t, snap.Begin(), with("x", "198.19.0.7", "198.19.0.1", "198.19.0.2"))
	})
	t.Run("a shared backend stays counted until its last service lets go", func(t *testing.T) {
		tx := base.Begin()
		put(t, tx, with("other", "198.19.0.4", "198.18.1.1"))
		tx.Delete("web")
		c := addrConflict(t, tx, with("x", "198.18.1.1"))
		wantAddrConflict(t, c, store.AddressConflictError{Service: "x", Addr: a("198.18.1.1"), Role: store.RoleVIP, Holder: "other", HolderRole: store.RoleBackend})
		tx.Delete("other")
		put(t, tx, with("x", "198.18.1.1"))
	})
}

// TestVIPAsBackendInAnOldState: a state stored before vipd refused a VIP
// as a backend loads, and its services may still change while they keep
// what they had, even deleted and stored again in one transaction as
// SyncServices does; but no service may join in on such an address.
func TestVIPAsBackendInAnOldState(t *testing.T) {
	var entries []*store.Entry
	for i, s := range []*vipdv1.Service{with("web", "198.19.0.1", "198.18.1.1"), with("loop", "198.19.0.2", "198.19.0.1", "198.18.1.5")} {
		out, dp := normalize(t, s)
		e, err := store.NewEntry(out, dp, uint64(i+1))
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, e)
	}
	old, err := store.Build(2, entries)
	if err != nil {
		t.Fatalf("an old state with a VIP as a backend does not load: %v", err)
	}

	tx := old.Begin()
	put(t, tx, with("loop", "198.19.0.2", "198.19.0.1", "198.18.1.6"))
	put(t, tx, with("web", "198.19.0.1", "198.18.1.2"))

	tx = old.Begin()
	tx.Delete("loop")
	tx.Delete("web")
	put(t, tx, with("web", "198.19.0.1"))
	put(t, tx, with("loop", "198.19.0.2", "198.19.0.1"))

	// A service that has its own VIP as a backend, stored again.
	self := with("self", "198.19.0.3", "198.19.0.3")
	out, dp := normalize(t, self)
	e, err := store.NewEntry(out, dp, 3)
	if err != nil {
		t.Fatal(err)
	}
	selfish, err := store.Build(3, append(entries, e))
	if err != nil {
		t.Fatal(err)
	}
	tx = selfish.Begin()
	tx.Delete("self")
	put(t, tx, with("self", "198.19.0.3", "198.19.0.3", "198.18.1.7"))
	snap := tx.Commit()
	// Both of its roles stay counted.
	other := with("y", "198.19.0.3")
	other.Ports[0] = tcp(81)
	c := addrConflict(t, snap.Begin(), other)
	wantAddrConflict(t, c, store.AddressConflictError{Service: "y", Addr: netip.MustParseAddr("198.19.0.3"), Role: store.RoleVIP, Holder: "self", HolderRole: store.RoleBackend})
	put(t, snap.Begin(), with("self", "198.19.0.4", "198.18.1.7"))
	c = addrConflict(t, snap.Begin(), with("x", "198.19.0.9", "198.19.0.3"))
	wantAddrConflict(t, c, store.AddressConflictError{Service: "x", Addr: netip.MustParseAddr("198.19.0.3"), Role: store.RoleBackend, Holder: "self", HolderRole: store.RoleVIP})
	tx = snap.Begin()
	tx.Delete("self")
	put(t, tx, with("x", "198.19.0.9", "198.19.0.3"))

	c = addrConflict(t, old.Begin(), with("x", "198.19.0.9", "198.19.0.1"))
	wantAddrConflict(t, c, store.AddressConflictError{Service: "x", Addr: netip.MustParseAddr("198.19.0.1"), Role: store.RoleBackend, Holder: "web", HolderRole: store.RoleVIP})
	// loop's 198.18.1.5 was no VIP in the old state: it may not become one,
	// even when loop is deleted and stored again in the same transaction.
	tx = old.Begin()
	tx.Delete("loop")
	put(t, tx, with("x", "198.18.1.5"))
	c = addrConflict(t, tx, with("loop", "198.19.0.2", "198.19.0.1", "198.18.1.5"))
	wantAddrConflict(t, c, store.AddressConflictError{Service: "loop", Addr: netip.MustParseAddr("198.18.1.5"), Role: store.RoleBackend, Holder: "x", HolderRole: store.RoleVIP})
}
