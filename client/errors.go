package client

import (
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// FieldViolations returns the google.rpc.BadRequest field violations that
// vipd attaches to an InvalidArgument error, such as field
// "service.vips[0]". It returns nil when err carries none. err may be
// wrapped.
func FieldViolations(err error) []*errdetails.BadRequest_FieldViolation {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return nil
	}
	var out []*errdetails.BadRequest_FieldViolation
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			out = append(out, br.GetFieldViolations()...)
		}
	}
	return out
}

// IsNotFound reports whether err says that the service does not exist, as
// GetService, DeleteService and UpdateBackends do. It is the one code that
// callers routinely treat as success (a delete that found nothing to delete);
// test other codes with status.Code.
func IsNotFound(err error) bool {
	return status.Code(err) == codes.NotFound
}
