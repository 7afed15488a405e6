package client

import (
	"strconv"
	"strings"

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

// ErrorDomain is the domain of the google.rpc.ErrorInfo that vipd attaches
// to a refusal.
const ErrorDomain = "vipd.io"

// The reasons of the google.rpc.ErrorInfo that vipd attaches to a
// SyncServices or SyncServicesStream refusal (see Culprits).
const (
	// ReasonServiceOwnedByOther: a listed name is another owner's service
	// (AlreadyExists).
	ReasonServiceOwnedByOther = "SERVICE_OWNED_BY_OTHER"
	// ReasonServiceConflict: a VIP:port, node port or external IP:port of a
	// listed service is another service's (AlreadyExists).
	ReasonServiceConflict = "SERVICE_CONFLICT"
	// ReasonOverLimit: a listed service does not fit under vipd's
	// --max-services or --max-total-backends (ResourceExhausted).
	ReasonOverLimit = "OVER_LIMIT"
	// ReasonUnsupportedByDataplane: vipd's dataplane cannot honour a
	// listed service (FailedPrecondition).
	ReasonUnsupportedByDataplane = "UNSUPPORTED_BY_DATAPLANE"
	// ReasonDataplaneExhausted: a kernel table is full (ResourceExhausted).
	// It names no service.
	ReasonDataplaneExhausted = "DATAPLANE_EXHAUSTED"
)

// Culprit is a listed service that vipd names as a cause of a
// SyncServices or SyncServicesStream refusal.
type Culprit struct {
	// Index is the service's place in the list (for a stream, in the
	// services of all chunks, in order).
	Index int
	// Service is the service's name, when vipd gives it (it does for the
	// refusals with a Reason); the caller knows it from Index anyway.
	Service string
	// Field is "services[Index]" or a field inside it, such as
	// "services[2].vips[0]".
	Field string
	// Reason is one of the Reason constants, or "" for an InvalidArgument
	// field violation.
	Reason string
	// Description says what is wrong, naming the other service or owner
	// when there is one.
	Description string
}

// Culprits returns the listed services that err, a SyncServices or
// SyncServicesStream refusal, names: one for each google.rpc.BadRequest
// field violation of a field services[i]..., in vipd's order (a service
// with several faults appears once for each). It reads the names from the
// google.rpc.ErrorInfo (domain ErrorDomain, metadata service_<i>). A
// refusal of the whole request (vipd's dataplane full, too many requests
// in flight, permission denied) names none: Culprits returns nil, and
// RefusalReason may still say why. err may be wrapped.
func Culprits(err error) []Culprit {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return nil
	}
	var (
		out   []Culprit
		names map[string]string
	)
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				if i, ok := serviceIndex(v.GetField()); ok {
					out = append(out, Culprit{Index: i, Field: v.GetField(), Reason: v.GetReason(), Description: v.GetDescription()})
				}
			}
		case *errdetails.ErrorInfo:
			if d.GetDomain() == ErrorDomain {
				names = d.GetMetadata()
			}
		}
	}
	for k := range out {
		out[k].Service = names["service_"+strconv.Itoa(out[k].Index)]
	}
	return out
}

// RefusalReason returns the reason of the google.rpc.ErrorInfo that vipd
// attaches to err (one of the Reason constants), or "" when err carries
// none. err may be wrapped.
func RefusalReason(err error) string {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			return info.GetReason()
		}
	}
	return ""
}

// serviceIndex reads i from a field "services[i]...".
func serviceIndex(field string) (int, bool) {
	after, ok := strings.CutPrefix(field, "services[")
	if !ok {
		return 0, false
	}
	n, _, ok := strings.Cut(after, "]")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(n)
	return i, err == nil && i >= 0
}
