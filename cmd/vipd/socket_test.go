package main

import (
	"testing"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/envflag"
)

// TestSocketDefaultIsTheClients: vipd serves where vipctl and vipd-k8s look
// by default, and the variable that moves their default moves vipd's too.
func TestSocketDefaultIsTheClients(t *testing.T) {
	f := rootCommand().Flags().Lookup("socket")
	if f == nil {
		t.Fatal("vipd has no --socket flag")
	}
	if f.DefValue != client.DefaultSocket {
		t.Errorf("--socket default = %q, want client.DefaultSocket %q", f.DefValue, client.DefaultSocket)
	}
	if got := envflag.Name(envPrefix, "socket"); got != client.SocketEnv {
		t.Errorf("--socket is set by %s, want client.SocketEnv %s", got, client.SocketEnv)
	}
}
