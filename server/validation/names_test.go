package validation_test

import (
	"slices"
	"testing"

	"github.com/vipd/vipd/server/validation"
)

// TestUnsafeNames: a service or owner name may not be "-", start with "-"
// (a flag on a command line), or have an empty, "." or ".." segment
// between slashes (a step through directories); names that only look
// alike pass.
func TestUnsafeNames(t *testing.T) {
	for _, name := range []string{".", "..", "/", "-", "-web", "--", "a/../b", "a/./b", "./web", "../web", "web/.", "web/..", "/web", "web/", "a//b"} {
		if v := validation.Name(name, "name"); !slices.Equal(violationFields(v), []string{"name"}) {
			t.Errorf("name %q: violations %v; want one on name", name, v)
		}
		svc := valid()
		svc.Name, svc.Owner = name, name
		if _, _, v := validation.Service(svc, validation.Limits{}, "service"); !slices.Equal(violationFields(v), []string{"service.name", "service.owner"}) {
			t.Errorf("service and owner %q: violations %v; want service.name and service.owner", name, v)
		}
	}
	for _, name := range []string{"a", "web-", "a-b", "a.b", "a..b", "...", ".web", "web.", "_", "default/web", "a/b/c", "a/-b", "0"} {
		if v := validation.Name(name, "name"); len(v) > 0 {
			t.Errorf("name %q: %v; want it accepted", name, v)
		}
	}
}
