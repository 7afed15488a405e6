package none

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"

	"github.com/vipd/vipd/dataplane"
)

// Name is the dataplane's name, as --dataplane and GetStatus spell it.
const Name = "none"

// errClosed is what Apply returns after Close.
var errClosed = errors.New("dataplane none is closed")

// Dataplane programs nothing and keeps the last State it applied. The zero
// value is not usable; call New. It is safe for concurrent use.
type Dataplane struct {
	mu      sync.Mutex
	applied dataplane.ServiceSet // nil before the first successful Apply
	gen     uint64
	closed  bool
}

// New returns a Dataplane with nothing applied.
func New() *Dataplane { return &Dataplane{} }

// Name implements dataplane.Dataplane.
func (d *Dataplane) Name() string { return Name }

// Capabilities implements dataplane.Dataplane: every load-balancing
// algorithm and every protocol, as the recording fake declares by default.
func (d *Dataplane) Capabilities() dataplane.Capabilities {
	return dataplane.Capabilities{
		LoadBalancing: []dataplane.LoadBalancing{dataplane.LoadBalancingRandom, dataplane.LoadBalancingMaglev},
		Protocols:     []dataplane.Protocol{dataplane.TCP, dataplane.UDP, dataplane.SCTP},
		External:      true,
	}
}

// Apply implements dataplane.Dataplane. It is all-or-nothing: a State that
// asks for something unsupported (an error wrapping
// dataplane.ErrUnsupported), or any State after Close, leaves the last
// applied one in place. On success s's services replace the applied ones;
// nothing older is kept. It keeps s.Set as it is (a ServiceSet never
// changes) and copies only a Services map, so that an Apply costs no more
// than checking the services s.Changed names (all of them on a full Apply).
func (d *Dataplane) Apply(_ context.Context, s *dataplane.State) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("apply generation %d: %w", s.Generation, errClosed)
	}
	if err := d.check(s); err != nil {
		return fmt.Errorf("apply generation %d: %w", s.Generation, err)
	}
	set := s.Set
	if set == nil {
		set = dataplane.ServiceMap(maps.Clone(s.Services))
	}
	d.applied, d.gen = set, s.Generation
	return nil
}

// check returns the first service of s that the capabilities cannot honour.
// A partial Apply checks only the services it changes: the others were
// checked when they were applied, and the capabilities never change.
func (d *Dataplane) check(s *dataplane.State) error {
	caps := d.Capabilities()
	if s.Changed == nil || d.applied == nil {
		for _, svc := range s.All() {
			if err := caps.Check(svc); err != nil {
				return err
			}
		}
		return nil
	}
	for _, name := range s.Changed {
		if svc, ok := s.Get(name); ok {
			if err := caps.Check(svc); err != nil {
				return err
			}
		}
	}
	return nil
}

// Applied returns the services of the last successful Apply, nil before
// the first one, and its generation.
func (d *Dataplane) Applied() (dataplane.ServiceSet, uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.applied, d.gen
}

// Close implements dataplane.Dataplane. Apply fails after it.
func (d *Dataplane) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	return nil
}

// WatchFlows implements dataplane.FlowSource: nothing forwards, so it
// reports no event and returns ctx's error once ctx ends.
func (d *Dataplane) WatchFlows(ctx context.Context, _ func(dataplane.FlowEvent), _ func(uint64)) error {
	<-ctx.Done()
	return ctx.Err()
}

// ListFlows implements dataplane.FlowSource: there are no flows.
func (d *Dataplane) ListFlows(context.Context) ([]dataplane.Flow, error) { return nil, nil }

// ExplainFlow implements dataplane.Explainer with an empty Explanation: no
// affinity entry and no deterministic pick, so Explain answers from the
// desired state alone.
func (d *Dataplane) ExplainFlow(context.Context, dataplane.ExplainQuery) (dataplane.Explanation, error) {
	return dataplane.Explanation{}, nil
}

var (
	_ dataplane.Dataplane  = (*Dataplane)(nil)
	_ dataplane.FlowSource = (*Dataplane)(nil)
	_ dataplane.Explainer  = (*Dataplane)(nil)
)
