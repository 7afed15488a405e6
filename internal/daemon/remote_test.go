package daemon_test

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/daemon"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// pki is a CA with vipd's server certificate and client certificates, and
// a second CA that vipd does not trust.
type pki struct {
	ca, other *testCA
	server    certFiles
	// clients by name: "a" (URI SAN spiffe://vipd.test/ctrl-a and CN
	// "admin": the URI SAN is its identity), "b" (CN ctrl-b), "admin" (CN
	// admin), "stranger" (CN stranger, in no policy), "foreign" (CN admin,
	// signed by the other CA).
	clients map[string]certFiles
}

func newPKI(t *testing.T) *pki {
	ca, other := newCA(t, "vipd-test"), newCA(t, "someone-else")
	return &pki{ca: ca, other: other, server: ca.serverCert(), clients: map[string]certFiles{
		"a":        ca.issue("a", certSpec{cn: "admin", uris: []string{"spiffe://vipd.test/ctrl-a"}}),
		"b":        ca.issue("b", certSpec{cn: "ctrl-b"}),
		"admin":    ca.issue("admin", certSpec{cn: "admin"}),
		"stranger": ca.issue("stranger", certSpec{cn: "stranger"}),
		"foreign":  other.issue("foreign", certSpec{cn: "admin"}),
	}}
}

// tlsConfig returns vipd's settings for p, listening on a free loopback port.
func (p *pki) remote(t *testing.T, authzFile string) daemon.Remote {
	return daemon.Remote{
		Listen:      "tcp://" + freeAddr(t, "tcp", "127.0.0.1"),
		TLSCert:     p.server.Cert,
		TLSKey:      p.server.Key,
		TLSClientCA: p.ca.CertFile,
		AuthzFile:   authzFile,
	}
}

// dial returns a client of the vipd at addr (tcp://host:port) with the
// named client certificate ("" for none).
func (p *pki) dial(t *testing.T, addr, name string) *client.Client {
	t.Helper()
	cfg := &tls.Config{RootCAs: x509.NewCertPool()}
	if name != "" {
		var err error
		cf := p.clients[name]
		if cfg, err = client.TLSConfigFromFiles(p.ca.CertFile, cf.Cert, cf.Key); err != nil {
			t.Fatal(err)
		}
	} else {
		pem, err := os.ReadFile(p.ca.CertFile)
		if err != nil {
			t.Fatal(err)
		}
		cfg.RootCAs.AppendCertsFromPEM(pem)
	}
	c, err := client.New(addr, client.WithTLS(cfg), client.WithMaxAttempts(1), client.WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func writeAuthz(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "authz.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

const testPolicy = `# who may change which owners' services
spiffe://vipd.test/ctrl-a: [team-a]
ctrl-b: [team-b, shared]
admin: "*"
`

func svc(name, owner, vip string, backends ...string) *vipdv1.Service {
	s := &vipdv1.Service{Name: name, Owner: owner, Vips: []string{vip}, Ports: []*vipdv1.Port{{Port: 80}}}
	for _, b := range backends {
		s.Backends = append(s.Backends, &vipdv1.Backend{Ip: b})
	}
	return s
}

// TestMutualTLSHandshake checks who gets through vipd's TCP listener: a
// client without a certificate and one with a certificate of another CA are
// refused during the TLS handshake, before any call; a valid one gets every
// service, over TLS 1.3.
func TestMutualTLSHandshake(t *testing.T) {
	p := newPKI(t)
	cfg := config(t)
	cfg.Remote = p.remote(t, "")
	r := start(t, cfg, healthpb.HealthCheckResponse_SERVING)
	addr := strings.TrimPrefix(cfg.Remote.Listen, "tcp://")

	roots := x509.NewCertPool()
	pem, _ := os.ReadFile(p.ca.CertFile)
	roots.AppendCertsFromPEM(pem)
	loadPair := func(name string) []tls.Certificate {
		c, err := tls.LoadX509KeyPair(p.clients[name].Cert, p.clients[name].Key)
		if err != nil {
			t.Fatal(err)
		}
		return []tls.Certificate{c}
	}
	for _, tc := range []struct {
		name    string
		cfg     *tls.Config
		wantErr string // in the handshake or the first read; "" = accepted
	}{
		{"no certificate", &tls.Config{RootCAs: roots}, "certificate required"},
		// GetClientCertificate: crypto/tls would otherwise send no
		// certificate at all, as none matches the CAs vipd asks for.
		{"certificate of another CA", &tls.Config{RootCAs: roots, GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &loadPair("foreign")[0], nil
		}}, "unknown certificate authority"},
		{"TLS 1.1", &tls.Config{RootCAs: roots, Certificates: loadPair("admin"), MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}, "protocol version"},
		{"valid certificate", &tls.Config{RootCAs: roots, Certificates: loadPair("admin")}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.NextProtos = []string{"h2"}
			conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, tc.cfg)
			if err == nil {
				defer conn.Close()
				// TLS 1.3 clients finish their side of the handshake before
				// the server has checked their certificate: its verdict
				// comes as an alert on the first read.
				conn.SetReadDeadline(time.Now().Add(2 * time.Second))
				buf := make([]byte, 64)
				_, err = io.ReadAtLeast(conn, buf, 1)
			}
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("handshake with a valid certificate: %v", err)
				}
				if v := conn.ConnectionState().Version; v != tls.VersionTLS13 {
					t.Errorf("negotiated TLS version %x, want 1.3", v)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("handshake: %v, want an error with %q", err, tc.wantErr)
			}
		})
	}

	// The refusals are logged (at most once every 10 s).
	if log := r.log.String(); !strings.Contains(log, "[WARN]  vipd.grpc: TLS handshake failed; connection refused: peer=127.0.0.1:") ||
		!strings.Contains(log, "refused=1") {
		t.Errorf("no log line for the refused handshakes:\n%s", log)
	}

	// Through gRPC: refused clients never get a call through.
	for _, name := range []string{"", "foreign"} {
		c := p.dial(t, cfg.Remote.Listen, name)
		_, err := c.Status(ctxT(t))
		if status.Code(err) != codes.Unavailable {
			t.Errorf("GetStatus with client certificate %q: %v, want Unavailable", name, err)
		}
		if _, err := c.UpsertService(ctxT(t), svc("x", "default", "198.19.0.1"), 0); err == nil {
			t.Errorf("UpsertService with client certificate %q succeeded", name)
		}
	}
	c := p.dial(t, cfg.Remote.Listen, "admin")
	if st, err := c.Health(ctxT(t)); err != nil || st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health over mTLS: %v %v", st, err)
	}
	if _, err := c.UpsertService(ctxT(t), svc("web", "default", "198.19.0.1", "198.18.1.10"), 0); err != nil {
		t.Fatalf("upsert over mTLS: %v", err)
	}
	got, err := r.local.GetService(ctxT(t), "web")
	if err != nil || got.GetBackends()[0].GetIp() != "198.18.1.10" {
		t.Fatalf("the Unix socket does not see the service upserted over TCP: %v %v", got, err)
	}
	if _, err := c.ListFlows(ctxT(t), nil, 0); err != nil {
		t.Fatalf("ListFlows over mTLS: %v", err)
	}
	// No authz file: a valid certificate may change every owner, and vipd
	// said so at start.
	if _, err := c.UpsertService(ctxT(t), svc("other", "team-z", "198.19.0.2"), 0); err != nil {
		t.Fatalf("upsert of another owner without an authz file: %v", err)
	}
	if !strings.Contains(r.log.String(), "no --authz-file: every client with a certificate") {
		t.Errorf("no warning about the missing authz file in the log:\n%s", r.log)
	}
}

// TestAuthorization checks the owner checks of every mutating call, for
// identities from a URI SAN and from a CN, and that reads are open to every
// authenticated client and the Unix socket is trusted.
func TestAuthorization(t *testing.T) {
	p := newPKI(t)
	cfg := config(t)
	cfg.Remote = p.remote(t, writeAuthz(t, testPolicy))
	r := start(t, cfg, healthpb.HealthCheckResponse_SERVING)
	a := p.dial(t, cfg.Remote.Listen, "a")
	b := p.dial(t, cfg.Remote.Listen, "b")
	admin := p.dial(t, cfg.Remote.Listen, "admin")
	stranger := p.dial(t, cfg.Remote.Listen, "stranger")
	local := r.local

	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := local.UpsertService(ctxT(t), svc("a/web", "team-a", "198.19.0.1", "198.18.1.1"), 0)
	must(err)
	_, err = local.UpsertService(ctxT(t), svc("b/web", "team-b", "198.19.0.2", "198.18.1.2"), 0)
	must(err)

	type call struct {
		name   string
		do     func() error
		denied string // the owner named in PermissionDenied; "" = allowed
	}
	upsert := func(c *client.Client, s *vipdv1.Service) func() error {
		return func() error { _, err := c.UpsertService(ctxT(t), s, 0); return err }
	}
	takeover := func(c *client.Client, s *vipdv1.Service) func() error {
		return func() error {
			_, err := c.LoadBalancerClient().UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: s, TakeOwnership: true})
			return err
		}
	}
	del := func(c *client.Client, name string) func() error {
		return func() error { return c.DeleteService(ctxT(t), name, 0) }
	}
	backends := func(c *client.Client, name string) func() error {
		return func() error {
			_, err := c.UpdateBackends(ctxT(t), name, []*vipdv1.Backend{{Ip: "198.18.1.99"}}, nil, 0)
			return err
		}
	}
	sync := func(c *client.Client, owner string, svcs ...*vipdv1.Service) func() error {
		return func() error { _, err := c.SyncServices(ctxT(t), owner, svcs); return err }
	}
	calls := []call{
		{"a upserts its own owner's service", upsert(a, svc("a/web", "team-a", "198.19.0.1", "198.18.1.3")), ""},
		{"a creates a service of another owner", upsert(a, svc("a/new", "team-b", "198.19.0.3")), "team-b"},
		{"a takes over b's service", takeover(a, svc("b/web", "team-a", "198.19.0.2")), "team-b"},
		{"a's CN admin does not count: its URI SAN is its identity", upsert(a, svc("x/web", "team-x", "198.19.0.4")), "team-x"},
		{"a deletes b's service", del(a, "b/web"), "team-b"},
		{"a updates b's backends", backends(a, "b/web"), "team-b"},
		{"a syncs b's owner", sync(a, "team-b"), "team-b"},
		{"a updates its own backends", backends(a, "a/web"), ""},
		{"b (CN identity) upserts its own", upsert(b, svc("b/web", "team-b", "198.19.0.2", "198.18.1.5")), ""},
		{"b moves its service to another owner it may change", takeover(b, svc("b/web", "shared", "198.19.0.2")), ""},
		{"b moves it back", takeover(b, svc("b/web", "team-b", "198.19.0.2")), ""},
		{"b syncs its owner", sync(b, "shared", svc("s/one", "", "198.19.0.5")), ""},
		{"stranger upserts", upsert(stranger, svc("z/web", "default", "198.19.0.6")), "default"},
		{"stranger deletes", del(stranger, "a/web"), "team-a"},
		{"stranger syncs", sync(stranger, "default"), "default"},
		{"stranger updates backends", backends(stranger, "a/web"), "team-a"},
		{"admin takes over b's service", takeover(admin, svc("b/web", "team-a", "198.19.0.2")), ""},
		{"a now changes it", backends(a, "b/web"), ""},
		{"a syncs its owner, deleting b/web", sync(a, "team-a", svc("a/web", "", "198.19.0.1")), ""},
		{"the Unix socket changes anything", upsert(local, svc("x/web", "team-x", "198.19.0.4")), ""},
		{"the Unix socket deletes anything", del(local, "x/web"), ""},
	}
	for _, c := range calls {
		before, err := local.ListServices(ctxT(t), "")
		must(err)
		err = c.do()
		if c.denied == "" {
			if err != nil {
				t.Errorf("%s: %v, want success", c.name, err)
			}
			continue
		}
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), `owner "`+c.denied+`"`) {
			t.Errorf("%s: %v, want PermissionDenied naming owner %q", c.name, err, c.denied)
			continue
		}
		after, err := local.ListServices(ctxT(t), "")
		must(err)
		if len(after) != len(before) {
			t.Errorf("%s: denied, but the services changed: %d before, %d after", c.name, len(before), len(after))
		}
		for i := range after {
			if i < len(before) && after[i].GetGeneration() != before[i].GetGeneration() {
				t.Errorf("%s: denied, but %s changed", c.name, after[i].GetName())
			}
		}
	}
	// Reads are open to every authenticated client.
	for name, c := range map[string]*client.Client{"a": a, "stranger": stranger} {
		if _, err := c.GetService(ctxT(t), "a/web"); err != nil {
			t.Errorf("%s: GetService: %v", name, err)
		}
		if l, err := c.ListServices(ctxT(t), ""); err != nil || len(l) == 0 {
			t.Errorf("%s: ListServices: %v %v", name, l, err)
		}
		if _, err := c.Status(ctxT(t)); err != nil {
			t.Errorf("%s: GetStatus: %v", name, err)
		}
		if _, err := c.Explain(ctxT(t), &vipdv1.ExplainRequest{ClientIp: "198.18.0.9", Vip: "198.19.0.1", Port: 80}); err != nil {
			t.Errorf("%s: Explain: %v", name, err)
		}
		if _, err := c.ListFlows(ctxT(t), nil, 0); err != nil {
			t.Errorf("%s: ListFlows: %v", name, err)
		}
	}
	// Every denial is logged at warn level with identity, method and owner.
	log := r.log.String()
	for _, want := range []string{
		`[WARN]  vipd.api: permission denied: identity=spiffe://vipd.test/ctrl-a method=/vipd.v1.LoadBalancerService/UpsertService owner=team-b`,
		`[WARN]  vipd.api: permission denied: identity=spiffe://vipd.test/ctrl-a method=/vipd.v1.LoadBalancerService/DeleteService owner=team-b`,
		`[WARN]  vipd.api: permission denied: identity=spiffe://vipd.test/ctrl-a method=/vipd.v1.LoadBalancerService/UpdateBackends owner=team-b`,
		`[WARN]  vipd.api: permission denied: identity=spiffe://vipd.test/ctrl-a method=/vipd.v1.LoadBalancerService/SyncServices owner=team-b`,
		`[WARN]  vipd.api: permission denied: identity=stranger method=/vipd.v1.LoadBalancerService/UpsertService owner=default`,
	} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
}

// TestRefusesUnsafeRemoteConfig checks that vipd refuses to start, saying
// why, rather than serve the API on TCP without mutual TLS, or with a
// policy it cannot read.
func TestRefusesUnsafeRemoteConfig(t *testing.T) {
	p := newPKI(t)
	for _, tc := range []struct {
		name   string
		remote func(r *daemon.Remote)
		want   []string
	}{
		{"TCP without TLS flags", func(r *daemon.Remote) { r.TLSCert, r.TLSKey, r.TLSClientCA = "", "", "" },
			[]string{"needs mutual TLS", "--tls-cert, --tls-key, --tls-client-ca", "--insecure-listen"}},
		{"TCP without a client CA", func(r *daemon.Remote) { r.TLSClientCA = "" }, []string{"needs mutual TLS: set --tls-client-ca"}},
		{"plaintext on a non-loopback address", func(r *daemon.Remote) {
			r.TLSCert, r.TLSKey, r.TLSClientCA, r.InsecureListen, r.Listen = "", "", "", true, "tcp://0.0.0.0:0"
		}, []string{"refusing to serve the API in plaintext on 0.0.0.0:0", "loopback"}},
		{"plaintext on another address", func(r *daemon.Remote) {
			r.TLSCert, r.TLSKey, r.TLSClientCA, r.InsecureListen, r.Listen = "", "", "", true, "tcp://[fd00:198::1]:9650"
		}, []string{"refusing to serve the API in plaintext on [fd00:198::1]:9650"}},
		{"plaintext and TLS flags", func(r *daemon.Remote) { r.InsecureListen = true }, []string{"--insecure-listen serves plaintext"}},
		{"TLS flags without --listen", func(r *daemon.Remote) { r.Listen = "" }, []string{"--listen, which is not set"}},
		{"a bad scheme", func(r *daemon.Remote) { r.Listen = "udp://127.0.0.1:1" }, []string{"want tcp://host:port"}},
		{"no port", func(r *daemon.Remote) { r.Listen = "tcp://127.0.0.1" }, []string{"want tcp://host:port"}},
		{"a key that is not the certificate's", func(r *daemon.Remote) { r.TLSKey = p.clients["a"].Key }, []string{"--tls-cert", "private key does not match"}},
		{"a client CA file without certificates", func(r *daemon.Remote) { r.TLSClientCA = p.server.Key }, []string{"holds no PEM certificate"}},
		{"an authz file with a YAML error", func(r *daemon.Remote) { r.AuthzFile = writeAuthz(t, "a: [x\nb: y\n") }, []string{"refusing to start", "authz file", "line"}},
		{"an authz file listing an identity twice", func(r *daemon.Remote) { r.AuthzFile = writeAuthz(t, "a: [x]\nb: \"*\"\na: [y]\n") }, []string{"line 3", `"a"`}},
		{"an authz file with a bad entry", func(r *daemon.Remote) { r.AuthzFile = writeAuthz(t, "ctrl: all\n") }, []string{`identity "ctrl"`, `"all"`}},
		{"an authz file with a bad owner", func(r *daemon.Remote) { r.AuthzFile = writeAuthz(t, "ctrl: [Team A]\n") }, []string{`identity "ctrl"`, "owners[0]"}},
		{"a missing authz file", func(r *daemon.Remote) { r.AuthzFile = "/nonexistent/authz.yaml" }, []string{"/nonexistent/authz.yaml"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config(t)
			cfg.Remote = p.remote(t, "")
			tc.remote(&cfg.Remote)
			err := daemon.Run(ctxT(t), testLogger(t), cfg)
			if err == nil {
				t.Fatal("vipd started")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if _, serr := os.Stat(cfg.Socket); serr == nil {
				t.Errorf("vipd opened its socket despite: %v", err)
			}
		})
	}
}

// TestInsecureLoopback checks that --insecure-listen serves plaintext on a
// loopback address, IPv4 and IPv6, with a warning, and that with an authz
// file its anonymous clients may read but change nothing.
func TestInsecureLoopback(t *testing.T) {
	for _, host := range []string{"127.0.0.1", "::1"} {
		t.Run(host, func(t *testing.T) {
			cfg := config(t)
			cfg.Remote = daemon.Remote{Listen: "tcp://" + freeAddr(t, "tcp", host), InsecureListen: true, AuthzFile: writeAuthz(t, testPolicy)}
			r := start(t, cfg, healthpb.HealthCheckResponse_SERVING)
			c, err := client.New(cfg.Remote.Listen, client.WithMaxAttempts(1))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.ListServices(ctxT(t), ""); err != nil {
				t.Fatalf("plaintext read: %v", err)
			}
			_, err = c.UpsertService(ctxT(t), svc("web", "default", "198.19.0.1"), 0)
			if status.Code(err) != codes.PermissionDenied {
				t.Fatalf("plaintext upsert with an authz file: %v, want PermissionDenied", err)
			}
			if !strings.Contains(r.log.String(), "serving the API in plaintext on a loopback TCP address") {
				t.Errorf("no plaintext warning in the log:\n%s", r.log)
			}
		})
	}
}

// TestNoLeaksInLogs runs vipd at info level with mutual TLS and an authz
// file, makes calls whose bodies carry marker strings (a label value, a
// backend address), successful, invalid and denied ones, and checks that
// the log holds neither the markers nor any part of a private key.
func TestNoLeaksInLogs(t *testing.T) {
	p := newPKI(t)
	cfg := config(t)
	cfg.Remote = p.remote(t, writeAuthz(t, testPolicy))
	r := start(t, cfg, healthpb.HealthCheckResponse_SERVING)
	a := p.dial(t, cfg.Remote.Listen, "a")

	const label, backend = "leak-marker-7f3a9c", "198.18.213.77"
	marked := func(name, owner, vip string) *vipdv1.Service {
		s := svc(name, owner, vip, backend)
		s.Labels = map[string]string{"marker": label}
		return s
	}
	if _, err := a.UpsertService(ctxT(t), marked("a/web", "team-a", "198.19.0.1"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := a.SyncServices(ctxT(t), "team-a", []*vipdv1.Service{marked("a/web", "", "198.19.0.1"), marked("a/api", "", "198.19.0.2")}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.UpdateBackends(ctxT(t), "a/api", []*vipdv1.Backend{{Ip: "198.18.213.78", Zone: label}}, nil, 0); err != nil {
		t.Fatal(err)
	}
	// Refused calls are logged (at info and warn level), their bodies not.
	bad := marked("a/bad", "team-a", "198.19.0.3")
	bad.Ports[0].Port = 70000
	if _, err := a.UpsertService(ctxT(t), bad, 0); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("invalid upsert: %v", err)
	}
	if _, err := a.UpsertService(ctxT(t), marked("b/web", "team-b", "198.19.0.4"), 0); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("denied upsert: %v", err)
	}
	if _, err := a.UpsertService(ctxT(t), marked("a/clash", "team-a", "198.19.0.1"), 0); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("conflicting upsert: %v", err)
	}
	if _, err := r.local.GetService(ctxT(t), "a/web"); err != nil {
		t.Fatal(err)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}

	log := r.log.String()
	if !strings.Contains(log, "permission denied") || !strings.Contains(log, "InvalidArgument") {
		t.Fatalf("the log does not show the refused calls, so this test sees nothing:\n%s", log)
	}
	forbidden := []string{label, backend, "198.18.213.78", "PRIVATE KEY"}
	for _, f := range []string{p.server.Key, p.clients["a"].Key} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if len(line) >= 16 && !strings.HasPrefix(line, "-----") {
				forbidden = append(forbidden, line)
			}
		}
	}
	for _, f := range forbidden {
		if strings.Contains(log, f) {
			t.Errorf("the log contains %q:\n%s", f, log)
		}
	}
}
