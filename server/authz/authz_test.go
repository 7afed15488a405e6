package authz_test

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vipd/vipd/server/authz"
)

func TestParseAndAllowed(t *testing.T) {
	p, err := authz.Parse([]byte(`
# controllers
spiffe://cluster.local/ns/kube-system/sa/ctrl: [kubernetes]
nomad-agent: [nomad, batch, nomad]
admin: "*"
mixed: [a, "*"]
nobody: []
`))
	if err != nil {
		t.Fatal(err)
	}
	if p.Len() != 5 {
		t.Errorf("Len = %d, want 5", p.Len())
	}
	for _, tc := range []struct {
		id, owner string
		want      bool
	}{
		{"spiffe://cluster.local/ns/kube-system/sa/ctrl", "kubernetes", true},
		{"spiffe://cluster.local/ns/kube-system/sa/ctrl", "nomad", false},
		{"spiffe://cluster.local/ns/kube-system/sa/other", "kubernetes", false},
		{"nomad-agent", "nomad", true},
		{"nomad-agent", "batch", true},
		{"nomad-agent", "default", false},
		{"admin", "anything", true},
		{"mixed", "zzz", true},
		{"nobody", "default", false},
		{"", "default", false},
		{"Admin", "default", false},
	} {
		if got := p.Allowed(tc.id, tc.owner); got != tc.want {
			t.Errorf("Allowed(%q, %q) = %v, want %v", tc.id, tc.owner, got, tc.want)
		}
	}
	var nilPolicy *authz.Policy
	if nilPolicy.Allowed("admin", "x") {
		t.Error("a nil policy allows something")
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []string
	}{
		{"yaml syntax", "a: [x\nb: y\n", []string{"line"}},
		{"duplicate identity", "a: [x]\nb: \"*\"\na: [y]\n", []string{"line 3", `"a"`, "already"}},
		{"not a mapping", "- a\n- b\n", []string{"want a mapping"}},
		{"a string other than *", "ctrl: all\n", []string{`identity "ctrl"`, `"all"`, "list of owners"}},
		{"a number", "ctrl: 3\n", []string{`identity "ctrl"`}},
		{"null", "ctrl:\n", []string{`identity "ctrl"`}},
		{"a map", "ctrl: {a: b}\n", []string{`identity "ctrl"`}},
		{"a bad owner", "ctrl: [ok, Not OK]\n", []string{`identity "ctrl"`, "owners[1]"}},
		{"an empty owner", "ctrl: [\"\"]\n", []string{`identity "ctrl"`, "owners[0]", "required"}},
		{"an empty identity", "\"\": [a]\n", []string{"empty identity"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := authz.Parse([]byte(tc.in))
			if err == nil {
				t.Fatal("parsed")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "authz.yaml")
	if err := os.WriteFile(path, []byte("a: [x]\na: [y]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := authz.Load(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Load of a bad file: %v, want its path named", err)
	}
	if _, err := authz.Load(path + ".missing"); err == nil || !strings.Contains(err.Error(), path+".missing") {
		t.Fatalf("Load of a missing file: %v", err)
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := authz.Load(path)
	if err != nil || p.Len() != 0 || p.Allowed("a", "x") {
		t.Fatalf("empty file: %v, %v", p, err)
	}
}

func TestIdentity(t *testing.T) {
	u1, _ := url.Parse("spiffe://example.org/a")
	u2, _ := url.Parse("spiffe://example.org/b")
	for _, tc := range []struct {
		name string
		cert *x509.Certificate
		want string
	}{
		{"first URI SAN", &x509.Certificate{URIs: []*url.URL{u1, u2}, Subject: pkix.Name{CommonName: "cn"}}, "spiffe://example.org/a"},
		{"CN without URI SANs", &x509.Certificate{Subject: pkix.Name{CommonName: "cn"}, DNSNames: []string{"dns"}}, "cn"},
		{"neither", &x509.Certificate{}, ""},
		{"nil", nil, ""},
	} {
		if got := authz.Identity(tc.cert); got != tc.want {
			t.Errorf("%s: Identity = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestPrincipal(t *testing.T) {
	p, err := authz.Parse([]byte("ctrl: [team-a]\n"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if authz.FromContext(ctx) != nil {
		t.Fatal("a bare context has a principal")
	}
	if err := authz.FromContext(ctx).CheckOwner("anything"); err != nil {
		t.Fatalf("a trusted local call is denied: %v", err)
	}
	ctrl := authz.NewPrincipal("ctrl", p)
	ctx = authz.NewContext(ctx, ctrl)
	if authz.FromContext(ctx) != ctrl {
		t.Fatal("FromContext does not return the principal")
	}
	if err := ctrl.CheckOwner("team-a"); err != nil {
		t.Errorf("ctrl on team-a: %v", err)
	}
	err = ctrl.CheckOwner("team-b")
	var denied *authz.DeniedError
	if !errors.As(err, &denied) || denied.Identity != "ctrl" || denied.Owner != "team-b" || err.Error() != `identity "ctrl" may not change services of owner "team-b"` {
		t.Errorf("ctrl on team-b: %v", err)
	}
	if err := authz.NewPrincipal("", p).CheckOwner("team-a"); err == nil || !strings.Contains(err.Error(), "without a certificate") {
		t.Errorf("anonymous on team-a: %v", err)
	}
	if err := authz.NewPrincipal("anyone", nil).CheckOwner("team-b"); err != nil {
		t.Errorf("without a policy: %v", err)
	}
}

// TestCheckAllOwners: only an identity the policy gives "*" may change
// what concerns every owner; a trusted local client (nil Principal) and a
// principal without a policy may too.
func TestCheckAllOwners(t *testing.T) {
	p, err := authz.Parse([]byte("admin: \"*\"\nctrl: [a, b]\n"))
	if err != nil {
		t.Fatal(err)
	}
	for id, allowed := range map[string]bool{"admin": true, "ctrl": false, "stranger": false, "": false} {
		err := authz.NewPrincipal(id, p).CheckAllOwners()
		var denied *authz.DeniedError
		if allowed != (err == nil) || (err != nil && (!errors.As(err, &denied) || denied.Owner != authz.AllOwners)) {
			t.Errorf("%q: CheckAllOwners = %v, allowed %v", id, err, allowed)
		}
	}
	var local *authz.Principal
	if err := local.CheckAllOwners(); err != nil {
		t.Errorf("nil Principal: %v", err)
	}
	if err := authz.NewPrincipal("anyone", nil).CheckAllOwners(); err != nil {
		t.Errorf("no policy: %v", err)
	}
}
