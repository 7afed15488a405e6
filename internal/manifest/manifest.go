package manifest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"
)

// Stdin is the source name of standard input, which LoadFile reads for "-".
const Stdin = "stdin"

// LoadFile reads the services in the file at path, or in standard input when
// path is "-". See Load.
func LoadFile(path string) ([]*vipdv1.Service, error) {
	if path == "-" {
		return Load(os.Stdin, Stdin)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Load(f, path)
}

// Load reads the services in r, in the order they are written; source names
// r in errors. Decoding errors are *Error values. An input with no documents
// (empty, or only comments) is an error, so that a mistaken file cannot
// prune everything; an explicit empty list yields no services and no error.
func Load(r io.Reader, source string) ([]*vipdv1.Service, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", source, err)
	}
	l := loader{source: source}
	for _, d := range splitDocuments(data) {
		if err := l.document(d); err != nil {
			return nil, err
		}
	}
	if l.documents == 0 {
		return nil, &Error{Source: source, Err: errors.New("no services found")}
	}
	kube, err := fromKubernetes(l.kube)
	if err != nil {
		return nil, err
	}
	return append(l.services, kube...), nil
}

// loader collects the services of one source, document by document.
type loader struct {
	source    string
	documents int // non-empty documents seen
	services  []*vipdv1.Service
	kube      []kubeObject
}

// rawDocument is one YAML document of a source and the line it starts on.
type rawDocument struct {
	line int
	data []byte
}

// splitDocuments cuts data at YAML document separators: lines that are
// "---", optionally followed by spaces. The first document need not start
// with one.
func splitDocuments(data []byte) []rawDocument {
	var (
		docs  []rawDocument
		cur   bytes.Buffer
		start = 1
		line  = 0
	)
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, len(data)+1)
	for sc.Scan() {
		line++
		if strings.TrimRight(sc.Text(), " \t\r") == "---" {
			docs = append(docs, rawDocument{line: start, data: bytes.Clone(cur.Bytes())})
			cur.Reset()
			start = line + 1
			continue
		}
		cur.Write(sc.Bytes())
		cur.WriteByte('\n')
	}
	return append(docs, rawDocument{line: start, data: cur.Bytes()})
}

// document decodes one document: null (empty), a service, a list of
// services, an object {services: [...]}, or a Kubernetes object.
func (l *loader) document(d rawDocument) error {
	v, err := decodeJSONTree(d.data, d.line)
	if err != nil {
		return &Error{Source: l.source, Document: l.documents + 1, Line: d.line, Err: err}
	}
	if v == nil {
		return nil
	}
	l.documents++
	at := position{source: l.source, document: l.documents, line: d.line}
	switch v := v.(type) {
	case []any:
		return l.items(v, "", at)
	case map[string]any:
		list, ok := v["services"]
		if !ok {
			return l.item(v, "", at)
		}
		// Service has no field "services", so this is a wrapper object.
		for k := range v {
			if k != "services" {
				return at.errorf(k, "unknown field (an object with \"services\" may have no other fields)")
			}
		}
		if list == nil {
			return nil
		}
		items, ok := list.([]any)
		if !ok {
			return at.errorf("services", "want a list, got %s", jsonType(list))
		}
		return l.items(items, "services", at)
	}
	return at.errorf("", "want a service, a list of services or {services: [...]}, got %s", jsonType(v))
}

func (l *loader) items(items []any, path string, at position) error {
	for i, item := range items {
		if err := l.item(item, joinPath(path, fmt.Sprintf("[%d]", i)), at); err != nil {
			return err
		}
	}
	return nil
}

// item decodes one object that is a service or a Kubernetes object.
func (l *loader) item(v any, path string, at position) error {
	obj, ok := v.(map[string]any)
	if !ok {
		return at.errorf(path, "want a service object, got %s", jsonType(v))
	}
	if k, ok := asKubernetes(obj, path, at); ok {
		l.kube = append(l.kube, k)
		return nil
	}
	svc, err := decodeService(obj, path)
	if err != nil {
		return at.wrap(err)
	}
	l.services = append(l.services, svc)
	return nil
}

// decodeService turns the decoded JSON of one service into a Service.
func decodeService(obj map[string]any, path string) (*vipdv1.Service, error) {
	svc := &vipdv1.Service{}
	if err := normalize(obj, svc.ProtoReflect().Descriptor(), path); err != nil {
		return nil, err
	}
	data, err := json.Marshal(obj)
	if err != nil {
		return nil, &pathError{path: path, err: err}
	}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(data, svc); err != nil {
		return nil, &pathError{path: path, err: errors.New(cleanProtojsonError(err))}
	}
	return svc, nil
}

// protojsonNoise matches what protojson puts in its messages that means
// nothing to the user: its prefix, and a position in JSON that we made.
var protojsonNoise = regexp.MustCompile(`^proto:[\s\x{00a0}]*|[\s\x{00a0}]*\(line \d+:\d+\)`)

func cleanProtojsonError(err error) string {
	return strings.TrimLeft(protojsonNoise.ReplaceAllString(err.Error(), ""), ": ")
}

// decodeJSONTree decodes a YAML or JSON document into a tree of
// map[string]any, []any, string, json.Number, bool and nil. YAML errors get
// line numbers counted from the start of the source, not of the document.
func decodeJSONTree(data []byte, firstLine int) (any, error) {
	js := bytes.TrimSpace(data)
	// JSON is decoded as is: YAML would take it too, but not all of it
	// (tabs for indentation, for one).
	if len(js) == 0 || (js[0] != '{' && js[0] != '[') || !json.Valid(js) {
		var err error
		if js, err = yaml.YAMLToJSON(data); err != nil {
			return nil, errors.New(yamlErrorLines(err.Error(), firstLine))
		}
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	return v, nil
}

var yamlLine = regexp.MustCompile(`line (\d+)`)

// yamlErrorLines shifts the "line N" of a YAML error message so that it
// counts from the start of the source.
func yamlErrorLines(msg string, firstLine int) string {
	msg = strings.TrimPrefix(msg, "error converting YAML to JSON: ")
	return yamlLine.ReplaceAllStringFunc(msg, func(s string) string {
		n, err := strconv.Atoi(strings.TrimPrefix(s, "line "))
		if err != nil {
			return s
		}
		return fmt.Sprintf("line %d", n+firstLine-1)
	})
}

// position is where a document is, for errors.
type position struct {
	source   string
	document int
	line     int
}

func (p position) errorf(path, format string, args ...any) error {
	return &Error{Source: p.source, Document: p.document, Line: p.line, Path: path, Err: fmt.Errorf(format, args...)}
}

// wrap places err, a *pathError or another error from decoding, in the document.
func (p position) wrap(err error) error {
	e := &Error{Source: p.source, Document: p.document, Line: p.line, Err: err}
	var pe *pathError
	if errors.As(err, &pe) {
		e.Path, e.Err = pe.path, pe.err
	}
	return e
}
