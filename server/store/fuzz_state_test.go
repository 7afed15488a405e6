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
	"strings"
	"testing"

	"github.com/vipd/vipd/server/store"
)

// FuzzTornStateDir damages a whole state directory, the state file and the
// journal of the changes saved since, the way a crash, a full disk or a bad
// sector would: cut short, extended, or with bytes changed at any offset to
// any value. Load must then return exactly one of the states that Save had
// acknowledged, and only the one the damage allows, or fail with
// ErrCorrupt and a message that names the damaged file. It must never
// return an empty, an older or a made-up state in silence.
//
// What the damage allows follows the file formats: a damaged state file is
// corruption, which the journal cannot make up for. In the journal, the
// records wholly before the first damaged byte are intact, and what follows
// them decides (classifyTail, after journal.go's rules): nothing, or a torn
// append (a short header, zeros to the end of the file, a payload running
// past it, or a bad payload checksum with nothing after it), must load
// exactly the state after the intact records, and cut the rest off the
// file; anything else must be corruption. So a journal cut short anywhere
// loads, and never fails.
//
// The existing tests cover single damages (TestLoadTruncated,
// TestLoadFlippedByte, TestJournalTornTail, TestJournalCorrupt) and FuzzLoad
// fuzzes a state file alone; this target fuzzes both files together, with
// any number of damages, over histories of 1 to 12 journal records.
//
// The fuzz input is the history's length and a list of damages, 4 bytes
// each: op, offset (little-endian uint16) and value. op&1 picks the file
// (0 the journal, 1 the state file); op>>1&3 is the damage: 0 sets the byte
// at offset to value, 1 XORs it with value, 2 cuts the file at offset, 3
// appends offset%32+1 bytes of value. Offsets wrap around the file's size.
func FuzzTornStateDir(f *testing.F) {
	// The seed corpus is in testdata/fuzz/FuzzTornStateDir; these add the
	// plain cases, so that a run without it still starts from them.
	f.Add(uint8(5), []byte{})
	f.Add(uint8(5), []byte{damageCut, 40, 0, 0})
	f.Add(uint8(5), []byte{damageXor, 20, 0, 0xff})
	f.Add(uint8(5), []byte{damageXor | damageStateFile, 60, 0, 0x01})
	f.Add(uint8(5), []byte{damageAppend, 11, 0, 0})
	f.Add(uint8(1), []byte{damageSet, 4, 0, 0x00, damageCut, 200, 0, 0})

	// Built before fuzzing (F's methods are off limits in the target);
	// each costs a sync per record.
	histories := make([]*history, maxHistory+1)
	for n := 1; n <= maxHistory; n++ {
		histories[n] = buildHistory(f, n)
	}
	from := openDir(f)
	statePath, journal := from.Path(), journalPath(from)
	f.Fuzz(func(t *testing.T, records uint8, damage []byte) {
		h := histories[int(records)%maxHistory+1]
		gotState, gotJournal := applyDamage(h.state, h.journal, damage)
		overwrite(t, statePath, gotState)
		overwrite(t, journal, gotJournal)
		s, err := from.Load()
		left, rerr := os.ReadFile(journal)
		if rerr != nil {
			t.Fatal(rerr)
		}
		h.check(t, gotState, gotJournal, s, err, left, statePath, journal)
	})
}

// Damage ops of FuzzTornStateDir's input.
const (
	damageStateFile = 1 // op bit: damage the state file, not the journal
	damageSet       = 0 << 1
	damageXor       = 1 << 1
	damageCut       = 2 << 1
	damageAppend    = 3 << 1
)

// maxHistory is the most journal records a history has, and maxDamages the
// most damages one input applies.
const (
	maxHistory = 12
	maxDamages = 8
)

// applyDamage returns copies of the state file and journal with damage
// applied; see FuzzTornStateDir for its encoding.
func applyDamage(state, journal, damage []byte) ([]byte, []byte) {
	files := [2][]byte{slices.Clone(journal), slices.Clone(state)}
	for i := 0; i+4 <= len(damage) && i/4 < maxDamages; i += 4 {
		op, off, val := damage[i], int(damage[i+1])|int(damage[i+2])<<8, damage[i+3]
		b := &files[op&damageStateFile]
		switch op &^ damageStateFile & 6 {
		case damageSet:
			if len(*b) > 0 {
				(*b)[off%len(*b)] = val
			}
		case damageXor:
			if len(*b) > 0 {
				(*b)[off%len(*b)] ^= val
			}
		case damageCut:
			*b = (*b)[:off%(len(*b)+1)]
		case damageAppend:
			*b = append(*b, bytes.Repeat([]byte{val}, off%32+1)...)
		}
	}
	return files[1], files[0]
}

// history is a state directory as Save left it after a state file and a
// number of journal records, with every state Save acknowledged on the way.
type history struct {
	state, journal []byte
	// snaps[k] is the state after the first k records (snaps[0] is the
	// state file's); ends[k] is the journal's size after them.
	snaps []*store.Snapshot
	ends  []int
}

// buildHistory saves a state file of three services, then n changes through
// the journal: new services, updates, deletes, and changes of several
// services at once.
func buildHistory(tb testing.TB, n int) *history {
	tb.Helper()
	d := openDir(tb)
	s, err := d.Load()
	if err != nil {
		tb.Fatal(err)
	}
	tx := s.Begin()
	put(tb, tx, svc("base-a", "10.96.3.1", 2, tcp(80)))
	put(tb, tx, owned("kube", svc("base-b", "10.96.3.2", 1, udp(53), tcp(53))))
	put(tb, tx, svc("base-c", "fd00:96::3:3", 3, tcp(443)))
	s = tx.Commit()
	save(tb, d, s)
	h := &history{snaps: []*store.Snapshot{s}, ends: []int{0}}
	for i := range n {
		tx := s.Begin()
		switch i % 4 {
		case 0: // a new service
			put(tb, tx, svc(fmt.Sprintf("new-%d", i), fmt.Sprintf("10.96.4.%d", i+1), i%3+1, tcp(80)))
		case 1: // an update
			put(tb, tx, svc("base-a", "10.96.3.1", i%5+1, tcp(80), tcp(8080)))
		case 2: // several services in one change
			put(tb, tx, svc(fmt.Sprintf("multi-%d", i), fmt.Sprintf("10.96.5.%d", i+1), 1, udp(53)))
			put(tb, tx, owned("kube", svc("base-b", "10.96.3.2", i%4+1, udp(53))))
			tx.Delete(fmt.Sprintf("new-%d", i-2))
		case 3: // a delete
			tx.Delete(fmt.Sprintf("multi-%d", i-1))
		}
		s = tx.Commit()
		if err := d.Save(s); err != nil {
			tb.Fatalf("Save change %d: %v", i, err)
		}
		st, err := os.Stat(journalPath(d))
		if err != nil {
			tb.Fatal(err)
		}
		if int(st.Size()) <= h.ends[len(h.ends)-1] {
			tb.Fatalf("change %d did not go to the journal (%d bytes after it)", i, st.Size())
		}
		h.snaps = append(h.snaps, s)
		h.ends = append(h.ends, int(st.Size()))
	}
	if h.state, err = os.ReadFile(d.Path()); err != nil {
		tb.Fatal(err)
	}
	if h.journal, err = os.ReadFile(journalPath(d)); err != nil {
		tb.Fatal(err)
	}
	if len(h.journal) != h.ends[n] {
		tb.Fatalf("journal is %d bytes, the records end at %d", len(h.journal), h.ends[n])
	}
	// The history itself must load to its last state, or the checks below
	// would blame the damage for the builder's mistakes.
	got, err := reopenDir(tb, d).Load()
	if err != nil {
		tb.Fatalf("Load of the undamaged history: %v", err)
	}
	sameSnapshot(tb, s, got)
	return h
}

// reopenDir closes d and opens its directory again, as a restarted vipd does.
func reopenDir(tb testing.TB, d *store.Dir) *store.Dir {
	tb.Helper()
	path := filepath.Dir(d.Path())
	d.Close()
	d2, err := store.OpenDir(path)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { d2.Close() })
	return d2
}

// wholeRecords is how many records of the history end at or before off.
func (h *history) wholeRecords(off int) int {
	k := 0
	for k+1 < len(h.ends) && h.ends[k+1] <= off {
		k++
	}
	return k
}

// check judges Load's outcome (s, err) on the damaged files, and the
// journal it left behind (left); see FuzzTornStateDir for the rules.
func (h *history) check(t *testing.T, gotState, gotJournal []byte, s *store.Snapshot, err error, left []byte, statePath, journal string) {
	t.Helper()
	n := len(h.snaps) - 1
	corrupt := func(file, why string) {
		t.Helper()
		mustBeCorrupt(t, why, s, err)
		if !strings.Contains(err.Error(), file) {
			t.Fatalf("%s: the error %q does not name the damaged file %s", why, err, file)
		}
	}
	loads := func(k int, why string) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: Load failed (%v), want the state after %d of %d journal records", why, err, k, n)
		}
		if s.Revision() != h.snaps[k].Revision() {
			t.Fatalf("%s: loaded revision %d, want %d: the state after %d of %d journal records", why, s.Revision(), h.snaps[k].Revision(), k, n)
		}
		sameSnapshot(t, h.snaps[k], s)
		// The torn or damaged tail is cut, so that later appends follow
		// whole records.
		if len(left) != h.ends[k] || !bytes.Equal(left, h.journal[:h.ends[k]]) {
			t.Fatalf("%s: Load left a journal of %d bytes, want the %d bytes of the %d whole records", why, len(left), h.ends[k], k)
		}
	}

	if !bytes.Equal(gotState, h.state) {
		corrupt(statePath, "damaged state file")
		return
	}
	// Records wholly before the first damaged byte are intact; what the
	// damaged journal holds from the end of the last of them decides.
	o := 0
	for o < len(gotJournal) && o < len(h.journal) && gotJournal[o] == h.journal[o] {
		o++
	}
	k := h.wholeRecords(o)
	why := fmt.Sprintf("journal of %d bytes damaged from byte %d (after %d whole records of %d)", len(gotJournal), o, k, n)
	if len(gotJournal) < len(h.journal) && o == len(gotJournal) {
		why = fmt.Sprintf("journal cut at byte %d of %d (after %d whole records of %d)", o, len(h.journal), k, n)
	}
	switch classifyTail(gotJournal[h.ends[k]:]) {
	case tailNone, tailTorn:
		loads(k, why)
	case tailCorrupt:
		corrupt(journal, why)
	case tailForged:
		// A damaged record whose checksum still matches: no checksum
		// can tell it from a real one.
	}
}

// What the journal holds after its last intact record.
const (
	tailNone    = iota // nothing
	tailTorn           // a torn append: cut off, never an error
	tailCorrupt        // damage Load must refuse
	tailForged         // a whole record with a matching checksum
)

// classifyTail applies the journal format's rules (journal.go) to the bytes
// after the last intact record: a short header, zeros to the end of the
// file, a payload running past it, or a bad payload checksum with nothing
// after it are a torn append; a length that does not match its check, or a
// bad checksum with more bytes after it, are corruption.
func classifyTail(b []byte) int {
	switch {
	case len(b) == 0:
		return tailNone
	case len(b) < 12 || !slices.ContainsFunc(b, func(c byte) bool { return c != 0 }):
		return tailTorn
	}
	le := binary.LittleEndian
	n := le.Uint32(b)
	if le.Uint32(b[4:]) != ^n {
		return tailCorrupt
	}
	end := 12 + uint64(n)
	if end > uint64(len(b)) {
		return tailTorn
	}
	if crc32.Checksum(b[12:end], castagnoli) != le.Uint32(b[8:]) {
		if end == uint64(len(b)) {
			return tailTorn
		}
		return tailCorrupt
	}
	return tailForged
}

// TestTornStateDirCheck makes sure the fuzz target's oracle is not vacuous:
// each class of damage ends up in the branch meant for it, with the outcome
// the rules promise.
func TestTornStateDirCheck(t *testing.T) {
	h := buildHistory(t, 4)
	d := openDir(t)
	run := func(damage []byte) (*store.Snapshot, error, []byte) {
		t.Helper()
		st, j := applyDamage(h.state, h.journal, damage)
		overwrite(t, d.Path(), st)
		overwrite(t, journalPath(d), j)
		s, err := d.Load()
		left, rerr := os.ReadFile(journalPath(d))
		if rerr != nil {
			t.Fatal(rerr)
		}
		h.check(t, st, j, s, err, left, d.Path(), journalPath(d))
		return s, err, left
	}
	le16 := func(n int) (byte, byte) { return byte(n), byte(n >> 8) }

	if s, err, _ := run(nil); err != nil || s.Revision() != h.snaps[4].Revision() {
		t.Fatalf("undamaged: %v, %v", s, err)
	}
	// A cut inside record 3 loads the state after 2 records.
	lo, hi := le16(h.ends[2] + 5)
	if s, err, left := run([]byte{damageCut, lo, hi, 0}); err != nil || s.Revision() != h.snaps[2].Revision() || len(left) != h.ends[2] {
		t.Fatalf("cut in record 3: revision %v, %v, %d bytes left", s, err, len(left))
	}
	// A flipped byte in record 1, with records after it, is corruption.
	lo, hi = le16(h.ends[0] + 20)
	if _, err, _ := run([]byte{damageXor, lo, hi, 0xff}); !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("flipped byte in record 1: %v, want ErrCorrupt", err)
	}
	// A flipped payload byte of the last record is a torn append.
	lo, hi = le16(h.ends[3] + 14)
	if s, err, _ := run([]byte{damageXor, lo, hi, 0x10}); err != nil || s.Revision() != h.snaps[3].Revision() {
		t.Fatalf("flipped byte in the last record: %v, %v", s, err)
	}
	// A damaged state file is corruption, whatever the journal holds.
	if _, err, _ := run([]byte{damageXor | damageStateFile, 30, 0, 0x04}); !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("flipped state file byte: %v, want ErrCorrupt", err)
	}
	// Zeros after the last record are not a record.
	if s, err, _ := run([]byte{damageAppend, 31, 0, 0}); err != nil || s.Revision() != h.snaps[4].Revision() {
		t.Fatalf("zeros appended: %v, %v", s, err)
	}
}
