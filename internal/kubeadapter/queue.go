package kubeadapter

// The work queue: informer events mark Services dirty (markDirty) or a
// full sync due (markFull); loop, the one goroutine that changes vipd,
// takes the whole dirty set at once and hands it to a pass (fullsync.go,
// servicepass.go), requeueing what failed, with a minimum period between
// passes and a backoff after a failed one.

import (
	"context"
	"time"
)

// work is what one pass takes: the dirty Services, with when each was
// marked and its earliest trigger time, and whether a full sync is due.
type work struct {
	full       bool
	fullSince  time.Time
	fullReason string
	names      map[string]time.Time
	triggers   map[string]time.Time
	// zone, when setZone, is the node's zone to hand to vipd first
	// (zone.go).
	zone    string
	setZone bool
}

// take hands the whole dirty set (and a pending full sync) to a pass, so
// that a burst of changes becomes one pass.
func (a *Adapter) take() work {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := work{
		full:       !a.fullSince.IsZero(),
		fullSince:  a.fullSince,
		fullReason: a.fullReason,
		names:      a.dirty,
		triggers:   a.triggers,
	}
	w.zone, w.setZone = a.takeZone(w.full)
	a.dirty, a.triggers = map[string]time.Time{}, map[string]time.Time{}
	a.fullSince, a.fullReason = time.Time{}, ""
	a.fullPassTaken(w.full)
	a.inflight = w.fullSince
	for _, t := range w.names {
		if a.inflight.IsZero() || t.Before(a.inflight) {
			a.inflight = t
		}
	}
	return w
}

func (a *Adapter) hasWork() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.dirty) > 0 || !a.fullSince.IsZero() || a.zone.pending
}

// requeue puts names of w back as dirty, keeping when they were first
// marked and their trigger times; full puts the full sync back too.
func (a *Adapter) requeue(w work, names []string, full bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, n := range names {
		if t, ok := a.dirty[n]; !ok || w.names[n].Before(t) {
			a.dirty[n] = w.names[n]
		}
		if tt, ok := w.triggers[n]; ok {
			if cur, ok := a.triggers[n]; !ok || tt.Before(cur) {
				a.triggers[n] = tt
			}
		}
	}
	if full {
		since := w.fullSince
		if since.IsZero() {
			since = time.Now()
		}
		if a.fullSince.IsZero() || since.Before(a.fullSince) {
			a.fullSince = since
			a.fullReason = w.fullReason
		}
	}
}

// passDone ends a pass: nothing is in flight any more.
func (a *Adapter) passDone(full, ok bool) {
	now := time.Now()
	a.mu.Lock()
	a.inflight = time.Time{}
	if ok {
		a.lastSync = now
		a.synced = a.synced || full
	}
	if full {
		a.fullPassDone(ok)
	}
	a.mu.Unlock()
	kind, result := "partial", "ok"
	if full {
		kind = "full"
	}
	if !ok {
		result = "error"
	}
	a.m.syncs.WithLabelValues(kind, result).Inc()
	if ok {
		a.m.lastSync.Set(float64(now.UnixNano()) / 1e9)
	}
	a.m.services.Set(float64(len(a.applied)))
	counts := map[string]int{}
	for _, r := range a.leftOut {
		counts[r]++
	}
	for _, r := range reasons {
		a.m.leftOut.WithLabelValues(r).Set(float64(counts[r]))
	}
	clear(counts)
	for _, r := range a.externalLeft {
		counts[r]++
	}
	for _, r := range externalReasons {
		a.m.externalOut.WithLabelValues(r).Set(float64(counts[r]))
	}
}

// loop is the one goroutine that changes vipd. It runs a pass whenever
// something is dirty, at least minSyncPeriod after the previous pass
// started, and backs off after a failed pass.
func (a *Adapter) loop(ctx context.Context) {
	var (
		lastStart time.Time
		backoff   = a.cfg.backoffMin
		periodic  *time.Timer
		tick      <-chan time.Time
	)
	if a.cfg.fullSyncPeriod > 0 {
		periodic = time.NewTimer(a.cfg.fullSyncPeriod)
		defer periodic.Stop()
		tick = periodic.C
	}
	for {
		// The periodic full sync is due even while changes keep coming.
		select {
		case <-tick:
			a.markFull("periodic full sync")
		default:
		}
		if !a.hasWork() {
			select {
			case <-ctx.Done():
				return
			case <-a.wake:
			case <-tick:
				a.markFull("periodic full sync")
			}
			continue
		}
		if wait := time.Until(lastStart.Add(a.cfg.minSyncPeriod)); wait > 0 {
			if !sleep(ctx, wait) {
				return
			}
		}
		lastStart = time.Now()
		a.checkInstance(ctx)
		w := a.take()
		// Only the node's zone changed: no pass of services.
		zoneOnly := !w.full && w.setZone && len(w.names) == 0
		var err error
		switch {
		case w.full:
			// The full sync hands vipd the zone once vipd serves.
			err = a.fullPass(ctx, w)
			if err == nil && periodic != nil {
				periodic.Reset(a.cfg.fullSyncPeriod)
			}
		case zoneOnly:
			err = a.sendZone(ctx, w.zone)
		default:
			if w.setZone {
				if zerr := a.sendZone(ctx, w.zone); zerr != nil {
					// Retried on its own after this pass.
					a.log.Warn("setting vipd's zone failed; retrying after the pass", "error", zerr)
				}
			}
			err = a.partialPass(ctx, w)
		}
		if !zoneOnly {
			a.passDone(w.full, err == nil)
			a.retryFreed()
		}
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			backoff = a.cfg.backoffMin
			continue
		}
		a.log.Warn("sync failed; retrying", "full", w.full, "in", backoff, "error", err)
		if !sleep(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, a.cfg.backoffMax)
	}
}

// sleep waits for d or ctx, and reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// observe records the programming latency of the changes in w that names
// now has applied.
func (a *Adapter) observe(w work, names ...string) {
	now := time.Now()
	for _, n := range names {
		if t, ok := w.triggers[n]; ok {
			if d := now.Sub(t); d >= 0 {
				a.m.programming.Observe(d.Seconds())
			}
		}
	}
}
