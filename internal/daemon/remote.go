package daemon

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/user"
	"strconv"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/server"
	"github.com/vipd/vipd/server/authz"
)

// Remote configures vipd's API for remote control planes: a TCP listener,
// mutual TLS and authorization.
type Remote struct {
	// Listen is "tcp://host:port" (or "host:port"), IPv4 or IPv6; empty
	// serves the Unix socket only. The listener is in vipd's own network
	// namespace, not --netns.
	Listen string
	// TLSCert and TLSKey are the server's certificate and key (PEM), and
	// TLSClientCA the CA bundle (PEM) that client certificates must chain
	// to. Listen requires all three unless InsecureListen is set.
	TLSCert, TLSKey, TLSClientCA string
	// InsecureListen serves Listen in plaintext. It is refused unless
	// Listen's host is a loopback address.
	InsecureListen bool
	// AuthzFile is the YAML policy of which identity may change which
	// owners' services (see package authz). Empty lets every client with a
	// valid certificate change everything, with a warning.
	AuthzFile string
}

// Limits are the API's concurrency limits; zero means no limit.
type Limits struct {
	// MaxConcurrentStreams bounds the calls open on one client connection.
	MaxConcurrentStreams uint32
	// MaxInflightRequests bounds the unary calls in progress over all
	// clients (health checks and GetStatus are not counted).
	MaxInflightRequests int
	// MaxFlowWatchers bounds the WatchFlows streams open at once.
	MaxFlowWatchers int
}

var errNoListen = errors.New("--tls-cert, --tls-key, --tls-client-ca and --insecure-listen configure --listen, which is not set")

// serverOptions checks r and returns the gRPC shell options it asks for,
// and the reloader of its files (nil without Listen). It refuses an
// incomplete or unsafe configuration before anything has been opened, with
// a message naming the flags.
func (r Remote) serverOptions(log hclog.Logger) ([]server.Option, *reloader, error) {
	if r.Listen == "" {
		if r.TLSCert != "" || r.TLSKey != "" || r.TLSClientCA != "" || r.InsecureListen {
			return nil, nil, errNoListen
		}
		if r.AuthzFile != "" {
			log.Warn("--authz-file has no effect without --listen: Unix-socket clients are trusted")
		}
		return nil, nil, nil
	}
	addr, err := ParseListen(r.Listen)
	if err != nil {
		return nil, nil, err
	}
	anyTLS := r.TLSCert != "" || r.TLSKey != "" || r.TLSClientCA != ""
	switch {
	case r.InsecureListen && anyTLS:
		return nil, nil, errors.New("--insecure-listen serves plaintext: drop it, or drop --tls-cert, --tls-key and --tls-client-ca")
	case r.InsecureListen:
		if !isLoopback(addr) {
			return nil, nil, fmt.Errorf("refusing to serve the API in plaintext on %s: --insecure-listen is only for a loopback address (127.0.0.1, [::1], localhost); "+
				"for any other address use mutual TLS (--tls-cert, --tls-key, --tls-client-ca)", addr)
		}
		rl, err := newReloader(log.Named("reload"), r, false)
		if err != nil {
			return nil, nil, fmt.Errorf("refusing to start: %w", err)
		}
		log.Warn("serving the API in plaintext on a loopback TCP address: any local user may connect; use mutual TLS for anything but tests",
			"addr", addr, "authz", authzSummary(r.AuthzFile, rl.policy()))
		return []server.Option{server.WithAuthorizationFrom(rl.policy), server.WithTCP(addr, nil)}, rl, nil
	}
	var missing []string
	for _, f := range []struct{ flag, value string }{{"--tls-cert", r.TLSCert}, {"--tls-key", r.TLSKey}, {"--tls-client-ca", r.TLSClientCA}} {
		if f.value == "" {
			missing = append(missing, f.flag)
		}
	}
	if len(missing) > 0 {
		return nil, nil, fmt.Errorf("--listen %s needs mutual TLS: set %s (or, on a loopback address only, --insecure-listen)", r.Listen, strings.Join(missing, ", "))
	}
	rl, err := newReloader(log.Named("reload"), r, true)
	if err != nil {
		return nil, nil, fmt.Errorf("refusing to start: %w", err)
	}
	if policy := rl.policy(); policy == nil {
		log.Warn("no --authz-file: every client with a certificate from --tls-client-ca may change every owner's services", "addr", addr, "client_ca", r.TLSClientCA)
	} else {
		log.Info("remote clients are authorized by owner", "authz_file", r.AuthzFile, "identities", policy.Len())
	}
	return []server.Option{server.WithAuthorizationFrom(rl.policy), server.WithTCP(addr, rl.serverTLS())}, rl, nil
}

func authzSummary(file string, p *authz.Policy) string {
	if p == nil {
		return "none: clients may change every owner's services"
	}
	return file + ": clients without a certificate have no identity, so they may change nothing"
}

// ParseListen turns a --listen value, "tcp://host:port" or "host:port", into
// a TCP address to listen on.
func ParseListen(s string) (string, error) {
	addr := s
	if scheme, rest, ok := strings.Cut(s, "://"); ok {
		if scheme != "tcp" {
			return "", fmt.Errorf("--listen %s: want tcp://host:port", s)
		}
		addr = rest
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("--listen %s: want tcp://host:port (an IPv6 host in brackets): %w", s, err)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || (n == 0 && port != "0") {
		return "", fmt.Errorf("--listen %s: port %q is not a port number", s, port)
	}
	return net.JoinHostPort(host, port), nil
}

// isLoopback reports whether addr's host is a loopback IP address or
// "localhost".
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// LookupGroup resolves a --socket-group value, a group name or a numeric
// GID, to a GID.
func LookupGroup(s string) (int, error) {
	if n, err := strconv.ParseUint(s, 10, 31); err == nil {
		return int(n), nil
	}
	g, err := user.LookupGroup(s)
	if err != nil {
		return 0, fmt.Errorf("--socket-group %s: %w", s, err)
	}
	gid, err := strconv.Atoi(g.Gid)
	if err != nil {
		return 0, fmt.Errorf("--socket-group %s: gid %q: %w", s, g.Gid, err)
	}
	return gid, nil
}

func (l Limits) serverOptions() []server.Option {
	return []server.Option{
		server.WithMaxConcurrentStreams(l.MaxConcurrentStreams),
		server.WithMaxInflightRequests(l.MaxInflightRequests),
		server.WithMaxFlowWatchers(l.MaxFlowWatchers),
	}
}
