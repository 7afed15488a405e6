package daemon

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/server/authz"
)

// remoteFiles is what the TCP listener's files held when they were read:
// the TLS configuration for new handshakes and the authorization policy.
type remoteFiles struct {
	tls      *tls.Config // nil for a plaintext listener
	leaf     *x509.Certificate
	caCerts  int
	caPEM    []byte
	policy   *authz.Policy // nil without an authz file
	authzRaw []byte
}

// reloader holds the TCP listener's current files and reads them again on
// Reload. New TLS handshakes and new calls use what it holds at the time;
// connections already open keep the material they were made with.
type reloader struct {
	log hclog.Logger
	r   Remote
	tls bool // false: --insecure-listen
	mu  sync.Mutex
	cur atomic.Pointer[remoteFiles]
}

// newReloader reads r's files for the first time. Errors name the flags.
func newReloader(log hclog.Logger, r Remote, withTLS bool) (*reloader, error) {
	rl := &reloader{log: log, r: r, tls: withTLS}
	f, err := rl.read()
	if err != nil {
		return nil, err
	}
	rl.cur.Store(f)
	return rl, nil
}

// read reads every file, or returns the first error, naming the file.
func (rl *reloader) read() (*remoteFiles, error) {
	f := &remoteFiles{}
	if rl.tls {
		cert, err := tls.LoadX509KeyPair(rl.r.TLSCert, rl.r.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("load --tls-cert %s and --tls-key %s: %w", rl.r.TLSCert, rl.r.TLSKey, err)
		}
		pool, n, pemData, err := loadClientCAs(rl.r.TLSClientCA)
		if err != nil {
			return nil, err
		}
		f.leaf, f.caCerts, f.caPEM = cert.Leaf, n, pemData
		f.tls = &tls.Config{
			MinVersion:   tls.VersionTLS12,
			Certificates: []tls.Certificate{cert},
			ClientAuth:   tls.RequireAndVerifyClientCert,
			ClientCAs:    pool,
		}
	}
	if rl.r.AuthzFile != "" {
		raw, err := os.ReadFile(rl.r.AuthzFile)
		if err != nil {
			return nil, fmt.Errorf("read --authz-file: %w", err)
		}
		if f.policy, err = authz.Parse(raw); err != nil {
			return nil, fmt.Errorf("authz file %s: %w", rl.r.AuthzFile, err)
		}
		f.authzRaw = raw
	}
	return f, nil
}

// loadClientCAs reads the PEM bundle at path into a pool and counts its
// certificates.
func loadClientCAs(path string) (*x509.CertPool, int, []byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("read --tls-client-ca: %w", err)
	}
	pool, n := x509.NewCertPool(), 0
	for rest := data; ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, 0, nil, fmt.Errorf("--tls-client-ca %s: certificate %d: %w", path, n+1, err)
		}
		pool.AddCert(cert)
		n++
	}
	if n == 0 {
		return nil, 0, nil, fmt.Errorf("--tls-client-ca %s holds no PEM certificate", path)
	}
	return pool, n, data, nil
}

// serverTLS is the listener's tls.Config: each handshake takes the
// configuration current at its start.
func (rl *reloader) serverTLS() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return rl.cur.Load().tls, nil
		},
	}
}

// policy is the current authorization policy.
func (rl *reloader) policy() *authz.Policy { return rl.cur.Load().policy }

// Reload reads every file again. If all of them load, they replace the old
// ones at once and the log says what changed; if any fails, the old ones
// stay, and the log says why.
func (rl *reloader) Reload() {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	next, err := rl.read()
	if err != nil {
		rl.log.Error("reload failed; keeping the TLS and authz files loaded before", "error", err)
		return
	}
	old := rl.cur.Swap(next)
	if c := changes(old, next); len(c) > 0 {
		rl.log.Info("reloaded: " + strings.Join(c, ", "))
		return
	}
	rl.log.Info("nothing to reload: the plaintext listener has no TLS files, and there is no --authz-file")
}

// changes describes, for the log, what differs between old and next.
func changes(old, next *remoteFiles) []string {
	var out []string
	if next.tls != nil {
		if bytes.Equal(old.leaf.Raw, next.leaf.Raw) {
			out = append(out, "tls certificate (unchanged)")
		} else {
			out = append(out, fmt.Sprintf("tls certificate (new serial %s, expires %s; was serial %s)",
				next.leaf.SerialNumber.Text(16), next.leaf.NotAfter.UTC().Format(time.RFC3339), old.leaf.SerialNumber.Text(16)))
		}
		if bytes.Equal(old.caPEM, next.caPEM) {
			out = append(out, "client CA (unchanged)")
		} else {
			out = append(out, fmt.Sprintf("client CA (%d certificates, was %d)", next.caCerts, old.caCerts))
		}
	}
	if next.authzRaw != nil {
		if bytes.Equal(old.authzRaw, next.authzRaw) {
			out = append(out, "authz (unchanged)")
		} else {
			out = append(out, fmt.Sprintf("authz (%d identities, was %d)", next.policy.Len(), old.policy.Len()))
		}
	}
	return out
}

// watchReload calls rl.Reload and rescan for each signal on reload until
// ctx ends; it only logs that there is nothing to reload when both are nil
// (no --listen, no --services-dir). It returns a function that stops it
// and waits.
func watchReload(ctx context.Context, log hclog.Logger, reload <-chan os.Signal, rl *reloader, rescan func()) (stop func()) {
	if reload == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case sig := <-reload:
				if rescan != nil {
					rescan()
				}
				if rl == nil {
					if rescan == nil {
						log.Info("nothing to reload: vipd reloads its TLS and authz files on "+sig.String()+", and has none without --listen", "signal", sig.String())
					}
					continue
				}
				log.Info("reloading the TLS and authz files", "signal", sig.String())
				rl.Reload()
			}
		}
	}()
	return func() { cancel(); <-done }
}
