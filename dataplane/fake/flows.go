package fake

import (
	"context"
	"slices"

	"github.com/vipd/vipd/dataplane"
)

// flowReq is one thing a test hands to the running WatchFlows: an event, a
// kernel loss, or an error to return with. done is closed once it is handled.
type flowReq struct {
	ev   *dataplane.FlowEvent
	lost uint64
	err  error
	done chan struct{}
}

// flowState is the fake's flow source and explainer.
type flowState struct {
	reqs    chan flowReq
	flows   []dataplane.Flow
	listErr error
	explain func(dataplane.ExplainQuery) (dataplane.Explanation, error)
	queries []dataplane.ExplainQuery
}

// WatchFlows implements dataplane.FlowSource. It reports what the test
// passes to Emit, Lose and FailWatch, until ctx ends. Each of those goes to
// one running WatchFlows.
func (d *Dataplane) WatchFlows(ctx context.Context, emit func(dataplane.FlowEvent), lost func(uint64)) error {
	for {
		select {
		case r := <-d.flow.reqs:
			switch {
			case r.err != nil:
				close(r.done)
				return r.err
			case r.ev != nil:
				emit(*r.ev)
			default:
				lost(r.lost)
			}
			close(r.done)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Emit hands ev to the running WatchFlows, and returns once its emit
// callback has returned. It waits for a WatchFlows to run.
func (d *Dataplane) Emit(ev dataplane.FlowEvent) { d.flowReq(flowReq{ev: &ev}) }

// Lose reports n events lost by the kernel to the running WatchFlows, and
// returns once its lost callback has returned. It waits for a WatchFlows
// to run.
func (d *Dataplane) Lose(n uint64) { d.flowReq(flowReq{lost: n}) }

// FailWatch makes the running WatchFlows return err. It waits for a
// WatchFlows to run.
func (d *Dataplane) FailWatch(err error) { d.flowReq(flowReq{err: err}) }

func (d *Dataplane) flowReq(r flowReq) {
	r.done = make(chan struct{})
	d.flow.reqs <- r
	<-r.done
}

// SetFlows sets the live flows that ListFlows returns, and err, when not
// nil, makes ListFlows fail instead.
func (d *Dataplane) SetFlows(flows []dataplane.Flow, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.flow.flows, d.flow.listErr = slices.Clone(flows), err
}

// ListFlows implements dataplane.FlowSource.
func (d *Dataplane) ListFlows(context.Context) ([]dataplane.Flow, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.flow.listErr != nil {
		return nil, d.flow.listErr
	}
	return slices.Clone(d.flow.flows), nil
}

// SetExplain makes ExplainFlow answer with f; nil, the default, answers
// with an empty Explanation: no affinity entry and no deterministic pick.
func (d *Dataplane) SetExplain(f func(dataplane.ExplainQuery) (dataplane.Explanation, error)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.flow.explain = f
}

// ExplainFlow implements dataplane.Explainer with the answer SetExplain set.
func (d *Dataplane) ExplainFlow(_ context.Context, q dataplane.ExplainQuery) (dataplane.Explanation, error) {
	d.mu.Lock()
	d.flow.queries = append(d.flow.queries, q)
	f := d.flow.explain
	d.mu.Unlock()
	if f == nil {
		return dataplane.Explanation{}, nil
	}
	return f(q)
}

// ExplainQueries returns every query ExplainFlow was asked, oldest first.
func (d *Dataplane) ExplainQueries() []dataplane.ExplainQuery {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.flow.queries)
}

var (
	_ dataplane.FlowSource = (*Dataplane)(nil)
	_ dataplane.Explainer  = (*Dataplane)(nil)
)
