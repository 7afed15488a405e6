package validation

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// ResolvePath checks that path, in the syntax of Violation.Field, names a
// field of msg, the request the violation is about. The syntax is the
// .proto field names joined by ".", each optionally followed by list
// indices ("ports[1]") or quoted map keys (`labels["app"]`), as in
// "service.backends[3].ports[\"http\"]". Every index must be inside its
// list and every key in its map; the last field may be unset. It is the
// contract the server's field violations keep, which tests and fuzz targets
// check every violation against.
func ResolvePath(msg proto.Message, path string) error {
	if path == "" {
		return errors.New("empty field path")
	}
	m := msg.ProtoReflect()
	rest := path
	for {
		name := fieldName(rest)
		if name == "" {
			return fmt.Errorf("field path %q: want a field name at %q", path, rest)
		}
		rest = rest[len(name):]
		fd := m.Descriptor().Fields().ByName(protoreflect.Name(name))
		if fd == nil {
			return fmt.Errorf("field path %q: %s has no field %q", path, m.Descriptor().FullName(), name)
		}
		v := m.Get(fd)
		var next protoreflect.Message // the message the path goes on in, if any
		switch {
		case fd.IsList() && strings.HasPrefix(rest, "["):
			end := strings.IndexByte(rest, ']')
			if end < 0 {
				return fmt.Errorf("field path %q: unclosed index at %q", path, rest)
			}
			i, err := strconv.Atoi(rest[1:end])
			if err != nil || i < 0 || rest[1] == '+' || rest[1] == '0' && end > 2 {
				return fmt.Errorf("field path %q: bad index %q", path, rest[:end+1])
			}
			if n := v.List().Len(); i >= n {
				return fmt.Errorf("field path %q: %s has %d elements, no [%d]", path, name, n, i)
			}
			rest = rest[end+1:]
			if fd.Kind() == protoreflect.MessageKind {
				next = v.List().Get(i).Message()
			}
		case fd.IsMap() && strings.HasPrefix(rest, "["):
			quoted, err := strconv.QuotedPrefix(rest[1:])
			if err != nil || !strings.HasPrefix(rest[1+len(quoted):], "]") {
				return fmt.Errorf("field path %q: want a quoted key in [] at %q", path, rest)
			}
			key, _ := strconv.Unquote(quoted)
			if fd.MapKey().Kind() != protoreflect.StringKind {
				return fmt.Errorf("field path %q: %s has keys of kind %s, not strings", path, name, fd.MapKey().Kind())
			}
			mk := protoreflect.ValueOfString(key).MapKey()
			if !v.Map().Has(mk) {
				return fmt.Errorf("field path %q: %s has no key %q", path, name, key)
			}
			rest = rest[1+len(quoted)+1:]
			if fd.MapValue().Kind() == protoreflect.MessageKind {
				next = v.Map().Get(mk).Message()
			}
		case !fd.IsList() && !fd.IsMap() && fd.Kind() == protoreflect.MessageKind:
			next = v.Message()
		}
		switch {
		case rest == "":
			return nil
		case rest[0] != '.':
			return fmt.Errorf("field path %q: unexpected %q after %s", path, rest, name)
		case next == nil:
			return fmt.Errorf("field path %q: %s has no fields", path, name)
		}
		m, rest = next, rest[1:]
	}
}

// fieldName is the .proto field name at the start of s, or "".
func fieldName(s string) string {
	for i, r := range s {
		switch {
		case r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z':
		case r >= '0' && r <= '9' && i > 0:
		default:
			return s[:i]
		}
	}
	return s
}
