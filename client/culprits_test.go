package client_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/vipd/vipd/client"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
)

func withDetails(t *testing.T, code codes.Code, details ...protoadapt.MessageV1) error {
	t.Helper()
	st, err := status.New(code, "refused").WithDetails(details...)
	if err != nil {
		t.Fatal(err)
	}
	return st.Err()
}

// TestCulprits: Culprits reads each services[i] field violation with its
// reason and, from the ErrorInfo, the service's name; violations of other
// fields, other domains' names and errors without details give nothing.
func TestCulprits(t *testing.T) {
	conflict := withDetails(t, codes.AlreadyExists,
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
			{Field: "services[1].vips[0]", Description: "service b: 198.19.0.1:80/TCP is already used by service z", Reason: client.ReasonServiceConflict},
			{Field: "services[4]", Description: "service e: ...", Reason: client.ReasonServiceConflict},
		}},
		&errdetails.ErrorInfo{Domain: client.ErrorDomain, Reason: client.ReasonServiceConflict,
			Metadata: map[string]string{"service": "b", "index": "1", "service_1": "b", "service_4": "e"}})
	invalid := withDetails(t, codes.InvalidArgument, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
		{Field: "owner", Description: "empty"},
		{Field: "services[2].vips[0]", Description: "not an IP"},
		{Field: "services[x]", Description: "not an index"},
	}})
	whole := withDetails(t, codes.ResourceExhausted, &errdetails.ErrorInfo{Domain: client.ErrorDomain, Reason: client.ReasonDataplaneExhausted})
	foreign := withDetails(t, codes.AlreadyExists,
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "services[0]"}}},
		&errdetails.ErrorInfo{Domain: "example.com", Reason: "X", Metadata: map[string]string{"service_0": "a"}})
	tests := []struct {
		name   string
		err    error
		want   []string
		reason string
	}{
		{"conflict", conflict, []string{"1 b services[1].vips[0] SERVICE_CONFLICT", "4 e services[4] SERVICE_CONFLICT"}, client.ReasonServiceConflict},
		{"wrapped", fmt.Errorf("sync: %w", conflict), []string{"1 b services[1].vips[0] SERVICE_CONFLICT", "4 e services[4] SERVICE_CONFLICT"}, client.ReasonServiceConflict},
		{"invalid", invalid, []string{"2  services[2].vips[0] "}, ""},
		{"whole request", whole, nil, client.ReasonDataplaneExhausted},
		{"another domain", foreign, []string{"0  services[0] "}, ""},
		{"no status", errors.New("plain"), nil, ""},
		{"nil", nil, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, c := range client.Culprits(tt.err) {
				got = append(got, fmt.Sprintf("%d %s %s %s", c.Index, c.Service, c.Field, c.Reason))
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("Culprits: got %q, want %q", got, tt.want)
			}
			if r := client.RefusalReason(tt.err); r != tt.reason {
				t.Errorf("RefusalReason: %q, want %q", r, tt.reason)
			}
		})
	}
}
