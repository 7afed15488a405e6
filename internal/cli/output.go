package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"sigs.k8s.io/yaml"
)

// The formats of -o/--output.
const (
	outputTable = "table"
	outputJSON  = "json"
	outputYAML  = "yaml"
)

var outputFormats = []string{outputTable, outputJSON, outputYAML}

// printer writes results to standard output in the format chosen with -o.
type printer struct {
	w      io.Writer
	format string
}

// show writes a result: for -o table by calling view, otherwise as JSON or
// YAML of msg, which is vipd's answer (or a list of answers), so that the
// machine formats are the API's own. JSON and YAML of a service can be fed
// back to "vipctl apply -f".
func (p printer) show(msg proto.Message, view func(*table)) error {
	if p.format == outputTable {
		t := newTable(p.w)
		view(t)
		return t.flush()
	}
	b, err := encode(msg, p.format)
	if err != nil {
		return err
	}
	_, err = p.w.Write(b)
	return err
}

// encode is msg as JSON, or as YAML when format is "yaml". The JSON is the
// API's canonical JSON (protojson: lowerCamel field names, as grpcurl
// prints them), except that a list field of msg itself is printed when
// empty too ({"services": []}, not {}), and it is indented by
// encoding/json: protojson varies its whitespace on purpose, and scripts
// may diff our output.
func encode(msg proto.Message, format string) ([]byte, error) {
	compact, err := marshalJSON(msg)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, compact, "", "  "); err != nil {
		return nil, fmt.Errorf("indent json: %w", err)
	}
	buf.WriteByte('\n')
	if format != outputYAML {
		return buf.Bytes(), nil
	}
	y, err := yaml.JSONToYAML(buf.Bytes())
	if err != nil {
		return nil, fmt.Errorf("convert json to yaml: %w", err)
	}
	return y, nil
}

// marshalJSON is msg in protojson, with msg's own list fields present
// even when empty, in the order protojson writes fields.
func marshalJSON(msg proto.Message) ([]byte, error) {
	m := msg.ProtoReflect()
	md := m.Descriptor()
	if md.ParentFile().Package() == "google.protobuf" {
		// A well-known type has a JSON form of its own.
		return marshalOne(msg)
	}
	var fields [][]byte
	for i := range md.Fields().Len() {
		fd := md.Fields().Get(i)
		switch {
		case fd.IsList() && !m.Has(fd):
			fields = append(fields, []byte(strconv.Quote(fd.JSONName())+":[]"))
		case m.Has(fd):
			one := m.New()
			one.Set(fd, m.Get(fd))
			b, err := marshalOne(one.Interface())
			if err != nil {
				return nil, err
			}
			var buf bytes.Buffer
			if err := json.Compact(&buf, b); err != nil {
				return nil, fmt.Errorf("compact json: %w", err)
			}
			fields = append(fields, bytes.TrimSuffix(bytes.TrimPrefix(buf.Bytes(), []byte("{")), []byte("}")))
		}
	}
	return slices.Concat([]byte("{"), bytes.Join(fields, []byte(",")), []byte("}")), nil
}

// marshalOne is msg in protojson.
func marshalOne(msg proto.Message) ([]byte, error) {
	b, err := protojson.Marshal(msg)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", msg.ProtoReflect().Descriptor().FullName(), err)
	}
	return b, nil
}

// listOf is {key: [items...]}, for results that are no single API message,
// with each item in the form encode gives it.
func listOf[M proto.Message](key string, items []M) (*structpb.Struct, error) {
	list := &structpb.ListValue{}
	for _, item := range items {
		b, err := marshalOne(item)
		if err != nil {
			return nil, err
		}
		v := &structpb.Value{}
		if err := protojson.Unmarshal(b, v); err != nil {
			return nil, fmt.Errorf("decode %s as a value: %w", item.ProtoReflect().Descriptor().FullName(), err)
		}
		list.Values = append(list.Values, v)
	}
	return &structpb.Struct{Fields: map[string]*structpb.Value{key: structpb.NewListValue(list)}}, nil
}

// table lays out rows in aligned columns; every table and key/value view of
// vipctl goes through it.
type table struct {
	tw  *tabwriter.Writer
	err error // the first write error
}

func newTable(w io.Writer) *table {
	return &table{tw: tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)}
}

// row writes one row. An empty cell is shown as "-", so that every row has
// the same number of words for awk.
func (t *table) row(cells ...string) {
	for i, c := range cells {
		if c == "" {
			cells[i] = "-"
		}
	}
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

// field writes a "Key:  value" row of a key/value view.
func (t *table) field(key, value string) {
	t.row(key+":", value)
}

// section ends the rows aligned so far: the rows that follow get columns of
// their own, as a backends table does below a key/value view.
func (t *table) section() {
	if err := t.tw.Flush(); err != nil && t.err == nil {
		t.err = err
	}
}

func (t *table) flush() error {
	t.section()
	return t.err
}
