package store

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"slices"

	"github.com/vipd/vipd/dataplane"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/protobuf/encoding/protowire"
)

// An Entry keeps its service twice in principle: in dataplane form, which
// the dataplane reads, and serialized in API form (EncodeSpec), which the
// state file, the journal, GetService and SameSpec need. The backends are
// most of both (a service of 10 backends encodes to some 250 bytes, of
// which 200 are its backends), and their API form follows from their
// dataplane form: the conversion (validation.ConvertService) is a
// bijection on normalized backends. So an Entry keeps the encoded spec
// with its backends cut out, and encodes them from Dataplane.Backends
// when it needs the whole spec. It cuts them only when that encoding
// gives back exactly the bytes it cut (slimSpec checks), so a field that
// one day reaches the API form of a backend but not its dataplane form
// costs memory, never correctness.

// backendsField is vipd.v1.Service's backends field number.
const backendsField protowire.Number = 5

// vipd.v1.Backend's field numbers.
const (
	backendIPField             protowire.Number = 1
	backendPortsField          protowire.Number = 2
	backendStateField          protowire.Number = 3
	backendWeightField         protowire.Number = 4
	backendNodeLocalField      protowire.Number = 5
	backendZoneField           protowire.Number = 6
	backendOnlyNamedPortsField protowire.Number = 7
)

// slimSpec returns spec with its backends field cut out and the offset of
// the cut, when the cut bytes are exactly appendBackends(nil, bs); else
// spec itself and -1. The returned slice is a new one, so that spec's
// array may be freed; spec does not change.
func slimSpec(spec []byte, bs []dataplane.Backend) ([]byte, int32) {
	if len(bs) == 0 {
		return spec, -1
	}
	start, end := -1, -1
	for off := 0; off < len(spec); {
		num, typ, n := protowire.ConsumeTag(spec[off:])
		if n < 0 {
			return spec, -1
		}
		m := protowire.ConsumeFieldValue(num, typ, spec[off+n:])
		if m < 0 {
			return spec, -1
		}
		if num == backendsField {
			switch {
			case start < 0:
				start = off
			case end != off:
				// Not one run: not EncodeSpec's form.
				return spec, -1
			}
			end = off + n + m
		}
		off += n + m
	}
	if start < 0 {
		return spec, -1
	}
	var buf [1024]byte
	enc, ok := appendBackends(buf[:0], bs)
	if !ok || !bytes.Equal(enc, spec[start:end]) {
		return spec, -1
	}
	rest := make([]byte, 0, len(spec)-(end-start))
	rest = append(rest, spec[:start]...)
	rest = append(rest, spec[end:]...)
	return rest, int32(start)
}

// appendBackends appends bs as the backends field of a vipd.v1.Service,
// as EncodeSpec encodes the normalized backends they were converted from.
// It fails on a value no normalized backend has (a state it does not
// know).
func appendBackends(b []byte, bs []dataplane.Backend) ([]byte, bool) {
	for i := range bs {
		if _, ok := apiState(bs[i].State); !ok {
			return b, false
		}
		b = protowire.AppendTag(b, backendsField, protowire.BytesType)
		// The length goes first: one byte is kept for it, the length of
		// almost every backend, and the message moved when it needs more.
		at := len(b)
		b = appendBackend(append(b, 0), &bs[i])
		n := len(b) - at - 1
		if n < 0x80 {
			b[at] = byte(n)
			continue
		}
		var l [binary.MaxVarintLen64]byte
		ln := protowire.AppendVarint(l[:0], uint64(n))
		b = append(b, ln[1:]...)
		copy(b[at+len(ln):], b[at+1:at+1+n])
		copy(b[at:], ln)
	}
	return b, true
}

// backendsSize is the length of appendBackends' output.
func backendsSize(bs []dataplane.Backend) int {
	n := 0
	for i := range bs {
		size, _ := backendSize(&bs[i])
		n += protowire.SizeTag(backendsField) + protowire.SizeBytes(size)
	}
	return n
}

// apiState is the API's value of a dataplane backend state.
func apiState(s dataplane.BackendState) (vipdv1.BackendState, bool) {
	switch s {
	case dataplane.BackendReady:
		return vipdv1.BackendState_BACKEND_STATE_READY, true
	case dataplane.BackendTerminating:
		return vipdv1.BackendState_BACKEND_STATE_TERMINATING, true
	case dataplane.BackendNotServing:
		return vipdv1.BackendState_BACKEND_STATE_NOT_SERVING, true
	}
	return 0, false
}

// ipLen is the length of a's text form.
func ipLen(a netip.Addr) int {
	var buf [64]byte
	return len(a.AppendTo(buf[:0]))
}

// backendSize is the length of appendBackend's output for b.
func backendSize(b *dataplane.Backend) (int, bool) {
	state, ok := apiState(b.State)
	if !ok {
		return 0, false
	}
	n := protowire.SizeTag(backendIPField) + protowire.SizeBytes(ipLen(b.IP))
	for k, v := range b.Ports {
		n += protowire.SizeTag(backendPortsField) + protowire.SizeBytes(mapEntrySize(k, v))
	}
	n += protowire.SizeTag(backendStateField) + protowire.SizeVarint(uint64(state))
	if b.Weight != 0 {
		n += protowire.SizeTag(backendWeightField) + protowire.SizeVarint(uint64(b.Weight))
	}
	if b.NodeLocal {
		n += protowire.SizeTag(backendNodeLocalField) + 1
	}
	if b.Zone != "" {
		n += protowire.SizeTag(backendZoneField) + protowire.SizeBytes(len(b.Zone))
	}
	if b.OnlyNamedPorts {
		n += protowire.SizeTag(backendOnlyNamedPortsField) + 1
	}
	return n, true
}

// mapEntrySize is the length of a ports map entry's message: protobuf
// writes a map entry's key and value even when they are zero.
func mapEntrySize(k string, v uint16) int {
	return protowire.SizeTag(1) + protowire.SizeBytes(len(k)) + protowire.SizeTag(2) + protowire.SizeVarint(uint64(v))
}

// appendBackend appends b as a vipd.v1.Backend message, without its tag
// and length, fields in number order and map keys sorted, as a
// deterministic proto.Marshal writes them. b's state is known
// (backendSize checked).
func appendBackend(out []byte, b *dataplane.Backend) []byte {
	out = protowire.AppendTag(out, backendIPField, protowire.BytesType)
	var buf [64]byte
	out = protowire.AppendBytes(out, b.IP.AppendTo(buf[:0]))
	if len(b.Ports) > 0 {
		var keysBuf [8]string
		keys := keysBuf[:0]
		for k := range b.Ports {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			v := b.Ports[k]
			out = protowire.AppendTag(out, backendPortsField, protowire.BytesType)
			out = protowire.AppendVarint(out, uint64(mapEntrySize(k, v)))
			out = protowire.AppendTag(out, 1, protowire.BytesType)
			out = protowire.AppendString(out, k)
			out = protowire.AppendTag(out, 2, protowire.VarintType)
			out = protowire.AppendVarint(out, uint64(v))
		}
	}
	state, _ := apiState(b.State)
	out = protowire.AppendTag(out, backendStateField, protowire.VarintType)
	out = protowire.AppendVarint(out, uint64(state))
	if b.Weight != 0 {
		out = protowire.AppendTag(out, backendWeightField, protowire.VarintType)
		out = protowire.AppendVarint(out, uint64(b.Weight))
	}
	if b.NodeLocal {
		out = protowire.AppendTag(out, backendNodeLocalField, protowire.VarintType)
		out = protowire.AppendVarint(out, 1)
	}
	if b.Zone != "" {
		out = protowire.AppendTag(out, backendZoneField, protowire.BytesType)
		out = protowire.AppendString(out, b.Zone)
	}
	if b.OnlyNamedPorts {
		out = protowire.AppendTag(out, backendOnlyNamedPortsField, protowire.VarintType)
		out = protowire.AppendVarint(out, 1)
	}
	return out
}
