package cli

import (
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testkit/testserver"
)

// TestServiceGetHealth: "service get" shows the health check and each
// probed backend's health, and explain gives a failing backend's reason.
// The backends are on loopback: a refused port (1) and a listener.
func TestServiceGetHealth(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	sock := testserver.Start(t).Socket()
	file := writeFile(t, "svc.yaml", `
name: web
vips: [10.96.0.10]
ports: [{name: http, port: 80, target_port: `+strconv.Itoa(port)+`}]
backends:
- {ip: 127.0.0.1}
- {ip: 127.0.0.2, ports: {http: 1}}
health_check: {protocol: tcp, interval_ms: 50, unhealthy_threshold: 2, healthy_threshold: 1}
`)
	vipctl(t, sock, "", "apply", "-f", file).checkCode(t, ExitOK)
	var out string
	deadline := time.Now().Add(5 * time.Second)
	for {
		out = vipctl(t, sock, "", "service", "get", "web").stdout
		if strings.Contains(out, "failing health check (connection refused") && strings.Contains(out, "passing health check") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("service get never showed one failing and one passing backend:\n%s", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, want := range []string{
		"Health check:             tcp, first port, every 50ms (timeout 50ms, up after 1 passes, down after 2 failures)\n",
		"  IP         HEALTH   SINCE",
		"  127.0.0.2  failing  ",
		"  127.0.0.1  passing  ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("service get lacks %q:\n%s", want, out)
		}
	}
	ex := vipctl(t, sock, "", "explain", "10.0.0.1", "10.96.0.10:80")
	if !strings.Contains(ex.stdout, "failing health check (connection refused,") {
		t.Errorf("explain does not give the health reason:\n%s%s", ex.stdout, ex.stderr)
	}
}
