package daemon_test

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// handshake makes a TLS connection to addr with the client certificate
// cf, trusting p's CA, and reads until the server's first bytes, which
// come only once it has accepted the certificate. It returns the serial of
// the server's certificate and the handshake's verdict.
func (p *pki) handshake(t *testing.T, addr string, cf certFiles) (*big.Int, error) {
	t.Helper()
	roots := x509.NewCertPool()
	pem, err := os.ReadFile(p.ca.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	roots.AppendCertsFromPEM(pem)
	pair, err := tls.LoadX509KeyPair(cf.Cert, cf.Key)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{RootCAs: roots, NextProtos: []string{"h2"},
		// Sent even when its CA is not among those vipd asks for.
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", strings.TrimPrefix(addr, "tcp://"), cfg)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	serial := conn.ConnectionState().PeerCertificates[0].SerialNumber
	conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	_, err = io.ReadAtLeast(conn, make([]byte, 16), 1)
	return serial, err
}

func serialOf(t *testing.T, certFile string) *big.Int {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(certFile, certFile[:len(certFile)-len(".pem")]+"-key.pem")
	if err != nil {
		t.Fatal(err)
	}
	return pair.Leaf.SerialNumber
}

func writeFile(t *testing.T, path string, from ...string) {
	t.Helper()
	var data []byte
	for _, f := range from {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		data = append(data, b...)
	}
	// Written aside and renamed, as tools that renew certificates do.
	if err := os.WriteFile(path+".new", data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
}

// TestReloadTLSAndAuthz runs vipd with mutual TLS and an authz file,
// replaces the server certificate, the client CA bundle (now of another
// CA) and the authz policy, and reloads: new handshakes get the new
// certificate and accept clients of the new CA only, a connection made
// before goes on, and its next call is authorized by the new policy. A
// reload with a broken file changes nothing.
func TestReloadTLSAndAuthz(t *testing.T) {
	p := newPKI(t)
	ca2 := newCA(t, "next-ca")
	c2 := ca2.issue("c2", certSpec{cn: "ctrl-c"})
	dir := t.TempDir()
	clientCA, authzFile := filepath.Join(dir, "client-ca.pem"), filepath.Join(dir, "authz.yaml")
	writeFile(t, clientCA, p.ca.CertFile)
	if err := os.WriteFile(authzFile, []byte("ctrl-b: [team-b]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	serverCert := certFiles{Cert: filepath.Join(dir, "server.pem"), Key: filepath.Join(dir, "server-key.pem")}
	writeFile(t, serverCert.Cert, p.server.Cert)
	writeFile(t, serverCert.Key, p.server.Key)
	cfg := config(t)
	cfg.Remote = p.remote(t, authzFile)
	cfg.Remote.TLSClientCA, cfg.Remote.TLSCert, cfg.Remote.TLSKey = clientCA, serverCert.Cert, serverCert.Key
	hup := make(chan os.Signal, 1)
	cfg.Reload = hup
	r := start(t, cfg, healthpb.HealthCheckResponse_SERVING)
	addr := cfg.Remote.Listen
	reload := func(want string) {
		t.Helper()
		before := strings.Count(r.log.String(), want)
		hup <- syscall.SIGHUP
		deadline := time.Now().Add(10 * time.Second)
		for strings.Count(r.log.String(), want) == before {
			if time.Now().After(deadline) {
				t.Fatalf("no %q in the log after SIGHUP:\n%s", want, r.log)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	b := p.dial(t, addr, "b") // connected before the reload, and kept
	if _, err := b.UpsertService(ctxT(t), svc("c/web", "team-c", "198.19.0.1"), 0); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("ctrl-b changes team-c before the reload: %v, want PermissionDenied", err)
	}
	oldSerial := serialOf(t, p.server.Cert)
	if serial, err := p.handshake(t, addr, c2); err == nil || serial.Cmp(oldSerial) != 0 {
		t.Fatalf("before the reload: a certificate of the new CA: %v (server serial %v, want %v); want refused", err, serial, oldSerial)
	}

	next := p.ca.issue("server-next", certSpec{cn: "vipd", ips: []net.IP{net.IPv4(127, 0, 0, 1)}, server: true})
	writeFile(t, serverCert.Cert, next.Cert)
	writeFile(t, serverCert.Key, next.Key)
	writeFile(t, clientCA, ca2.CertFile)
	if err := os.WriteFile(authzFile, []byte("ctrl-b: [team-b, team-c]\nctrl-c: \"*\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	reload("reloaded:")
	newSerial := serialOf(t, next.Cert)
	for _, want := range []string{"new serial " + newSerial.Text(16), "client CA (1 certificates, was 1)", "authz (2 identities, was 1)"} {
		if !strings.Contains(r.log.String(), want) {
			t.Errorf("the reload's log line lacks %q:\n%s", want, r.log)
		}
	}
	if serial, err := p.handshake(t, addr, c2); err != nil || serial.Cmp(newSerial) != 0 {
		t.Fatalf("after the reload: a certificate of the new CA: %v, server serial %v (want %v)", err, serial, newSerial)
	}
	if _, err := p.handshake(t, addr, p.clients["b"]); err == nil {
		t.Fatal("after the reload: a certificate of the old CA, no longer in --tls-client-ca, is accepted")
	}
	// The connection made before goes on, under the new policy.
	if _, err := b.UpsertService(ctxT(t), svc("c/web", "team-c", "198.19.0.1"), 0); err != nil {
		t.Fatalf("ctrl-b changes team-c after the reload, on its old connection: %v", err)
	}

	// A broken authz file: nothing changes, not even the CA bundle that
	// was replaced with it.
	writeFile(t, clientCA, p.ca.CertFile)
	if err := os.WriteFile(authzFile, []byte("ctrl-b: [team-b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	reload("reload failed; keeping the TLS and authz files loaded before")
	if _, err := p.handshake(t, addr, c2); err != nil {
		t.Fatalf("after a failed reload: the CA loaded before is gone: %v", err)
	}
	if _, err := b.UpsertService(ctxT(t), svc("c/api", "team-c", "198.19.0.2"), 0); err != nil {
		t.Fatalf("after a failed reload: the policy loaded before is gone: %v", err)
	}
	if !strings.Contains(r.log.String(), authzFile) {
		t.Errorf("the failed reload's log line does not name the file:\n%s", r.log)
	}
}

// TestSIGHUPKeepsVipdRunning sends SIGHUP to a vipd process without
// --listen: it logs that there is nothing to reload and goes on serving;
// SIGTERM then stops it cleanly and removes its socket.
func TestSIGHUPKeepsVipdRunning(t *testing.T) {
	p := startServing(t)
	p.signal(syscall.SIGHUP)
	p.waitLog("nothing to reload")
	p.signal(syscall.SIGHUP)
	c := startServingClient(t, p)
	if st, err := c.Health(ctxT(t)); err != nil || st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health after SIGHUP: %v %v\n%s", st, err, p.stderr)
	}
	p.signal(syscall.SIGTERM)
	if code := p.wait(15 * time.Second); code != 0 {
		t.Fatalf("vipd exited %d after SIGHUP and SIGTERM:\n%s", code, p.stderr)
	}
	if _, err := os.Lstat(p.socket); !os.IsNotExist(err) {
		t.Errorf("socket left behind: %v", err)
	}
}
