package client

import (
	"fmt"
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
