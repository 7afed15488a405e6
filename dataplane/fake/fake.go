package fake

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/vipd/vipd/dataplane"
)

// Name is the fake dataplane's name.
const Name = "fake"

// Record is one call to Apply.
type Record struct {
	// State is a shallow copy of the state passed to Apply, with its
	// services always in the Services map (Set is nil), and its Node.
	State *dataplane.State
	// Full is true when the fake treated the call as a full rebuild: the first
	// Apply, and every Apply after a failed one.
	Full bool
	// Err is what Apply returned.
	Err error
}

// Hook runs at the start of every Apply, before anything is applied. A non-nil
// error fails that Apply. A hook may block, for example until a test releases it.
type Hook func(ctx context.Context, s *dataplane.State) error

// Dataplane is the recording fake. The zero value is not usable; call New.
type Dataplane struct {
	mu       sync.Mutex
	caps     dataplane.Capabilities
	hook     Hook
	failures []error
	applied  map[string]*dataplane.Service
	gen      uint64
	node     dataplane.Node
	records  []Record
	needFull bool
	closed   bool
	flow     flowState
	// drift is what DetectDrift reports until the next successful full
	// Apply; driftChecks counts DetectDrift calls.
	drift       []dataplane.Drift
	stuckDrift  []dataplane.Drift
	driftErr    error
	driftChecks int
}

// Option configures a fake Dataplane.
type Option func(*Dataplane)

// WithCapabilities replaces the default capabilities (everything supported).
func WithCapabilities(c dataplane.Capabilities) Option {
	return func(d *Dataplane) { d.caps = c }
}

// New returns a fake that supports every algorithm and protocol unless told otherwise.
func New(opts ...Option) *Dataplane {
	d := &Dataplane{
		caps: dataplane.Capabilities{
			LoadBalancing: []dataplane.LoadBalancing{dataplane.LoadBalancingRandom, dataplane.LoadBalancingMaglev},
			Protocols:     []dataplane.Protocol{dataplane.TCP, dataplane.UDP, dataplane.SCTP},
			External:      true,
		},
		applied:  map[string]*dataplane.Service{},
		needFull: true,
		flow:     flowState{reqs: make(chan flowReq)},
	}
	for _, o := range opts {
		o(d)
	}
	return d
}

// Name implements dataplane.Dataplane.
func (d *Dataplane) Name() string { return Name }

// Capabilities implements dataplane.Dataplane.
func (d *Dataplane) Capabilities() dataplane.Capabilities { return d.caps }

// SetHook installs h for every later Apply; nil removes it.
func (d *Dataplane) SetHook(h Hook) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.hook = h
}

// FailNext makes the next Apply fail with err, after the hook has run.
// Several calls queue several failures.
func (d *Dataplane) FailNext(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.failures = append(d.failures, err)
}

// Apply implements dataplane.Dataplane. It is all-or-nothing: the applied
// copy changes only when Apply returns nil.
func (d *Dataplane) Apply(ctx context.Context, s *dataplane.State) error {
	d.mu.Lock()
	hook := d.hook
	d.mu.Unlock()
	var err error
	if hook != nil {
		err = hook(ctx, s)
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil && len(d.failures) > 0 {
		err = d.failures[0]
		d.failures = d.failures[1:]
	}
	if err == nil && d.closed {
		err = errors.New("fake dataplane is closed")
	}
	if err == nil {
		err = d.check(s)
	}
	rec := Record{
		State: &dataplane.State{Generation: s.Generation, Services: s.Map(), Changed: slices.Clone(s.Changed), Node: s.Node},
		Full:  d.needFull,
		Err:   err,
	}
	d.records = append(d.records, rec)
	if err != nil {
		d.needFull = true
		return fmt.Errorf("fake apply generation %d: %w", s.Generation, err)
	}
	d.applied = rec.State.Services
	d.gen = s.Generation
	d.node = s.Node
	if rec.Full || s.Changed == nil {
		// A full Apply rebuilds everything, which is what repairs drift;
		// as in the real dataplanes, an Apply after a failed one is full.
		d.drift = nil
	}
	d.needFull = false
	return nil
}

// SetDrift makes DetectDrift report drift, as if another tool had removed
// what it names, until the next successful full Apply (one with a nil
// State.Changed, or any Apply after a failed one, or the first), which
// repairs it. A partial Apply leaves it.
func (d *Dataplane) SetDrift(drift []dataplane.Drift) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.drift = slices.Clone(drift)
}

// SetUnrepairableDrift makes DetectDrift report drift that no Apply
// repairs, as an interface the tc program cannot be attached to would be,
// until it is called again with nil.
func (d *Dataplane) SetUnrepairableDrift(drift []dataplane.Drift) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stuckDrift = slices.Clone(drift)
}

// SetDriftError makes every DetectDrift fail with err, as when the kernel
// cannot be read; nil ends that.
func (d *Dataplane) SetDriftError(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.driftErr = err
}

// DetectDrift implements dataplane.DriftDetector: it fails as SetDriftError
// said, or reports what SetDrift set, if no full Apply has repaired it
// since, and what SetUnrepairableDrift set.
func (d *Dataplane) DetectDrift(context.Context) ([]dataplane.Drift, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.driftChecks++
	if d.driftErr != nil {
		return nil, d.driftErr
	}
	return slices.Concat(d.drift, d.stuckDrift), nil
}

// DriftKinds implements dataplane.DriftDetector: the fake reports
// whatever SetDrift was given, so it names no kinds up front.
func (d *Dataplane) DriftKinds() []string { return nil }

// DriftChecks returns how many times DetectDrift has been called.
func (d *Dataplane) DriftChecks() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.driftChecks
}

func (d *Dataplane) check(s *dataplane.State) error {
	for _, svc := range s.All() {
		if err := d.caps.Check(svc); err != nil {
			return err
		}
	}
	return nil
}

// Applied returns the services of the last successful Apply and its generation.
func (d *Dataplane) Applied() (map[string]*dataplane.Service, uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.applied), d.gen
}

// AppliedNode returns the Node of the last successful Apply.
func (d *Dataplane) AppliedNode() dataplane.Node {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.node
}

// Records returns every Apply call so far, oldest first.
func (d *Dataplane) Records() []Record {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.records)
}

// Close implements dataplane.Dataplane. The applied copy stays readable.
func (d *Dataplane) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	return nil
}

var (
	_ dataplane.Dataplane     = (*Dataplane)(nil)
	_ dataplane.DriftDetector = (*Dataplane)(nil)
)
