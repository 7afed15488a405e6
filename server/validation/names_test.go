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

// TestFileOwners: an owner may be "file:" and a file name of one segment
// (the services directory's owners), and only that form has a ":"; a
// service name may not use it.
func TestFileOwners(t *testing.T) {
	for _, owner := range []string{"file:web.yaml", "file:a", "file:0-web_1.json", "file:a..b.yml"} {
		if v := validation.NewOwner(owner, "owner"); len(v) > 0 {
			t.Errorf("NewOwner(%q): %v; want it accepted", owner, v)
		}
		if v := validation.Owner(owner, "owner"); len(v) > 0 {
			t.Errorf("Owner(%q): %v; want it accepted", owner, v)
		}
		svc := valid()
		svc.Owner = owner
		if _, _, v := validation.Service(svc, validation.Limits{}, "service"); len(v) > 0 {
			t.Errorf("service owned by %q: %v; want it accepted", owner, v)
		}
		if v := validation.Name(owner, "name"); !slices.Equal(violationFields(v), []string{"name"}) {
			t.Errorf("service name %q: violations %v; want one on name", owner, v)
		}
	}
	for _, owner := range []string{"file:", "file:.web.yaml", "file:-web", "file:..", "file:a/b", "file:Web.yaml", "file:a:b", "files:a", "x:a",
		validation.FileOwner(strings.Repeat("a", validation.MaxNameLength))} {
		if v := validation.NewOwner(owner, "owner"); !slices.Equal(violationFields(v), []string{"owner"}) {
			t.Errorf("NewOwner(%q): violations %v; want one on owner", owner, v)
		}
		if v := validation.Owner(owner, "owner"); !slices.Equal(violationFields(v), []string{"owner"}) {
			t.Errorf("Owner(%q): violations %v; want one on owner", owner, v)
		}
	}
	// Names keep their rules as owners.
	if v := validation.NewOwner("-web", "owner"); len(v) != 1 {
		t.Errorf("NewOwner(-web): %v; want it refused as NewName refuses it", v)
	}
	if v := validation.Owner("kube/cluster-1", "owner"); len(v) > 0 {
		t.Errorf("Owner(kube/cluster-1): %v", v)
	}
}
