package health

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"syscall"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// spec is what one backend's check does; targets with equal specs keep
// their state across a change of the service.
type spec struct {
	protocol    vipdv1.HealthCheckProtocol
	addr        netip.AddrPort
	path        string
	grpcService string
	interval    int64 // ms
	timeout     int64 // ms
	healthy     uint32
	unhealthy   uint32
}

// dialer opens TCP connections, from a network namespace when ns is set.
type dialer struct{ ns *nsSockets }

func (d dialer) dial(ctx context.Context, addr string) (net.Conn, error) {
	if d.ns == nil {
		var nd net.Dialer
		return nd.DialContext(ctx, "tcp", addr)
	}
	return d.ns.dialTCP(ctx, addr)
}

// checker runs the HTTP or gRPC checks of one target, one at a time.
type checker struct {
	spec spec
	d    dialer
	http *http.Client
	grpc *grpc.ClientConn
}

func newChecker(s spec, d dialer) *checker {
	c := &checker{spec: s, d: d}
	if s.protocol == vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_HTTP {
		c.http = &http.Client{
			Transport: &http.Transport{
				DialContext:       func(ctx context.Context, _, addr string) (net.Conn, error) { return d.dial(ctx, addr) },
				DisableKeepAlives: true,
			},
			// 3xx passes: the redirect is the answer.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	return c
}

// check runs one check; nil means it passed.
func (c *checker) check(ctx context.Context) error {
	addr := c.spec.addr.String()
	switch c.spec.protocol {
	case vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_HTTP:
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+c.spec.path, nil)
		if err != nil {
			return err
		}
		req.Header.Set("User-Agent", "vipd-health-check")
		resp, err := c.http.Do(req)
		if err != nil {
			return describe(err)
		}
		resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode > 399 {
			return fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		return nil
	case vipdv1.HealthCheckProtocol_HEALTH_CHECK_PROTOCOL_GRPC:
		if c.grpc == nil {
			conn, err := grpc.NewClient("passthrough:///"+addr,
				grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithContextDialer(c.d.dial))
			if err != nil {
				return err
			}
			c.grpc = conn
		}
		resp, err := healthpb.NewHealthClient(c.grpc).Check(ctx, &healthpb.HealthCheckRequest{Service: c.spec.grpcService})
		if err != nil {
			// A fresh connection next time: one in reconnect backoff
			// would fail checks after the server is back.
			c.grpc.Close()
			c.grpc = nil
			return describe(err)
		}
		if resp.Status != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("gRPC health %s", resp.Status)
		}
		return nil
	default:
		// TCP checks run on tcpChecker.
		return fmt.Errorf("no checker for %v", c.spec.protocol)
	}
}

func (c *checker) close() {
	if c.grpc != nil {
		c.grpc.Close()
	}
}

// describe shortens the common errors to what explain shows:
// "connection refused", "timeout".
func describe(err error) error {
	if err == nil {
		return nil
	}
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return errors.New("connection refused")
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ETIMEDOUT):
		return errors.New("timeout")
	case errors.Is(err, syscall.EHOSTUNREACH):
		return errors.New("host unreachable")
	case strings.Contains(err.Error(), "connection refused"):
		return errors.New("connection refused")
	case strings.Contains(err.Error(), "context deadline exceeded"):
		return errors.New("timeout")
	}
	return err
}
