package reconcile

import (
	"context"
	"time"

	"github.com/vipd/vipd/dataplane"
)

// WithNode makes n the Node of the initial apply and of every apply until
// SetNode changes it, so that the first apply already serves node ports
// on the node's addresses. Without it the Node starts as the zero Node.
func WithNode(n dataplane.Node) Option { return func(r *Reconciler) { r.node = n } }

// WithAppliedHook makes the reconciler call f with every State the
// dataplane accepted, after each successful Apply (a roll-back included),
// from the goroutine that applies: f must not block, and must neither
// change s nor keep it beyond what ServiceSet promises (the set never
// changes). It is for what follows the programmed state, such as the
// health-check node port server; nil means none.
func WithAppliedHook(f func(s *dataplane.State)) Option { return func(r *Reconciler) { r.applied = f } }

// SetNode submits the node's network (internal/nodenet): every later State
// carries n. A Node that differs from the current one (Node.Equal) takes
// the same path as a Do: it is batched with other changes and applied all
// or nothing, with State.Changed naming only the services that other
// changes in the batch touched (an apply of only a Node change has an
// empty, not nil, Changed); SetNode returns once the dataplane has it, or
// the apply's error, in which case the previous Node stays in force and
// the caller may submit n again. An equal Node applies nothing. While the
// reconciler holds (WithHold), n is kept without an apply and the
// releasing sync carries it. The Node is not desired state: it uses up no
// generation and is not saved.
func (r *Reconciler) SetNode(ctx context.Context, n dataplane.Node) error {
	return r.submit(ctx, &request{ctx: ctx, node: &n, done: make(chan result, 1), submitted: time.Now()}).err
}
