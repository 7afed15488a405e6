package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/manifest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Exit codes; see the package documentation.
const (
	ExitOK          = 0
	ExitError       = 1
	ExitUsage       = 2
	ExitNotFound    = 3
	ExitInvalid     = 4
	ExitConflict    = 5
	ExitUnavailable = 6
	ExitDenied      = 7
)

// exitCodesHelp documents the exit codes in "vipctl --help".
const exitCodesHelp = `Exit codes:
  0  success
  1  any other error
  2  usage error: bad flags or arguments
  3  NotFound: no such service, or no such backend to remove
  4  InvalidArgument: vipd rejected the input, or an input file is invalid
  5  conflict: AlreadyExists, Aborted (a stale generation), FailedPrecondition (another owner's service)
  6  vipd unavailable: Unavailable or DeadlineExceeded
  7  denied: PermissionDenied (this client may not change that owner's services) or Unauthenticated`

// usageError is a mistake in the command line: flags, arguments, or their
// combination. It exits with ExitUsage.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usageErrorf(format string, args ...any) error {
	return &usageError{err: fmt.Errorf(format, args...)}
}

// inputError is invalid input that vipctl notices before asking vipd, such
// as a service whose owner contradicts --owner. It exits with ExitInvalid.
type inputError struct{ err error }

func (e *inputError) Error() string { return e.err.Error() }
func (e *inputError) Unwrap() error { return e.err }

func inputErrorf(format string, args ...any) error {
	return &inputError{err: fmt.Errorf(format, args...)}
}

// fileErrors are objections to services of the input files, each placed
// where the service was read. cause is the first of vipd's errors behind
// them, which decides the exit code; summary is a last line, such as
// "nothing was applied".
type fileErrors struct {
	errs    []*manifest.Error
	cause   error
	summary string
}

// add appends the errors of o; the first cause stays.
func (e *fileErrors) add(o *fileErrors) {
	e.errs = append(e.errs, o.errs...)
	if e.cause == nil {
		e.cause = o.cause
	}
}

func (e *fileErrors) Error() string {
	lines := make([]string, 0, len(e.errs)+1)
	for _, fe := range e.errs {
		lines = append(lines, fe.Error())
	}
	if e.summary != "" {
		lines = append(lines, e.summary)
	}
	return strings.Join(lines, "\n")
}

func (e *fileErrors) Unwrap() error { return e.cause }

// ExitCode maps the error of a command to vipctl's exit code: nil is
// ExitOK, and gRPC status errors, wrapped or not, map by their code.
func ExitCode(err error) int {
	if err == nil {
		return ExitOK
	}
	var (
		usage *usageError
		input *inputError
		file  *manifest.Error
	)
	switch {
	case errors.As(err, &usage):
		return ExitUsage
	case errors.As(err, &input), errors.As(err, &file):
		return ExitInvalid
	}
	if st, ok := status.FromError(err); ok {
		switch st.Code() {
		case codes.NotFound:
			return ExitNotFound
		case codes.InvalidArgument:
			return ExitInvalid
		case codes.AlreadyExists, codes.Aborted, codes.FailedPrecondition:
			return ExitConflict
		case codes.Unavailable, codes.DeadlineExceeded:
			return ExitUnavailable
		case codes.PermissionDenied, codes.Unauthenticated:
			return ExitDenied
		}
		return ExitError
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return ExitUnavailable
	}
	return ExitError
}

// writeError prints err for a person: a gRPC error as "Code: message" after
// whatever context wraps it, then each field violation on its own line.
func writeError(w io.Writer, err error) {
	var placed *fileErrors
	if errors.As(err, &placed) {
		// Each on a line of its own, as a compiler reports a file.
		for _, line := range strings.Split(placed.Error(), "\n") {
			fmt.Fprintf(w, "Error: %s\n", line)
		}
		return
	}
	msg := describe(err)
	violations := client.FieldViolations(err)
	if len(violations) > 0 {
		// vipd's message may repeat the violations ("invalid request:
		// service.vips[0]: ..."); they are listed below, one per line.
		first := violations[0].GetField() + ": " + violations[0].GetDescription()
		if i := strings.Index(msg, first); i > 0 {
			msg = strings.TrimRight(msg[:i], ":; ")
		}
	}
	fmt.Fprintf(w, "Error: %s\n", msg)
	for _, v := range violations {
		fmt.Fprintf(w, "  %s: %s\n", v.GetField(), v.GetDescription())
	}
}

// describe is err's message with a gRPC status shown as "Code: message"
// instead of gRPC's "rpc error: code = Code desc = message".
func describe(err error) string {
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) {
		return err.Error()
	}
	st := se.GRPCStatus()
	inner, _ := se.(error)
	msg := err.Error()
	// fmt.Errorf("...: %w", statusErr) ends with the status's own text;
	// anything else is shown as it is.
	if inner == nil || !strings.HasSuffix(msg, inner.Error()) {
		return msg
	}
	return strings.TrimSuffix(msg, inner.Error()) + st.Code().String() + ": " + st.Message()
}
