package store

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/validation"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The state file is one header followed by the payload:
//
//	magic     [8]byte  "vipdstat"
//	version   uint32   formatVersion
//	reserved  uint32   0
//	revision  uint64   the snapshot's revision
//	count     uint64   number of service records
//	length    uint64   payload length in bytes
//	reserved  uint32   0
//	checksum  uint32   CRC-32C of the header's first 44 bytes and the payload
//	payload   count × (uvarint length, protobuf vipd.v1.Service)
//
// Save writes the records sorted by service name; Load accepts any order.
// Each record is the deterministic encoding of the service without its
// generation, followed by the generation field, so that the same snapshot
// always saves to the same bytes.
//
// All integers are little-endian. The checksum and the exact length make any
// truncation or corrupted byte detectable.
const (
	magic         = "vipdstat"
	formatVersion = 1
	headerSize    = 48
	stateFileName = "state"
	lockFileName  = "lock"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// StateFiles are the names of the files in a state directory that together
// hold the desired state: the state file and the journal of changes since.
// Anything that sets a state aside must move all of them: a journal means
// nothing without the state file below it.
func StateFiles() []string { return []string{stateFileName, journalFileName} }

// ErrCorrupt is wrapped by every error about a state file that exists but
// cannot be trusted. vipd refuses to start on it rather than start empty.
var ErrCorrupt = errors.New("state file is corrupt")

// Dir is a state directory: the state file, the journal of the changes
// since it was written (see journal.go), and a lock that keeps a second
// vipd from using the same directory.
type Dir struct {
	path string
	lock *os.File
	j    journal
}

// DirOption configures OpenDir.
type DirOption func(*Dir)

// WithLogger makes Load log what it repairs, such as a torn journal record
// it cuts off, to log. Without it nothing is logged.
func WithLogger(log hclog.Logger) DirOption {
	return func(d *Dir) { d.j.log = log }
}

// OpenDir creates path if needed and locks it for this process. Close releases it.
func OpenDir(path string, opts ...DirOption) (*Dir, error) {
	if err := os.MkdirAll(path, 0o700); err != nil {
		return nil, fmt.Errorf("create state dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(path, lockFileName), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open state dir lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock state dir %s (is another vipd using it?): %w", path, err)
	}
	d := &Dir{path: path, lock: f, j: journal{path: filepath.Join(path, journalFileName), log: hclog.NewNullLogger()}}
	for _, o := range opts {
		o(d)
	}
	return d, nil
}

// Path is the state file's path.
func (d *Dir) Path() string { return filepath.Join(d.path, stateFileName) }

// Close releases the lock and the journal.
func (d *Dir) Close() error {
	return errors.Join(d.j.close(), d.lock.Close())
}

// Load reads the state file and replays the journal over it. A missing file
// is an empty store. A file that is truncated, corrupt, of an unknown
// version, or whose services have no dataplane form is an error wrapping
// ErrCorrupt; so is a journal that is damaged anywhere but in its last,
// torn record (a crash in the middle of an append, which was never
// acknowledged: it is cut off, with a WARN line giving its offset and
// size). Services load by the structural conversion alone (see
// decodeEntry), so a state written by any earlier vipd loads.
func (d *Dir) Load() (*Snapshot, error) {
	s := Empty()
	size := 0
	data, err := os.ReadFile(d.Path())
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("read state file: %w", err)
	default:
		// data is not used past decode, so that its records (26 MB
		// for 100,000 services × 10 backends) can be collected while
		// decode builds the snapshot's indexes from the entries.
		size = len(data)
		if s, err = decode(data); err != nil {
			return nil, fmt.Errorf("%s: %w: %w", d.Path(), ErrCorrupt, err)
		}
	}
	s, err = d.j.open(filepath.Join(d.path, journalFileName), s, size)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func decode(data []byte) (*Snapshot, error) {
	if len(data) < headerSize {
		return nil, fmt.Errorf("%d bytes is shorter than the %d-byte header", len(data), headerSize)
	}
	if string(data[:8]) != magic {
		return nil, errors.New("not a vipd state file (bad magic)")
	}
	le := binary.LittleEndian
	if v := le.Uint32(data[8:]); v != formatVersion {
		return nil, fmt.Errorf("format version %d is not supported (this vipd reads version %d)", v, formatVersion)
	}
	revision := le.Uint64(data[16:])
	count := le.Uint64(data[24:])
	length := le.Uint64(data[32:])
	if uint64(len(data)-headerSize) != length {
		return nil, fmt.Errorf("payload is %d bytes, header says %d (truncated or extended)", len(data)-headerSize, length)
	}
	sum := crc32.Update(crc32.Checksum(data[:44], castagnoli), castagnoli, data[headerSize:])
	if want := le.Uint32(data[44:]); sum != want {
		return nil, fmt.Errorf("checksum %08x does not match the stored %08x", sum, want)
	}
	payload := data[headerSize:]
	recs := make([][]byte, 0, min(count, uint64(len(payload))))
	for i := uint64(0); i < count; i++ {
		n, k := binary.Uvarint(payload)
		if k <= 0 || n > uint64(len(payload)-k) {
			return nil, fmt.Errorf("record %d: bad length", i)
		}
		recs = append(recs, payload[k:k+int(n)])
		payload = payload[k+int(n):]
	}
	if len(payload) != 0 {
		return nil, fmt.Errorf("%d bytes follow the last record", len(payload))
	}
	entries, err := decodeEntries(recs)
	if err != nil {
		return nil, err
	}
	return build(revision, entries)
}

// decodeEntries decodes recs (decodeEntry), index for index. Records are
// independent, so it decodes them on every CPU, in blocks, each worker
// with its own recordDecoder: a state of 100,000 services spends most of
// its load here. On failure it returns the error of the first bad record.
func decodeEntries(recs [][]byte) ([]*Entry, error) {
	const block = 1024
	entries := make([]*Entry, len(recs))
	errs := make([]error, len(recs))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), (len(recs)+block-1)/block) {
		wg.Go(func() {
			var d recordDecoder
			for {
				lo := int(next.Add(block)) - block
				if lo >= len(recs) {
					return
				}
				for i := lo; i < min(lo+block, len(recs)); i++ {
					entries[i], errs[i] = d.decode(recs[i])
				}
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("record %d: %w", i, err)
		}
	}
	return entries, nil
}

// decodeEntry turns a stored record into an entry by the structural
// conversion alone (validation.ConvertService), never the admission
// policy: limits, character sets and address rules may have tightened since
// an earlier vipd wrote the record, and refusing to start over that would
// break running traffic. Only a record that has no dataplane form fails.
func decodeEntry(rec []byte) (*Entry, error) {
	var d recordDecoder
	return d.decode(rec)
}

// recordDecoder is decodeEntry for one goroutine at a time, reusing its
// messages from one record to the next. The API form of a record is
// scratch (an Entry keeps its dataplane form and its encoding, see
// Entry), and a big state has ten backends for every service: decoding
// each record into new messages made a load of 100,000 services allocate,
// and collect, a million backend messages. The zero value is ready to use.
type recordDecoder struct {
	ServiceDecoder
	// enc and spec are fastEntry's buffers.
	enc, spec []byte
	// owner is the owner of the last service decoded, which the next one
	// that has the same takes: services of one owner keep one string.
	owner string
}

// ServiceDecoder decodes Service messages one after another into messages
// that it reuses: the service's and its backends'. A service with ten
// backends decoded into new messages is eleven messages for the collector
// to take, and a sync or a load of 100,000 services decodes a million
// backends. The state file's records (recordDecoder) and the chunks of a
// SyncServicesStream (server) are decoded with it. The zero value is
// ready to use; one goroutine uses it at a time.
type ServiceDecoder struct {
	svc      vipdv1.Service
	backends []*vipdv1.Backend
	rest     []byte
	// raw is the service's backend fields, tags and lengths included, in
	// the encoding's order.
	raw []byte
}

// Decode decodes b, a Service's encoding, as proto.Unmarshal does into a
// new message, and returns the service. The service and its backends'
// messages are d's: the next Decode resets and reuses them, so whatever
// outlives it must not point into them (a message, a slice of the
// backends). The strings and byte slices decoded are each new, and can be
// kept.
func (d *ServiceDecoder) Decode(b []byte) (*vipdv1.Service, error) {
	if err := d.unmarshal(b); err != nil {
		return nil, err
	}
	return &d.svc, nil
}

// decode is decodeEntry(rec). Nothing the entry keeps is d's.
func (d *recordDecoder) decode(rec []byte) (*Entry, error) {
	stored := &d.svc
	if err := d.unmarshal(rec); err != nil {
		return nil, fmt.Errorf("decode service: %w", err)
	}
	gen := stored.Generation
	stored.Generation = 0
	if stored.Owner == d.owner {
		stored.Owner = d.owner
	} else {
		d.owner = stored.Owner
	}
	dp, v := validation.ConvertService(stored, "service")
	if len(v) > 0 {
		return nil, fmt.Errorf("service %q does not convert: %w", stored.Name, v)
	}
	if gen == 0 {
		return nil, fmt.Errorf("service %s has no generation", stored.Name)
	}
	if e := d.fastEntry(dp, gen); e != nil {
		return e, nil
	}
	// NewEntry keeps dp and the encoding of stored, never stored itself
	// nor its backends.
	return NewEntry(stored, dp, gen)
}

// fastEntry is NewEntry(&d.svc, dp, gen) for the common record, whose
// backends are stored as the entry would cut them out of its spec (see
// slimSpec): it encodes the normalized service without its backends,
// rather than encode the backends' messages only to cut them out again.
// That holds when the record's backend fields are exactly
// appendBackends(dp.Backends): those bytes are then what EncodeSpec gives
// for the normalized backends (the conversion left them as they were, in
// the same order, with no field that their dataplane form lacks), and
// EncodeSpec puts the backends field between the fields numbered below
// and above it. It returns nil, for NewEntry to do, when that does not
// hold, when the service has fields this vipd does not know, or when it
// has no backends.
func (d *recordDecoder) fastEntry(dp *dataplane.Service, gen uint64) *Entry {
	svc := &d.svc
	if len(dp.Backends) == 0 || len(svc.ProtoReflect().GetUnknown()) > 0 {
		return nil
	}
	enc, ok := appendBackends(d.enc[:0], dp.Backends)
	d.enc = enc
	if !ok || !bytes.Equal(enc, d.raw) {
		return nil
	}
	bs := svc.Backends
	svc.Backends = nil
	spec, err := appendEncodedSpec(d.spec[:0], svc)
	svc.Backends = bs
	if err != nil {
		return nil
	}
	d.spec = spec
	at, ok := fieldsAbove(spec, backendsField)
	if !ok {
		return nil
	}
	dp.Generation = gen
	return &Entry{Dataplane: dp, spec: slices.Clone(spec), backendsAt: int32(at)}
}

// fieldsAbove returns the offset in b, a message's encoding, of its first
// field numbered above num: where a field num goes in field order. It
// fails when b does not parse, holds a field num, or is not in field
// order.
func fieldsAbove(b []byte, num protowire.Number) (int, bool) {
	at, last := len(b), protowire.Number(0)
	for off := 0; off < len(b); {
		n, typ, k := protowire.ConsumeTag(b[off:])
		if k < 0 || n == num || n < last {
			return 0, false
		}
		m := protowire.ConsumeFieldValue(n, typ, b[off+k:])
		if m < 0 {
			return 0, false
		}
		if n > num && at == len(b) {
			at = off
		}
		last = n
		off += k + m
	}
	return at, true
}

// SplitField splits msg, a message's encoding, into the elements of its
// repeated message field num and the rest: it calls each, in order, with
// each element's field (tag and length included) and its value, and
// appends every other field to rest, which it returns. A field num that
// is not length-delimited goes with the rest, for proto.Unmarshal to take
// or refuse as it would in the whole message. It stops at the first error
// of each, or of a field that does not parse.
func SplitField(rest, msg []byte, num protowire.Number, each func(field, value []byte) error) ([]byte, error) {
	for b := msg; len(b) > 0; {
		n, typ, k := protowire.ConsumeTag(b)
		if k < 0 {
			return rest, protowire.ParseError(k)
		}
		m := protowire.ConsumeFieldValue(n, typ, b[k:])
		if m < 0 {
			return rest, protowire.ParseError(m)
		}
		if n == num && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b[k:])
			if err := each(b[:k+m], v); err != nil {
				return rest, err
			}
		} else {
			rest = append(rest, b[:k+m]...)
		}
		b = b[k+m:]
	}
	return rest, nil
}

// unmarshal decodes rec into d.svc as proto.Unmarshal does, but decodes
// the backends into d.backends, which it reuses: it splits the record's
// backend fields from the rest, decodes the rest into d.svc, and each
// backend into a message of its own, in the record's order. Any field
// that is not a well-formed backend goes with the rest, for
// proto.Unmarshal to take or refuse as it would in the whole record.
func (d *ServiceDecoder) unmarshal(rec []byte) error {
	raw, n := d.raw[:0], 0
	rest, err := SplitField(d.rest[:0], rec, backendsField, func(field, v []byte) error {
		if n == len(d.backends) {
			d.backends = append(d.backends, &vipdv1.Backend{})
		}
		if err := proto.Unmarshal(v, d.backends[n]); err != nil {
			return err
		}
		raw = append(raw, field...)
		n++
		return nil
	})
	if err != nil {
		return err
	}
	d.rest, d.raw = rest, raw
	if err := proto.Unmarshal(rest, &d.svc); err != nil {
		return err
	}
	if n > 0 {
		d.svc.Backends = d.backends[:n]
	}
	return nil
}

// Save makes s durable before it returns. When s was committed on the
// snapshot saved last, and the journal is not due for compaction, it
// appends s's changes to the journal and syncs it: the cost follows the
// size of the change, not of the state. Otherwise it writes the whole state
// file and empties the journal. On error the previous state stays
// loadable.
func (d *Dir) Save(s *Snapshot) error {
	if d.j.canAppend(s) {
		return d.j.append(s)
	}
	n, err := d.writeFile(s)
	if err != nil {
		return err
	}
	return d.j.reset(s.revision, n)
}

// writeFile writes s atomically as the state file: a temporary file is
// written and synced, then renamed over the state file, and the directory
// is synced. On error the previous state file is intact. It returns the
// file's size.
//
// The records are streamed through a small buffer, so that saving a big
// state needs no second copy of it in memory; the checksum, which the
// header holds, is written last.
func (d *Dir) writeFile(s *Snapshot) (int, error) {
	// Records go in name order (the tree's order), so that a snapshot
	// always saves to the same bytes. The order is taken once: the length
	// and the records walk the same slice (100,000 names sort in tens of
	// milliseconds).
	entries := s.List("")
	payloadLen := 0
	for _, e := range entries {
		n := e.encodedLen()
		payloadLen += uvarintLen(uint64(n)) + n
	}
	header := make([]byte, headerSize)
	copy(header, magic)
	le := binary.LittleEndian
	le.PutUint32(header[8:], formatVersion)
	le.PutUint64(header[16:], s.revision)
	le.PutUint64(header[24:], uint64(s.Len()))
	le.PutUint64(header[32:], uint64(payloadLen))
	sum := crc32.Checksum(header[:44], castagnoli)
	err := writeAtomic(d.Path(), func(f *os.File) error {
		w := bufio.NewWriterSize(f, 1<<20)
		w.Write(header)
		var rec []byte
		for _, e := range entries {
			rec = binary.AppendUvarint(rec[:0], uint64(e.encodedLen()))
			rec = e.appendEncoded(rec)
			sum = crc32.Update(sum, castagnoli, rec)
			if _, err := w.Write(rec); err != nil {
				return err
			}
		}
		if err := w.Flush(); err != nil {
			return err
		}
		var c [4]byte
		le.PutUint32(c[:], sum)
		_, err := f.WriteAt(c[:], 44)
		return err
	})
	return headerSize + payloadLen, err
}

// writeAtomic makes path hold what write writes into a new file, or leaves
// it as it was on error.
func writeAtomic(path string, write func(*os.File) error) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("write state file: %w", err)
	}
	err = write(f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write state file: %w", err)
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("sync state dir: %w", err)
	}
	defer dir.Close()
	if err := dir.Sync(); err != nil {
		return fmt.Errorf("sync state dir: %w", err)
	}
	return nil
}

func uvarintLen(x uint64) int {
	n := 1
	for ; x >= 0x80; x >>= 7 {
		n++
	}
	return n
}
