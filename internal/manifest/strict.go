package manifest

import (
	"encoding"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// decodeStrict decodes obj, a decoded JSON tree (see decodeJSONTree), into
// out, a pointer to a Kubernetes API struct, the way the apiserver's strict
// decoding does: a field the struct does not define, matched case
// sensitively, is an error, and so is a value of the wrong JSON type.
// Errors are *pathError values naming the field below path.
func decodeStrict(obj map[string]any, out any, path string) error {
	if err := checkJSON(obj, reflect.TypeOf(out).Elem(), path); err != nil {
		return err
	}
	data, err := json.Marshal(obj)
	if err != nil {
		return &pathError{path: path, err: err}
	}
	// checkJSON has seen every value, so this fails only where a type's
	// own decoder refuses a value of the right JSON type.
	if err := json.Unmarshal(data, out); err != nil {
		return &pathError{path: path, err: err}
	}
	return nil
}

var (
	jsonUnmarshalerType = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
	intOrStringType     = reflect.TypeFor[intstr.IntOrString]()
	timeType            = reflect.TypeFor[metav1.Time]()
	microTimeType       = reflect.TypeFor[metav1.MicroTime]()
)

// checkJSON checks v, a JSON value, against Go type t as encoding/json
// would decode it, naming path in errors. null is accepted anywhere (it
// leaves the zero value). Values that a type decodes itself
// (json.Unmarshaler) are checked for the types Service and EndpointSlice
// use, and otherwise left to it.
func checkJSON(v any, t reflect.Type, path string) error {
	if v == nil {
		return nil
	}
	switch t {
	case intOrStringType:
		switch v := v.(type) {
		case string:
			return nil
		case json.Number:
			return checkInt(v, 32, path)
		}
		return errorAt(path, "want a number or a string, got %s", jsonType(v))
	case timeType, microTimeType:
		s, ok := v.(string)
		if !ok {
			return errorAt(path, "want a time (a string), got %s", jsonType(v))
		}
		if _, err := time.Parse(time.RFC3339, s); err != nil {
			return errorAt(path, "want an RFC 3339 time such as 2006-01-02T15:04:05Z, got %q", s)
		}
		return nil
	}
	if t.Kind() == reflect.Pointer {
		return checkJSON(v, t.Elem(), path)
	}
	pt := reflect.PointerTo(t)
	if pt.Implements(jsonUnmarshalerType) {
		return nil // such as FieldsV1, which holds any JSON
	}
	if pt.Implements(textUnmarshalerType) {
		if _, ok := v.(string); !ok {
			return errorAt(path, "want a string, got %s", jsonType(v))
		}
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return errorAt(path, "want an object, got %s", jsonType(v))
		}
		fields := jsonFields(t)
		// Sorted, so that of several problems the same one is reported each time.
		for _, key := range slices.Sorted(maps.Keys(obj)) {
			fp := joinPath(path, key)
			ft, ok := fields[key]
			if !ok {
				return errorAt(fp, "unknown field")
			}
			if err := checkJSON(obj[key], ft, fp); err != nil {
				return err
			}
		}
	case reflect.Map:
		obj, ok := v.(map[string]any)
		if !ok {
			return errorAt(path, "want an object, got %s", jsonType(v))
		}
		for _, key := range slices.Sorted(maps.Keys(obj)) {
			if err := checkJSON(obj[key], t.Elem(), joinPath(path, "["+strconv.Quote(key)+"]")); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			if _, ok := v.(string); !ok {
				return errorAt(path, "want a base64 string, got %s", jsonType(v))
			}
			return nil
		}
		list, ok := v.([]any)
		if !ok {
			return errorAt(path, "want a list, got %s", jsonType(v))
		}
		for i, item := range list {
			if err := checkJSON(item, t.Elem(), joinPath(path, fmt.Sprintf("[%d]", i))); err != nil {
				return err
			}
		}
	case reflect.String:
		if _, ok := v.(string); !ok {
			return errorAt(path, "want a string, got %s", jsonType(v))
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			return errorAt(path, "want true or false, got %s", jsonType(v))
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, ok := v.(json.Number)
		if !ok {
			return errorAt(path, "want a number, got %s", jsonType(v))
		}
		return checkInt(n, t.Bits(), path)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n, ok := v.(json.Number)
		if !ok {
			return errorAt(path, "want a number, got %s", jsonType(v))
		}
		if _, err := strconv.ParseUint(n.String(), 10, t.Bits()); err != nil {
			return errorAt(path, "want a whole number from 0 to %d, got %s", uint64(1)<<t.Bits()-1, n)
		}
	case reflect.Float32, reflect.Float64:
		n, ok := v.(json.Number)
		if !ok {
			return errorAt(path, "want a number, got %s", jsonType(v))
		}
		if _, err := strconv.ParseFloat(n.String(), t.Bits()); err != nil {
			return errorAt(path, "number %s is out of range", n)
		}
	}
	// Interfaces take any value; other kinds do not occur in JSON types.
	return nil
}

func checkInt(n json.Number, bits int, path string) error {
	if _, err := strconv.ParseInt(n.String(), 10, bits); err != nil {
		return errorAt(path, "want a whole number from %d to %d, got %s", -(int64(1) << (bits - 1)), int64(1)<<(bits-1)-1, n)
	}
	return nil
}

// fieldCache maps a struct type to its jsonFields.
var fieldCache sync.Map // reflect.Type → map[string]reflect.Type

// jsonFields maps the JSON names of struct t's fields, as encoding/json
// names them, to their types: the tag's name, else the Go name; fields of
// untagged embedded structs (json:",inline" in Kubernetes types) are
// promoted, and a field of the struct itself hides a promoted one.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	if f, ok := fieldCache.Load(t); ok {
		return f.(map[string]reflect.Type)
	}
	fields := map[string]reflect.Type{}
	var promoted []reflect.Type
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			et := f.Type
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				promoted = append(promoted, et)
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		fields[name] = f.Type
	}
	for _, et := range promoted {
		for name, ft := range jsonFields(et) {
			if _, ok := fields[name]; !ok {
				fields[name] = ft
			}
		}
	}
	fieldCache.Store(t, fields)
	return fields
}
