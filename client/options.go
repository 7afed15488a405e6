package client

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

const (
	// DefaultTimeout is the per-call deadline applied when the caller's
	// context has none.
	DefaultTimeout = 10 * time.Second

	// DefaultMaxAttempts is how many times a call is tried, in all, while
	// vipd answers Unavailable.
	DefaultMaxAttempts = 5

	// MaxMessageSize bounds a request or response. It matches the server's
	// default receive limit, which fits a SyncServices of 100,000 services
	// with 10 backends each; gRPC's own 4 MiB default would truncate a large
	// ListServices.
	MaxMessageSize = 64 << 20
)

// Option configures a Client. Options are applied in order by New, which
// reports the first invalid one.
type Option func(*config) error

// config is what the options set. Transport security lives in creds, so that
// a later WithTLS only has to replace it.
type config struct {
	timeout     time.Duration
	maxAttempts int
	creds       credentials.TransportCredentials
	dialOpts    []grpc.DialOption
}

func defaultConfig() config {
	return config{
		timeout:     DefaultTimeout,
		maxAttempts: DefaultMaxAttempts,
		creds:       insecure.NewCredentials(),
	}
}

// WithTimeout sets the deadline of each call whose context has none; the
// deadline covers every retry of the call. Zero disables the default, so that
// calls without a context deadline may wait for ever. The default is
// DefaultTimeout.
func WithTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("timeout %v is negative", d)
		}
		c.timeout = d
		return nil
	}
}

// WithMaxAttempts sets how many times a call is tried, in all, while vipd
// answers Unavailable; 1 disables retries. The default is DefaultMaxAttempts.
func WithMaxAttempts(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("max attempts %d is less than 1", n)
		}
		c.maxAttempts = n
		return nil
	}
}

// WithDialOptions appends gRPC dial options, such as interceptors or a custom
// dialer, after the client's own; they win where they conflict.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(c *config) error {
		c.dialOpts = append(c.dialOpts, opts...)
		return nil
	}
}

// WithTLS secures the connection with TLS as cfg says, for a vipd that
// serves its API on TCP (vipd --listen). vipd requires a client
// certificate (cfg.Certificates) signed by the CA it was given, and its own
// certificate is verified against cfg.RootCAs, for the target's host name
// or IP address unless cfg.ServerName says otherwise. TLSConfigFromFiles
// builds such a cfg. Without WithTLS the connection is plaintext, which is
// right for the Unix socket only. A nil cfg is an error.
func WithTLS(cfg *tls.Config) Option {
	return func(c *config) error {
		if cfg == nil {
			return errors.New("nil TLS config")
		}
		c.creds = credentials.NewTLS(cfg)
		return nil
	}
}

// TLSConfigFromFiles returns the TLS configuration of a client of vipd's TCP
// listener: vipd's certificate is verified against the CA bundle in caFile
// (PEM), and the client presents the certificate and key in certFile and
// keyFile (PEM). It requires TLS 1.2 at least. Errors name the files,
// never their contents.
func TLSConfigFromFiles(caFile, certFile, keyFile string) (*tls.Config, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("read CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA bundle %s holds no PEM certificate", caFile)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("load client certificate %s and key %s: %w", certFile, keyFile, err)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		RootCAs:      pool,
		Certificates: []tls.Certificate{cert},
	}, nil
}
