// Package fake is an in-process Dataplane for tests. It programs no kernel:
// it records every State it is asked to apply, applies each one
// transactionally to its own copy (kept only on success), honours its
// declared capabilities like a real dataplane, and lets tests inject failures
// or block an Apply to observe batching. As a FlowSource and Explainer it
// reports only what tests script: flow events (Emit), kernel losses (Lose),
// live flows (SetFlows) and explanations (SetExplain). As a DriftDetector
// it reports the drift a test sets (SetDrift) until a full Apply repairs it.
//
// Only tests and the test harness may import it: it keeps every applied
// State for ever. The daemon injects it only through daemon.WithDataplane;
// vipd's own dataplane that programs nothing is dataplane/none, and
// cmd/vipd's TestNoTestCodeInTheBinary checks that vipd does not link this
// package.
package fake
