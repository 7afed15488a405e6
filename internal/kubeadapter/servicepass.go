package kubeadapter

// The per-service pass: each dirty Service converted and written to vipd
// on its own (deletions first), with vipd's refusals recorded as left out
// and what a retry may fix returned as an error.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/kubeconvert"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

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

// deletesFirst orders names (sorted) so that the services to delete from
// vipd come first: a Service may reuse the VIP:port of one deleted in the
// same pass, and vipd refuses its create while the old one holds it.
func (a *Adapter) deletesFirst(names []string) []string {
	out := make([]string, 0, len(names))
	var rest []string
	for _, n := range names {
		if want, _, err := a.desired(n); err == nil && want == nil {
			out = append(out, n)
		} else {
			rest = append(rest, n)
		}
	}
	return append(out, rest...)
}

// desired converts the Service name as the informers have it now, with
// what the conversion leaves out of it; nil means it should not be in
// vipd.
func (a *Adapter) desired(name string) (*vipdv1.Service, []string, error) {
	obj, ok, err := a.services.GetStore().GetByKey(name)
	if err != nil || !ok {
		return nil, nil, err
	}
	svc, ok := obj.(*corev1.Service)
	if !ok {
		return nil, nil, nil
	}
	objs, err := a.slices.GetIndexer().ByIndex(sliceByService, name)
	if err != nil {
		return nil, nil, fmt.Errorf("endpoint slices of %s: %w", name, err)
	}
	out, omitted, err := kubeconvert.ConvertWithOmissions(svc, listOf[*discoveryv1.EndpointSlice](objs), a.convert)
	if kubeconvert.IsSkipped(err) {
		a.log.Debug("service not programmed", "service", name, "reason", err)
		return nil, nil, nil
	}
	return out, omissionStrings(omitted), err
}

func omissionStrings(os []kubeconvert.Omission) []string {
	out := make([]string, len(os))
	for i, o := range os {
		out[i] = o.String()
	}
	return out
}

// syncOne makes vipd's service name match the Service. It returns an error
// for what a retry may fix; what vipd refuses for good is left out instead
// (and not observed).
func (a *Adapter) syncOne(ctx context.Context, name string) (observe bool, err error) {
	want, omitted, err := a.desired(name)
	if err != nil {
		a.leave(name, ReasonInvalid, nil, err)
		return false, nil
	}
	a.logOmissions(name, omitted)
	prev, had := a.applied[name]
	if want == nil {
		delete(a.leftOut, name)
		delete(a.refused, name)
		delete(a.externalLeft, name)
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
	send, externalLeft := want, ""
	var externalErr error // why the external part is left out
	if a.noExternal && servesExternal(want) {
		send, externalLeft = withoutExternal(want), ReasonUnsupported
	}
	got, err := a.write(ctx, send, gen, create)
	if reason := fallbackReason(err); reason != "" && externalLeft == "" && hasExternalPart(want) {
		// Refused whole: the ClusterIP part alone may be fine.
		externalErr = err
		send = withoutExternal(want)
		if got, err = a.write(ctx, send, gen, create); err == nil {
			externalLeft = reason
			if reason == ReasonUnsupported {
				a.setNoExternal(true, externalErr)
			}
		}
	}
	var taken *takenError
	if errors.As(err, &taken) {
		delete(a.applied, name)
		delete(a.externalLeft, name)
		a.leave(name, ReasonOtherOwner, nil, err)
		return false, nil
	}
	if err == nil {
		if had && freesClaims(prev.sent, send) {
			a.freed = true
		}
		a.applied[name] = record{spec: want, sent: send, gen: got.Generation}
		delete(a.leftOut, name)
		delete(a.refused, name)
		switch {
		case externalLeft != "":
			a.leaveExternal(name, externalLeft, externalErr)
		case servesExternal(send):
			a.keepExternal(name)
			a.setNoExternal(false, nil)
		default:
			a.keepExternal(name)
		}
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
