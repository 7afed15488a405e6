package manifest

import (
	"fmt"
	"strings"
)

// Error is a problem with a service file: a document that cannot be decoded,
// an unknown field, a bad enum value, or a file with no services at all.
type Error struct {
	// Source names the input: a file name, or "stdin".
	Source string
	// Document is the 1-based index of the document among the source's
	// non-empty YAML documents; 0 when the error concerns the whole source.
	Document int
	// Line is the line the document starts on.
	Line int
	// Service names the service the error concerns, where known.
	Service string
	// Path is the field, such as "services[1].ports[0].protocol"; empty when
	// the error concerns the whole document or the decoder did not say.
	Path string
	// Err is the problem.
	Err error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.location())
	if e.Path != "" {
		b.WriteString(": ")
		b.WriteString(e.Path)
	}
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	return b.String()
}

// location is the source and document of e.
func (e *Error) location() string {
	var b strings.Builder
	b.WriteString(e.Source)
	if e.Document > 0 {
		fmt.Fprintf(&b, ": document %d", e.Document)
		var notes []string
		if e.Line > 1 {
			notes = append(notes, fmt.Sprintf("line %d", e.Line))
		}
		if e.Service != "" {
			notes = append(notes, fmt.Sprintf("service %q", e.Service))
		}
		if len(notes) > 0 {
			fmt.Fprintf(&b, " (%s)", strings.Join(notes, ", "))
		}
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// pathError is an error at a field path inside one document; the loader
// turns it into an *Error that also names the source and document.
type pathError struct {
	path string
	err  error
}

func (e *pathError) Error() string { return e.path + ": " + e.err.Error() }

func errorAt(path string, format string, args ...any) error {
	return &pathError{path: path, err: fmt.Errorf(format, args...)}
}

// joinPath appends a field name or an index ("[3]") to a path.
func joinPath(path, elem string) string {
	if path == "" || strings.HasPrefix(elem, "[") {
		return path + elem
	}
	return path + "." + elem
}
