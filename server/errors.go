package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/server/reconcile"
	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// toStatus turns an error from validation, the store or the reconciler into
// the gRPC status a client sees. It is the only place that chooses codes.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var (
		violations validation.Violations
		conflict   *store.ConflictError
		limit      *store.LimitError
		applyErr   *reconcile.ApplyError
		saveErr    *reconcile.SaveError
	)
	switch {
	case errors.As(err, &violations):
		return invalid(violations)
	case errors.As(err, &conflict):
		return status.Error(codes.AlreadyExists, conflict.Error())
	case errors.As(err, &limit):
		return overLimit(limit)
	case errors.As(err, &applyErr):
		switch {
		case errors.Is(err, dataplane.ErrUnsupported):
			return status.Error(codes.FailedPrecondition, err.Error())
		case errors.Is(err, dataplane.ErrResourceExhausted):
			return status.Error(codes.ResourceExhausted, err.Error()+"; the previous state stays in force")
		}
		return status.Error(codes.Unavailable, err.Error()+"; the change was rolled back")
	case errors.As(err, &saveErr):
		return status.Error(codes.Internal, err.Error()+"; the change was rolled back")
	case errors.Is(err, dataplane.ErrUnsupported):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, reconcile.ErrStopped):
		return status.Error(codes.Unavailable, "vipd is shutting down")
	}
	return status.Error(codes.Internal, err.Error())
}

// invalid is an InvalidArgument status carrying v as BadRequest field violations.
func invalid(v validation.Violations) error {
	br := &errdetails.BadRequest{}
	for _, x := range v {
		br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: x.Field, Description: x.Description})
	}
	msg := fmt.Sprintf("invalid request: %s", v.Error())
	st, err := status.New(codes.InvalidArgument, msg).WithDetails(br)
	if err != nil {
		return status.Error(codes.InvalidArgument, msg)
	}
	return st.Err()
}

// overLimit is a ResourceExhausted status for a change that would take the
// store past one of its totals, carrying a google.rpc.QuotaFailure whose
// subject names what is counted ("services" or "backends"). It is not
// InvalidArgument: the same request succeeds once other services make room.
func overLimit(e *store.LimitError) error {
	qf := &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
		Subject:     e.Resource,
		Description: fmt.Sprintf("at most %d %s in all (%s); the change would make %d", e.Limit, e.Resource, e.Flag, e.Count),
	}}}
	st, err := status.New(codes.ResourceExhausted, e.Error()).WithDetails(qf)
	if err != nil {
		return status.Error(codes.ResourceExhausted, e.Error())
	}
	return st.Err()
}

func notFound(name string) error {
	return status.Errorf(codes.NotFound, "service %s not found", name)
}

func generationMismatch(name string, want, have uint64) error {
	if have == 0 {
		return status.Errorf(codes.Aborted, "service %s: expected generation %d, but the service does not exist", name, want)
	}
	return status.Errorf(codes.Aborted, "service %s: expected generation %d, but it is at generation %d", name, want, have)
}

// errorDomain is the google.rpc.ErrorInfo domain of vipd's refusals.
const errorDomain = "vipd.io"

// The google.rpc.ErrorInfo reasons of a SyncServices refusal (the client
// package exports them as client.Reason*).
const (
	// reasonOwnedByOther: a listed name is another owner's service
	// (AlreadyExists).
	reasonOwnedByOther = "SERVICE_OWNED_BY_OTHER"
	// reasonConflict: a VIP:port, node port or external IP:port of a listed
	// service is another service's (AlreadyExists).
	reasonConflict = "SERVICE_CONFLICT"
	// reasonOverLimit: a listed service does not fit under --max-services
	// or --max-total-backends (ResourceExhausted).
	reasonOverLimit = "OVER_LIMIT"
	// reasonUnsupported: the dataplane cannot honour a listed service
	// (FailedPrecondition).
	reasonUnsupported = "UNSUPPORTED_BY_DATAPLANE"
	// reasonExhausted: a kernel table is full (ResourceExhausted); it names
	// no service.
	reasonExhausted = "DATAPLANE_EXHAUSTED"
)

// culprit is one listed service of a SyncServices that a refusal names.
type culprit struct {
	// index is its place in the list (across the chunks of a stream).
	index   int
	service string
	// field is services[index] or a field inside it, such as
	// services[3].vips[0].
	field string
	// desc says what is wrong with it.
	desc string
	// meta is ErrorInfo metadata beyond service, index and field, such as
	// owner or other_service.
	meta map[string]string
}

// maxCulprits bounds the services one refusal names: the details travel in
// a trailer, which a client refuses beyond its header list size (16 MiB by
// default in grpc-go), and each culprit takes a few hundred bytes.
const maxCulprits = 10000

// refusal returns st, with its code and message, carrying details that
// name cs, all refused for reason: a google.rpc.BadRequest with one field
// violation per culprit (field, description, reason), and a
// google.rpc.ErrorInfo (domain vipd.io, reason) whose metadata has the
// service, index and field of the first culprit, its meta, service_<index>
// = name for every culprit, and culprits = how many there are. Only the
// first maxCulprits are named; the list without them names the rest. Without
// culprits (a refusal of the whole request) the ErrorInfo alone carries
// reason.
func refusal(st *status.Status, reason string, cs []culprit) error {
	info := &errdetails.ErrorInfo{Reason: reason, Domain: errorDomain, Metadata: map[string]string{}}
	var br *errdetails.BadRequest
	if len(cs) > 0 {
		info.Metadata["culprits"] = strconv.Itoa(len(cs))
		cs = cs[:min(len(cs), maxCulprits)]
		br = &errdetails.BadRequest{}
		first := cs[0]
		maps.Copy(info.Metadata, first.meta)
		info.Metadata["service"] = first.service
		info.Metadata["index"] = strconv.Itoa(first.index)
		info.Metadata["field"] = first.field
		for _, c := range cs {
			br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: c.field, Description: c.desc, Reason: reason})
			info.Metadata["service_"+strconv.Itoa(c.index)] = c.service
		}
	}
	var with *status.Status
	var err error
	if br != nil {
		with, err = st.WithDetails(br, info)
	} else {
		with, err = st.WithDetails(info)
	}
	if err != nil {
		return st.Err()
	}
	return with.Err()
}

// limitCulprit names d, which did not fit under a limit (e), as services[i].
func limitCulprit(d desiredService, e *store.LimitError) culprit {
	return culprit{index: d.index, service: d.dp.Name, field: "services[" + strconv.Itoa(d.index) + "]", desc: e.Error(),
		meta: map[string]string{"resource": e.Resource, "limit": strconv.Itoa(e.Limit), "flag": e.Flag}}
}

// conflictCulprit names d, whose claim another service holds (e), at the
// field of the claim. index gives the place in the list of the listed
// services.
func conflictCulprit(d desiredService, e *store.ConflictError, index map[string]int) culprit {
	field := "services[" + strconv.Itoa(d.index) + "]"
	switch {
	case e.Use != "":
		field += "." + e.Use
	case e.Claim.Kind == store.ClaimVIP:
		if k := slices.Index(d.dp.VIPs, e.Claim.VIP); k >= 0 {
			field += ".vips[" + strconv.Itoa(k) + "]"
		}
	}
	meta := map[string]string{"other_service": e.Holder}
	if j, ok := index[e.Holder]; ok {
		meta["other_index"] = strconv.Itoa(j)
	}
	return culprit{index: d.index, service: d.dp.Name, field: field, desc: e.Error(), meta: meta}
}

// unsupportedCulprit names d, which caps cannot honour (err, from
// caps.Check), at the field of the first setting that caps refuses.
func unsupportedCulprit(d desiredService, err error, caps dataplane.Capabilities) culprit {
	c := culprit{index: d.index, service: d.dp.Name, field: "services[" + strconv.Itoa(d.index) + "]" + unsupportedField(d.dp, caps), desc: err.Error()}
	var ue *dataplane.UnsupportedError
	if errors.As(err, &ue) {
		c.meta = map[string]string{"feature": ue.Feature}
	}
	return c
}
