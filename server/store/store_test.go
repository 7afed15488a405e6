package store_test

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vipd/vipd/dataplane"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/protobuf/proto"
)

var addrCmp = cmp.Options{
	cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
	cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }),
}

func tcp(port uint32) *vipdv1.Port {
	return &vipdv1.Port{Name: fmt.Sprintf("tcp-%d", port), Protocol: vipdv1.Protocol_PROTOCOL_TCP, Port: port}
}

func udp(port uint32) *vipdv1.Port {
	return &vipdv1.Port{Name: fmt.Sprintf("udp-%d", port), Protocol: vipdv1.Protocol_PROTOCOL_UDP, Port: port}
}

func sctp(port uint32) *vipdv1.Port {
	return &vipdv1.Port{Name: fmt.Sprintf("sctp-%d", port), Protocol: vipdv1.Protocol_PROTOCOL_SCTP, Port: port}
}

// svc returns an API service named name on vips (comma-separated) and ports,
// with n backends of the first VIP's family.
func svc(name, vips string, n int, ports ...*vipdv1.Port) *vipdv1.Service {
	s := &vipdv1.Service{Name: name, Vips: strings.Split(vips, ","), Ports: ports}
	for i := range n {
		ip := fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)
		if strings.Contains(s.Vips[0], ":") {
			ip = fmt.Sprintf("fd00::%x", i+1)
		}
		s.Backends = append(s.Backends, &vipdv1.Backend{Ip: ip})
	}
	return s
}

func owned(owner string, s *vipdv1.Service) *vipdv1.Service {
	s.Owner = owner
	return s
}

// normalize validates in as the server does, and fails the test if it is invalid.
func normalize(t testing.TB, in *vipdv1.Service) (*vipdv1.Service, *dataplane.Service) {
	t.Helper()
	out, dp, v := validation.Service(in, validation.Limits{}, "service")
	if len(v) > 0 {
		t.Fatalf("service %s does not validate: %v", in.Name, v)
	}
	return out, dp
}

// put stages in and fails the test on error.
func put(t testing.TB, tx *store.Txn, in *vipdv1.Service) *store.Entry {
	t.Helper()
	e, err := tx.Put(normalize(t, in))
	if err != nil {
		t.Fatalf("Put %s: %v", in.Name, err)
	}
	return e
}

// snapshot commits services (in order) on an empty store.
func snapshot(t testing.TB, svcs ...*vipdv1.Service) *store.Snapshot {
	t.Helper()
	tx := store.Empty().Begin()
	for _, s := range svcs {
		put(t, tx, s)
	}
	return tx.Commit()
}

func names(entries []*store.Entry) []string {
	var res []string
	for _, e := range entries {
		res = append(res, e.Service().Name)
	}
	return res
}

func TestTxnVisibility(t *testing.T) {
	base := store.Empty()
	tx := base.Begin()
	if got := tx.NextGeneration(); got != 1 {
		t.Errorf("NextGeneration on an empty store = %d, want 1", got)
	}
	e := put(t, tx, svc("a", "10.96.0.1", 2, tcp(80)))
	if e.Service().Generation != 1 || e.Dataplane.Generation != 1 {
		t.Errorf("first Put got generations %d/%d, want 1/1", e.Service().Generation, e.Dataplane.Generation)
	}
	if got, ok := tx.Get("a"); !ok || got != e {
		t.Errorf("Txn.Get(a) = %v, %v; want the staged entry", got, ok)
	}
	if _, ok := tx.Get("b"); ok {
		t.Error("Txn.Get(b) found a service that was never put")
	}
	if _, ok := base.Get("a"); ok {
		t.Error("a staged Put is visible in the base snapshot")
	}

	snap := tx.Commit()
	if got, ok := snap.Get("a"); !ok || got != e {
		t.Errorf("Snapshot.Get(a) = %v, %v; want the committed entry", got, ok)
	}
	if snap.Len() != 1 || snap.Revision() != 1 || snap.BackendCount() != 2 {
		t.Errorf("committed snapshot: Len %d Revision %d BackendCount %d, want 1 1 2", snap.Len(), snap.Revision(), snap.BackendCount())
	}
	if base.Len() != 0 || base.Revision() != 0 || base.BackendCount() != 0 {
		t.Errorf("base after Commit: Len %d Revision %d BackendCount %d, want all 0", base.Len(), base.Revision(), base.BackendCount())
	}

	tx = snap.Begin()
	if tx.Delete("nope") {
		t.Error("Delete of an unknown service reported true")
	}
	if got := tx.NextGeneration(); got != 2 {
		t.Errorf("Delete of an unknown service changed NextGeneration to %d", got)
	}
	if !tx.Delete("a") {
		t.Error("Delete(a) reported false")
	}
	if _, ok := tx.Get("a"); ok {
		t.Error("Txn.Get(a) found a deleted service")
	}
	if tx.Delete("a") {
		t.Error("second Delete(a) reported true")
	}
	if _, ok := snap.Get("a"); !ok {
		t.Error("a staged Delete is visible in the base snapshot")
	}
	if got := tx.NextGeneration(); got != 3 {
		t.Errorf("NextGeneration after Delete = %d, want 3: Delete bumps the revision", got)
	}
	empty := tx.Commit()
	if empty.Len() != 0 || empty.Revision() != 2 || empty.BackendCount() != 0 {
		t.Errorf("after Delete: Len %d Revision %d BackendCount %d, want 0 2 0", empty.Len(), empty.Revision(), empty.BackendCount())
	}
}

func TestGenerations(t *testing.T) {
	snap := store.Empty()
	var gens []uint64 // the generations service a got, in order
	step := func(f func(tx *store.Txn)) {
		t.Helper()
		tx := snap.Begin()
		f(tx)
		snap = tx.Commit()
	}
	putA := func(tx *store.Txn) {
		t.Helper()
		want := tx.NextGeneration()
		e := put(t, tx, svc("a", "10.96.0.1", 1, tcp(80)))
		if e.Service().Generation != want || e.Dataplane.Generation != want {
			t.Errorf("Put got generations %d/%d, want NextGeneration %d", e.Service().Generation, e.Dataplane.Generation, want)
		}
		gens = append(gens, want)
	}
	step(putA)
	step(func(tx *store.Txn) { put(t, tx, svc("b", "10.96.0.2", 1, tcp(80))) })
	step(putA)
	step(func(tx *store.Txn) { tx.Delete("a") })
	step(putA)
	step(func(tx *store.Txn) {
		tx.Delete("a")
		putA(tx)
		tx.Delete("a")
	})
	step(putA)
	step(func(tx *store.Txn) {
		// Neither a failed Put nor a Delete of nothing uses a generation.
		if _, err := tx.Put(normalize(t, svc("c", "10.96.0.1", 1, tcp(80)))); err == nil {
			t.Error("conflicting Put succeeded")
		}
		tx.Delete("nope")
	})
	if diff := cmp.Diff([]uint64{1, 3, 5, 7, 9}, gens); diff != "" {
		t.Errorf("generations of a (-want +got):\n%s", diff)
	}
	if got := snap.Revision(); got != 9 {
		t.Errorf("revision %d, want 9", got)
	}
	if e, _ := snap.Get("a"); e.Service().Generation != 9 {
		t.Errorf("stored generation of a is %d, want 9", e.Service().Generation)
	}
}

func TestNewEntry(t *testing.T) {
	s, dp := normalize(t, svc("a", "10.96.0.1", 1, tcp(80)))
	e, err := store.NewEntry(s, dp, 42)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(e.Service(), s) || e.Dataplane != dp || s.Generation != 42 || dp.Generation != 42 || e.Generation() != 42 {
		t.Errorf("NewEntry did not stamp and keep the given values: %v", e)
	}
	if e.Service() == e.Service() {
		t.Error("Service returned the same message twice; each caller must own its copy")
	}
	if e.Name() != "a" || e.Owner() != s.Owner {
		t.Errorf("Name %q Owner %q, want a and %q", e.Name(), e.Owner(), s.Owner)
	}
}

func TestCommitLeavesBaseUntouched(t *testing.T) {
	base := snapshot(t,
		svc("a", "10.96.0.1", 2, tcp(80)),
		svc("b", "10.96.0.2", 1, tcp(80)),
	)
	a, _ := base.Get("a")
	b, _ := base.Get("b")
	bSpec := proto.Clone(b.Service())
	stateBefore := plainState(base.DataplaneState(nil))

	tx := base.Begin()
	tx.Delete("a")
	put(t, tx, svc("c", "10.96.0.1", 4, tcp(80))) // takes a's claim
	put(t, tx, svc("b", "10.96.0.2", 3, tcp(80), tcp(443)))
	next := tx.Commit()
	again := tx.Commit()

	for _, s := range []*store.Snapshot{next, again} {
		if got := names(s.List("")); !slices.Equal(got, []string{"b", "c"}) {
			t.Errorf("committed services %v, want [b c]", got)
		}
		if s.Revision() != 5 || s.BackendCount() != 7 {
			t.Errorf("committed Revision %d BackendCount %d, want 5 7", s.Revision(), s.BackendCount())
		}
	}

	if got := names(base.List("")); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("base services %v, want [a b]", got)
	}
	if e, _ := base.Get("a"); e != a {
		t.Error("base entry a changed")
	}
	if e, _ := base.Get("b"); e != b || !proto.Equal(b.Service(), bSpec) {
		t.Error("base entry b changed")
	}
	if base.Revision() != 2 || base.BackendCount() != 3 || base.Len() != 2 {
		t.Errorf("base Revision %d BackendCount %d Len %d, want 2 3 2", base.Revision(), base.BackendCount(), base.Len())
	}
	if diff := cmp.Diff(stateBefore, plainState(base.DataplaneState(nil)), addrCmp); diff != "" {
		t.Errorf("base dataplane state changed (-before +after):\n%s", diff)
	}
	// The base's claims are its own: a still holds 10.96.0.1:80 there, and 443 is free.
	_, err := base.Begin().Put(normalize(t, svc("x", "10.96.0.1", 0, tcp(80))))
	if ce := conflict(t, err); ce.Holder != "a" {
		t.Errorf("conflict in base names holder %s, want a", ce.Holder)
	}
	if _, err := base.Begin().Put(normalize(t, svc("x", "10.96.0.2", 0, tcp(443)))); err != nil {
		t.Errorf("a claim staged on top of base leaked into it: %v", err)
	}
}

func TestCommitNothing(t *testing.T) {
	base := snapshot(t, svc("a", "10.96.0.1", 1, tcp(80)))
	tx := base.Begin()
	tx.Delete("nope")
	if got := tx.Commit(); got != base {
		t.Error("Commit of an empty Txn made a new snapshot")
	}
	if got := tx.Changed(); len(got) != 0 {
		t.Errorf("Changed() = %v, want none", got)
	}
}

func TestChanged(t *testing.T) {
	base := snapshot(t, svc("a", "10.96.0.1", 1, tcp(80)), svc("b", "10.96.0.2", 1, tcp(80)))
	tx := base.Begin()
	put(t, tx, svc("z", "10.96.0.3", 1, tcp(80)))
	tx.Delete("b")
	if _, err := tx.Put(normalize(t, svc("c", "10.96.0.1", 1, tcp(80)))); err == nil {
		t.Fatal("conflicting Put succeeded")
	}
	sub := tx.Sub()
	put(t, sub, svc("y", "10.96.0.4", 1, tcp(80)))
	sub.Merge()
	dropped := tx.Sub()
	put(t, dropped, svc("x", "10.96.0.5", 1, tcp(80)))
	if diff := cmp.Diff([]string{"b", "y", "z"}, tx.Changed()); diff != "" {
		t.Errorf("Changed (-want +got):\n%s", diff)
	}
}

// conflict returns err as a *ConflictError, failing the test if it is not one.
func conflict(t testing.TB, err error) *store.ConflictError {
	t.Helper()
	var ce *store.ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("got error %v, want a *store.ConflictError", err)
	}
	return ce
}

func TestSubDropped(t *testing.T) {
	base := snapshot(t, svc("a", "10.96.0.1", 1, tcp(80)))
	tx := base.Begin()
	put(t, tx, svc("b", "10.96.0.2", 1, tcp(80)))
	gen := tx.NextGeneration()

	sub := tx.Sub()
	if _, ok := sub.Get("b"); !ok {
		t.Fatal("Sub does not see its parent's staged Put")
	}
	if _, ok := sub.Get("a"); !ok {
		t.Fatal("Sub does not see the base")
	}
	sub.Delete("a")
	sub.Delete("b")
	put(t, sub, svc("c", "10.96.0.1", 1, tcp(80))) // a's claim, free in sub
	put(t, sub, svc("d", "10.96.0.3", 1, tcp(80)))
	// sub is dropped: nothing of it may show in tx.

	for _, name := range []string{"a", "b"} {
		if _, ok := tx.Get(name); !ok {
			t.Errorf("a dropped Sub's Delete(%s) is visible in the parent", name)
		}
	}
	for _, name := range []string{"c", "d"} {
		if _, ok := tx.Get(name); ok {
			t.Errorf("a dropped Sub's Put(%s) is visible in the parent", name)
		}
	}
	if got := tx.NextGeneration(); got != gen {
		t.Errorf("parent NextGeneration %d after a dropped Sub, want %d", got, gen)
	}
	if diff := cmp.Diff([]string{"b"}, tx.Changed()); diff != "" {
		t.Errorf("parent Changed (-want +got):\n%s", diff)
	}
	// The dropped Sub's claims hold nothing, and the ones it released still hold.
	put(t, tx, svc("e", "10.96.0.3", 1, tcp(80)))
	_, err := tx.Put(normalize(t, svc("f", "10.96.0.1", 1, tcp(80))))
	if ce := conflict(t, err); ce.Holder != "a" {
		t.Errorf("conflict names holder %s, want a", ce.Holder)
	}
	snap := tx.Commit()
	if got := names(snap.List("")); !slices.Equal(got, []string{"a", "b", "e"}) {
		t.Errorf("committed %v, want [a b e]", got)
	}
	if snap.BackendCount() != 3 {
		t.Errorf("BackendCount %d, want 3", snap.BackendCount())
	}
}

func TestSubFailedStep(t *testing.T) {
	base := snapshot(t, svc("a", "10.96.0.1", 1, tcp(80)))
	tx := base.Begin()
	gen := tx.NextGeneration()
	sub := tx.Sub()
	sub.Delete("a")
	put(t, sub, svc("b", "10.96.0.2", 1, tcp(80)))
	if _, err := sub.Put(normalize(t, svc("c", "10.96.0.2", 1, tcp(80)))); err == nil {
		t.Fatal("conflicting Put in a Sub succeeded")
	}
	// The step failed; its Sub is dropped, and the parent commits nothing.
	if got := tx.NextGeneration(); got != gen {
		t.Errorf("NextGeneration %d, want %d", got, gen)
	}
	if got := tx.Commit(); got != base {
		t.Error("Commit after a dropped Sub made a new snapshot")
	}
}

func TestSubMerged(t *testing.T) {
	base := snapshot(t, svc("a", "10.96.0.1", 2, tcp(80)))
	tx := base.Begin()
	put(t, tx, svc("b", "10.96.0.2", 1, tcp(80)))

	sub := tx.Sub()
	sub.Delete("a")
	sub.Delete("b")
	c := put(t, sub, svc("c", "10.96.0.1", 3, tcp(80))) // a's claim
	if got := tx.NextGeneration(); got != 3 {
		t.Errorf("parent NextGeneration %d before Merge, want 3", got)
	}
	sub.Merge()

	for _, name := range []string{"a", "b"} {
		if _, ok := tx.Get(name); ok {
			t.Errorf("merged Delete(%s) is not visible in the parent", name)
		}
	}
	if e, ok := tx.Get("c"); !ok || e != c {
		t.Error("merged Put(c) is not visible in the parent")
	}
	if got := tx.NextGeneration(); got != 6 {
		t.Errorf("parent NextGeneration %d after Merge, want 6", got)
	}
	_, err := tx.Put(normalize(t, svc("x", "10.96.0.1", 0, tcp(80))))
	if ce := conflict(t, err); ce.Holder != "c" {
		t.Errorf("conflict names holder %s, want c", ce.Holder)
	}
	put(t, tx, svc("b", "10.96.0.2", 1, tcp(80))) // b's claim was released by the merged Delete

	snap := tx.Commit()
	if got := names(snap.List("")); !slices.Equal(got, []string{"b", "c"}) {
		t.Errorf("committed %v, want [b c]", got)
	}
	if snap.Revision() != 6 || snap.BackendCount() != 4 {
		t.Errorf("Revision %d BackendCount %d, want 6 4", snap.Revision(), snap.BackendCount())
	}
	_, err = snap.Begin().Put(normalize(t, svc("x", "10.96.0.1", 0, tcp(80))))
	if ce := conflict(t, err); ce.Holder != "c" {
		t.Errorf("after Commit the conflict names holder %s, want c", ce.Holder)
	}
}

func TestSubNested(t *testing.T) {
	base := snapshot(t, svc("a", "10.96.0.1", 1, tcp(80)))
	tx := base.Begin()
	s1 := tx.Sub()
	put(t, s1, svc("b", "10.96.0.2", 1, tcp(80)))
	s2 := s1.Sub()
	if _, ok := s2.Get("b"); !ok {
		t.Fatal("a nested Sub does not see its parent")
	}
	s2.Delete("a")
	_, err := s2.Put(normalize(t, svc("c", "10.96.0.2", 1, tcp(80))))
	if ce := conflict(t, err); ce.Holder != "b" {
		t.Errorf("nested conflict names holder %s, want b", ce.Holder)
	}
	put(t, s2, svc("c", "10.96.0.1", 1, tcp(80)))
	if got := s2.Names(""); len(got) != 0 {
		t.Errorf("Names(\"\") = %v", got)
	}
	if diff := cmp.Diff([]string{"b", "c"}, s2.Names("default")); diff != "" {
		t.Errorf("nested Names (-want +got):\n%s", diff)
	}
	s2.Merge()
	if _, ok := s1.Get("a"); ok {
		t.Error("merged nested Delete is not visible")
	}
	if _, ok := tx.Get("c"); ok {
		t.Error("nested Merge reached the grandparent")
	}
	s1.Merge()
	snap := tx.Commit()
	if got := names(snap.List("")); !slices.Equal(got, []string{"b", "c"}) {
		t.Errorf("committed %v, want [b c]", got)
	}
	if snap.Revision() != 4 {
		t.Errorf("Revision %d, want 4", snap.Revision())
	}
}

func TestClaims(t *testing.T) {
	vip := netip.MustParseAddr("10.96.0.1")
	tests := []struct {
		name          string
		holder, other *vipdv1.Service
		want          *store.ConflictError // nil: no conflict
	}{
		{
			name:   "same VIP, port and protocol",
			holder: svc("a", "10.96.0.1", 1, tcp(80)),
			other:  svc("b", "10.96.0.1", 1, tcp(80)),
			want:   &store.ConflictError{Service: "b", Holder: "a", Claim: store.Claim{VIP: vip, Protocol: dataplane.TCP, Port: 80}},
		},
		{
			name:   "TCP by default",
			holder: svc("a", "10.96.0.1", 1, tcp(80)),
			other:  svc("b", "10.96.0.1", 1, &vipdv1.Port{Port: 80}),
			want:   &store.ConflictError{Service: "b", Holder: "a", Claim: store.Claim{VIP: vip, Protocol: dataplane.TCP, Port: 80}},
		},
		{
			name:   "one of several ports",
			holder: svc("a", "10.96.0.1", 1, tcp(80), sctp(3868)),
			other:  svc("b", "10.96.0.1", 1, udp(3868), sctp(3868)),
			want:   &store.ConflictError{Service: "b", Holder: "a", Claim: store.Claim{VIP: vip, Protocol: dataplane.SCTP, Port: 3868}},
		},
		{
			name:   "one of several VIPs, IPv6",
			holder: svc("a", "10.96.0.1,fd00:96::1", 1, tcp(80)),
			other:  svc("b", "10.96.0.2,FD00:96::0001", 1, tcp(80)),
			want:   &store.ConflictError{Service: "b", Holder: "a", Claim: store.Claim{VIP: netip.MustParseAddr("fd00:96::1"), Protocol: dataplane.TCP, Port: 80}},
		},
		{
			name:   "same VIP, another port",
			holder: svc("a", "10.96.0.1", 1, tcp(80)),
			other:  svc("b", "10.96.0.1", 1, tcp(81)),
		},
		{
			name:   "same VIP and port, UDP",
			holder: svc("a", "10.96.0.1", 1, tcp(53)),
			other:  svc("b", "10.96.0.1", 1, udp(53)),
		},
		{
			name:   "same VIP and port, SCTP",
			holder: svc("a", "10.96.0.1", 1, tcp(53), udp(53)),
			other:  svc("b", "10.96.0.1", 1, sctp(53)),
		},
		{
			name:   "another VIP, same port",
			holder: svc("a", "10.96.0.1", 1, tcp(80)),
			other:  svc("b", "10.96.0.2", 1, tcp(80)),
		},
		{
			name:   "same claims, same service",
			holder: svc("a", "10.96.0.1", 1, tcp(80)),
			other:  svc("a", "10.96.0.1", 3, tcp(80), tcp(443)),
		},
	}
	// The holder may be committed, staged in the same Txn, or staged in the
	// parent of the Txn the other service is put in.
	layouts := map[string]func(t *testing.T, holder *vipdv1.Service) *store.Txn{
		"committed": func(t *testing.T, holder *vipdv1.Service) *store.Txn {
			return snapshot(t, holder).Begin()
		},
		"staged": func(t *testing.T, holder *vipdv1.Service) *store.Txn {
			tx := store.Empty().Begin()
			put(t, tx, holder)
			return tx
		},
		"staged in parent": func(t *testing.T, holder *vipdv1.Service) *store.Txn {
			tx := store.Empty().Begin()
			put(t, tx, holder)
			return tx.Sub()
		},
	}
	for _, tt := range tests {
		for layout, setup := range layouts {
			t.Run(tt.name+"/"+layout, func(t *testing.T) {
				tx := setup(t, proto.Clone(tt.holder).(*vipdv1.Service))
				gen := tx.NextGeneration()
				before, hadBefore := tx.Get(tt.other.Name)
				e, err := tx.Put(normalize(t, proto.Clone(tt.other).(*vipdv1.Service)))
				if tt.want == nil {
					if err != nil {
						t.Fatalf("Put: %v", err)
					}
					if got, _ := tx.Get(tt.other.Name); got != e {
						t.Error("Put entry is not visible")
					}
					return
				}
				if e != nil {
					t.Errorf("conflicting Put returned an entry: %v", e)
				}
				ce := conflict(t, err)
				if diff := cmp.Diff(tt.want, ce, addrCmp); diff != "" {
					t.Errorf("ConflictError (-want +got):\n%s", diff)
				}
				for _, s := range []string{tt.want.Service, tt.want.Holder, tt.want.Claim.String()} {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not mention %s", err, s)
					}
				}
				// Nothing was staged.
				if tx.NextGeneration() != gen {
					t.Errorf("failed Put changed NextGeneration to %d, want %d", tx.NextGeneration(), gen)
				}
				if after, has := tx.Get(tt.other.Name); has != hadBefore || after != before {
					t.Error("failed Put changed the stored service")
				}
				if slices.Contains(tx.Changed(), tt.other.Name) {
					t.Error("failed Put shows in Changed")
				}
			})
		}
	}
}

func TestClaimString(t *testing.T) {
	tests := []struct {
		c    store.Claim
		want string
	}{
		{store.Claim{VIP: netip.MustParseAddr("10.96.0.1"), Protocol: dataplane.TCP, Port: 80}, "10.96.0.1:80/TCP"},
		{store.Claim{VIP: netip.MustParseAddr("fd00::1"), Protocol: dataplane.SCTP, Port: 3868}, "[fd00::1]:3868/SCTP"},
	}
	for _, tt := range tests {
		if got := tt.c.String(); got != tt.want {
			t.Errorf("String() = %q, want %q", got, tt.want)
		}
	}
}

func TestClaimMovesWithService(t *testing.T) {
	base := snapshot(t, svc("a", "10.96.0.1", 1, tcp(80), tcp(443)))
	tx := base.Begin()
	put(t, tx, svc("a", "10.96.0.1", 1, tcp(81), tcp(443))) // a lets go of :80
	put(t, tx, svc("b", "10.96.0.1", 1, tcp(80)))
	_, err := tx.Put(normalize(t, svc("c", "10.96.0.1", 1, tcp(443))))
	if ce := conflict(t, err); ce.Holder != "a" {
		t.Errorf("conflict names holder %s, want a", ce.Holder)
	}
	_, err = tx.Put(normalize(t, svc("a", "10.96.0.1", 1, tcp(80))))
	if ce := conflict(t, err); ce.Holder != "b" || ce.Service != "a" {
		t.Errorf("conflict %v, want a blocked by b", ce)
	}
	snap := tx.Commit()
	for port, holder := range map[uint32]string{80: "b", 81: "a", 443: "a"} {
		_, err := snap.Begin().Put(normalize(t, svc("x", "10.96.0.1", 0, tcp(port))))
		if ce := conflict(t, err); ce.Holder != holder {
			t.Errorf("port %d is held by %s, want %s", port, ce.Holder, holder)
		}
	}
}

func TestClaimFreedByDelete(t *testing.T) {
	base := snapshot(t, svc("a", "10.96.0.1", 1, tcp(80)))

	t.Run("same txn", func(t *testing.T) {
		tx := base.Begin()
		tx.Delete("a")
		put(t, tx, svc("b", "10.96.0.1", 1, tcp(80)))
		snap := tx.Commit()
		_, err := snap.Begin().Put(normalize(t, svc("a", "10.96.0.1", 1, tcp(80))))
		if ce := conflict(t, err); ce.Holder != "b" {
			t.Errorf("conflict names holder %s, want b", ce.Holder)
		}
	})
	t.Run("next txn", func(t *testing.T) {
		tx := base.Begin()
		tx.Delete("a")
		snap := tx.Commit()
		put(t, snap.Begin(), svc("b", "10.96.0.1", 1, tcp(80)))
	})
	t.Run("delete and re-create", func(t *testing.T) {
		tx := base.Begin()
		tx.Delete("a")
		put(t, tx, svc("a", "10.96.0.1", 1, tcp(80)))
		_, err := tx.Put(normalize(t, svc("b", "10.96.0.1", 1, tcp(80))))
		if ce := conflict(t, err); ce.Holder != "a" {
			t.Errorf("conflict names holder %s, want a", ce.Holder)
		}
	})
	t.Run("swap", func(t *testing.T) {
		// SyncServices deletes every changing service before it puts any, so
		// that two services may swap VIPs in one call.
		base := snapshot(t, svc("a", "10.96.0.1", 1, tcp(80)), svc("b", "10.96.0.2", 1, tcp(80)))
		tx := base.Begin()
		tx.Delete("a")
		tx.Delete("b")
		put(t, tx, svc("a", "10.96.0.2", 1, tcp(80)))
		put(t, tx, svc("b", "10.96.0.1", 1, tcp(80)))
		snap := tx.Commit()
		for vip, holder := range map[string]string{"10.96.0.1": "b", "10.96.0.2": "a"} {
			_, err := snap.Begin().Put(normalize(t, svc("x", vip, 0, tcp(80))))
			if ce := conflict(t, err); ce.Holder != holder {
				t.Errorf("%s is held by %s, want %s", vip, ce.Holder, holder)
			}
		}
	})
}

func TestNames(t *testing.T) {
	base := snapshot(t,
		owned("o1", svc("a", "10.96.0.1", 1, tcp(80))),
		owned("o2", svc("b", "10.96.0.2", 1, tcp(80))),
		owned("o1", svc("c", "10.96.0.3", 1, tcp(80))),
		svc("z", "10.96.0.26", 1, tcp(80)),
	)
	tx := base.Begin()
	put(t, tx, owned("o1", svc("d", "10.96.0.4", 1, tcp(80))))
	tx.Delete("c")
	sub := tx.Sub()
	put(t, sub, owned("o1", svc("e", "10.96.0.5", 1, tcp(80))))
	sub.Delete("a")
	put(t, sub, owned("o1", svc("b", "10.96.0.2", 1, tcp(80)))) // b changes owner
	put(t, sub, owned("o2", svc("d", "10.96.0.4", 1, tcp(80)))) // and so does d

	tests := []struct {
		txn   string
		tx    *store.Txn
		owner string
		want  []string
	}{
		{"base", base.Begin(), "o1", []string{"a", "c"}},
		{"base", base.Begin(), "o2", []string{"b"}},
		{"base", base.Begin(), "default", []string{"z"}},
		{"parent", tx, "o1", []string{"a", "d"}},
		{"parent", tx, "o2", []string{"b"}},
		{"sub", sub, "o1", []string{"b", "e"}},
		{"sub", sub, "o2", []string{"d"}},
		{"sub", sub, "o3", nil},
		{"sub", sub, "", nil},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, tt.tx.Names(tt.owner)); diff != "" {
			t.Errorf("%s Names(%q) (-want +got):\n%s", tt.txn, tt.owner, diff)
		}
	}
}

func TestList(t *testing.T) {
	snap := snapshot(t,
		owned("o1", svc("c", "10.96.0.3", 1, tcp(80))),
		owned("o2", svc("b", "10.96.0.2", 1, tcp(80))),
		owned("o1", svc("a", "10.96.0.1", 1, tcp(80))),
	)
	for owner, want := range map[string][]string{"": {"a", "b", "c"}, "o1": {"a", "c"}, "o2": {"b"}, "o3": nil} {
		if diff := cmp.Diff(want, names(snap.List(owner))); diff != "" {
			t.Errorf("List(%q) (-want +got):\n%s", owner, diff)
		}
	}
}

func TestBackendCount(t *testing.T) {
	snap := store.Empty()
	steps := []struct {
		name string
		do   func(tx *store.Txn)
		want int
	}{
		{"put a and b", func(tx *store.Txn) {
			put(t, tx, svc("a", "10.96.0.1", 3, tcp(80)))
			put(t, tx, svc("b", "10.96.0.2", 2, tcp(80)))
		}, 5},
		{"replace a", func(tx *store.Txn) { put(t, tx, svc("a", "10.96.0.1", 1, tcp(80))) }, 3},
		{"replace a twice", func(tx *store.Txn) {
			put(t, tx, svc("a", "10.96.0.1", 7, tcp(80)))
			put(t, tx, svc("a", "10.96.0.1", 4, tcp(80)))
		}, 6},
		{"delete b", func(tx *store.Txn) { tx.Delete("b") }, 4},
		{"put and delete c", func(tx *store.Txn) {
			put(t, tx, svc("c", "10.96.0.3", 9, tcp(80)))
			tx.Delete("c")
		}, 4},
		{"delete and re-create a", func(tx *store.Txn) {
			tx.Delete("a")
			put(t, tx, svc("a", "10.96.0.1", 2, tcp(80)))
		}, 2},
		{"through a Sub", func(tx *store.Txn) {
			sub := tx.Sub()
			put(t, sub, svc("d", "10.96.0.4", 10, tcp(80)))
			sub.Delete("a")
			sub.Merge()
			dropped := tx.Sub()
			put(t, dropped, svc("e", "10.96.0.5", 100, tcp(80)))
		}, 10},
		{"no backends", func(tx *store.Txn) { put(t, tx, svc("d", "10.96.0.4", 0, tcp(80))) }, 0},
	}
	for _, step := range steps {
		prev := snap
		prevCount := prev.BackendCount()
		tx := snap.Begin()
		step.do(tx)
		snap = tx.Commit()
		if got := snap.BackendCount(); got != step.want {
			t.Errorf("%s: BackendCount %d, want %d", step.name, got, step.want)
		}
		if got := snap.DataplaneState(nil).BackendCount(); got != step.want {
			t.Errorf("%s: the dataplane state has %d backends, want %d", step.name, got, step.want)
		}
		if prev.BackendCount() != prevCount {
			t.Errorf("%s: Commit changed the base's BackendCount", step.name)
		}
	}
}

func TestDataplaneState(t *testing.T) {
	if diff := cmp.Diff(&dataplane.State{Services: map[string]*dataplane.Service{}}, plainState(store.Empty().DataplaneState(nil))); diff != "" {
		t.Errorf("empty state (-want +got):\n%s", diff)
	}
	tx := store.Empty().Begin()
	a := put(t, tx, svc("a", "10.96.0.1", 1, tcp(80)))
	b := put(t, tx, svc("b", "10.96.0.2,fd00:96::2", 0, udp(53)))
	c := put(t, tx, svc("c", "10.96.0.3", 1, tcp(80)))
	tx.Delete("c")
	snap := tx.Commit()

	got := snap.DataplaneState([]string{"a", "c"})
	want := &dataplane.State{
		Generation: 4,
		Services:   map[string]*dataplane.Service{"a": a.Dataplane, "b": b.Dataplane},
		Changed:    []string{"a", "c"},
	}
	if diff := cmp.Diff(want, plainState(got), addrCmp); diff != "" {
		t.Errorf("DataplaneState (-want +got):\n%s", diff)
	}
	if got.Len() != 2 {
		t.Errorf("DataplaneState Len %d, want 2", got.Len())
	}
	if _, ok := got.Get("c"); ok {
		t.Error("DataplaneState has the deleted service c")
	}
	ga, _ := got.Get("a")
	gb, _ := got.Get("b")
	if ga != a.Dataplane || gb != b.Dataplane {
		t.Error("DataplaneState does not hand out the stored dataplane services")
	}
	if gb.Generation != 2 || c.Dataplane.Generation != 3 {
		t.Errorf("dataplane generations %d and %d, want 2 and 3", gb.Generation, c.Dataplane.Generation)
	}
	var order []string
	for name := range got.All() {
		order = append(order, name)
	}
	if !slices.Equal(order, []string{"a", "b"}) {
		t.Errorf("DataplaneState All yields %v, want [a b] (name order)", order)
	}
	if st := snap.DataplaneState(nil); st.Changed != nil {
		t.Errorf("DataplaneState(nil).Changed = %v, want nil (diff everything)", st.Changed)
	}
	// A later commit leaves an earlier state alone: a dataplane may keep it.
	tx = snap.Begin()
	tx.Delete("a")
	put(t, tx, svc("d", "10.96.0.4", 1, tcp(80)))
	tx.Commit()
	if _, ok := got.Get("a"); !ok || got.Len() != 2 {
		t.Error("committing on a snapshot changed the state handed out before")
	}
}

// plainState returns s with its services as a map, for cmp.Diff.
func plainState(s *dataplane.State) *dataplane.State {
	return &dataplane.State{Generation: s.Generation, Services: s.Map(), Changed: s.Changed}
}

func TestSameSpec(t *testing.T) {
	snap := snapshot(t, svc("a", "10.96.0.1", 2, tcp(80)))
	e, _ := snap.Get("a")

	same, _ := normalize(t, svc("a", "10.96.0.1", 2, tcp(80)))
	same.Generation = 99
	if !e.SameSpec(same) {
		t.Error("SameSpec is false for the same spec with another generation")
	}
	if same.Generation != 99 {
		t.Errorf("SameSpec changed the argument's generation to %d", same.Generation)
	}
	if e.Service().Generation != 1 {
		t.Errorf("SameSpec changed the entry's generation to %d", e.Service().Generation)
	}
	other, _ := normalize(t, svc("a", "10.96.0.1", 3, tcp(80)))
	if e.SameSpec(other) {
		t.Error("SameSpec is true for another backend set")
	}
	raw := svc("a", "10.96.0.1", 2, tcp(80))
	if e.SameSpec(raw) {
		t.Error("SameSpec is true for a service without its defaults")
	}
}

// TestSnapshotConcurrentReaders runs under -race: a Snapshot is shared by
// goroutines that read it and commit on top of it.
func TestSnapshotConcurrentReaders(t *testing.T) {
	base := snapshot(t, svc("a", "10.96.0.1", 2, tcp(80)), svc("b", "10.96.0.2", 2, tcp(80)))
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 20 {
				tx := base.Begin()
				tx.Delete("a")
				s, dp, v := validation.Service(svc(fmt.Sprintf("s%d-%d", i, j), "10.96.0.1", 1, tcp(80)), validation.Limits{}, "service")
				if len(v) > 0 {
					t.Error(v)
					return
				}
				if _, err := tx.Put(s, dp); err != nil {
					t.Error(err)
					return
				}
				next := tx.Commit()
				if next.Len() != 2 || base.Len() != 2 || len(base.List("")) != 2 || base.DataplaneState(nil).BackendCount() != 4 {
					t.Error("snapshot changed under a reader")
					return
				}
				if _, ok := base.Get("a"); !ok {
					t.Error("base lost a")
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestEntryHealthCheck checks that HealthCheck, which decodes only the
// health check, gives what decoding the whole service does.
func TestEntryHealthCheck(t *testing.T) {
	for _, hc := range []*vipdv1.HealthCheck{
		nil,
		{Protocol: vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_HTTP, PortName: "http", Path: "/healthz", IntervalMs: 100, TimeoutMs: 50},
		{Protocol: vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_TCP},
	} {
		in := svc("a", "10.96.0.1", 3, &vipdv1.Port{Name: "http", Port: 80})
		in.Labels = map[string]string{"app": "web"}
		in.HealthCheck = hc
		s, dp := normalize(t, in)
		e, err := store.NewEntry(s, dp, 7)
		if err != nil {
			t.Fatal(err)
		}
		got, want := e.HealthCheck(), e.Service().GetHealthCheck()
		if (got == nil) != (want == nil) || !proto.Equal(got, want) {
			t.Errorf("HealthCheck() = %v, want %v (the decoded service's)", got, want)
		}
		if hc != nil && got == e.HealthCheck() {
			t.Error("HealthCheck returned the same message twice; each caller must own its copy")
		}
	}
}
