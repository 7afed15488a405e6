package health

import (
	"context"
	"time"

	"github.com/vipd/vipd/server/reconcile"
)

// submitRetry is the pause before a batch the reconciler refused is
// submitted again.
const submitRetry = time.Second

// pendingChange is what the reconciler is to be told about a backend: by
// target t, or a lift (failing false, t nil) for a backend no longer
// probed.
type pendingChange struct {
	failing bool
	t       *target
}

// report records that t's backend is now failing or not, to be submitted
// with the next batch; a no-op when that is what was reported last.
func (p *Prober) report(t *target, failing bool) {
	p.subMu.Lock()
	if t.retired || t.reported == failing {
		p.subMu.Unlock()
		return
	}
	t.reported = failing
	p.pending[t.key] = pendingChange{failing: failing, t: t}
	p.subMu.Unlock()
	p.kickSubmitter()
}

// retire stops submissions for t, which is no longer checked, and lifts
// what the reconciler has of it as failing.
func (p *Prober) retire(t *target) {
	p.subMu.Lock()
	t.retired = true
	if pc, ok := p.pending[t.key]; ok && pc.t == t {
		delete(p.pending, t.key)
	}
	lift := t.acked
	if lift {
		p.pending[t.key] = pendingChange{}
	}
	p.subMu.Unlock()
	if lift {
		p.kickSubmitter()
	}
}

func (p *Prober) kickSubmitter() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// submit hands the pending changes to the reconciler in batches, one
// SetHealth at a time, until ctx ends; a batch that fails is retried
// after submitRetry, merged with what came meanwhile.
func (p *Prober) submit(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		}
		p.subMu.Lock()
		batch := p.pending
		p.pending = map[key]pendingChange{}
		p.subMu.Unlock()
		if len(batch) == 0 {
			continue
		}
		changes := make([]reconcile.HealthChange, 0, len(batch))
		for k, pc := range batch {
			changes = append(changes, reconcile.HealthChange{Service: k.service, Backend: k.ip, Failing: pc.failing})
		}
		err := p.sub.SetHealth(ctx, changes)
		p.subMu.Lock()
		for k, pc := range batch {
			switch {
			case err != nil:
				// Newer news of the backend replaces the refused one.
				if _, ok := p.pending[k]; !ok && (pc.t == nil || !pc.t.retired) {
					p.pending[k] = pc
				}
			case pc.t != nil:
				pc.t.acked = pc.failing
				// Retired while this was on its way: lift it now.
				if pc.t.retired && pc.failing {
					if _, ok := p.pending[k]; !ok {
						p.pending[k] = pendingChange{}
					}
				}
			}
		}
		again := len(p.pending) > 0
		p.subMu.Unlock()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			p.log.Error("submit health changes; retrying", "backends", len(changes), "error", err, "retry_in", submitRetry)
			select {
			case <-ctx.Done():
				return
			case <-time.After(submitRetry):
			}
		}
		if again {
			p.kickSubmitter()
		}
	}
}
