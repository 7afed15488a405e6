package reconcile

import (
	"context"
	"iter"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/server/store"
)

// HealthChange is a change of one backend's health-check result, as a
// prober submits it with SetHealth.
type HealthChange struct {
	Service string
	Backend netip.Addr
	// Failing makes the backend NOT_SERVING in the dataplane; false lifts
	// that again.
	Failing bool
}

// failingSet is the backends that health checks failed, by service. It is
// replaced, never changed, so that an apply that fails can go back to the
// previous one.
type failingSet map[string]map[netip.Addr]struct{}

// with returns the set with changes made, and the names of the services
// whose set changed. It returns f itself when nothing changed.
func (f failingSet) with(changes []HealthChange) (failingSet, []string) {
	var out failingSet
	var changed []string
	for _, c := range changes {
		_, was := f[c.Service][c.Backend]
		if out != nil {
			_, was = out[c.Service][c.Backend]
		}
		if was == c.Failing {
			continue
		}
		if out == nil {
			out = maps.Clone(f)
			if out == nil {
				out = failingSet{}
			}
		}
		if !slices.Contains(changed, c.Service) {
			// Copy the service's set once per call: f's stays as it was.
			out[c.Service] = maps.Clone(out[c.Service])
			if out[c.Service] == nil {
				out[c.Service] = map[netip.Addr]struct{}{}
			}
			changed = append(changed, c.Service)
		}
		if c.Failing {
			if out[c.Service] == nil {
				out[c.Service] = map[netip.Addr]struct{}{}
			}
			out[c.Service][c.Backend] = struct{}{}
		} else {
			delete(out[c.Service], c.Backend)
			if len(out[c.Service]) == 0 {
				delete(out, c.Service)
			}
		}
	}
	if out == nil {
		return f, nil
	}
	return out, changed
}

// SetHealth submits health-check results: each failing backend is handed
// to the dataplane as NOT_SERVING, unless the control plane's state is
// NOT_SERVING already; health never promotes a backend. The change takes
// the same path as a Do: it is batched with other changes, applied all or
// nothing, and SetHealth returns once the dataplane has it, or the apply's
// error, in which case nothing changed. Health is not desired state: it
// uses up no generation and is not saved. Changes for services or backends
// that do not exist are kept, and take effect if they appear; a prober
// lifts what it no longer checks.
func (r *Reconciler) SetHealth(ctx context.Context, changes []HealthChange) error {
	if len(changes) == 0 {
		return nil
	}
	return r.submit(ctx, &request{ctx: ctx, health: changes, done: make(chan result, 1), submitted: time.Now()}).err
}

// dataplaneState is snap's state for the dataplane with the backends in
// failing lowered to NOT_SERVING.
func dataplaneState(snap *store.Snapshot, changed []string, failing failingSet) *dataplane.State {
	s := snap.DataplaneState(changed)
	if len(failing) == 0 {
		return s
	}
	over := map[string]*dataplane.Service{}
	for name, down := range failing {
		svc, ok := s.Get(name)
		if !ok {
			continue
		}
		var cp *dataplane.Service
		for i, b := range svc.Backends {
			if _, ok := down[b.IP]; !ok || b.State == dataplane.BackendNotServing {
				continue
			}
			if cp == nil {
				c := *svc
				c.Backends = slices.Clone(svc.Backends)
				cp = &c
			}
			cp.Backends[i].State = dataplane.BackendNotServing
		}
		if cp != nil {
			over[name] = cp
		}
	}
	if len(over) > 0 {
		s.Set = healthSet{base: s.ServiceSet(), over: over}
	}
	return s
}

// healthSet is a ServiceSet with some services replaced by their copies
// with failing backends lowered.
type healthSet struct {
	base dataplane.ServiceSet
	over map[string]*dataplane.Service
}

func (h healthSet) Get(name string) (*dataplane.Service, bool) {
	if svc, ok := h.over[name]; ok {
		return svc, true
	}
	return h.base.Get(name)
}

func (h healthSet) Len() int { return h.base.Len() }

func (h healthSet) All() iter.Seq2[string, *dataplane.Service] {
	return func(yield func(string, *dataplane.Service) bool) {
		for name, svc := range h.base.All() {
			if o, ok := h.over[name]; ok {
				svc = o
			}
			if !yield(name, svc) {
				return
			}
		}
	}
}
