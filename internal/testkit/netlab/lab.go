package netlab

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/vipd/vipd/internal/testkit/require"
)

// ErrClosed is returned by operations on a closed Lab or a removed pod.
var ErrClosed = errors.New("netlab: closed")

// buildTimeout bounds New's call to Build.
const buildTimeout = 2 * time.Minute

// Spec describes a lab to build.
type Spec struct {
	// Nodes lists the nodes: Nodes[0] becomes node 1. No nodes means one
	// node without pods.
	Nodes []NodeSpec
	// ExternalHosts names the external hosts to create behind the upstream
	// router, in order; see Lab.AddExternalHost.
	ExternalHosts []string
}

// NodeSpec describes one node of a lab.
type NodeSpec struct {
	// Pods names the pods to create on the node, in order; see
	// Node.AddPod for the rules on names.
	Pods []string
}

func (s Spec) nodes() []NodeSpec {
	if len(s.Nodes) == 0 {
		return []NodeSpec{{}}
	}
	return s.Nodes
}

func (s Spec) validate() error {
	if len(s.Nodes) > MaxNodes {
		return fmt.Errorf("invalid spec: %d nodes, at most %d", len(s.Nodes), MaxNodes)
	}
	for _, n := range s.Nodes {
		for _, p := range n.Pods {
			if err := validPodName(p); err != nil {
				return fmt.Errorf("invalid spec: %w", err)
			}
		}
	}
	if len(s.ExternalHosts) > MaxExternalHosts {
		return fmt.Errorf("invalid spec: %d external hosts, at most %d", len(s.ExternalHosts), MaxExternalHosts)
	}
	for _, h := range s.ExternalHosts {
		if err := validPodName(h); err != nil {
			return fmt.Errorf("invalid spec: external host: %w", err)
		}
	}
	return nil
}

// Lab is a built test network: an upstream router namespace, node
// namespaces, pod namespaces and external host namespaces. Close removes all of it. A Lab is safe for
// concurrent use.
type Lab struct {
	log    hclog.Logger
	prefix string

	// mu serializes changes to the topology and guards the fields below.
	mu       sync.Mutex
	closed   bool
	upstream *NS
	nodes    []*Node
	// externals are the external hosts; nextExternal is the number the
	// next one gets (numbers are never reused).
	externals    []*ExternalHost
	nextExternal int
}

// New builds the lab spec for a test and removes it when the test and its
// subtests have finished. It skips the test without root (see RequireRoot)
// and fails it if the lab cannot be built.
func New(tb testing.TB, spec Spec) *Lab {
	tb.Helper()
	RequireRoot(tb)
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	l, err := Build(ctx, spec, hclog.NewNullLogger())
	if err != nil {
		tb.Fatalf("build netlab: %v", err)
	}
	tb.Cleanup(func() {
		if err := l.Close(); err != nil {
			tb.Errorf("close netlab: %v", err)
		}
	})
	return l
}

// RequireRoot is require.Root for a test that builds a lab: it skips the
// test unless it runs as root, which netlab needs to create namespaces, and
// fails it instead with CI=true in the environment.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	require.Root(tb, "creating netlab's network namespaces")
}

// Build creates the lab spec and returns once every link and address in it
// is usable. It first sweeps namespaces left behind by dead processes (see
// Sweep). On error it removes whatever it had created; on success the caller
// must Close the lab. ctx bounds the construction only, not the lab's life.
// A nil log discards log output.
func Build(ctx context.Context, spec Spec, log hclog.Logger) (_ *Lab, err error) {
	if err := spec.validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = hclog.NewNullLogger()
	}
	log = log.Named("netlab")
	if _, err := Sweep(log); err != nil {
		log.Warn("sweep leftover namespaces", "error", err)
	}
	prefix, err := newPrefix()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	l := &Lab{log: log.With("lab", prefix), prefix: prefix, nextExternal: 1}
	defer func() {
		if err != nil {
			err = errors.Join(err, l.Close())
		}
	}()

	up, err := createNS(prefix+"-up", l.log)
	if err != nil {
		return nil, fmt.Errorf("build lab: %w", err)
	}
	l.upstream = up
	if err := up.enableForwarding(); err != nil {
		return nil, fmt.Errorf("build lab: %w", err)
	}
	for i, ns := range spec.nodes() {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("build lab: %w", err)
		}
		n, err := l.addNode(ctx, i+1)
		if err != nil {
			return nil, fmt.Errorf("build lab: %w", err)
		}
		for _, p := range ns.Pods {
			if _, err := n.AddPod(ctx, p); err != nil {
				return nil, fmt.Errorf("build lab: %w", err)
			}
		}
	}
	for _, h := range spec.ExternalHosts {
		if _, err := l.AddExternalHost(ctx, h); err != nil {
			return nil, fmt.Errorf("build lab: %w", err)
		}
	}
	l.log.Info("built lab", "nodes", len(l.nodes), "external_hosts", len(l.externals), "elapsed", time.Since(start))
	return l, nil
}

// newPrefix returns "vl<pid>-<random>", the start of every namespace name in
// a new lab; Sweep relies on the pid.
func newPrefix() (string, error) {
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate lab name: %w", err)
	}
	return fmt.Sprintf("vl%d-%s", os.Getpid(), hex.EncodeToString(b[:])), nil
}

func (l *Lab) addNode(ctx context.Context, k int) (*Node, error) {
	ns, err := createNS(fmt.Sprintf("%s-node%d", l.prefix, k), l.log)
	if err != nil {
		return nil, err
	}
	n := &Node{NS: ns, lab: l, index: k, nextHost: firstPodHost}
	// Registered before wiring, so that Close removes it if wiring fails.
	l.mu.Lock()
	l.nodes = append(l.nodes, n)
	l.mu.Unlock()
	if err := n.wire(ctx); err != nil {
		return nil, fmt.Errorf("wire node%d: %w", k, err)
	}
	return n, nil
}

// Close stops all echo servers and removes all of the lab's namespaces and
// links. It returns every error it met, but always tries to remove
// everything. Calling Close again does nothing and returns nil.
func (l *Lab) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	var errs []error
	for _, h := range l.externals {
		errs = append(errs, h.teardown())
	}
	l.externals = nil
	for _, n := range l.nodes {
		errs = append(errs, n.teardown())
	}
	if l.upstream != nil {
		errs = append(errs, l.upstream.close())
	}
	err := errors.Join(errs...)
	l.log.Info("closed lab", "error", err)
	return err
}

// Node returns node k, counting from 1 as in the node's name and address
// plan. It panics if the lab has no node k.
func (l *Lab) Node(k int) *Node {
	l.mu.Lock()
	defer l.mu.Unlock()
	if k < 1 || k > len(l.nodes) {
		panic(fmt.Sprintf("netlab: no node %d in a lab of %d nodes", k, len(l.nodes)))
	}
	return l.nodes[k-1]
}

// Nodes returns the lab's nodes, node 1 first.
func (l *Lab) Nodes() []*Node {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*Node(nil), l.nodes...)
}

// Pod returns the pod called name on any node, or nil if there is none.
func (l *Lab) Pod(name string) *Pod {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.podLocked(name)
}

func (l *Lab) podLocked(name string) *Pod {
	for _, n := range l.nodes {
		for _, p := range n.pods {
			if p.name == name {
				return p
			}
		}
	}
	return nil
}

// Upstream returns the router namespace that joins the nodes.
func (l *Lab) Upstream() *NS {
	return l.upstream
}

// Namespaces returns the names of all the lab's namespaces: upstream, then
// each node followed by its pods, then the external hosts.
func (l *Lab) Namespaces() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var names []string
	if l.upstream != nil {
		names = append(names, l.upstream.name)
	}
	for _, n := range l.nodes {
		names = append(names, n.name)
		for _, p := range n.pods {
			names = append(names, p.NS.name)
		}
	}
	for _, h := range l.externals {
		names = append(names, h.NS.name)
	}
	return names
}
