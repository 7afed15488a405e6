package manifest_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vipd/vipd/internal/manifest"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"sigs.k8s.io/yaml"
)

// fuzzSource names the fuzzed input in errors.
const fuzzSource = "fuzz.yaml"

// FuzzLoad fuzzes what "vipctl apply -f" reads: YAML or JSON, one or many
// documents, vipd services or Kubernetes objects. It checks that
//   - nothing panics;
//   - notes on what was left out are one line each;
//   - every error is a *manifest.Error that names the source and, unless
//     the source holds no document at all, the document;
//   - every service read either passes vipd's validation or is rejected
//     with violations that name its fields (validation.ResolvePath);
//   - what vipctl prints for the services read (-o json and -o yaml, of
//     each and of the list) reads back as the same services.
//
// Its seed corpus is in testdata/fuzz/FuzzLoad (see TestFuzzCorpus).
func FuzzLoad(f *testing.F) {
	lim := validation.Limits{MaxBackends: validation.DefaultMaxBackends}
	f.Fuzz(func(t *testing.T, data []byte) {
		l := manifest.NewLoader(manifest.Options{NodeName: "node-a"})
		err := l.Read(bytes.NewReader(data), fuzzSource)
		var res *manifest.Result
		if err == nil {
			res, err = l.Result()
		}
		if err != nil {
			checkLoadError(t, err)
			return
		}
		for _, note := range res.Notes {
			if note == "" || strings.Contains(note, "\n") {
				t.Errorf("note %q is not one line", note)
			}
		}
		svcs := res.Services
		// vipctl prints only what vipd stored, which validated.
		var valid []*vipdv1.Service
		for i, svc := range svcs {
			if svc == nil {
				t.Fatalf("service %d is nil", i)
			}
			_, _, v := validation.Service(svc, lim, "service")
			req := &vipdv1.UpsertServiceRequest{Service: svc}
			for _, x := range v {
				if err := validation.ResolvePath(req, x.Field); err != nil || x.Description == "" {
					t.Errorf("service %d: violation %q (%s) names no field: %v", i, x.Field, x.Description, err)
				}
			}
			if len(v) == 0 {
				valid = append(valid, svc)
			}
		}
		checkPrintedReadsBack(t, valid)
	})
}

func checkLoadError(t *testing.T, err error) {
	t.Helper()
	var me *manifest.Error
	if !errors.As(err, &me) {
		t.Fatalf("error %q (%T) is not a *manifest.Error", err, err)
	}
	msg := err.Error()
	if me.Source != fuzzSource || !strings.HasPrefix(msg, fuzzSource+": ") || me.Err == nil {
		t.Fatalf("error %q does not name the source %s", msg, fuzzSource)
	}
	switch {
	case me.Document == 0 && me.Err.Error() != "no services found":
		t.Fatalf("error %q names no document", msg)
	case me.Document > 0 && !strings.Contains(msg, fmt.Sprintf(": document %d", me.Document)):
		t.Fatalf("error %q does not show document %d", msg, me.Document)
	case me.Path != "" && !strings.Contains(msg, me.Path):
		t.Fatalf("error %q does not show the path %q", msg, me.Path)
	}
}

// printed is svc as "vipctl service get -o json" prints it, or -o yaml.
func printed(t *testing.T, m proto.Message, asYAML bool) []byte {
	t.Helper()
	compact, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		t.Fatalf("encode %v: %v", m, err)
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, compact, "", "  "); err != nil {
		t.Fatalf("indent: %v", err)
	}
	buf.WriteByte('\n')
	if !asYAML {
		return buf.Bytes()
	}
	y, err := yaml.JSONToYAML(buf.Bytes())
	if err != nil {
		t.Fatalf("to YAML: %v", err)
	}
	return y
}

// printedList is svcs as "vipctl service list -o json" prints them, or -o yaml.
func printedList(t *testing.T, svcs []*vipdv1.Service, asYAML bool) []byte {
	t.Helper()
	return printed(t, &vipdv1.ListServicesResponse{Services: svcs}, asYAML)
}

func checkPrintedReadsBack(t *testing.T, svcs []*vipdv1.Service) {
	t.Helper()
	for _, asYAML := range []bool{false, true} {
		for i, svc := range svcs {
			out := printed(t, svc, asYAML)
			got, err := manifest.Load(bytes.NewReader(out), "printed")
			if err != nil {
				t.Fatalf("service %d as printed (yaml %v) does not read back: %v\n%s", i, asYAML, err, out)
			}
			if len(got) != 1 || !proto.Equal(svc, got[0]) {
				t.Fatalf("service %d as printed (yaml %v) reads back differently (-read +read back):\n%s\n%s", i, asYAML,
					cmp.Diff([]*vipdv1.Service{svc}, got, protocmp.Transform()), out)
			}
		}
		if len(svcs) == 0 {
			continue
		}
		out := printedList(t, svcs, asYAML)
		got, err := manifest.Load(bytes.NewReader(out), "printed")
		if err != nil {
			t.Fatalf("the list as printed (yaml %v) does not read back: %v\n%s", asYAML, err, out)
		}
		if !slices.EqualFunc(svcs, got, func(a, b *vipdv1.Service) bool { return proto.Equal(a, b) }) {
			t.Fatalf("the list as printed (yaml %v) reads back differently (-read +read back):\n%s\n%s", asYAML,
				cmp.Diff(svcs, got, protocmp.Transform()), out)
		}
	}
}
