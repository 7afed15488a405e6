package manifest

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// normalize prepares obj, the decoded JSON of a message md, for protojson: it
// walks the fields that md defines and rewrites short enum spellings to
// their full names in place. It fails on a field md does not define, on an
// unknown enum value, and where a list or object is not one, naming the
// field's path. Scalars are left for protojson to check.
func normalize(obj map[string]any, md protoreflect.MessageDescriptor, path string) error {
	fields := md.Fields()
	// Sorted, so that of several problems the same one is reported each time.
	for _, key := range slices.Sorted(maps.Keys(obj)) {
		fp := joinPath(path, key)
		fd := fields.ByJSONName(key)
		if fd == nil {
			fd = fields.ByName(protoreflect.Name(key))
		}
		if fd == nil {
			return errorAt(fp, "unknown field")
		}
		v := obj[key]
		if v == nil {
			continue // protojson reads null as "not set"
		}
		switch {
		case fd.IsMap():
			m, ok := v.(map[string]any)
			if !ok {
				return errorAt(fp, "want an object, got %s", jsonType(v))
			}
			for k, mv := range m {
				nv, err := normalizeValue(mv, fd.MapValue(), joinPath(fp, "["+strconv.Quote(k)+"]"))
				if err != nil {
					return err
				}
				m[k] = nv
			}
		case fd.IsList():
			list, ok := v.([]any)
			if !ok {
				return errorAt(fp, "want a list, got %s", jsonType(v))
			}
			for i, item := range list {
				nv, err := normalizeValue(item, fd, joinPath(fp, fmt.Sprintf("[%d]", i)))
				if err != nil {
					return err
				}
				list[i] = nv
			}
		default:
			nv, err := normalizeValue(v, fd, fp)
			if err != nil {
				return err
			}
			obj[key] = nv
		}
	}
	return nil
}

// normalizeValue normalizes one singular value of field fd: a message is
// walked, an enum spelled as a string gets its full name.
func normalizeValue(v any, fd protoreflect.FieldDescriptor, path string) (any, error) {
	if v == nil {
		return nil, nil
	}
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		if fd.Message().ParentFile().Package() == "google.protobuf" {
			return v, nil // well-known types have JSON forms of their own
		}
		m, ok := v.(map[string]any)
		if !ok {
			return nil, errorAt(path, "want an object, got %s", jsonType(v))
		}
		return m, normalize(m, fd.Message(), path)
	case protoreflect.EnumKind:
		s, ok := v.(string)
		if !ok {
			return v, nil // a number, which protojson accepts and checks
		}
		n, err := ParseEnum(fd.Enum(), s)
		if err != nil {
			return nil, &pathError{path: path, err: err}
		}
		return string(fd.Enum().Values().ByNumber(n).Name()), nil
	}
	return v, nil
}

// jsonType names the JSON type of a value decoded with UseNumber.
func jsonType(v any) string {
	switch v.(type) {
	case map[string]any:
		return "an object"
	case []any:
		return "a list"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return "a number"
}

// badValuePath returns the path of the value in obj, a normalized message
// md at path, that protojson rejects: the first field in key order that
// fails alone, then, inside it, the list item, map entry or message field
// that does. It is path itself when no part fails alone. protojson names
// the field it rejects but not where it is.
func badValuePath(obj map[string]any, md protoreflect.MessageDescriptor, path string) string {
	fields := md.Fields()
	for _, key := range slices.Sorted(maps.Keys(obj)) {
		if decodes(md, map[string]any{key: obj[key]}) {
			continue
		}
		fp := joinPath(path, key)
		fd := fields.ByJSONName(key)
		if fd == nil {
			fd = fields.ByName(protoreflect.Name(key))
		}
		if fd == nil {
			return fp
		}
		switch v := obj[key].(type) {
		case []any:
			for i, item := range v {
				if !decodes(md, map[string]any{key: []any{item}}) {
					return valuePath(item, fd, joinPath(fp, fmt.Sprintf("[%d]", i)))
				}
			}
		case map[string]any:
			if fd.IsMap() {
				for _, k := range slices.Sorted(maps.Keys(v)) {
					if !decodes(md, map[string]any{key: map[string]any{k: v[k]}}) {
						return valuePath(v[k], fd.MapValue(), joinPath(fp, "["+strconv.Quote(k)+"]"))
					}
				}
				return fp
			}
			return valuePath(v, fd, fp)
		}
		return fp
	}
	return path
}

// valuePath descends into v, a value of field fd at path, when it is a
// message of this API.
func valuePath(v any, fd protoreflect.FieldDescriptor, path string) string {
	m, ok := v.(map[string]any)
	if !ok || fd.Message() == nil || fd.Message().ParentFile().Package() == "google.protobuf" {
		return path
	}
	return badValuePath(m, fd.Message(), path)
}

// decodes reports whether protojson takes obj as a message md.
func decodes(md protoreflect.MessageDescriptor, obj map[string]any) bool {
	data, err := json.Marshal(obj)
	if err != nil {
		return false
	}
	return protojson.Unmarshal(data, dynamicpb.NewMessage(md)) == nil
}
