package kubeadapter

// The full pass: one SyncServices that makes vipd's kubernetes-owned
// services exactly the converted state of the informers, leaving out what
// another owner holds and what vipd refuses; when vipd refuses without
// naming a service, a piecewise pass of one service at a time.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/kubeconvert"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

const (
	// fullSyncTimeout bounds one SyncServices: 100,000 services take
	// seconds to program, beyond the client's default deadline.
	fullSyncTimeout = 2 * time.Minute
	// maxSyncRaces bounds the retries of a full sync that met a name
	// another owner created meanwhile.
	maxSyncRaces = 3
)

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
		// The full sync is requeued, and hands vipd the zone when it runs.
		return err
	}
	if w.setZone {
		// Before the services, so that a restarted vipd selects by the
		// node's zone from the first write. A failure leaves the zone
		// pending, for a pass of its own after this one.
		if err := a.sendZone(ctx, w.zone); err != nil {
			a.log.Warn("setting vipd's zone before the full sync failed; syncing the services anyway", "error", err)
		}
	}
	defer func() { a.prevLeftOut, a.prevExternalLeft = nil, nil }()
	start := time.Now()
	for race := 0; ; race++ {
		all, err := a.vipd.ListServices(ctx, "")
		if err != nil {
			return fmt.Errorf("list vipd's services: %w", err)
		}
		svcs := listOf[*corev1.Service](a.services.GetStore().List())
		eps := listOf[*discoveryv1.EndpointSlice](a.slices.GetStore().List())
		want, omitted, left := kubeconvert.ConvertAllWithOmissions(svcs, eps, a.convert)
		a.logAllOmissions(want, omitted)
		conversions := make(map[string]*vipdv1.Service, len(want))
		for _, s := range want {
			conversions[s.Name] = s
		}

		// Each full sync finds what it leaves out afresh; what it left
		// out before is not logged again.
		a.prevLeftOut, a.prevExternalLeft = a.leftOut, a.externalLeft
		a.leftOut, a.refused, a.externalLeft = map[string]string{}, map[string]*vipdv1.Service{}, map[string]string{}
		held := heldOf(all)
		for _, l := range left {
			if !kubeconvert.IsSkipped(l.Err) {
				a.leave(l.Service, ReasonInvalid, nil, l.Err)
				// As when vipd refuses a new version: the old one stays.
				if old, ok := held[l.Service]; ok {
					want = append(want, old)
				}
			}
		}
		want = a.withoutForeign(all, want, held)
		// Every full sync tries the external parts, whatever vipd said of
		// them before: vipd may have restarted with another dataplane.
		resp, sent, err := a.syncDropping(ctx, want, held)
		if status.Code(err) == codes.FailedPrecondition && slices.ContainsFunc(sent, servesExternal) {
			// The ClusterIP parts alone may be fine.
			first := err
			stripped := make([]*vipdv1.Service, len(sent))
			was := map[string]bool{}
			for i, s := range sent {
				stripped[i] = s
				if servesExternal(s) {
					stripped[i], was[s.Name] = withoutExternal(s), true
				}
			}
			if resp, sent, err = a.syncDropping(ctx, stripped, held); err == nil {
				a.setNoExternal(true, first)
				for _, s := range sent {
					if was[s.Name] {
						a.leaveExternal(s.Name, ReasonUnsupported, first)
					}
				}
			}
		} else if err == nil && slices.ContainsFunc(sent, servesExternal) {
			a.setNoExternal(false, nil)
		}
		switch code := status.Code(err); {
		case err == nil:
		case code == codes.AlreadyExists && race < maxSyncRaces:
			// A name listed free a moment ago was taken by another owner.
			a.log.Info("full sync met a service created meanwhile; listing again", "error", err)
			continue
		case code == codes.FailedPrecondition || code == codes.ResourceExhausted || code == codes.AlreadyExists:
			// vipd does not say which service it refused (syncDropping
			// handles the refusals that name one): apply them one by one,
			// so that one cannot hold up the others.
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
			g, ok := gens[s.Name]
			if !ok {
				continue
			}
			if _, refused := a.leftOut[s.Name]; refused {
				// vipd keeps the version it had (see heldOf): written
				// again once the Service changes, or a retry may fit.
				a.applied[s.Name] = record{spec: s, sent: s, gen: g}
				continue
			}
			a.applied[s.Name] = record{spec: conversions[s.Name], sent: s, gen: g}
			names = append(names, s.Name)
		}
		for name := range a.externalLeft {
			if _, ok := a.applied[name]; !ok {
				delete(a.externalLeft, name) // left out whole after all
			}
		}
		a.observe(w, names...)
		a.log.Info("full sync", "reason", w.fullReason, "services", len(sent), "created", len(resp.Created),
			"updated", len(resp.Updated), "deleted", len(resp.Deleted), "unchanged", len(resp.Unchanged),
			"left_out", len(a.leftOut), "external_left_out", len(a.externalLeft), "elapsed", time.Since(start))
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

// heldOf returns the kubernetes-owned services of all, vipd's, by name,
// each as a version to send again: when vipd refuses a new version of a
// service it holds, or the new version cannot be converted, the full sync
// sends the version vipd has, so that vipd keeps it, as it does when an
// UpsertService of the per-service path is refused. The Service is
// reported left out all the same (leave). The copies carry vipd's
// defaults, so they never equal a conversion.
func heldOf(all []*vipdv1.Service) map[string]*vipdv1.Service {
	held := map[string]*vipdv1.Service{}
	for _, s := range all {
		if s.Owner == kubeconvert.Owner {
			c := proto.CloneOf(s)
			c.Generation = 0
			held[s.Name] = c
		}
	}
	return held
}

// withoutForeign leaves out of want the names and the VIP:ports that
// services of other owners hold: SyncServices would refuse the whole call
// for either. A Service whose new version takes another owner's VIP:port
// keeps the version vipd holds (held).
func (a *Adapter) withoutForeign(all, want []*vipdv1.Service, held map[string]*vipdv1.Service) []*vipdv1.Service {
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
	// heldBy says which of cs another owner's service holds, or "".
	heldBy := func(cs []claim) string {
		for _, c := range cs {
			if h, ok := claims[c]; ok {
				return fmt.Sprintf("%s is held by service %s", c, h)
			}
		}
		return ""
	}
	out := want[:0]
	for _, s := range want {
		if owner, ok := names[s.Name]; ok {
			a.leave(s.Name, ReasonOtherOwner, nil, fmt.Errorf("vipd has service %s under owner %s", s.Name, owner))
			continue
		}
		if holder := heldBy(vipClaimsOf(s)); holder != "" {
			a.leave(s.Name, ReasonConflict, s, errors.New(holder))
			if old, ok := held[s.Name]; ok {
				out = append(out, old)
			}
			continue
		}
		if holder := heldBy(externalClaimsOf(s)); holder != "" {
			// The cluster IPs are free: they go in without the rest.
			a.leaveExternal(s.Name, ReasonConflict, errors.New(holder))
			s = withoutExternal(s)
		}
		out = append(out, s)
	}
	return out
}

// syncDropping calls SyncServices with want; while vipd refuses it naming
// services (client.Culprits: the services[i] field violations of an
// InvalidArgument, the culprits of a FailedPrecondition, AlreadyExists or
// ResourceExhausted), it sets those aside and tries the rest again in one
// call. A culprit refused for its external part alone is sent again
// without that part. A culprit that vipd holds (held, see heldOf) is sent
// again as the version vipd has, once, and left out if that is refused
// too; a new one is left out. Either is reported left out with the
// refusal's reason. It returns what it sent last; a refusal that names no
// service (or none of want) is returned as it is.
func (a *Adapter) syncDropping(ctx context.Context, want []*vipdv1.Service, held map[string]*vipdv1.Service) (*vipdv1.SyncServicesResponse, []*vipdv1.Service, error) {
	asHeld := map[string]bool{} // sent as the version vipd has
	for {
		cctx, cancel := context.WithTimeout(ctx, fullSyncTimeout)
		resp, err := a.vipd.SyncServices(cctx, kubeconvert.Owner, want)
		cancel()
		if err == nil {
			return resp, want, nil
		}
		bad := map[int][]string{}
		reasons := map[int]string{}
		onlyExternal := map[int]bool{} // every fault of services[i] is in its external part
		for _, c := range client.Culprits(err) {
			i := c.Index
			reason := culpritReason(status.Code(err), c.Reason)
			if reason == "" || i >= len(want) || c.Service != "" && c.Service != want[i].Name {
				continue
			}
			_, rest, _ := serviceIndex(c.Field)
			ext := externalField(rest)
			if _, seen := bad[i]; !seen {
				onlyExternal[i] = ext
			}
			onlyExternal[i] = onlyExternal[i] && ext
			reasons[i] = reason
			bad[i] = append(bad[i], c.Field+": "+c.Description)
		}
		if len(bad) == 0 {
			return nil, want, err
		}
		kept := make([]*vipdv1.Service, 0, len(want))
		for i, s := range want {
			v, ok := bad[i]
			if !ok {
				kept = append(kept, s)
				continue
			}
			reason, why := reasons[i], fmt.Errorf("vipd refused it: %s", strings.Join(v, "; "))
			old, isHeld := held[s.Name]
			switch {
			case onlyExternal[i] && hasExternalPart(s) && reason != ReasonOverLimit:
				// The ClusterIP part is fine: it goes in without the rest.
				a.leaveExternal(s.Name, reason, why)
				if reason == ReasonUnsupported {
					a.setNoExternal(true, err)
				}
				kept = append(kept, withoutExternal(s))
			case reason == ReasonOtherOwner:
				a.leave(s.Name, reason, nil, why)
			case isHeld && !asHeld[s.Name]:
				// A refused new version: vipd keeps the one it has.
				a.leave(s.Name, reason, s, why)
				asHeld[s.Name] = true
				kept = append(kept, old)
			case asHeld[s.Name]:
				// What vipd had is refused too now: the Service is left out.
				a.log.Warn("vipd refused the version it had of a service; leaving it out", "service", s.Name, "error", why)
			default:
				a.leave(s.Name, reason, s, why)
			}
		}
		want = kept
	}
}

// culpritReason is the reason a service is left out (see leftout.go) for
// a culprit with vipd's reason (client.Reason*) in a refusal of code, or
// "" for one the adapter cannot leave out alone.
func culpritReason(code codes.Code, reason string) string {
	switch reason {
	case client.ReasonServiceOwnedByOther:
		return ReasonOtherOwner
	case client.ReasonServiceConflict:
		return ReasonConflict
	case client.ReasonOverLimit:
		return ReasonOverLimit
	case client.ReasonUnsupportedByDataplane:
		return ReasonUnsupported
	case "":
		if code == codes.InvalidArgument {
			return ReasonInvalid
		}
	}
	return ""
}

// serviceIndex reads i from a field violation "services[i]...", and
// returns what follows it.
func serviceIndex(field string) (i int, rest string, ok bool) {
	after, ok := strings.CutPrefix(field, "services[")
	if !ok {
		return 0, "", false
	}
	n, rest, ok := strings.Cut(after, "]")
	if !ok {
		return 0, "", false
	}
	i, err := strconv.Atoi(n)
	return i, rest, err == nil && i >= 0
}

// piecewise is a full sync done one service at a time, for when vipd
// refuses a SyncServices without naming the service at fault: every
// desired service is upserted and every other kubernetes-owned one
// deleted, each refusal attributed to its own service.
func (a *Adapter) piecewise(ctx context.Context, w work, all, want []*vipdv1.Service) error {
	a.applied, a.externalLeft = map[string]record{}, map[string]string{}
	names := map[string]bool{}
	for _, s := range all {
		if s.Owner == kubeconvert.Owner {
			// vipd's copy has defaults filled in, so it never equals a
			// conversion: each is rewritten once, with its generation.
			a.applied[s.Name] = record{spec: s, sent: s, gen: s.Generation}
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
