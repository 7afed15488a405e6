package manifest

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	kjson "sigs.k8s.io/json"
)

// decodeStrict decodes obj, a decoded JSON tree (see decodeJSONTree), into
// a new T, a Kubernetes API struct, with the apiserver's own strict decoder
// (sigs.k8s.io/json): field names match case sensitively, a field T does
// not define is an error, and so is a value of the wrong JSON type; null
// leaves the zero value. Errors are *pathError values naming the field
// below path. Of several unknown fields the first in key order is named
// and the others listed; of several bad values the first in key order is
// named.
func decodeStrict[T any](obj map[string]any, path string) (*T, error) {
	data, err := json.Marshal(obj)
	if err != nil {
		return nil, &pathError{path: path, err: err}
	}
	out := new(T)
	strict, err := kjson.UnmarshalStrict(data, out, kjson.DisallowUnknownFields)
	if err != nil {
		// The decoder names a bad value's fields but not its list
		// indices or map keys, and a value that decodes itself (a
		// metav1.Time) not at all: find it by decoding its parts.
		at, lerr := locate(obj, func(v any) error {
			data, err := json.Marshal(v)
			if err != nil {
				return err
			}
			return kjson.UnmarshalCaseSensitivePreserveInts(data, new(T))
		})
		if lerr == nil { // not for the errors decoding can have
			at, lerr = "", err
		}
		return nil, &pathError{path: joinRelative(path, at), err: describe(lerr)}
	}
	if len(strict) > 0 {
		return nil, strictError(strict, path)
	}
	return out, nil
}

// strictError turns the strict errors of sigs.k8s.io/json, such as
// unknown field "spec.sessionAffinty", into a *pathError naming the first
// field; the fields of the next few follow in its message.
func strictError(errs []error, path string) error {
	at, problem, ok := fieldProblem(errs[0])
	if !ok {
		return &pathError{path: path, err: errors.Join(errs...)}
	}
	const listed = 5
	var more []string
	for i, err := range errs[1:] {
		if i == listed {
			more = append(more, fmt.Sprintf("and %d more", len(errs)-1-listed))
			break
		}
		switch p, pr, ok := fieldProblem(err); {
		case !ok:
			more = append(more, err.Error())
		case pr == problem:
			more = append(more, joinRelative(path, p))
		default:
			more = append(more, joinRelative(path, p)+": "+pr)
		}
	}
	if len(more) > 0 {
		problem += " (also " + strings.Join(more, ", ") + ")"
	}
	return &pathError{path: joinRelative(path, at), err: errors.New(problem)}
}

// fieldProblem splits a strict error of sigs.k8s.io/json, such as
// unknown field "spec.sessionAffinty", into its field path and problem.
func fieldProblem(err error) (path, problem string, ok bool) {
	var fe kjson.FieldError
	if !errors.As(err, &fe) {
		return "", "", false
	}
	path = fe.FieldPath()
	problem, ok = strings.CutSuffix(fe.Error(), " "+strconv.Quote(path))
	return path, problem, ok
}

// locate returns the path below v of the value that decode fails on, and
// decode's error for it alone; decode(w) decodes the document with w in
// place of v. A value is to blame itself when its empty form ({} or [])
// does not decode (a list where an object belongs), or when none of its
// parts fails alone. Parts are tried in key order, the order in which
// json.Marshal writes them and the decoder meets them.
func locate(v any, decode func(any) error) (string, error) {
	err := decode(v)
	if err == nil {
		return "", nil
	}
	switch v := v.(type) {
	case map[string]any:
		if decode(map[string]any{}) != nil {
			return "", err
		}
		for _, k := range slices.Sorted(maps.Keys(v)) {
			at, kerr := locate(v[k], func(w any) error { return decode(map[string]any{k: w}) })
			if kerr != nil {
				return joinRelative(keyElem(k), at), kerr
			}
		}
	case []any:
		if decode([]any{}) != nil {
			return "", err
		}
		for i, item := range v {
			at, ierr := locate(item, func(w any) error { return decode([]any{w}) })
			if ierr != nil {
				return joinRelative(fmt.Sprintf("[%d]", i), at), ierr
			}
		}
	}
	return "", err
}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// keyElem is the path element of an object key: .key, as sigs.k8s.io/json
// writes field names, or ["key"] where that would be ambiguous, as for
// the label key kubernetes.io/service-name.
func keyElem(k string) string {
	if identifier.MatchString(k) {
		return k
	}
	return fmt.Sprintf("[%q]", k)
}

// joinRelative appends rel, a path below path, to path.
func joinRelative(path, rel string) string {
	if rel == "" {
		return path
	}
	return joinPath(path, rel)
}

// describe says in JSON terms what the decoder's err means for a value.
func describe(err error) error {
	var te *json.UnmarshalTypeError
	var pe *time.ParseError
	switch {
	case errors.As(err, &te):
		return fmt.Errorf("want %s, got %s", wantJSON(te), gotJSON(te.Value))
	case errors.As(err, &pe):
		return fmt.Errorf("want an RFC 3339 time such as 2006-01-02T15:04:05Z, got %q", pe.Value)
	}
	return err
}

// wantJSON names the JSON values that the Go type of te takes.
func wantJSON(te *json.UnmarshalTypeError) string {
	number := strings.HasPrefix(te.Value, "number ") // a number, but out of range or not whole
	switch t := te.Type; t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if number {
			return fmt.Sprintf("a whole number from %d to %d", -(int64(1) << (t.Bits() - 1)), int64(1)<<(t.Bits()-1)-1)
		}
		return "a number"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if number {
			return fmt.Sprintf("a whole number from 0 to %d", uint64(1)<<t.Bits()-1)
		}
		return "a number"
	case reflect.Float32, reflect.Float64:
		if number {
			return fmt.Sprintf("a number in the range of float%d", t.Bits())
		}
		return "a number"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "a list"
	default:
		return t.String()
	}
}

// gotJSON names a JSON value as UnmarshalTypeError.Value describes it.
func gotJSON(value string) string {
	switch value {
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "array":
		return "a list"
	case "object":
		return "an object"
	case "number":
		return "a number"
	}
	return strings.TrimPrefix(value, "number ")
}
