package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vipd/vipd/internal/manifest"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"nil", nil, ExitOK},
		{"plain error", errors.New("boom"), ExitError},
		{"usage", usageErrorf("bad flag"), ExitUsage},
		{"wrapped usage", fmt.Errorf("x: %w", usageErrorf("bad flag")), ExitUsage},
		{"input", inputErrorf("owner mismatch"), ExitInvalid},
		{"bad file", &manifest.Error{Source: "a.yaml", Document: 1, Err: errors.New("unknown field")}, ExitInvalid},
		{"not found", status.Error(codes.NotFound, "service x not found"), ExitNotFound},
		{"invalid argument", status.Error(codes.InvalidArgument, "invalid service"), ExitInvalid},
		{"wrapped invalid argument", fmt.Errorf("apply service x: %w", status.Error(codes.InvalidArgument, "invalid")), ExitInvalid},
		{"already exists", status.Error(codes.AlreadyExists, "vip in use"), ExitConflict},
		{"aborted", status.Error(codes.Aborted, "generation mismatch"), ExitConflict},
		{"failed precondition", status.Error(codes.FailedPrecondition, "maglev unsupported"), ExitConflict},
		{"unavailable", status.Error(codes.Unavailable, "rolled back"), ExitUnavailable},
		{"retries exhausted", fmt.Errorf("max retries exhausted: %w", status.Error(codes.Unavailable, "down")), ExitUnavailable},
		{"deadline exceeded", status.Error(codes.DeadlineExceeded, "too slow"), ExitUnavailable},
		{"context deadline", fmt.Errorf("wait: %w", context.DeadlineExceeded), ExitUnavailable},
		{"permission denied", status.Error(codes.PermissionDenied, `identity "x" may not change services of owner "y"`), ExitDenied},
		{"unauthenticated", status.Error(codes.Unauthenticated, "no certificate"), ExitDenied},
		{"internal", status.Error(codes.Internal, "save failed"), ExitError},
		{"resource exhausted", status.Error(codes.ResourceExhausted, "map full"), ExitError},
		{"unimplemented", status.Error(codes.Unimplemented, "old vipd"), ExitError},
		{"canceled", status.Error(codes.Canceled, "interrupted"), ExitError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ExitCode(tc.err); got != tc.want {
				t.Errorf("ExitCode(%v) = %d, want %d", tc.err, got, tc.want)
			}
		})
	}
}

func TestWriteError(t *testing.T) {
	badRequest := &errdetails.BadRequest{
		FieldViolations: []*errdetails.BadRequest_FieldViolation{
			{Field: "service.vips[0]", Description: `"10.0.0.256" is not an IP address`},
			{Field: "service.ports[0].port", Description: "must be 1-65535"},
		},
	}
	invalid, err := status.New(codes.InvalidArgument, "invalid service").WithDetails(badRequest)
	if err != nil {
		t.Fatal(err)
	}
	repeating, err := status.New(codes.InvalidArgument,
		`invalid request: service.vips[0]: "10.0.0.256" is not an IP address; service.ports[0].port: must be 1-65535`).WithDetails(badRequest)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"plain", errors.New("boom"), "Error: boom\n"},
		{"status", status.Error(codes.NotFound, "service x not found"), "Error: NotFound: service x not found\n"},
		{"field violations", invalid.Err(), `Error: InvalidArgument: invalid service
  service.vips[0]: "10.0.0.256" is not an IP address
  service.ports[0].port: must be 1-65535
`},
		{"wrapped field violations", fmt.Errorf("apply service web: %w", invalid.Err()), `Error: apply service web: InvalidArgument: invalid service
  service.vips[0]: "10.0.0.256" is not an IP address
  service.ports[0].port: must be 1-65535
`},
		{"message repeating the violations", fmt.Errorf("apply service web: %w", repeating.Err()), `Error: apply service web: InvalidArgument: invalid request
  service.vips[0]: "10.0.0.256" is not an IP address
  service.ports[0].port: must be 1-65535
`},
		{"wrapped twice", fmt.Errorf("a: %w", fmt.Errorf("b: %w", status.Error(codes.Aborted, "stale"))), "Error: a: b: Aborted: stale\n"},
		{"status not at the end", fmt.Errorf("%w (while applying)", status.Error(codes.Aborted, "stale")),
			"Error: rpc error: code = Aborted desc = stale (while applying)\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			writeError(&b, tc.err)
			if diff := cmp.Diff(tc.want, b.String()); diff != "" {
				t.Errorf("writeError (-want +got):\n%s", diff)
			}
		})
	}
}
