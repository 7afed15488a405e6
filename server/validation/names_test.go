package validation_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/vipd/vipd/server/validation"
)

// TestUnsafeNames: a service or owner name that a write creates
// (NewName) may not be "-", start with "-" (a flag on a command line), or
// have an empty, "." or ".." segment between slashes (a step through
// directories); names that only look alike pass. Name and Service, the
// checks for a name that may be stored already, accept them, as every
// earlier vipd did.
func TestUnsafeNames(t *testing.T) {
	for _, name := range []string{".", "..", "/", "-", "-web", "--", "a/../b", "a/./b", "./web", "../web", "web/.", "web/..", "/web", "web/", "a//b"} {
		if v := validation.NewName(name, "name"); !slices.Equal(violationFields(v), []string{"name"}) {
			t.Errorf("new name %q: violations %v; want one on name", name, v)
		}
		if v := validation.Name(name, "name"); len(v) > 0 {
			t.Errorf("stored name %q: %v; want it accepted", name, v)
		}
		svc := valid()
		svc.Name, svc.Owner = name, name
		if _, _, v := validation.Service(svc, validation.Limits{}, "service"); len(v) > 0 {
			t.Errorf("service and owner %q: %v; want them accepted (NewName is the creating write's check)", name, v)
		}
	}
	for _, name := range []string{"a", "web-", "a-b", "a.b", "a..b", "...", ".web", "web.", "_", "default/web", "a/b/c", "a/-b", "0"} {
		if v := validation.NewName(name, "name"); len(v) > 0 {
			t.Errorf("name %q: %v; want it accepted", name, v)
		}
	}
	for _, name := range []string{"", "Web", "a b", strings.Repeat("a", validation.MaxNameLength+1)} {
		if v := validation.NewName(name, "name"); !slices.Equal(violationFields(v), []string{"name"}) {
			t.Errorf("new name %q: violations %v; want one on name", name, v)
		}
	}
}
