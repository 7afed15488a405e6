package cli

import "testing"

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
