package client_test

import (
	"testing"

	"github.com/vipd/vipd/client"
)

func TestSocketFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name, env, want string
	}{
		{"unset gives the default", "", client.DefaultSocket},
		{"set replaces the default", "/tmp/other/vipd.sock", "/tmp/other/vipd.sock"},
		{"a TCP target is passed through", "tcp://127.0.0.1:7443", "tcp://127.0.0.1:7443"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(client.SocketEnv, tc.env)
			if got := client.SocketFromEnv(); got != tc.want {
				t.Errorf("SocketFromEnv() with %s=%q = %q, want %q", client.SocketEnv, tc.env, got, tc.want)
			}
		})
	}
}

// TestDefaultSocketIsVipds pins the values that vipd's --socket default,
// vipctl and vipd-k8s share: changing them changes where every tool looks.
func TestDefaultSocketIsVipds(t *testing.T) {
	if client.DefaultSocket != "/run/vipd/vipd.sock" {
		t.Errorf("DefaultSocket = %q, want /run/vipd/vipd.sock", client.DefaultSocket)
	}
	if client.SocketEnv != "VIPD_SOCKET" {
		t.Errorf("SocketEnv = %q, want VIPD_SOCKET", client.SocketEnv)
	}
}
