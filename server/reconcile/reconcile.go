package reconcile

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/server/store"
)

// Mutation stages one caller's change in tx and returns the caller's result.
// It may be run more than once, each time on a fresh tx, so it must not have
// side effects outside tx. An error drops everything the mutation staged.
type Mutation func(tx *store.Txn) (any, error)

// Persister saves a snapshot durably; *store.Dir is one.
type Persister interface {
	Save(*store.Snapshot) error
}

// ApplyError is returned to callers whose change the dataplane refused. The
// change was rolled back.
type ApplyError struct{ Err error }

func (e *ApplyError) Error() string { return "dataplane apply: " + e.Err.Error() }
func (e *ApplyError) Unwrap() error { return e.Err }

// SaveError is returned to callers whose change could not be saved. The
// change was rolled back, in the dataplane too.
type SaveError struct{ Err error }

func (e *SaveError) Error() string { return "save state: " + e.Err.Error() }
func (e *SaveError) Unwrap() error { return e.Err }

// ErrStopped is returned for changes submitted after Run has returned.
var ErrStopped = errors.New("reconciler stopped")

// HeldError is returned for a change submitted with Do while the reconciler
// holds the dataplane (see WithHold). The change was not made.
type HeldError struct{ Reason string }

func (e *HeldError) Error() string {
	return "the dataplane is held until a full sync (" + e.Reason + "); only a change submitted with Release is accepted"
}

// Status describes the last dataplane sync.
type Status struct {
	// Ready is true once the initial state has been applied (under
	// WithHold: the first Release change).
	Ready bool
	// AppliedGeneration is the revision of the snapshot the dataplane has.
	AppliedGeneration uint64
	// LastSync is when the last successful apply finished, and LastSyncDuration how long it took.
	LastSync         time.Time
	LastSyncDuration time.Duration
	// LastError is the error of the last apply, or nil if it succeeded.
	LastError error
	// HeldReason is set while the reconciler holds the dataplane (see
	// WithHold): why it applies nothing yet.
	HeldReason string
	// Services and Backends count the applied snapshot.
	Services, Backends int
	// NodePortAddresses are the node-port addresses of the Node the
	// dataplane has (State.Node); the slice is never changed.
	NodePortAddresses []netip.Addr
	// Topology is the node's name and zone that topology-aware routing
	// uses (WithTopology, SetZone): the dataplane has it once an apply
	// since it was set succeeded; under a hold, from the releasing sync.
	Topology Topology
}

// Sync kinds reported to an Observer.
const (
	// SyncFull is an apply without a change hint (State.Changed is nil):
	// the initial apply and periodic resyncs, where the dataplane diffs
	// everything.
	SyncFull = "full"
	// SyncPartial is an apply of a change, with State.Changed naming the
	// services it touched.
	SyncPartial = "partial"
)

// Observer is told about every dataplane sync; internal/metrics implements
// it. Its methods are called from the reconciler's goroutine, one at a
// time, and must not block.
type Observer interface {
	// ObserveSync reports one Apply: its kind (SyncFull or SyncPartial),
	// how long the dataplane took, and its error (nil on success).
	ObserveSync(kind string, d time.Duration, err error)
	// ObserveProgramming reports, for one submitted change that is now
	// live, the time from its submission (Do) to the end of the Apply
	// that programmed it. It is called only for changes that were applied
	// and saved, once each, even when a batch carried several.
	ObserveProgramming(d time.Duration)
	// SetState reports the size of the state the dataplane now has, after
	// every successful Apply.
	SetState(services, backends int)
	// ObserveDriftRepair reports one successful repair of drift of kind
	// what (a dataplane.Drift's What) in the dataplane named dp: once per
	// distinct What a repairing full sync fixed.
	ObserveDriftRepair(dp, what string)
}

type nopObserver struct{}

func (nopObserver) ObserveSync(string, time.Duration, error) {}
func (nopObserver) ObserveProgramming(time.Duration)         {}
func (nopObserver) SetState(int, int)                        {}
func (nopObserver) ObserveDriftRepair(string, string)        {}

// Reconciler serializes changes into dataplane applies. Create it with New
// and start it with Run.
type Reconciler struct {
	log      hclog.Logger
	dp       dataplane.Dataplane
	persist  Persister
	resync   time.Duration
	drift    time.Duration
	maxBatch int
	observer Observer

	current atomic.Pointer[store.Snapshot]
	queue   chan *request
	ready   chan struct{}
	stopped chan struct{}
	// held is set by WithHold and cleared, by Run's goroutine only, when a
	// Release change has been applied.
	held bool
	// driftErr is the error of the last drift check, "" if it worked; Run's
	// goroutine only.
	driftErr string
	// failing is what SetHealth made NOT_SERVING, as the dataplane has
	// it; Run's goroutine only.
	failing failingSet
	// node is the Node every State carries (WithNode, SetNode), as the
	// dataplane has it; Run's goroutine only once Run started.
	node dataplane.Node
	// topology is the node's place for topology-aware routing
	// (WithTopology, SetZone); Run's goroutine only once Run started.
	// Status has a copy.
	topology Topology
	// topo is what the topology filter made of the applied state; it is
	// replaced only by Run's goroutine, after a successful Apply.
	topo atomic.Pointer[topoState]
	// applied, when not nil, is told every State the dataplane accepted
	// (WithAppliedHook).
	applied func(*dataplane.State)

	mu     sync.Mutex
	status Status
}

type request struct {
	ctx    context.Context
	mutate Mutation
	done   chan result
	// submitted is when Do received the change, the start of its
	// network-programming time.
	submitted time.Time
	// release marks a change submitted with Release.
	release bool
	// health, when not nil, makes this a SetHealth request: mutate is nil.
	health []HealthChange
	// node, when not nil, makes this a SetNode request: mutate is nil.
	node *dataplane.Node
	// zone, when not nil, makes this a SetZone request: mutate is nil.
	zone *string
}

type result struct {
	value any
	err   error
}

// Option configures a Reconciler.
type Option func(*Reconciler)

// WithResyncPeriod re-applies the whole state every d, telling the dataplane
// to diff everything (State.Changed is nil). Zero disables it.
func WithResyncPeriod(d time.Duration) Option { return func(r *Reconciler) { r.resync = d } }

// WithDriftCheck asks the dataplane every d, if it is a
// dataplane.DriftDetector, whether the kernel still holds what it
// programmed, and runs a full sync at once when it does not. Drift is
// logged at warn level, the repair at info level (error when the full sync
// fails; the next check retries), and each repair is reported to the
// Observer. There is no check before the initial apply nor while the
// reconciler holds (WithHold). Zero disables it.
//
// A check runs on the goroutine that applies changes, so each is bounded
// by driftCheckTimeout(d): a check that has not finished by then (a held
// xtables lock, say) is cancelled and counts as a failed check, logged at
// warn level, not as drift; writes wait for it at most that long.
func WithDriftCheck(d time.Duration) Option { return func(r *Reconciler) { r.drift = d } }

// WithMaxBatch bounds how many queued changes are merged into one apply.
func WithMaxBatch(n int) Option { return func(r *Reconciler) { r.maxBatch = n } }

// WithObserver reports every sync, programming time and applied state
// size to o. Nil means no observer.
func WithObserver(o Observer) Option {
	return func(r *Reconciler) {
		if o != nil {
			r.observer = o
		}
	}
}

// WithHold makes the reconciler hold the dataplane: Run applies nothing (no
// initial apply, no periodic resync) and refuses every change submitted
// with Do (a *HeldError), until a change submitted with Release has been
// applied as a full sync. Ready stays open until then, and Status reports
// reason. It is for a start over a desired state that is known to be
// incomplete (vipd --recover), where applying it would remove from the
// kernel what the control plane still wants.
func WithHold(reason string) Option {
	return func(r *Reconciler) {
		r.held = true
		r.status.HeldReason = reason
	}
}

// New returns a reconciler whose desired state starts as initial. Nothing is
// applied until Run.
func New(log hclog.Logger, dp dataplane.Dataplane, p Persister, initial *store.Snapshot, opts ...Option) *Reconciler {
	r := &Reconciler{
		log:      log,
		dp:       dp,
		persist:  p,
		maxBatch: 1024,
		observer: nopObserver{},
		queue:    make(chan *request, 1024),
		ready:    make(chan struct{}),
		stopped:  make(chan struct{}),
	}
	for _, o := range opts {
		o(r)
	}
	r.current.Store(initial)
	r.status.Services, r.status.Backends = initial.Len(), initial.BackendCount()
	return r
}

// Snapshot returns the current desired state, which is also the state the
// dataplane has applied once Ready is closed.
func (r *Reconciler) Snapshot() *store.Snapshot { return r.current.Load() }

// Ready is closed once the initial state has been applied; under WithHold,
// once the first Release change has been applied and saved.
func (r *Reconciler) Ready() <-chan struct{} { return r.ready }

// Status returns the last sync's status.
func (r *Reconciler) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status
}

// Do submits m and waits until its change is applied and saved, or refused.
// If ctx ends before m has run, m never runs; once m has run, Do waits for
// the outcome, which callers then see in full.
func (r *Reconciler) Do(ctx context.Context, m Mutation) (any, error) {
	return r.do(ctx, m, false)
}

// Release is Do for a change that may end a hold (see WithHold), such as a
// full sync from the control plane. While the reconciler holds, m runs
// like any change, and then the whole resulting state is applied as a full
// sync and saved; once that succeeds the hold ends and Ready closes. If it
// fails, the hold stays. Without a hold, Release is Do.
func (r *Reconciler) Release(ctx context.Context, m Mutation) (any, error) {
	return r.do(ctx, m, true)
}

// Validate runs m as Do would, but only on a transaction begun on the
// current desired state, which it then throws away: nothing is applied,
// saved or published, and no generation is used up. It returns m's result
// and error, or what Do would return without running m (ctx's error,
// ErrStopped, a *HeldError). It does not wait for changes queued before
// it, so a change that validates may still fail when submitted.
func (r *Reconciler) Validate(ctx context.Context, m Mutation) (any, error) {
	return r.validate(ctx, m, false)
}

// ValidateRelease is Validate for a change that Release would submit: a
// hold does not refuse it.
func (r *Reconciler) ValidateRelease(ctx context.Context, m Mutation) (any, error) {
	return r.validate(ctx, m, true)
}

func (r *Reconciler) validate(ctx context.Context, m Mutation, release bool) (any, error) {
	select {
	case <-r.stopped:
		return nil, ErrStopped
	default:
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if reason := r.Status().HeldReason; reason != "" && !release {
		return nil, &HeldError{Reason: reason}
	}
	return m(r.current.Load().Begin())
}

func (r *Reconciler) do(ctx context.Context, m Mutation, release bool) (any, error) {
	res := r.submit(ctx, &request{ctx: ctx, mutate: m, done: make(chan result, 1), submitted: time.Now(), release: release})
	return res.value, res.err
}

// submit queues q for the reconcile loop and waits for its result: the
// context's error if it ends before the loop takes q, ErrStopped if the
// loop stops first.
func (r *Reconciler) submit(ctx context.Context, q *request) result {
	select {
	case r.queue <- q:
	case <-ctx.Done():
		return result{err: ctx.Err()}
	case <-r.stopped:
		return result{err: ErrStopped}
	}
	select {
	case res := <-q.done:
		return res
	case <-r.stopped:
		return result{err: ErrStopped}
	}
}

// Run applies the initial state, retrying with backoff until it succeeds,
// then processes changes until ctx ends. It returns ctx's error. Run must be
// called once. With WithHold it applies no initial state: the first
// successful Release change is the first apply.
func (r *Reconciler) Run(ctx context.Context) error {
	defer close(r.stopped)
	if r.held {
		r.log.Warn("holding the dataplane: nothing is applied until a full sync", "reason", r.status.HeldReason)
	} else {
		if err := r.applyInitial(ctx); err != nil {
			return err
		}
		close(r.ready)
	}

	var tick <-chan time.Time
	if r.resync > 0 {
		t := time.NewTicker(r.resync)
		defer t.Stop()
		tick = t.C
	}
	var driftTick <-chan time.Time
	det, ok := r.dp.(dataplane.DriftDetector)
	if ok && r.drift > 0 {
		t := time.NewTicker(r.drift)
		defer t.Stop()
		driftTick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick:
			r.resyncAll(ctx)
		case <-driftTick:
			r.repairDrift(ctx, det)
		case q := <-r.queue:
			batch := []*request{q}
		drain:
			for len(batch) < r.maxBatch {
				select {
				case q := <-r.queue:
					batch = append(batch, q)
				default:
					break drain
				}
			}
			r.process(ctx, batch)
		}
	}
}

func (r *Reconciler) applyInitial(ctx context.Context) error {
	backoff := 100 * time.Millisecond
	for {
		snap := r.current.Load()
		_, err := r.apply(ctx, snap, nil)
		if err == nil {
			r.log.Info("initial state applied", "services", snap.Len(), "backends", snap.BackendCount(), "generation", snap.Revision())
			return nil
		}
		r.log.Error("apply initial state; retrying", "error", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

func (r *Reconciler) resyncAll(ctx context.Context) {
	if r.held {
		// The desired state is not the whole truth yet: a resync would
		// remove what the kernel still has for the control plane.
		return
	}
	snap := r.current.Load()
	if _, err := r.apply(ctx, snap, nil); err != nil {
		r.log.Error("periodic resync", "error", err)
	}
}

// maxDriftCheckTimeout caps driftCheckTimeout: no write waits longer
// than this for a drift check.
const maxDriftCheckTimeout = 10 * time.Second

// driftCheckTimeout bounds one drift check made every period: half the
// period, so that checks that keep timing out leave the writer at least
// half its time for changes (at a full period the next tick would be due
// as each check gives up, and checks would run back to back), and at most
// maxDriftCheckTimeout, so that a change never waits longer than that for
// one.
func driftCheckTimeout(period time.Duration) time.Duration {
	return min(period/2, maxDriftCheckTimeout)
}

// repairDrift asks det for drift and, when it reports any, repairs it with
// a full sync of the current snapshot, then checks again: each kind of
// drift that is gone is counted as repaired, and what is left is logged as
// an error. A failed or timed-out check or a failed repair is logged and
// left to the next tick.
func (r *Reconciler) repairDrift(ctx context.Context, det dataplane.DriftDetector) {
	if r.held {
		// Nothing was applied yet that could have drifted, and a full sync
		// would remove what the kernel still has for the control plane.
		return
	}
	timeout := driftCheckTimeout(r.drift)
	checkCtx, cancel := context.WithTimeout(ctx, timeout)
	drift, err := det.DetectDrift(checkCtx)
	timedOut := errors.Is(checkCtx.Err(), context.DeadlineExceeded)
	cancel()
	if ctx.Err() != nil {
		return // stopping
	}
	if err != nil && timedOut {
		err = fmt.Errorf("timed out after %s, so as not to hold up changes any longer: %w", timeout, err)
	}
	if err != nil {
		// Logged at warn level when it starts or changes, not every tick.
		if err.Error() != r.driftErr {
			r.log.Warn("dataplane drift check failed; retrying every period", "error", err)
		} else {
			r.log.Debug("dataplane drift check failed", "error", err)
		}
		r.driftErr = err.Error()
		return
	}
	if r.driftErr != "" {
		r.log.Info("dataplane drift check works again")
		r.driftErr = ""
	}
	if len(drift) == 0 {
		return
	}
	var whats []string
	for _, d := range drift {
		r.log.Warn("dataplane drift; repairing with a full sync", "what", d.What, "detail", d.Detail)
		if !slices.Contains(whats, d.What) {
			whats = append(whats, d.What)
		}
	}
	snap := r.current.Load()
	start := time.Now()
	if _, err := r.apply(ctx, snap, nil); err != nil {
		r.log.Error("dataplane drift repair failed; retrying at the next check", "what", whats, "error", err)
		return
	}
	elapsed := time.Since(start)
	// Only what is gone after the sync counts as repaired: the dataplane
	// may be unable to repair some of it (an interface the tc program
	// cannot be attached to, say).
	left := r.driftLeft(ctx, det)
	for _, d := range left {
		r.log.Error("dataplane drift remains after a full sync; retrying at the next check", "what", d.What, "detail", d.Detail)
	}
	var repaired []string
	for _, w := range whats {
		if !slices.ContainsFunc(left, func(d dataplane.Drift) bool { return d.What == w }) {
			r.observer.ObserveDriftRepair(r.dp.Name(), w)
			repaired = append(repaired, w)
		}
	}
	if len(repaired) > 0 {
		r.log.Info("dataplane drift repaired with a full sync", "what", repaired, "generation", snap.Revision(), "elapsed", elapsed)
	}
}

// driftLeft checks again, after a repair, what drift is left. A check that
// fails tells nothing: it returns nil, and the next tick checks again.
func (r *Reconciler) driftLeft(ctx context.Context, det dataplane.DriftDetector) []dataplane.Drift {
	checkCtx, cancel := context.WithTimeout(ctx, driftCheckTimeout(r.drift))
	defer cancel()
	drift, err := det.DetectDrift(checkCtx)
	if err != nil {
		r.log.Debug("dataplane drift check after a repair failed", "error", err)
		return nil
	}
	return drift
}

// apply hands snap to the dataplane, records the outcome in the status and
// reports it to the observer. It returns when the Apply finished. A nil
// changed makes it a full sync.
func (r *Reconciler) apply(ctx context.Context, snap *store.Snapshot, changed []string) (time.Time, error) {
	start := time.Now()
	s := dataplaneState(snap, changed, r.failing)
	s.Node = r.node
	// Topology works on the health-lowered services: a backend that fails
	// its checks is no longer usable, which may widen the selection.
	prevTopo := r.topo.Load()
	topo, err := prevTopo.next(r.topology, snap, s.ServiceSet(), changed)
	if err != nil {
		// The specs were encoded by the store: this is a bug, not input.
		r.log.Error("topology filter failed; applying without it", "error", err)
		topo = nil
	} else {
		s.Set = topo.set(s.ServiceSet())
		if changed != nil {
			// A new zone changes services that no change named.
			s.Changed = topo.changedSince(prevTopo, changed)
		}
	}
	err = r.dp.Apply(ctx, s)
	end := time.Now()
	elapsed := end.Sub(start)
	kind := SyncPartial
	if changed == nil {
		kind = SyncFull
	}
	r.observer.ObserveSync(kind, elapsed, err)

	r.mu.Lock()
	r.status.LastError = err
	if err == nil {
		r.status.Ready = true
		r.status.AppliedGeneration = snap.Revision()
		r.status.LastSync = end
		r.status.LastSyncDuration = elapsed
		r.status.Services, r.status.Backends = snap.Len(), snap.BackendCount()
		r.status.NodePortAddresses = s.Node.NodePortAddresses
	}
	r.mu.Unlock()
	if err != nil {
		return end, err
	}
	r.topo.Store(topo)
	r.observer.SetState(snap.Len(), snap.BackendCount())
	if r.applied != nil {
		r.applied(s)
	}
	r.log.Debug("applied", "generation", snap.Revision(), "changed", len(changed), "elapsed", elapsed)
	return end, nil
}

// process runs a batch of mutations in order on one transaction, applies and
// saves the result once, and answers every request. If the dataplane refuses
// the merged change, each request is retried on its own so that one bad
// change cannot fail its neighbours.
//
// While the reconciler holds, a request submitted with Do is refused; the
// first Release request that stages without error ends the hold for the
// requests after it in the batch, and makes the batch's apply a full one.
func (r *Reconciler) process(ctx context.Context, batch []*request) {
	base := r.current.Load()
	tx := base.Begin()
	held, releasing := r.held, false
	prev := r.overlay()
	failing, node, topology := prev.failing, prev.node, prev.topology
	var healthChanged []string
	var staged []*request
	var values []any
	var changes []bool // per staged request: did it change anything
	for _, q := range batch {
		if err := q.ctx.Err(); err != nil {
			q.done <- result{err: err}
			continue
		}
		if q.node != nil || q.zone != nil {
			// Accepted while holding too: the releasing sync carries it.
			if q.node != nil {
				node = *q.node
			} else {
				topology.Zone = *q.zone
			}
			changes = append(changes, false)
			staged = append(staged, q)
			values = append(values, nil)
			continue
		}
		if held && !q.release {
			q.done <- result{err: &HeldError{Reason: r.Status().HeldReason}}
			continue
		}
		if q.health != nil {
			var names []string
			failing, names = failing.with(q.health)
			for _, n := range names {
				if !slices.Contains(healthChanged, n) {
					healthChanged = append(healthChanged, n)
				}
			}
			changes = append(changes, len(names) > 0)
			staged = append(staged, q)
			values = append(values, nil)
			continue
		}
		sub := tx.Sub()
		v, err := q.mutate(sub)
		if err != nil {
			q.done <- result{err: err}
			continue
		}
		if held {
			held, releasing = false, true
		}
		changes = append(changes, sub.Dirty())
		sub.Merge()
		staged = append(staged, q)
		values = append(values, v)
	}
	if len(staged) == 0 {
		return
	}
	if len(staged) == 1 {
		// A batch of one never runs its mutation again (only the
		// changes of a failed merged apply are retried one by one,
		// below): drop it, so that what it holds, such as a big
		// SyncServices' validated list, can be collected while the
		// change is applied and saved.
		staged[0].mutate = nil
	}
	changed := tx.Changed()
	nodeChanged := !node.Equal(&prev.node)
	topologyChanged := topology != prev.topology
	if (len(changed) == 0 && len(healthChanged) == 0 && !nodeChanged && !topologyChanged && !releasing) || (r.held && !releasing) {
		// Under a hold only node and zone changes get here: nothing is
		// applied until the releasing sync, which carries them.
		r.node = node
		r.setTopology(topology)
		for i, q := range staged {
			q.done <- result{value: values[i]}
		}
		return
	}
	// Health, node and zone changes ride on the batch's apply; they are
	// not desired state, so a batch of only those applies the current
	// snapshot and saves nothing.
	r.setOverlay(overlay{failing: failing, node: node, topology: topology})
	var (
		applied time.Time
		err     error
	)
	switch {
	case releasing:
		applied, err = r.commitRelease(ctx, tx.Commit())
	case len(changed) == 0:
		if healthChanged == nil {
			// Only the node or the zone changed: no service's desired
			// state did (State.Changed never lists a Node change; apply
			// adds the services a zone change affects), and this is no
			// full sync.
			healthChanged = []string{}
		}
		applied, err = r.apply(ctx, base, healthChanged)
		if err != nil {
			r.log.Error("dataplane apply of health, node or zone changes failed; change rolled back", "services", healthChanged, "node_changed", nodeChanged, "zone_changed", topologyChanged, "error", err)
			err = &ApplyError{Err: err}
		}
	default:
		for _, n := range healthChanged {
			if !slices.Contains(changed, n) {
				changed = append(changed, n)
			}
		}
		applied, err = r.commit(ctx, base, tx.Commit(), changed, prev)
	}
	if err != nil {
		r.setOverlay(prev)
	}
	if err == nil {
		for i, q := range staged {
			if changes[i] {
				r.observer.ObserveProgramming(applied.Sub(q.submitted))
			}
			q.done <- result{value: values[i]}
		}
		return
	}
	var applyErr *ApplyError
	if len(staged) > 1 && errors.As(err, &applyErr) {
		r.log.Warn("merged apply failed; retrying changes one by one", "changes", len(staged), "error", err)
		for _, q := range staged {
			r.process(ctx, []*request{q})
		}
		return
	}
	for _, q := range staged {
		q.done <- result{err: err}
	}
}

// commitRelease applies next in full, saves it and publishes it, and ends
// the hold. On an apply error nothing changed and the hold stays. If the
// save fails after the apply, the dataplane keeps next, unlike in commit:
// rolling it back to the held state would remove what the control plane
// wants, and the previous kernel state is not known. The hold stays, so
// nothing but another Release touches the kernel until a save succeeds.
func (r *Reconciler) commitRelease(ctx context.Context, next *store.Snapshot) (time.Time, error) {
	applied, err := r.apply(ctx, next, nil)
	if err != nil {
		r.log.Error("dataplane apply of the releasing sync failed; still holding", "generation", next.Revision(), "error", err)
		return time.Time{}, &ApplyError{Err: err}
	}
	if err := r.persist.Save(next); err != nil {
		r.log.Error("saving state failed after the releasing sync; the dataplane keeps it, still holding", "generation", next.Revision(), "error", err)
		r.mu.Lock()
		r.status.Ready = false
		r.mu.Unlock()
		return time.Time{}, &SaveError{Err: fmt.Errorf("generation %d: %w", next.Revision(), err)}
	}
	r.current.Store(next)
	r.held = false
	r.mu.Lock()
	r.status.HeldReason = ""
	r.mu.Unlock()
	r.log.Info("hold released: the full state is applied", "services", next.Len(), "backends", next.BackendCount(), "generation", next.Revision())
	close(r.ready)
	return applied, nil
}

// commit applies next, saves it and publishes it, and returns when the
// dataplane finished applying it. On any error the dataplane and the
// published snapshot are left at base.
//
// prev is the overlay that goes with base.
func (r *Reconciler) commit(ctx context.Context, base, next *store.Snapshot, changed []string, prev overlay) (time.Time, error) {
	applied, err := r.apply(ctx, next, changed)
	if err != nil {
		r.log.Error("dataplane apply failed; change rolled back", "generation", next.Revision(), "error", err)
		return time.Time{}, &ApplyError{Err: err}
	}
	if err := r.persist.Save(next); err != nil {
		r.log.Error("saving state failed; rolling the dataplane back", "generation", next.Revision(), "error", err)
		r.setOverlay(prev)
		if _, rerr := r.apply(ctx, base, changed); rerr != nil {
			r.log.Error("roll back dataplane", "error", rerr)
		}
		return time.Time{}, &SaveError{Err: fmt.Errorf("generation %d: %w", next.Revision(), err)}
	}
	r.current.Store(next)
	return applied, nil
}
