package manifest

import (
	"fmt"
	"strings"
	"unicode"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// ParseEnum finds the value of enum ed that s names. Besides the full name
// (PROTOCOL_UDP), it accepts the name without the enum's prefix (udp), and
// ignores case, "_" and "-" in both: not_serving, notServing, not-serving
// and NOT_SERVING are all BACKEND_STATE_NOT_SERVING. The error lists the
// short names.
func ParseEnum(ed protoreflect.EnumDescriptor, s string) (protoreflect.EnumNumber, error) {
	want := foldEnum(s)
	prefix := enumPrefix(ed)
	values := ed.Values()
	for i := range values.Len() {
		name := string(values.Get(i).Name())
		if want == foldEnum(name) || want == foldEnum(strings.TrimPrefix(name, prefix)) {
			return values.Get(i).Number(), nil
		}
	}
	return 0, fmt.Errorf("unknown value %q (want %s)", s, strings.Join(ShortEnumNames(ed), ", "))
}

// ShortEnumName is the short spelling of value n of enum ed, such as "udp"
// or "not-serving": lower case, without the enum's prefix, words joined by
// "-" as in vipctl's flags. It is the full name for a number the enum does
// not define.
func ShortEnumName(ed protoreflect.EnumDescriptor, n protoreflect.EnumNumber) string {
	v := ed.Values().ByNumber(n)
	if v == nil {
		return fmt.Sprint(int32(n))
	}
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(string(v.Name()), enumPrefix(ed))), "_", "-")
}

// ShortEnumNames lists the short spellings of ed's values, in number order,
// leaving out the zero value, which only means "the default".
func ShortEnumNames(ed protoreflect.EnumDescriptor) []string {
	var names []string
	values := ed.Values()
	for i := range values.Len() {
		if n := values.Get(i).Number(); n != 0 {
			names = append(names, ShortEnumName(ed, n))
		}
	}
	return names
}

// enumPrefix is the prefix that protobuf style puts on every value of ed:
// the enum's name in upper snake case, such as "BACKEND_STATE_".
func enumPrefix(ed protoreflect.EnumDescriptor) string {
	return upperSnake(string(ed.Name())) + "_"
}

// upperSnake turns a CamelCase name into UPPER_SNAKE_CASE.
func upperSnake(s string) string {
	name := []rune(s)
	var b strings.Builder
	for i, r := range name {
		// A word starts at an upper-case letter after a lower-case one, or
		// at the last capital of an acronym: "IPFamily" is IP_FAMILY.
		if i > 0 && unicode.IsUpper(r) &&
			(unicode.IsLower(name[i-1]) || i+1 < len(name) && unicode.IsLower(name[i+1])) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToUpper(r))
	}
	return b.String()
}

// foldEnum is s in lower case without "_" and "-", so that spellings that
// differ only in case and separators compare equal.
func foldEnum(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '_' || r == '-' {
			return -1
		}
		return unicode.ToLower(r)
	}, s)
}
