package cli

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestEndpointOf(t *testing.T) {
	for _, tc := range []struct {
		target string
		want   endpoint
	}{
		{"/run/vipd/vipd.sock", endpoint{network: "unix", address: "/run/vipd/vipd.sock", shown: "unix:///run/vipd/vipd.sock"}},
		{"unix:///run/vipd/vipd.sock", endpoint{network: "unix", address: "/run/vipd/vipd.sock", shown: "unix:///run/vipd/vipd.sock"}},
		{"unix:vipd.sock", endpoint{network: "unix", address: "vipd.sock", shown: "unix:vipd.sock"}},
		{"unix-abstract:vipd", endpoint{network: "unix", address: "@vipd", shown: "unix-abstract:vipd"}},
		{"tcp://198.19.0.1:9650", endpoint{network: "tcp", address: "198.19.0.1:9650", shown: "tcp://198.19.0.1:9650"}},
		{"[::1]:9650", endpoint{network: "tcp", address: "[::1]:9650", shown: "tcp://[::1]:9650"}},
	} {
		if got := endpointOf(tc.target); got != tc.want {
			t.Errorf("endpointOf(%q) = %+v, want %+v", tc.target, got, tc.want)
		}
	}
}

// TestDiagnosePlaced checks that diagnose leaves errors placed in the
// input files as they are, so that what they say (such as which services
// apply wrote before vipd went away) is not replaced.
func TestDiagnosePlaced(t *testing.T) {
	placed := &fileErrors{cause: status.Error(codes.Unavailable, "connection refused"), summary: "1 of 2 services were applied: a"}
	ep := endpoint{network: "unix", address: filepath.Join(t.TempDir(), "missing.sock"), shown: "unix:///missing.sock"}
	if got := ep.diagnose(placed, time.Second, nil); got != error(placed) {
		t.Errorf("diagnose(placed) = %v, want the placed errors as they are", got)
	}
	if got := ep.diagnose(status.Error(codes.Unavailable, "connection refused"), time.Second, nil); !strings.Contains(got.Error(), "cannot reach vipd at unix:///missing.sock: no such file") {
		t.Errorf("diagnose(Unavailable) = %v, want the cause", got)
	}
}
