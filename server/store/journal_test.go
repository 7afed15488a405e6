package store_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/vipd/vipd/server/store"
)

// changes applies n single-service changes to s (upserts of svc-i, and a
// delete every fifth), saving each through d, and returns every snapshot
// in order, s first.
func changes(t *testing.T, d *store.Dir, s *store.Snapshot, n int) []*store.Snapshot {
	t.Helper()
	out := []*store.Snapshot{s}
	for i := range n {
		tx := s.Begin()
		if i%5 == 4 {
			tx.Delete(fmt.Sprintf("svc-%d", i-1))
		} else {
			put(t, tx, svc(fmt.Sprintf("svc-%d", i), fmt.Sprintf("10.96.1.%d", i+1), i%3+1, tcp(80)))
		}
		s = tx.Commit()
		if err := d.Save(s); err != nil {
			t.Fatalf("Save change %d: %v", i, err)
		}
		out = append(out, s)
	}
	return out
}

// started returns a Dir that has loaded and saved once: its state file
// exists, so further changes go to the journal.
func started(t *testing.T) (*store.Dir, *store.Snapshot) {
	t.Helper()
	d := openDir(t)
	s, err := d.Load()
	if err != nil {
		t.Fatal(err)
	}
	tx := s.Begin()
	put(t, tx, svc("base", "10.96.2.1", 1, tcp(80)))
	s = tx.Commit()
	save(t, d, s)
	return d, s
}

func journalPath(d *store.Dir) string { return filepath.Join(filepath.Dir(d.Path()), "journal") }

func reopen(t *testing.T, d *store.Dir) *store.Dir {
	t.Helper()
	path := filepath.Dir(d.Path())
	d.Close()
	d2, err := store.OpenDir(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d2.Close() })
	return d2
}

// TestJournalAppends checks that changes on top of the saved snapshot go
// to the journal, not the state file, and that Load replays them.
func TestJournalAppends(t *testing.T) {
	d := openDir(t)
	save(t, d, fixture(t)) // a Dir that has not loaded writes whole
	first, err := os.ReadFile(d.Path())
	if err != nil {
		t.Fatal(err)
	}
	d = reopen(t, d)
	s, err := d.Load()
	if err != nil {
		t.Fatal(err)
	}
	snaps := changes(t, d, s, 20)
	if got, _ := os.ReadFile(d.Path()); string(got) != string(first) {
		t.Fatal("the state file was rewritten for changes that fit the journal")
	}
	if st, err := os.Stat(journalPath(d)); err != nil || st.Size() == 0 {
		t.Fatalf("journal after 20 changes: %v, %v; want a non-empty file", st, err)
	}
	got, err := reopen(t, d).Load()
	if err != nil {
		t.Fatalf("Load with a journal: %v", err)
	}
	sameSnapshot(t, snaps[len(snaps)-1], got)
}

// TestJournalTornTail cuts the journal inside its last record at every
// offset: Load returns the state before that change, cuts the torn bytes
// off, and later appends work.
func TestJournalTornTail(t *testing.T) {
	d, s := started(t)
	snaps := changes(t, d, s, 3)
	data, err := os.ReadFile(journalPath(d))
	if err != nil {
		t.Fatal(err)
	}
	snaps2 := changes(t, d, snaps[len(snaps)-1], 1)
	whole, err := os.ReadFile(journalPath(d))
	if err != nil {
		t.Fatal(err)
	}
	for n := len(data) + 1; n < len(whole); n++ {
		if err := os.WriteFile(journalPath(d), whole[:n], 0o600); err != nil {
			t.Fatal(err)
		}
		d2 := reopen(t, d)
		got, err := d2.Load()
		if err != nil {
			t.Fatalf("journal cut to %d of %d bytes: Load: %v", n, len(whole), err)
		}
		sameSnapshot(t, snaps[len(snaps)-1], got)
		if cut, _ := os.ReadFile(journalPath(d2)); len(cut) != len(data) {
			t.Fatalf("journal cut to %d bytes: Load left %d bytes, want the %d of whole records", n, len(cut), len(data))
		}
		d = d2
	}
	// Zeros where the last record should be (space the file system
	// allocated but never wrote) are a torn tail too.
	zeros := append(append([]byte(nil), data...), make([]byte, len(whole)-len(data))...)
	if err := os.WriteFile(journalPath(d), zeros, 0o600); err != nil {
		t.Fatal(err)
	}
	d = reopen(t, d)
	if got, err := d.Load(); err != nil {
		t.Fatalf("zeros after the last whole record: %v", err)
	} else {
		sameSnapshot(t, snaps[len(snaps)-1], got)
	}
	// The damaged last record (not just cut short) is torn too.
	bad := append([]byte(nil), whole...)
	bad[len(bad)-1] ^= 0xff
	if err := os.WriteFile(journalPath(d), bad, 0o600); err != nil {
		t.Fatal(err)
	}
	d = reopen(t, d)
	got, err := d.Load()
	if err != nil {
		t.Fatalf("damaged last record: %v", err)
	}
	sameSnapshot(t, snaps[len(snaps)-1], got)
	more := changes(t, d, got, 2)
	got, err = reopen(t, d).Load()
	if err != nil {
		t.Fatal(err)
	}
	sameSnapshot(t, more[len(more)-1], got)
	_ = snaps2
}

// TestJournalCorrupt: damage anywhere but the last record is corruption.
func TestJournalCorrupt(t *testing.T) {
	d, s := started(t)
	changes(t, d, s, 3)
	whole, err := os.ReadFile(journalPath(d))
	if err != nil {
		t.Fatal(err)
	}
	// Flip every byte of the first record in turn (the first record is
	// followed by two more, so none of it is a torn tail).
	n := int(whole[0]) | int(whole[1])<<8 | int(whole[2])<<16 | int(whole[3])<<24
	for i := range 12 + n {
		bad := append([]byte(nil), whole...)
		bad[i] ^= 0xff
		if err := os.WriteFile(journalPath(d), bad, 0o600); err != nil {
			t.Fatal(err)
		}
		d = reopen(t, d)
		got, err := d.Load()
		mustBeCorrupt(t, "journal byte "+strconv.Itoa(i)+" flipped", got, err)
	}
}

// TestJournalCompaction: a journal that outgrows the threshold makes the
// next Save write the state file and empty the journal.
func TestJournalCompaction(t *testing.T) {
	defer store.SetJournalCompactAt(2048)()
	d, s := started(t)
	snaps := changes(t, d, s, 60)
	st, err := os.Stat(journalPath(d))
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() > 2048+1024 {
		t.Fatalf("journal is %d bytes after 60 changes with a 2 KiB threshold: no compaction", st.Size())
	}
	if _, err := os.Stat(d.Path()); err != nil {
		t.Fatalf("no state file after compactions: %v", err)
	}
	got, err := reopen(t, d).Load()
	if err != nil {
		t.Fatal(err)
	}
	sameSnapshot(t, snaps[len(snaps)-1], got)
}

// TestJournalOlderThanStateFile: a crash between writing the state file
// and emptying the journal leaves records the state file already holds;
// Load skips them.
func TestJournalOlderThanStateFile(t *testing.T) {
	d, s := started(t)
	snaps := changes(t, d, s, 4)
	old, err := os.ReadFile(journalPath(d))
	if err != nil {
		t.Fatal(err)
	}
	last := snaps[len(snaps)-1]
	d = reopen(t, d)
	if _, err := d.Load(); err != nil {
		t.Fatal(err)
	}
	// A snapshot not committed on the saved one: written whole.
	tx := store.Empty().Begin()
	for _, e := range last.List("") {
		put(t, tx, e.Service())
	}
	full := tx.Commit()
	save(t, d, full)
	if err := os.WriteFile(journalPath(d), old, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := reopen(t, d).Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	sameSnapshot(t, full, got)
}

// TestJournalGap: a record that does not apply to the state before it is
// corruption.
func TestJournalGap(t *testing.T) {
	d, s := started(t)
	changes(t, d, s, 2)
	first, err := os.ReadFile(journalPath(d))
	if err != nil {
		t.Fatal(err)
	}
	n := int(first[0]) | int(first[1])<<8 | int(first[2])<<16 | int(first[3])<<24
	// Drop the first record: the second applies to a revision never seen.
	if err := os.WriteFile(journalPath(d), first[12+n:], 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := reopen(t, d).Load()
	mustBeCorrupt(t, "journal with a gap", got, err)
	if !errors.Is(err, store.ErrCorrupt) {
		t.Fatal(err)
	}
}
