package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/internal/pmap"
	"golang.org/x/sys/unix"
)

// The journal holds the changes saved since the state file was written, as
// records appended in order, each synced before Save returns:
//
//	length    uint32   payload length
//	check     uint32   ^length: a damaged length is corruption, not a torn write
//	checksum  uint32   CRC-32C of the payload
//	payload:
//	  parent    uint64   the revision the change applies to
//	  revision  uint64   the revision after it
//	  count     uvarint  number of changed services
//	  count × ( op byte (journalPut or journalDelete), uvarint name length, name,
//	            put only: uvarint length, protobuf vipd.v1.Service as in the state file )
//
// Load replays the records above the state file's revision. Records at or
// below it are skipped: a compaction wrote the state file and then emptied
// the journal, and a crash may fall between the two. Every record must
// apply to the revision the one before it left (no gaps). Only the last
// record may be damaged (a torn append, never acknowledged: a short header,
// a short payload, a bad payload checksum with nothing after it, or zeros
// to the end of the file); it is cut off.
const (
	journalFileName = "journal"
	journalHeader   = 12

	journalPut    = 1
	journalDelete = 2
)

// journalMinCompact is the journal size that always allows a compaction;
// a larger state compacts when the journal outgrows its state file, so a
// compaction's cost is spread over at least as many bytes of changes.
var journalMinCompact int64 = 4 << 20

// journal is the open journal of a Dir.
type journal struct {
	log      hclog.Logger
	f        *os.File
	path     string
	size     int64  // bytes of whole records
	fileSize int    // size of the state file: the compaction threshold
	saved    uint64 // revision of the last durable snapshot
	known    bool   // saved is known: Load or a full Save ran
}

// open opens (creating) the journal at path and replays it over base, the
// snapshot of a state file of fileSize bytes.
func (j *journal) open(path string, base *Snapshot, fileSize int) (*Snapshot, error) {
	j.close()
	j.path = path
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open journal: %w", err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("read journal: %w", err)
	}
	s, good, err := replay(base, data)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w: %w", path, ErrCorrupt, err)
	}
	if good < len(data) {
		// A torn last record: the append it belonged to never returned.
		j.log.Warn("journal: cutting off a torn last record, a change whose save never returned",
			"path", path, "offset", good, "size", len(data)-good)
		if err := f.Truncate(int64(good)); err != nil {
			f.Close()
			return nil, fmt.Errorf("cut the torn end of the journal: %w", err)
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			f.Close()
			return nil, fmt.Errorf("sync journal: %w", err)
		}
	}
	*j = journal{log: j.log, f: f, path: path, size: int64(good), fileSize: fileSize, saved: s.revision, known: true}
	return s, nil
}

// replay applies the journal's records to base. It returns the result and
// the length of the whole, valid records; a torn last record is not an
// error, any other damage is.
func replay(base *Snapshot, data []byte) (*Snapshot, int, error) {
	le := binary.LittleEndian
	var services *pmap.Builder[string, *Entry]
	revision := base.revision
	off := 0
	for off < len(data) {
		if len(data)-off < journalHeader || allZero(data[off:]) {
			break // torn header, or space the file system never filled
		}
		n := int(le.Uint32(data[off:]))
		if le.Uint32(data[off+4:]) != ^uint32(n) {
			return nil, 0, fmt.Errorf("record at offset %d: damaged length", off)
		}
		end := off + journalHeader + n
		if end > len(data) {
			break // torn payload
		}
		payload := data[off+journalHeader : end]
		if crc32.Checksum(payload, castagnoli) != le.Uint32(data[off+8:]) {
			if end == len(data) {
				break // the last record, damaged while being written
			}
			return nil, 0, fmt.Errorf("record at offset %d: checksum mismatch", off)
		}
		parent, rev, changes, err := decodeRecord(payload)
		if err != nil {
			return nil, 0, fmt.Errorf("record at offset %d: %w", off, err)
		}
		off = end
		if rev <= revision {
			continue // already in the state file
		}
		if parent != revision {
			return nil, 0, fmt.Errorf("record for revision %d applies to %d, but the state is at %d", rev, parent, revision)
		}
		if services == nil {
			services = base.services.Builder()
		}
		for name, e := range changes {
			if e == nil {
				services.Delete(name)
			} else {
				services.Set(name, e)
			}
		}
		revision = rev
	}
	if services == nil {
		return base, off, nil
	}
	// build checks the claims of the result, as Load does for a state file.
	t := services.Map()
	entries := make([]*Entry, 0, t.Len())
	for _, e := range t.All() {
		entries = append(entries, e)
	}
	s, err := build(revision, entries)
	if err != nil {
		return nil, 0, err
	}
	return s, off, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// decodeRecord parses a record's payload; a nil entry is a deletion.
func decodeRecord(p []byte) (parent, revision uint64, changes map[string]*Entry, err error) {
	if len(p) < 16 {
		return 0, 0, nil, errors.New("short record")
	}
	le := binary.LittleEndian
	parent, revision = le.Uint64(p), le.Uint64(p[8:])
	if revision <= parent {
		return 0, 0, nil, fmt.Errorf("revision %d does not follow %d", revision, parent)
	}
	p = p[16:]
	count, k := binary.Uvarint(p)
	if k <= 0 || count > uint64(len(p)) {
		return 0, 0, nil, errors.New("bad change count")
	}
	p = p[k:]
	field := func() ([]byte, error) {
		n, k := binary.Uvarint(p)
		if k <= 0 || n > uint64(len(p)-k) {
			return nil, errors.New("bad field length")
		}
		b := p[k : k+int(n)]
		p = p[k+int(n):]
		return b, nil
	}
	changes = make(map[string]*Entry, count)
	for i := uint64(0); i < count; i++ {
		if len(p) == 0 {
			return 0, 0, nil, errors.New("truncated change")
		}
		op := p[0]
		p = p[1:]
		name, err := field()
		if err != nil {
			return 0, 0, nil, err
		}
		switch op {
		case journalDelete:
			changes[string(name)] = nil
		case journalPut:
			rec, err := field()
			if err != nil {
				return 0, 0, nil, err
			}
			e, err := decodeEntry(rec)
			if err != nil {
				return 0, 0, nil, err
			}
			if e.Name() != string(name) {
				return 0, 0, nil, fmt.Errorf("change of %q holds service %q", name, e.Name())
			}
			if e.Generation() > revision {
				return 0, 0, nil, fmt.Errorf("service %s has generation %d, above the record's revision %d", name, e.Generation(), revision)
			}
			changes[string(name)] = e
		default:
			return 0, 0, nil, fmt.Errorf("unknown change kind %d", op)
		}
	}
	if len(p) != 0 {
		return 0, 0, nil, fmt.Errorf("%d bytes follow the last change", len(p))
	}
	return parent, revision, changes, nil
}

// canAppend reports whether s can be saved as a journal record: a state
// file exists (the first save writes one), s was committed on the snapshot
// saved last and says what it changed, and the journal, with the record,
// stays below the compaction threshold. The last condition also bounds the
// record, which is built in memory: a change as big as the state (a big
// SyncServices) writes the state file, streamed, instead.
func (j *journal) canAppend(s *Snapshot) bool {
	if j.f == nil || !j.known || j.fileSize <= 0 || s.delta == nil || s.parent != j.saved {
		return false
	}
	limit := max(int64(j.fileSize), journalMinCompact)
	size := j.size
	for _, name := range s.delta {
		if size >= limit {
			return false
		}
		size += int64(1 + 2*binary.MaxVarintLen64 + len(name))
		if e, ok := s.Get(name); ok {
			size += int64(e.encodedLen())
		}
	}
	return size < limit
}

// append writes s's changes as one record and syncs it.
func (j *journal) append(s *Snapshot) error {
	size := journalHeader + 16 + binary.MaxVarintLen64
	for _, name := range s.delta {
		size += 1 + 2*binary.MaxVarintLen64 + len(name)
		if e, ok := s.Get(name); ok {
			size += e.encodedLen()
		}
	}
	rec := make([]byte, journalHeader, size)
	rec = binary.LittleEndian.AppendUint64(rec, s.parent)
	rec = binary.LittleEndian.AppendUint64(rec, s.revision)
	rec = binary.AppendUvarint(rec, uint64(len(s.delta)))
	for _, name := range s.delta {
		e, ok := s.Get(name)
		if ok {
			rec = append(rec, journalPut)
		} else {
			rec = append(rec, journalDelete)
		}
		rec = binary.AppendUvarint(rec, uint64(len(name)))
		rec = append(rec, name...)
		if ok {
			rec = binary.AppendUvarint(rec, uint64(e.encodedLen()))
			rec = e.appendEncoded(rec)
		}
	}
	n := uint32(len(rec) - journalHeader)
	binary.LittleEndian.PutUint32(rec, n)
	binary.LittleEndian.PutUint32(rec[4:], ^n)
	binary.LittleEndian.PutUint32(rec[8:], crc32.Checksum(rec[journalHeader:], castagnoli))
	if _, err := j.f.Write(rec); err != nil {
		// Cut off whatever part was written, so that the journal stays
		// whole records; the next Save writes the state file anyway.
		j.f.Truncate(j.size)
		j.known = false
		return fmt.Errorf("append to journal: %w", err)
	}
	if err := unix.Fdatasync(int(j.f.Fd())); err != nil {
		j.f.Truncate(j.size)
		j.known = false
		return fmt.Errorf("sync journal: %w", err)
	}
	j.size += int64(len(rec))
	j.saved = s.revision
	return nil
}

// reset empties the journal after a state file of revision and fileSize
// bytes was written. The state file is durable already: if emptying fails,
// the next Save writes the state file again rather than append.
func (j *journal) reset(revision uint64, fileSize int) error {
	if j.f == nil {
		f, err := os.OpenFile(j.path, os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o600)
		if err != nil {
			j.known = false
			return nil
		}
		j.f = f
	}
	if j.f.Truncate(0) != nil || unix.Fdatasync(int(j.f.Fd())) != nil {
		j.known = false
		return nil
	}
	j.size, j.fileSize, j.saved, j.known = 0, fileSize, revision, true
	return nil
}

func (j *journal) close() error {
	if j.f == nil {
		return nil
	}
	err := j.f.Close()
	j.f = nil
	return err
}
