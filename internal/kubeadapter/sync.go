package kubeadapter

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/kubeconvert"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Reasons a Service is left out of vipd (the reason label of
// vipd_k8s_services_left_out).
const (
	// ReasonOtherOwner: vipd has a service of that name under another owner.
	ReasonOtherOwner = "other-owner"
	// ReasonConflict: a VIP:port of it is another service's (AlreadyExists).
	ReasonConflict = "conflict"
	// ReasonInvalid: vipd refused it as invalid, or it could not be converted.
	ReasonInvalid = "invalid"
	// ReasonUnsupported: vipd's dataplane cannot honour it (FailedPrecondition).
	ReasonUnsupported = "unsupported"
	// ReasonOverLimit: it would take vipd past one of its totals
	// (--max-services, --max-total-backends: ResourceExhausted with a
	// google.rpc.QuotaFailure).
	ReasonOverLimit = "over-limit"
)

var reasons = []string{ReasonOtherOwner, ReasonConflict, ReasonInvalid, ReasonUnsupported, ReasonOverLimit}

const (
	// fullSyncTimeout bounds one SyncServices: 100,000 services take
	// seconds to program, beyond the client's default deadline.
	fullSyncTimeout = 2 * time.Minute
	// maxSyncRaces bounds the retries of a full sync that met a name
	// another owner created meanwhile.
	maxSyncRaces = 3
	// maxWriteRaces bounds the rereads of one service's write that met
	// another writer.
	maxWriteRaces = 3
)

// work is what one pass takes: the dirty Services, with when each was
// marked and its earliest trigger time, and whether a full sync is due.
type work struct {
	full       bool
	fullSince  time.Time
	fullReason string
	names      map[string]time.Time
	triggers   map[string]time.Time
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
	a.dirty, a.triggers = map[string]time.Time{}, map[string]time.Time{}
	a.fullSince, a.fullReason = time.Time{}, ""
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
	return len(a.dirty) > 0 || !a.fullSince.IsZero()
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
		w := a.take()
		var err error
		if w.full {
			err = a.fullPass(ctx, w)
			if err == nil && periodic != nil {
				periodic.Reset(a.cfg.fullSyncPeriod)
			}
		} else {
			err = a.partialPass(ctx, w)
		}
		a.passDone(w.full, err == nil)
		a.retryFreed()
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

// waitVIPD waits for vipd to serve. A vipd that answers but stays not
// serving (vipd --recover holds its dataplane until a SyncServices) is
// synced all the same: the SyncServices is what it waits for.
func (a *Adapter) waitVIPD(ctx context.Context) error {
	wctx, cancel := context.WithTimeout(ctx, a.cfg.servingWait)
	err := a.vipd.WaitServing(wctx)
	cancel()
	if err == nil || ctx.Err() != nil {
		return err
	}
	st, serr := a.vipd.Status(ctx)
	if serr != nil {
		return fmt.Errorf("wait for vipd: %w", err)
	}
	a.log.Warn("vipd answers but is not serving; syncing anyway (a SyncServices ends a --recover hold)", "reason", st.GetLastError())
	return nil
}

// fullPass makes vipd's kubernetes-owned services exactly the converted
// state with one SyncServices, leaving out what another owner holds and
// what vipd refuses.
func (a *Adapter) fullPass(ctx context.Context, w work) error {
	err := a.fullSync(ctx, w)
	if err != nil {
		a.requeue(w, slices.Collect(maps.Keys(w.names)), true)
		return fmt.Errorf("full sync (%s): %w", w.fullReason, err)
	}
	return nil
}

func (a *Adapter) fullSync(ctx context.Context, w work) error {
	if err := a.waitVIPD(ctx); err != nil {
		return err
	}
	defer func() { a.prevLeftOut = nil }()
	start := time.Now()
	for race := 0; ; race++ {
		all, err := a.vipd.ListServices(ctx, "")
		if err != nil {
			return fmt.Errorf("list vipd's services: %w", err)
		}
		svcs := listOf[*corev1.Service](a.services.GetStore().List())
		eps := listOf[*discoveryv1.EndpointSlice](a.slices.GetStore().List())
		want, left := kubeconvert.ConvertAll(svcs, eps, a.convert)

		// Each full sync finds what it leaves out afresh; what it left
		// out before is not logged again.
		a.prevLeftOut = a.leftOut
		a.leftOut, a.refused = map[string]string{}, map[string]*vipdv1.Service{}
		for _, l := range left {
			if !kubeconvert.IsSkipped(l.Err) {
				a.leave(l.Service, ReasonInvalid, nil, l.Err)
			}
		}
		want = a.withoutForeign(all, want)
		resp, sent, err := a.syncDropping(ctx, want)
		switch code := status.Code(err); {
		case err == nil:
		case code == codes.AlreadyExists && race < maxSyncRaces:
			// A name listed free a moment ago was taken by another owner.
			a.log.Info("full sync met a service created meanwhile; listing again", "error", err)
			continue
		case code == codes.FailedPrecondition || code == codes.ResourceExhausted || code == codes.AlreadyExists:
			// vipd does not say which service it refused: apply them one
			// by one, so that one cannot hold up the others.
			a.log.Warn("vipd refused the full sync without naming a service; applying the services one by one", "error", err)
			return a.piecewise(ctx, w, all, sent)
		default:
			return err
		}
		ours, err := a.vipd.ListServices(ctx, kubeconvert.Owner)
		if err != nil {
			return fmt.Errorf("list kubernetes services after the sync: %w", err)
		}
		gens := map[string]uint64{}
		for _, s := range ours {
			gens[s.Name] = s.Generation
		}
		a.applied = map[string]record{}
		var names []string
		for _, s := range sent {
			if g, ok := gens[s.Name]; ok {
				a.applied[s.Name] = record{spec: s, gen: g}
				names = append(names, s.Name)
			}
		}
		a.observe(w, names...)
		a.log.Info("full sync", "reason", w.fullReason, "services", len(sent), "created", len(resp.Created),
			"updated", len(resp.Updated), "deleted", len(resp.Deleted), "unchanged", len(resp.Unchanged),
			"left_out", len(a.leftOut), "elapsed", time.Since(start))
		return nil
	}
}

func listOf[T any](objs []any) []T {
	out := make([]T, 0, len(objs))
	for _, o := range objs {
		if t, ok := o.(T); ok {
			out = append(out, t)
		}
	}
	return out
}

// claim is one VIP:port/protocol, as vipd's store keys them.
type claim struct {
	vip   netip.Addr
	proto vipdv1.Protocol
	port  uint32
}

func claimsOf(s *vipdv1.Service) []claim {
	var out []claim
	for _, v := range s.Vips {
		ip, err := netip.ParseAddr(v)
		if err != nil {
			continue
		}
		for _, p := range s.Ports {
			proto := p.Protocol
			if proto == vipdv1.Protocol_PROTOCOL_UNSPECIFIED {
				proto = vipdv1.Protocol_PROTOCOL_TCP
			}
			out = append(out, claim{ip.Unmap(), proto, p.Port})
		}
	}
	return out
}

// withoutForeign leaves out of want the names and the VIP:ports that
// services of other owners hold: SyncServices would refuse the whole call
// for either.
func (a *Adapter) withoutForeign(all, want []*vipdv1.Service) []*vipdv1.Service {
	names := map[string]string{}
	claims := map[claim]string{}
	for _, s := range all {
		if s.Owner == kubeconvert.Owner {
			continue
		}
		names[s.Name] = s.Owner
		for _, c := range claimsOf(s) {
			claims[c] = s.Name
		}
	}
	out := want[:0]
	for _, s := range want {
		if owner, ok := names[s.Name]; ok {
			a.leave(s.Name, ReasonOtherOwner, nil, fmt.Errorf("vipd has service %s under owner %s", s.Name, owner))
			continue
		}
		var holder string
		for _, c := range claimsOf(s) {
			if h, ok := claims[c]; ok {
				holder = fmt.Sprintf("%s/%s is held by service %s", netip.AddrPortFrom(c.vip, uint16(c.port)), strings.TrimPrefix(c.proto.String(), "PROTOCOL_"), h)
				break
			}
		}
		if holder != "" {
			a.leave(s.Name, ReasonConflict, s, errors.New(holder))
			continue
		}
		out = append(out, s)
	}
	return out
}

// syncDropping calls SyncServices with want; while vipd refuses services as
// invalid, naming them as services[i], it drops those and tries again. It
// returns what it sent last.
func (a *Adapter) syncDropping(ctx context.Context, want []*vipdv1.Service) (*vipdv1.SyncServicesResponse, []*vipdv1.Service, error) {
	for {
		cctx, cancel := context.WithTimeout(ctx, fullSyncTimeout)
		resp, err := a.vipd.SyncServices(cctx, kubeconvert.Owner, want)
		cancel()
		if status.Code(err) != codes.InvalidArgument {
			return resp, want, err
		}
		bad := map[int][]string{}
		for _, v := range client.FieldViolations(err) {
			if i, ok := serviceIndex(v.GetField()); ok && i < len(want) {
				bad[i] = append(bad[i], v.GetField()+": "+v.GetDescription())
			}
		}
		if len(bad) == 0 {
			return nil, want, err
		}
		kept := make([]*vipdv1.Service, 0, len(want)-len(bad))
		for i, s := range want {
			if v, ok := bad[i]; ok {
				a.leave(s.Name, ReasonInvalid, s, fmt.Errorf("vipd refused it: %s", strings.Join(v, "; ")))
				continue
			}
			kept = append(kept, s)
		}
		want = kept
	}
}

// serviceIndex reads i from a field violation "services[i]..." .
func serviceIndex(field string) (int, bool) {
	rest, ok := strings.CutPrefix(field, "services[")
	if !ok {
		return 0, false
	}
	n, _, ok := strings.Cut(rest, "]")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(n)
	return i, err == nil && i >= 0
}

// leave records that name is not programmed, and why; svc, when not nil,
// is the version refused, which is not tried again until it changes.
func (a *Adapter) leave(name, reason string, svc *vipdv1.Service, err error) {
	if a.leftOut[name] != reason && a.prevLeftOut[name] != reason {
		a.log.Warn("service left out", "service", name, "reason", reason, "error", err)
	}
	a.leftOut[name] = reason
	if svc != nil {
		a.refused[name] = svc
	}
}

// piecewise is a full sync done one service at a time, for when vipd
// refuses a SyncServices without naming the service at fault: every
// desired service is upserted and every other kubernetes-owned one
// deleted, each refusal attributed to its own service.
func (a *Adapter) piecewise(ctx context.Context, w work, all, want []*vipdv1.Service) error {
	a.applied = map[string]record{}
	names := map[string]bool{}
	for _, s := range all {
		if s.Owner == kubeconvert.Owner {
			// vipd's copy has defaults filled in, so it never equals a
			// conversion: each is rewritten once, with its generation.
			a.applied[s.Name] = record{spec: s, gen: s.Generation}
			names[s.Name] = true
		}
	}
	for _, s := range want {
		names[s.Name] = true
	}
	var errs []error
	for _, n := range a.deletesFirst(slices.Sorted(maps.Keys(names))) {
		observe, err := a.syncOne(ctx, n)
		if err != nil {
			if status.Code(err) == codes.Unavailable || ctx.Err() != nil {
				return err
			}
			errs = append(errs, err)
			continue
		}
		if observe {
			a.observe(w, n)
		}
	}
	return errors.Join(errs...)
}

// deletesFirst orders names (sorted) so that the services to delete from
// vipd come first: a Service may reuse the VIP:port of one deleted in the
// same pass, and vipd refuses its create while the old one holds it.
func (a *Adapter) deletesFirst(names []string) []string {
	out := make([]string, 0, len(names))
	var rest []string
	for _, n := range names {
		if want, err := a.desired(n); err == nil && want == nil {
			out = append(out, n)
		} else {
			rest = append(rest, n)
		}
	}
	return append(out, rest...)
}

// retryFreed marks dirty again, after a pass that deleted a service or took
// VIP:ports off one, the Services left out for a VIP:port conflict or over
// vipd's limits: they may fit now. A retry that fails again frees nothing,
// so this does not loop.
func (a *Adapter) retryFreed() {
	if !a.freed {
		return
	}
	a.freed = false
	for name, reason := range a.leftOut {
		if reason == ReasonConflict || reason == ReasonOverLimit {
			delete(a.refused, name)
			a.markDirty(name, time.Time{})
		}
	}
}

// partialPass applies each dirty Service on its own, deletes first.
func (a *Adapter) partialPass(ctx context.Context, w work) error {
	names := a.deletesFirst(slices.Sorted(maps.Keys(w.names)))
	var failed []string
	var errs []error
	for i, n := range names {
		observe, err := a.syncOne(ctx, n)
		if err == nil {
			if observe {
				a.observe(w, n)
			}
			continue
		}
		if ctx.Err() != nil {
			a.requeue(w, names[i:], false)
			return ctx.Err()
		}
		if status.Code(err) == codes.Unavailable {
			// vipd restarted or went away: what it has now is unknown.
			a.requeue(w, append(failed, names[i:]...), true)
			a.markFull("vipd unavailable")
			return fmt.Errorf("service %s: %w", n, err)
		}
		failed = append(failed, n)
		errs = append(errs, fmt.Errorf("service %s: %w", n, err))
	}
	a.requeue(w, failed, false)
	return errors.Join(errs...)
}

// desired converts the Service name as the informers have it now; nil
// means it should not be in vipd.
func (a *Adapter) desired(name string) (*vipdv1.Service, error) {
	obj, ok, err := a.services.GetStore().GetByKey(name)
	if err != nil || !ok {
		return nil, err
	}
	svc, ok := obj.(*corev1.Service)
	if !ok {
		return nil, nil
	}
	objs, err := a.slices.GetIndexer().ByIndex(sliceByService, name)
	if err != nil {
		return nil, fmt.Errorf("endpoint slices of %s: %w", name, err)
	}
	out, err := kubeconvert.Convert(svc, listOf[*discoveryv1.EndpointSlice](objs), a.convert)
	if kubeconvert.IsSkipped(err) {
		a.log.Debug("service not programmed", "service", name, "reason", err)
		return nil, nil
	}
	return out, err
}

// syncOne makes vipd's service name match the Service. It returns an error
// for what a retry may fix; what vipd refuses for good is left out instead
// (and not observed).
func (a *Adapter) syncOne(ctx context.Context, name string) (observe bool, err error) {
	want, err := a.desired(name)
	if err != nil {
		a.leave(name, ReasonInvalid, nil, err)
		return false, nil
	}
	prev, had := a.applied[name]
	if want == nil {
		delete(a.leftOut, name)
		delete(a.refused, name)
		if !had {
			return true, nil
		}
		if err := a.deleteOwned(ctx, name, prev.gen); err != nil {
			return true, err
		}
		a.freed = true
		return true, nil
	}
	if had && proto.Equal(prev.spec, want) {
		return true, nil
	}
	if r, ok := a.refused[name]; ok && proto.Equal(r, want) {
		return false, nil
	}
	gen, create := prev.gen, !had
	if !had {
		cur, err := a.vipd.GetService(ctx, name)
		switch {
		case client.IsNotFound(err):
		case err != nil:
			return false, fmt.Errorf("get: %w", err)
		case cur.Owner != kubeconvert.Owner:
			a.leave(name, ReasonOtherOwner, nil, fmt.Errorf("vipd has it under owner %s", cur.Owner))
			return false, nil
		default:
			gen, create = cur.Generation, false
		}
	}
	got, err := a.write(ctx, want, gen, create)
	var taken *takenError
	if errors.As(err, &taken) {
		delete(a.applied, name)
		a.leave(name, ReasonOtherOwner, nil, err)
		return false, nil
	}
	if err == nil {
		if had && freesClaims(prev.spec, want) {
			a.freed = true
		}
		a.applied[name] = record{spec: want, gen: got.Generation}
		delete(a.leftOut, name)
		delete(a.refused, name)
		return true, nil
	}
	switch status.Code(err) {
	case codes.InvalidArgument:
		a.leave(name, ReasonInvalid, want, err)
	case codes.FailedPrecondition:
		a.leave(name, ReasonUnsupported, want, err)
	case codes.AlreadyExists:
		a.leave(name, ReasonConflict, want, err)
	case codes.ResourceExhausted:
		if !isOverLimit(err) {
			// vipd's --max-inflight-requests: busy for now.
			return false, fmt.Errorf("upsert: %w", err)
		}
		a.leave(name, ReasonOverLimit, want, err)
	default:
		return false, fmt.Errorf("upsert: %w", err)
	}
	return false, nil
}

// isOverLimit reports whether err is vipd's refusal of a change that would
// take it past one of its totals: ResourceExhausted with a QuotaFailure.
// A ResourceExhausted without one (too many requests in flight) is not.
func isOverLimit(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.ResourceExhausted {
		return false
	}
	for _, d := range st.Details() {
		if _, ok := d.(*errdetails.QuotaFailure); ok {
			return true
		}
	}
	return false
}

// freesClaims reports whether prev holds a VIP:port that next does not.
func freesClaims(prev, next *vipdv1.Service) bool {
	kept := map[claim]bool{}
	for _, c := range claimsOf(next) {
		kept[c] = true
	}
	for _, c := range claimsOf(prev) {
		if !kept[c] {
			return true
		}
	}
	return false
}

// takenError is write's answer for a name that another owner holds.
type takenError struct{ owner string }

func (e *takenError) Error() string { return "owner " + e.owner + " holds it" }

// write makes vipd's service want.Name equal to want: a create when create
// (vipd refuses it if the name exists, whoever owns it), else an update of
// the kubernetes-owned service at generation gen. When another writer got
// in between (the create met an existing name, the update another
// generation), it reads the service again and goes on as what it finds: a
// create when the name is free, an update at its generation when it is
// kubernetes-owned, and a *takenError, without writing, when another owner
// holds it. A create refused while the name is free is a VIP:port conflict
// (unless the name came and went meanwhile: one more create tells). Other
// errors are vipd's status errors.
func (a *Adapter) write(ctx context.Context, want *vipdv1.Service, gen uint64, create bool) (*vipdv1.Service, error) {
	freeBefore := false // a refused create found the name free once
	for race := 0; ; race++ {
		var (
			got *vipdv1.Service
			err error
		)
		if create {
			got, err = a.vipd.CreateService(ctx, want)
		} else {
			got, err = a.vipd.UpsertService(ctx, want, gen)
		}
		code := status.Code(err)
		if race >= maxWriteRaces || !(create && code == codes.AlreadyExists || !create && code == codes.Aborted) {
			return got, err
		}
		cur, gerr := a.vipd.GetService(ctx, want.Name)
		switch {
		case client.IsNotFound(gerr):
			if create && freeBefore {
				return nil, err
			}
			freeBefore = freeBefore || create
			gen, create = 0, true
		case gerr != nil:
			return nil, fmt.Errorf("get after a write conflict: %w", gerr)
		case cur.Owner != kubeconvert.Owner:
			return nil, &takenError{owner: cur.Owner}
		default:
			gen, create = cur.Generation, false
		}
	}
}

// deleteOwned deletes name, which the adapter applied at generation gen,
// unless another owner has taken it over since.
func (a *Adapter) deleteOwned(ctx context.Context, name string, gen uint64) error {
	for try := 0; ; try++ {
		err := a.vipd.DeleteService(ctx, name, gen)
		if err == nil || client.IsNotFound(err) {
			delete(a.applied, name)
			return nil
		}
		if status.Code(err) != codes.Aborted || try > 0 {
			return fmt.Errorf("delete: %w", err)
		}
		cur, gerr := a.vipd.GetService(ctx, name)
		switch {
		case client.IsNotFound(gerr):
			delete(a.applied, name)
			return nil
		case gerr != nil:
			return fmt.Errorf("get after a generation conflict: %w", gerr)
		case cur.Owner != kubeconvert.Owner:
			a.log.Info("service taken over by another owner; not deleting it", "service", name, "owner", cur.Owner)
			delete(a.applied, name)
			return nil
		}
		gen = cur.Generation
	}
}

// watchVIPD follows vipd's health with a Watch stream: when vipd stops
// serving or the stream breaks (vipd restarted, or lost its state), the
// next pass is a full sync.
func (a *Adapter) watchVIPD(ctx context.Context) {
	backoff := a.cfg.backoffMin
	serving := false
	for ctx.Err() == nil {
		sctx, cancel := context.WithCancel(ctx)
		stream, err := a.vipd.HealthClient().Watch(sctx, &healthpb.HealthCheckRequest{})
		for err == nil {
			var resp *healthpb.HealthCheckResponse
			if resp, err = stream.Recv(); err != nil {
				break
			}
			if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				err = fmt.Errorf("vipd health is %v", resp.GetStatus())
				break
			}
			serving, backoff = true, a.cfg.backoffMin
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		if serving {
			serving = false
			a.log.Info("vipd stopped serving; a full sync follows once it is back", "error", err)
			a.markFull("vipd reconnected")
		}
		if !sleep(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}
