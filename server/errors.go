package server

import (
	"context"
	"errors"
	"fmt"

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
