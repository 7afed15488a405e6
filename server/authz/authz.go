package authz

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/vipd/vipd/server/validation"
	"sigs.k8s.io/yaml"
)

// AllOwners is the value that lets an identity change every owner's services.
const AllOwners = "*"

// Policy maps identities to the owners they may change. The zero value and
// nil allow nothing to anyone; use Parse or Load. A Policy is immutable and
// safe for concurrent use.
type Policy struct {
	rules map[string]rule
}

type rule struct {
	all    bool
	owners []string // sorted
}

// Load reads and parses the policy file at path; see Parse. Errors name the
// file.
func Load(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read authz file: %w", err)
	}
	p, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("authz file %s: %w", path, err)
	}
	return p, nil
}

// Parse reads a policy: a YAML (or JSON) mapping of identity to either a
// list of owner names or the string "*". YAML syntax errors and duplicate
// identities are reported with their line; a bad entry names its identity.
// An empty document is a policy that allows nothing.
func Parse(data []byte) (*Policy, error) {
	var raw map[string]json.RawMessage
	// Strict: an identity listed twice is an error rather than a silent
	// override of its first rule.
	if err := yaml.UnmarshalStrict(data, &raw); err != nil {
		return nil, fmt.Errorf("want a mapping of identity to a list of owners or %q: %w", AllOwners, err)
	}
	p := &Policy{rules: make(map[string]rule, len(raw))}
	ids := make([]string, 0, len(raw))
	for id := range raw {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if strings.TrimSpace(id) == "" {
			return nil, errors.New("an empty identity: every key must be a certificate's URI SAN or common name")
		}
		r, err := parseRule(raw[id])
		if err != nil {
			return nil, fmt.Errorf("identity %q: %w", id, err)
		}
		p.rules[id] = r
	}
	return p, nil
}

func parseRule(v json.RawMessage) (rule, error) {
	var s string
	if err := json.Unmarshal(v, &s); err == nil {
		if s != AllOwners {
			return rule{}, fmt.Errorf("%q: want a list of owners, or %q for every owner", s, AllOwners)
		}
		return rule{all: true}, nil
	}
	var owners []string
	if err := json.Unmarshal(v, &owners); err != nil || owners == nil {
		return rule{}, fmt.Errorf("%s: want a list of owners, or %q for every owner", v, AllOwners)
	}
	var r rule
	for i, o := range owners {
		if o == AllOwners {
			r.all = true
			continue
		}
		if vs := validation.Owner(o, fmt.Sprintf("owners[%d]", i)); len(vs) > 0 {
			return rule{}, vs
		}
		r.owners = append(r.owners, o)
	}
	if r.all {
		return rule{all: true}, nil
	}
	slices.Sort(r.owners)
	r.owners = slices.Compact(r.owners)
	return r, nil
}

// Allowed reports whether identity may change the services of owner. A nil
// Policy allows nothing.
func (p *Policy) Allowed(identity, owner string) bool {
	if p == nil {
		return false
	}
	r, ok := p.rules[identity]
	if !ok {
		return false
	}
	if r.all {
		return true
	}
	_, found := slices.BinarySearch(r.owners, owner)
	return found
}

// Len is the number of identities the policy lists.
func (p *Policy) Len() int {
	if p == nil {
		return 0
	}
	return len(p.rules)
}

// Identity is the identity a client certificate stands for: its first URI
// SAN (a SPIFFE ID, say) if it has one, else its subject's common name.
// It is empty for a certificate with neither, which no policy lists.
func Identity(cert *x509.Certificate) string {
	if cert == nil {
		return ""
	}
	if len(cert.URIs) > 0 {
		return cert.URIs[0].String()
	}
	return cert.Subject.CommonName
}

// Principal is an authenticated remote client: its identity and the policy
// that applies to it.
type Principal struct {
	// Identity is the client's identity (see Identity); empty for a
	// client without a certificate (a plaintext loopback listener).
	Identity string
	// policy nil with allowAll false allows nothing.
	policy   *Policy
	allowAll bool
}

// NewPrincipal returns the principal for identity under policy. A nil policy
// means vipd runs without an authz file: the principal may change every
// owner's services.
func NewPrincipal(identity string, policy *Policy) *Principal {
	return &Principal{Identity: identity, policy: policy, allowAll: policy == nil}
}

// DeniedError says that a principal may not change an owner's services.
type DeniedError struct {
	Identity, Owner string
}

func (e *DeniedError) Error() string {
	id := e.Identity
	if id == "" {
		id = "(a client without a certificate)"
	}
	if e.Owner == AllOwners {
		return fmt.Sprintf("identity %q may not change the node's settings: that needs %q (every owner) in the authz file", id, AllOwners)
	}
	return fmt.Sprintf("identity %q may not change services of owner %q", id, e.Owner)
}

// CheckOwner returns a *DeniedError unless p may change the services of
// owner. A nil Principal (a trusted local client) may change everything.
func (p *Principal) CheckOwner(owner string) error {
	if p == nil || p.allowAll || p.policy.Allowed(p.Identity, owner) {
		return nil
	}
	return &DeniedError{Identity: p.Identity, Owner: owner}
}

// CheckAllOwners returns a *DeniedError (Owner AllOwners) unless p may
// change the services of every owner, as a call that changes the node
// for all of them needs: an identity the policy gives AllOwners. A nil
// Principal (a trusted local client) and a principal without a policy
// may.
func (p *Principal) CheckAllOwners() error {
	if p == nil || p.allowAll {
		return nil
	}
	if r, ok := p.policy.rules[p.Identity]; ok && r.all {
		return nil
	}
	return &DeniedError{Identity: p.Identity, Owner: AllOwners}
}

type principalKey struct{}

// NewContext returns ctx carrying p.
func NewContext(ctx context.Context, p *Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the Principal of ctx, or nil for a call from a
// trusted local client (none was attached).
func FromContext(ctx context.Context) *Principal {
	p, _ := ctx.Value(principalKey{}).(*Principal)
	return p
}
