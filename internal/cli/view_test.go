package cli

import (
	"testing"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

func TestPortString(t *testing.T) {
	for _, tc := range []struct {
		port *vipdv1.Port
		want string
	}{
		{&vipdv1.Port{Port: 80, Protocol: vipdv1.Protocol_PROTOCOL_TCP, TargetPort: 8080}, "80/TCP→8080"},
		{&vipdv1.Port{Port: 53, Protocol: vipdv1.Protocol_PROTOCOL_UDP}, "53/UDP"},
		{&vipdv1.Port{Port: 53, Protocol: vipdv1.Protocol_PROTOCOL_UDP, TargetPort: 53}, "53/UDP"},
		{&vipdv1.Port{Port: 3868, Protocol: vipdv1.Protocol_PROTOCOL_SCTP, TargetPort: 3869}, "3868/SCTP→3869"},
		{&vipdv1.Port{Port: 1}, "1/UNSPECIFIED"},
	} {
		if got := portString(tc.port); got != tc.want {
			t.Errorf("portString(%v) = %q, want %q", tc.port, got, tc.want)
		}
	}
}

func TestAffinityString(t *testing.T) {
	for _, tc := range []struct {
		a    *vipdv1.SessionAffinityConfig
		want string
	}{
		{nil, "unspecified"},
		{&vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_NONE}, "none"},
		{&vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP, TimeoutSeconds: 10800}, "client_ip:10800s"},
	} {
		if got := affinityString(tc.a); got != tc.want {
			t.Errorf("affinityString(%v) = %q, want %q", tc.a, got, tc.want)
		}
	}
}
