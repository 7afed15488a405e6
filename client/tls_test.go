package client_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/testkit/testserver"
)

// TestTCPTarget checks the tcp://host:port form (the TLS itself is tested
// against a real daemon in internal/daemon).
func TestTCPTarget(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testserver.Start(t, testserver.WithListener(tcp))
	c, err := client.New("tcp://" + tcp.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Status(context.Background()); err != nil {
		t.Fatalf("status over tcp://: %v", err)
	}
	for _, bad := range []string{"tcp://", "tcp://localhost", "tcp:///x"} {
		if _, err := client.New(bad); err == nil || !strings.Contains(err.Error(), "tcp://host:port") {
			t.Errorf("New(%q): %v", bad, err)
		}
	}
}

func TestTLSOptions(t *testing.T) {
	if _, err := client.New("tcp://127.0.0.1:1", client.WithTLS(nil)); err == nil {
		t.Error("WithTLS(nil) accepted")
	}
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ca, cert, key string
		want          string
	}{
		{filepath.Join(dir, "missing.pem"), "c", "k", "missing.pem"},
		{notPEM, "c", "k", "holds no PEM certificate"},
	} {
		if _, err := client.TLSConfigFromFiles(tc.ca, tc.cert, tc.key); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("TLSConfigFromFiles(%s, %s, %s): %v, want %q", tc.ca, tc.cert, tc.key, err, tc.want)
		}
	}
}
