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
	"slices"
	"strconv"
	"strings"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"
)

// Stdin is the source name of standard input, which LoadFile reads for "-".
const Stdin = "stdin"

// Options are the inputs of a load that the files do not give.
type Options struct {
	// NodeName is the name of the node the services are for: endpoints of
	// Kubernetes EndpointSlices whose nodeName equals it are node-local
	// (what internalTrafficPolicy: Local keeps). Empty means none is.
	NodeName string
}

// Result is what a Loader read.
type Result struct {
	// Services are the vipd services, those written as such first, in the
	// order of the sources and documents, then those converted from
	// Kubernetes Services, in name order.
	Services []*vipdv1.Service
	// Origins[i] is where Services[i] was read.
	Origins []Origin
	// Notes say what was read but left out, one sentence each, such as
	// "skipped Service default/db: it is headless (clusterIP: None): ...":
	// for the user to see, not errors.
	Notes []string
}

// Loader reads the services of one or more sources, such as the files of
// one "vipctl apply". Kubernetes objects are converted together once every
// source is read, so that a Service and its EndpointSlices may come in
// different sources. A Loader is not safe for concurrent use.
type Loader struct {
	opts     Options
	services []*vipdv1.Service
	origins  []Origin
	kube     kubeObjects
}

// NewLoader returns a Loader that reads with opts.
func NewLoader(opts Options) *Loader { return &Loader{opts: opts} }

// ReadFile reads the file at path, or standard input when path is "-". See
// Read.
func (l *Loader) ReadFile(path string) error {
	if path == "-" {
		return l.Read(os.Stdin, Stdin)
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return l.Read(f, path)
}

// Read reads the documents in r; source names r in errors. Decoding errors
// are *Error values, and on error nothing of r is kept. A source with no
// documents (empty, or only comments) is an error, so that a mistaken file
// cannot prune everything; an explicit empty list adds no services and no
// error.
func (l *Loader) Read(r io.Reader, source string) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return fmt.Errorf("read %s: %w", source, err)
	}
	sr := reader{source: source, kube: l.kube.clone()}
	for _, d := range splitDocuments(data) {
		if err := sr.document(d); err != nil {
			return err
		}
	}
	if sr.documents == 0 {
		return &Error{Source: source, Err: errors.New("no services found")}
	}
	l.services = append(l.services, sr.services...)
	l.origins = append(l.origins, sr.origins...)
	l.kube = sr.kube
	return nil
}

// Result converts the Kubernetes objects read (see the package
// documentation) and returns every service read, with notes on what was
// left out. A Kubernetes Service that cannot be converted is an *Error
// naming where it was read. Result does not change the Loader.
func (l *Loader) Result() (*Result, error) {
	kube, kubeOrigins, notes, err := l.kube.convert(l.opts)
	if err != nil {
		return nil, err
	}
	svcs := append(slices.Clip(l.services), kube...)
	origins := append(slices.Clip(l.origins), kubeOrigins...)
	return &Result{Services: svcs, Origins: origins, Notes: notes}, nil
}

// LoadFile reads the services in the file at path, or in standard input when
// path is "-". See Load.
func LoadFile(path string) ([]*vipdv1.Service, error) {
	l := NewLoader(Options{})
	if err := l.ReadFile(path); err != nil {
		return nil, err
	}
	return results(l)
}

// Load reads the services in r, in the order they are written, then those
// converted from Kubernetes objects, with no node name and without notes;
// source names r in errors. It is Loader.Read and Loader.Result for one
// source.
func Load(r io.Reader, source string) ([]*vipdv1.Service, error) {
	l := NewLoader(Options{})
	if err := l.Read(r, source); err != nil {
		return nil, err
	}
	return results(l)
}

func results(l *Loader) ([]*vipdv1.Service, error) {
	res, err := l.Result()
	if err != nil {
		return nil, err
	}
	return res.Services, nil
}

// reader reads the documents of one source.
type reader struct {
	source    string
	documents int // non-empty documents seen
	services  []*vipdv1.Service
	origins   []Origin
	kube      kubeObjects
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
func (l *reader) document(d rawDocument) error {
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

func (l *reader) items(items []any, path string, at position) error {
	for i, item := range items {
		if err := l.item(item, joinPath(path, fmt.Sprintf("[%d]", i)), at); err != nil {
			return err
		}
	}
	return nil
}

// item decodes one object that is a service or a Kubernetes object.
func (l *reader) item(v any, path string, at position) error {
	obj, ok := v.(map[string]any)
	if !ok {
		return at.errorf(path, "want a service object, got %s", jsonType(v))
	}
	if isKubernetes(obj) {
		return l.kube.add(obj, path, at)
	}
	// The name, if it is one, tells the user which service an error is
	// about when the document holds a list.
	name, _ := obj["name"].(string)
	svc, err := decodeService(obj, path)
	if err != nil {
		e := at.wrap(err)
		e.Service = name
		return e
	}
	l.services = append(l.services, svc)
	l.origins = append(l.origins, Origin{Source: at.source, Document: at.document, Line: at.line, Path: path})
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
		return nil, &pathError{path: badValuePath(obj, svc.ProtoReflect().Descriptor(), path), err: errors.New(cleanProtojsonError(err))}
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

// String says where p is, as an Error does: "svc.yaml: document 2 (line 5)".
func (p position) String() string {
	return (&Error{Source: p.source, Document: p.document, Line: p.line}).location()
}

func (p position) errorf(path, format string, args ...any) error {
	return &Error{Source: p.source, Document: p.document, Line: p.line, Path: path, Err: fmt.Errorf(format, args...)}
}

// wrap places err, a *pathError or another error from decoding, in the document.
func (p position) wrap(err error) *Error {
	e := &Error{Source: p.source, Document: p.document, Line: p.line, Err: err}
	var pe *pathError
	if errors.As(err, &pe) {
		e.Path, e.Err = pe.path, pe.err
	}
	return e
}

// Origin is where a service was read, so that a problem found later, such
// as a field that vipd rejects, can be reported where the user wrote it.
type Origin struct {
	Source   string
	Document int
	Line     int
	// Path is the service's path in the document: "" when the document is
	// the service, "[2]" or "services[2]" for a list item, or the path of
	// the Kubernetes Service it was converted from.
	Path string
	// Kubernetes is set for a service converted from a Kubernetes Service,
	// whose fields are not the document's.
	Kubernetes bool
}

// Error places err, about field (a path in vipd.v1.Service such as
// "backends[0].weight"; empty for the service as a whole) of the named
// service, where the service was read. For a converted Kubernetes Service
// the field is named as converted, since the document does not have it.
func (o Origin) Error(service, field string, err error) *Error {
	e := &Error{Source: o.Source, Document: o.Document, Line: o.Line, Service: service, Path: o.Path, Err: err}
	switch {
	case field == "":
	case o.Kubernetes:
		e.Err = fmt.Errorf("converted to %s: %w", field, err)
	default:
		e.Path = joinPath(o.Path, field)
	}
	return e
}
