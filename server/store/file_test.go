package store_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
)

// The state file's header, as file.go lays it out.
const (
	headerSize     = 48
	versionOffset  = 8
	revisionOffset = 16
	countOffset    = 24
	lengthOffset   = 32
	checksumOffset = 44
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// encodeFile builds a state file around payload with a correct length and
// checksum, so that tests can reach the checks behind the checksum.
func encodeFile(version uint32, revision, count uint64, payload []byte) []byte {
	buf := make([]byte, headerSize, headerSize+len(payload))
	copy(buf, "vipdstat")
	le := binary.LittleEndian
	le.PutUint32(buf[versionOffset:], version)
	le.PutUint64(buf[revisionOffset:], revision)
	le.PutUint64(buf[countOffset:], count)
	le.PutUint64(buf[lengthOffset:], uint64(len(payload)))
	buf = append(buf, payload...)
	le.PutUint32(buf[checksumOffset:], crc32.Update(crc32.Checksum(buf[:checksumOffset], castagnoli), castagnoli, buf[headerSize:]))
	return buf
}

// record encodes one payload record: uvarint length, then svc.
func record(t testing.TB, svc *vipdv1.Service) []byte {
	t.Helper()
	// The file's layout: the deterministic encoding without the
	// generation, then the generation field (a field numbered above it,
	// such as external_traffic_policy, comes before it).
	noGen := proto.Clone(svc).(*vipdv1.Service)
	noGen.Generation = 0
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(noGen)
	if err != nil {
		t.Fatal(err)
	}
	if svc.Generation != 0 {
		b = protowire.AppendVarint(protowire.AppendTag(b, 10, protowire.VarintType), svc.Generation)
	}
	return append(binary.AppendUvarint(nil, uint64(len(b))), b...)
}

// stored returns svc normalized and stamped with gen, as Save writes it.
func stored(t testing.TB, svc *vipdv1.Service, gen uint64) *vipdv1.Service {
	t.Helper()
	out, _ := normalize(t, svc)
	out.Generation = gen
	return out
}

func openDir(t testing.TB) *store.Dir {
	t.Helper()
	d, err := store.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func save(t testing.TB, d *store.Dir, s *store.Snapshot) []byte {
	t.Helper()
	if err := d.Save(s); err != nil {
		t.Fatalf("Save: %v", err)
	}
	data, err := os.ReadFile(d.Path())
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// fixture is a store with services of every kind, whose revision is above
// every generation because of a delete.
func fixture(t testing.TB) *store.Snapshot {
	t.Helper()
	dns := owned("kube", svc("kube-system/dns", "10.96.0.10", 3, udp(53), tcp(53)))
	dns.SessionAffinity = &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP}
	dual := svc("dual", "10.96.0.20,fd00:96::20", 0, tcp(80), &vipdv1.Port{Name: "https", Port: 443, TargetPort: 8443})
	dual.Backends = []*vipdv1.Backend{
		{Ip: "fd00::2", Weight: 5, Zone: "a"},
		{Ip: "10.0.0.2", Ports: map[string]uint32{"https": 9443}, State: vipdv1.BackendState_BACKEND_STATE_TERMINATING, NodeLocal: true},
	}
	dual.InternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	dual.LoadBalancing = vipdv1.LoadBalancing_LOAD_BALANCING_MAGLEV
	dual.Labels = map[string]string{"app": "dual", "tier": "web"}
	v6 := svc("v6", "FD00:96::0030", 0, sctp(3868))
	v6.Backends = []*vipdv1.Backend{{Ip: "fd00::30"}, {Ip: "fd00::3"}}

	tx := store.Empty().Begin()
	put(t, tx, svc("web", "10.96.0.1", 2, tcp(80)))
	put(t, tx, dns)
	put(t, tx, svc("gone", "10.96.0.99", 1, tcp(80)))
	put(t, tx, dual)
	put(t, tx, v6)
	put(t, tx, svc("web", "10.96.0.1", 4, tcp(80), tcp(443)))
	tx.Delete("gone")
	return tx.Commit()
}

// small is a store of two services, small enough to corrupt at every offset.
func small(t testing.TB) *store.Snapshot {
	t.Helper()
	return snapshot(t, svc("a", "10.96.0.1", 1, tcp(80)), svc("b", "fd00:96::1", 1, udp(53)))
}

// sameSnapshot fails the test unless got holds exactly what want holds.
func sameSnapshot(t testing.TB, want, got *store.Snapshot) {
	t.Helper()
	if got.Revision() != want.Revision() || got.Len() != want.Len() || got.BackendCount() != want.BackendCount() {
		t.Errorf("Revision/Len/BackendCount %d/%d/%d, want %d/%d/%d",
			got.Revision(), got.Len(), got.BackendCount(), want.Revision(), want.Len(), want.BackendCount())
	}
	var wantSvcs, gotSvcs []*vipdv1.Service
	for _, e := range want.List("") {
		wantSvcs = append(wantSvcs, e.Service())
	}
	for _, e := range got.List("") {
		gotSvcs = append(gotSvcs, e.Service())
	}
	if diff := cmp.Diff(wantSvcs, gotSvcs, protocmp.Transform()); diff != "" {
		t.Errorf("services (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(plainState(want.DataplaneState(nil)), plainState(got.DataplaneState(nil)), addrCmp); diff != "" {
		t.Errorf("dataplane state (-want +got):\n%s", diff)
	}
}

func TestSaveLoadRoundTrip(t *testing.T) {
	want := fixture(t)
	if want.Revision() != 7 || want.Len() != 4 {
		t.Fatalf("fixture has revision %d and %d services, want 7 and 4", want.Revision(), want.Len())
	}
	path := t.TempDir()
	d, err := store.OpenDir(path)
	if err != nil {
		t.Fatal(err)
	}
	data := save(t, d, want)
	d.Close()

	// As after a restart: a new Dir on the same path.
	d, err = store.OpenDir(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	got, err := d.Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	sameSnapshot(t, want, got)
	for name, gen := range map[string]uint64{"web": 6, "kube-system/dns": 2, "dual": 4, "v6": 5} {
		if e, ok := got.Get(name); !ok || e.Service().Generation != gen || e.Dataplane.Generation != gen {
			t.Errorf("loaded %s: %v, want generation %d", name, e, gen)
		}
	}
	if diff := cmp.Diff([]string{"kube-system/dns"}, got.Begin().Names("kube")); diff != "" {
		t.Errorf("loaded owners (-want +got):\n%s", diff)
	}

	// Claims are rebuilt.
	tx := got.Begin()
	for _, c := range []struct {
		svc    *vipdv1.Service
		holder string
	}{
		{svc("x", "10.96.0.1", 0, tcp(443)), "web"},
		{svc("x", "10.96.0.10", 0, udp(53)), "kube-system/dns"},
		{svc("x", "fd00:96::20", 0, tcp(443)), "dual"},
		{svc("x", "fd00:96::30", 0, sctp(3868)), "v6"},
	} {
		_, err := tx.Put(normalize(t, c.svc))
		if ce := conflict(t, err); ce.Holder != c.holder {
			t.Errorf("%v is held by %s, want %s", ce.Claim, ce.Holder, c.holder)
		}
	}
	// The deleted service's claim is free, and generations go on from the revision.
	e := put(t, tx, svc("x", "10.96.0.99", 0, tcp(80)))
	if e.Service().Generation != 8 {
		t.Errorf("first generation after Load is %d, want 8", e.Service().Generation)
	}

	// Saving what was loaded writes the same bytes.
	if again := save(t, openDir(t), got); !bytes.Equal(again, data) {
		t.Error("re-saving a loaded snapshot wrote a different file")
	}
}

func TestSaveDeterministic(t *testing.T) {
	s := fixture(t)
	d := openDir(t)
	first := save(t, d, s)
	for range 20 {
		if again := save(t, d, s); !bytes.Equal(again, first) {
			t.Fatal("saving the same snapshot twice wrote different files")
		}
	}
}

// TestFileFormat pins the layout: encodeFile builds byte for byte what Save writes.
func TestFileFormat(t *testing.T) {
	s := small(t)
	data := save(t, openDir(t), s)
	var payload []byte
	for _, e := range s.List("") {
		payload = append(payload, record(t, e.Service())...)
	}
	if want := encodeFile(1, 2, 2, payload); !bytes.Equal(data, want) {
		t.Errorf("saved file:\n%x\nwant:\n%x", data, want)
	}
}

func TestSaveEmpty(t *testing.T) {
	// A store whose services were all deleted keeps its revision, so that
	// generations never repeat across a restart.
	tx := snapshot(t, svc("a", "10.96.0.1", 1, tcp(80))).Begin()
	tx.Delete("a")
	s := tx.Commit()
	d := openDir(t)
	data := save(t, d, s)
	if len(data) != headerSize {
		t.Errorf("empty state file is %d bytes, want %d", len(data), headerSize)
	}
	got, err := d.Load()
	if err != nil {
		t.Fatal(err)
	}
	if got.Len() != 0 || got.Revision() != 2 {
		t.Errorf("loaded Len %d Revision %d, want 0 2", got.Len(), got.Revision())
	}
	if g := got.Begin().NextGeneration(); g != 3 {
		t.Errorf("NextGeneration after Load is %d, want 3", g)
	}
}

func TestLoadMissingFile(t *testing.T) {
	got, err := openDir(t).Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if got.Len() != 0 || got.Revision() != 0 || got.BackendCount() != 0 {
		t.Errorf("Load of a missing file: Len %d Revision %d BackendCount %d, want an empty store", got.Len(), got.Revision(), got.BackendCount())
	}
}

func TestOpenDirLocks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a", "b")
	d1, err := store.OpenDir(path)
	if err != nil {
		t.Fatalf("OpenDir of a missing directory: %v", err)
	}
	if d2, err := store.OpenDir(path); err == nil {
		d2.Close()
		t.Fatal("a second OpenDir succeeded while the first is open")
	} else if !strings.Contains(err.Error(), path) {
		t.Errorf("error %q does not name the directory", err)
	}
	// A failed OpenDir does not take the lock away from the holder.
	if d2, err := store.OpenDir(path); err == nil {
		d2.Close()
		t.Fatal("a third OpenDir succeeded while the first is open")
	}
	if err := d1.Close(); err != nil {
		t.Fatal(err)
	}
	d3, err := store.OpenDir(path)
	if err != nil {
		t.Fatalf("OpenDir after Close: %v", err)
	}
	d3.Close()
}

func TestSaveLeavesNoTempFile(t *testing.T) {
	path := t.TempDir()
	d, err := store.OpenDir(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	before := entries(t, path)
	save(t, d, small(t))
	save(t, d, fixture(t))
	want := append(before, filepath.Base(d.Path()), "journal")
	slices.Sort(want)
	if diff := cmp.Diff(want, entries(t, path)); diff != "" {
		t.Errorf("state dir after Save (-want +got):\n%s", diff)
	}
}

func TestSaveFailure(t *testing.T) {
	path := t.TempDir()
	d, err := store.OpenDir(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	// A non-empty directory where the state file belongs makes the rename fail.
	if err := os.MkdirAll(filepath.Join(d.Path(), "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	before := entries(t, path)
	if err := d.Save(small(t)); err == nil {
		t.Fatal("Save succeeded over a directory")
	}
	if diff := cmp.Diff(before, entries(t, path)); diff != "" {
		t.Errorf("state dir after a failed Save (-before +after):\n%s", diff)
	}
}

func entries(t testing.TB, path string) []string {
	t.Helper()
	des, err := os.ReadDir(path)
	if err != nil {
		t.Fatal(err)
	}
	var res []string
	for _, de := range des {
		res = append(res, de.Name())
	}
	return res
}

// overwrite makes data the content of the file at path. It rewrites in place
// rather than truncating first, because ext4 flushes a file that is truncated
// to zero and written again (auto_da_alloc), which makes fuzzing ten times slower.
func overwrite(t testing.TB, path string, data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteAt(data, 0)
	if err == nil {
		err = f.Truncate(int64(len(data)))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
}

// load writes data as the state file of a fresh Dir and loads it.
func load(t testing.TB, data []byte) (*store.Snapshot, error) {
	t.Helper()
	d := openDir(t)
	if err := os.WriteFile(d.Path(), data, 0o600); err != nil {
		t.Fatal(err)
	}
	return d.Load()
}

// mustBeCorrupt fails the test unless Load failed with ErrCorrupt and returned nothing.
func mustBeCorrupt(t testing.TB, what string, s *store.Snapshot, err error) {
	t.Helper()
	if !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("%s: Load = %v, want an error wrapping ErrCorrupt", what, err)
	}
	if s != nil {
		t.Fatalf("%s: Load returned a snapshot (%d services) along with %v", what, s.Len(), err)
	}
}

func TestLoadTruncated(t *testing.T) {
	data := save(t, openDir(t), small(t))
	d := openDir(t)
	for n := range len(data) {
		overwrite(t, d.Path(), data[:n])
		s, err := d.Load()
		mustBeCorrupt(t, "truncated to "+strconv.Itoa(n)+" bytes", s, err)
	}
}

func TestLoadExtended(t *testing.T) {
	data := save(t, openDir(t), small(t))
	for _, extra := range [][]byte{{0}, {0xff}, data} {
		s, err := load(t, append(slices.Clone(data), extra...))
		mustBeCorrupt(t, "extended", s, err)
	}
}

func TestLoadFlippedByte(t *testing.T) {
	data := save(t, openDir(t), small(t))
	d := openDir(t)
	for i := range data {
		bad := slices.Clone(data)
		bad[i] ^= 0xff
		overwrite(t, d.Path(), bad)
		s, err := d.Load()
		mustBeCorrupt(t, "byte "+strconv.Itoa(i)+" flipped", s, err)
	}
}

func TestLoadFlippedBit(t *testing.T) {
	data := save(t, openDir(t), small(t))
	d := openDir(t)
	for i := range len(data) * 8 {
		bad := slices.Clone(data)
		bad[i/8] ^= 1 << (i % 8)
		overwrite(t, d.Path(), bad)
		s, err := d.Load()
		mustBeCorrupt(t, "bit "+strconv.Itoa(i)+" flipped", s, err)
	}
}

func TestLoadVersion(t *testing.T) {
	for _, v := range []uint32{0, 2, 1 << 31} {
		s, err := load(t, encodeFile(v, 0, 0, nil))
		mustBeCorrupt(t, "version "+strconv.Itoa(int(v)), s, err)
		if !strings.Contains(err.Error(), "version") {
			t.Errorf("error %q does not say what is wrong with the version", err)
		}
	}
}

func TestLoadInvalidContent(t *testing.T) {
	a := stored(t, svc("a", "10.96.0.1", 1, tcp(80)), 1)
	b := stored(t, svc("b", "10.96.0.2", 1, tcp(80)), 2)
	bOnA := stored(t, svc("b", "10.96.0.1", 1, tcp(80)), 2)
	// A VIP that does not parse has no dataplane form. (A name that the
	// admission policy rejects today still loads: see TestLoadFormats.)
	invalid := stored(t, svc("a", "10.96.0.1", 1, tcp(80)), 1)
	invalid.Vips[0] = "10.96.0.300"
	noGen := stored(t, svc("a", "10.96.0.1", 1, tcp(80)), 0)
	cat := func(parts ...[]byte) []byte { return slices.Concat(parts...) }

	// Every file here has a correct length and checksum.
	tests := []struct {
		name string
		data []byte
		want string // in the error
	}{
		{"bad magic", func() []byte {
			f := encodeFile(1, 2, 2, cat(record(t, a), record(t, b)))
			copy(f, "VIPDSTAT")
			return f
		}(), "magic"},
		{"count too high", encodeFile(1, 2, 3, cat(record(t, a), record(t, b))), "record 2"},
		{"count too low", encodeFile(1, 2, 1, cat(record(t, a), record(t, b))), "follow"},
		{"huge count", encodeFile(1, 2, 1<<63, cat(record(t, a), record(t, b))), "record 2"},
		{"record longer than the payload", encodeFile(1, 2, 1, cat(binary.AppendUvarint(nil, 1000), record(t, a)[1:])), "record 0"},
		{"overlong uvarint", encodeFile(1, 2, 1, bytes.Repeat([]byte{0xff}, 11)), "record 0"},
		{"not a protobuf", encodeFile(1, 2, 1, cat(binary.AppendUvarint(nil, 3), []byte{0xff, 0xff, 0xff})), "record 0"},
		{"empty record", encodeFile(1, 2, 1, []byte{0}), "record 0"},
		{"service that does not convert", encodeFile(1, 1, 1, record(t, invalid)), "service.vips[0]"},
		{"service without generation", encodeFile(1, 1, 1, record(t, noGen)), "generation"},
		{"generation above the revision", encodeFile(1, 1, 2, cat(record(t, a), record(t, b))), "revision"},
		{"same service twice", encodeFile(1, 2, 2, cat(record(t, a), record(t, a))), "twice"},
		{"conflicting claims", encodeFile(1, 2, 2, cat(record(t, a), record(t, bOnA))), "already used"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := load(t, tt.data)
			mustBeCorrupt(t, tt.name, s, err)
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not mention %q", err, tt.want)
			}
		})
	}

	// The same encoder makes a file that loads, so the failures above are
	// about the content and not about the encoder.
	s, err := load(t, encodeFile(1, 2, 2, cat(record(t, a), record(t, b))))
	if err != nil {
		t.Fatalf("Load of a valid crafted file: %v", err)
	}
	if s.Len() != 2 {
		t.Errorf("loaded %d services, want 2", s.Len())
	}
}

func TestLoadIgnoresLimits(t *testing.T) {
	// The file is read without limits: flags may have changed since it was
	// written, and refusing to start would break running traffic.
	big := stored(t, svc("big", "192.0.2.1", validation.DefaultMaxBackends+1, tcp(80)), 1)
	s, err := load(t, encodeFile(1, 1, 1, record(t, big)))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if s.BackendCount() != validation.DefaultMaxBackends+1 {
		t.Errorf("loaded %d backends", s.BackendCount())
	}
	// Nor the port limit, which --max-ports may have raised.
	manyPorts := svc("ports", "192.0.2.2", 1)
	for i := range validation.DefaultMaxPorts + 1 {
		manyPorts.Ports = append(manyPorts.Ports, tcp(uint32(1000+i)))
	}
	out, dp, v := validation.Service(manyPorts, validation.Limits{MaxPorts: -1}, "service")
	if len(v) > 0 {
		t.Fatal(v)
	}
	tx := store.Empty().Begin()
	if _, err := tx.Put(out, dp); err != nil {
		t.Fatal(err)
	}
	d := openDir(t)
	save(t, d, tx.Commit())
	s, err = d.Load()
	if err != nil {
		t.Fatalf("Load of a service with %d ports: %v", len(manyPorts.Ports), err)
	}
	if e, ok := s.Get("ports"); !ok || len(e.Dataplane.Ports) != validation.DefaultMaxPorts+1 {
		t.Errorf("loaded %v", e)
	}
}

// FuzzLoad checks that Load never panics, and that whatever it accepts is
// exactly what Save writes.
func FuzzLoad(f *testing.F) {
	valid := save(f, openDir(f), small(f))
	f.Add(valid)
	f.Add(save(f, openDir(f), fixture(f)))
	f.Add(save(f, openDir(f), store.Empty()))
	f.Add(valid[:len(valid)-1])
	f.Add(valid[:headerSize])
	flipped := slices.Clone(valid)
	flipped[len(flipped)/2] ^= 0xff
	f.Add(flipped)
	f.Add(encodeFile(2, 0, 0, nil))
	f.Add([]byte{})
	// One directory to load from and one to save to serve every input: the
	// inputs of a worker run one at a time.
	from, to := openDir(f), openDir(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		overwrite(t, from.Path(), data)
		s, err := from.Load()
		if err != nil {
			mustBeCorrupt(t, "fuzzed file", s, err)
			return
		}
		if again := save(t, to, s); !bytes.Equal(again, data) {
			t.Fatalf("Load accepted a file that Save does not write back:\n%x\nre-saved:\n%x", data, again)
		}
	})
}

// FuzzDecodeRecords fuzzes what lies behind the checksum: the test wraps the
// fuzzed payload in a header with a correct length and checksum, so that the
// fuzzer reaches the record decoder and the checks on what it decodes. A
// payload may hold records Save never writes (fields out of order, defaults
// left out), so what Load accepts must survive one Save unchanged, and saving
// it again must write the same bytes.
func FuzzDecodeRecords(f *testing.F) {
	for _, s := range []*store.Snapshot{small(f), fixture(f), store.Empty()} {
		data := save(f, openDir(f), s)
		f.Add(s.Revision(), uint64(s.Len()), data[headerSize:])
	}
	a := stored(f, svc("a", "10.96.0.1", 1, tcp(80)), 1)
	f.Add(uint64(1), uint64(2), slices.Concat(record(f, a), record(f, a)))
	from, to := openDir(f), openDir(f)
	f.Fuzz(func(t *testing.T, revision, count uint64, payload []byte) {
		overwrite(t, from.Path(), encodeFile(1, revision, count, payload))
		s, err := from.Load()
		if err != nil {
			mustBeCorrupt(t, "fuzzed payload", s, err)
			return
		}
		if s.Revision() != revision || uint64(s.Len()) != count {
			t.Fatalf("loaded revision %d and %d services from a header that says %d and %d", s.Revision(), s.Len(), revision, count)
		}
		for _, e := range s.List("") {
			if g := e.Service().Generation; g == 0 || g > revision || e.Dataplane.Generation != g {
				t.Fatalf("loaded %s with generations %d/%d, revision %d", e.Service().Name, g, e.Dataplane.Generation, revision)
			}
		}
		first := save(t, to, s)
		s2, err := to.Load()
		if err != nil {
			t.Fatalf("Load of what Save wrote: %v", err)
		}
		sameSnapshot(t, s, s2)
		if again := save(t, to, s2); !bytes.Equal(again, first) {
			t.Fatalf("a loaded snapshot saves to different bytes after a round trip:\n%x\n%x", first, again)
		}
	})
}

func TestLoadAnyRecordOrder(t *testing.T) {
	// Files written before Save sorted its records must still load.
	a := stored(t, svc("a", "10.96.0.1", 1, tcp(80)), 1)
	b := stored(t, svc("b", "10.96.0.2", 1, tcp(80)), 2)
	s, err := load(t, encodeFile(1, 2, 2, slices.Concat(record(t, b), record(t, a))))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	want := encodeFile(1, 2, 2, slices.Concat(record(t, a), record(t, b)))
	if got := save(t, openDir(t), s); !bytes.Equal(got, want) {
		t.Errorf("re-saved file:\n%x\nwant records sorted by name:\n%x", got, want)
	}
}

// TestLoadManyRecords: records decode on every CPU, in blocks; they load
// all, in place, and of several bad records the first is named.
func TestLoadManyRecords(t *testing.T) {
	const n = 5000
	var good, bad []byte
	for i := range n {
		s := stored(t, svc(fmt.Sprintf("s%04d", i), fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), 1, tcp(80)), uint64(i+1))
		good = append(good, record(t, s)...)
		if i == 2100 || i == 4500 {
			s.Vips[0] = "10.96.0.300"
		}
		bad = append(bad, record(t, s)...)
	}
	s, err := load(t, encodeFile(1, n, n, good))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if s.Len() != n {
		t.Fatalf("loaded %d services, want %d", s.Len(), n)
	}
	for _, i := range []int{0, 1023, 1024, 2100, n - 1} {
		e, ok := s.Get(fmt.Sprintf("s%04d", i))
		if !ok || e.Generation() != uint64(i+1) || e.Service().Vips[0] != fmt.Sprintf("10.96.%d.%d", i/250, i%250+1) {
			t.Errorf("service s%04d: %v, %v; want generation %d and its VIP", i, e, ok, i+1)
		}
	}
	s, err = load(t, encodeFile(1, n, n, bad))
	mustBeCorrupt(t, "bad records", s, err)
	if !strings.Contains(err.Error(), "record 2100:") {
		t.Errorf("error %q does not name record 2100, the first bad one", err)
	}
}

// TestLoadSharesOwners: services of one owner loaded from the state file
// keep one owner string between them, not a decoded copy each.
func TestLoadSharesOwners(t *testing.T) {
	tx := store.Empty().Begin()
	for i := range 40 {
		s := svc(fmt.Sprintf("o%d/s%02d", i%2, i), fmt.Sprintf("10.96.0.%d", i+1), 2, tcp(80))
		s.Owner = fmt.Sprintf("o%d", i%2)
		if _, err := tx.Put(normalize(t, s)); err != nil {
			t.Fatal(err)
		}
	}
	d, err := store.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	save(t, d, tx.Commit())
	got, err := d.Load()
	if err != nil {
		t.Fatal(err)
	}
	owners := map[*byte]bool{}
	for _, e := range got.Each() {
		owners[unsafe.StringData(e.Dataplane.Owner)] = true
	}
	// One block of records, one decoder: o0's services, then o1's, in
	// name order.
	if got.Len() != 40 || len(owners) != 2 {
		t.Errorf("%d services of 2 owners keep %d owner strings", got.Len(), len(owners))
	}
}
