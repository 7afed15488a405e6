package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"time"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Client talks to one vipd. It is safe for concurrent use. Every mutating
// vipd call returns only after the kernel has applied the change, and a call
// that fails changes nothing; that is why the client may retry any call,
// mutating or not, that vipd answers with Unavailable (for example while it
// restarts).
//
// Errors are gRPC status errors, returned as gRPC returns them: use
// status.Code(err), IsNotFound and FieldViolations on them. (When retries
// run out, gRPC wraps the last status with a "max retries exhausted" note;
// those three still see it.)
type Client struct {
	conn   *grpc.ClientConn
	lb     vipdv1.LoadBalancerServiceClient
	status vipdv1.StatusServiceClient
	flows  vipdv1.FlowServiceClient
	node   vipdv1.NodeServiceClient
	health healthpb.HealthClient
}

// New returns a client for the vipd at target, which is one of
//
//	unix:///run/vipd/vipd.sock   a Unix socket
//	/run/vipd/vipd.sock          an absolute path, also a Unix socket
//	tcp://host:port              TCP (vipd --listen): use WithTLS
//	host:port                    TCP too
//
// A TCP connection is plaintext unless WithTLS is given; vipd accepts
// plaintext TCP only on a loopback address it was told to (--insecure-listen).
// Other gRPC target URIs with "://" (dns:///host:port) are passed through.
// New does not connect: the connection is made by the first call and remade
// after a failure, so New succeeds while vipd is down. The caller must Close
// the client.
func New(target string, opts ...Option) (*Client, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, fmt.Errorf("vipd client: %w", err)
		}
	}
	grpcTarget, err := dialTarget(target)
	if err != nil {
		return nil, fmt.Errorf("vipd client: %w", err)
	}
	sc, err := serviceConfig(cfg.maxAttempts)
	if err != nil {
		return nil, fmt.Errorf("vipd client: %w", err)
	}
	dialOpts := []grpc.DialOption{
		grpc.WithTransportCredentials(cfg.creds),
		// The service config comes from us, never from DNS, so that the
		// retry policy is the one documented here.
		grpc.WithDisableServiceConfig(),
		grpc.WithDefaultServiceConfig(sc),
		grpc.WithMaxCallAttempts(cfg.maxAttempts),
		// vipd is local (or at least near): reconnect quickly once it is
		// back, instead of gRPC's default backoff of up to two minutes.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  100 * time.Millisecond,
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   2 * time.Second,
			},
			MinConnectTimeout: 5 * time.Second,
		}),
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(MaxMessageSize),
			grpc.MaxCallSendMsgSize(MaxMessageSize),
			// A request larger than the replay buffer is not retried.
			grpc.MaxRetryRPCBufferSize(MaxMessageSize),
		),
		grpc.WithChainUnaryInterceptor(defaultTimeout(cfg.timeout)),
	}
	conn, err := grpc.NewClient(grpcTarget, append(dialOpts, cfg.dialOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("vipd client for %s: %w", target, err)
	}
	return &Client{
		conn:   conn,
		lb:     vipdv1.NewLoadBalancerServiceClient(conn),
		status: vipdv1.NewStatusServiceClient(conn),
		flows:  vipdv1.NewFlowServiceClient(conn),
		node:   vipdv1.NewNodeServiceClient(conn),
		health: healthpb.NewHealthClient(conn),
	}, nil
}

// dialTarget turns a vipd target into a gRPC target URI.
func dialTarget(target string) (string, error) {
	switch {
	case target == "":
		return "", fmt.Errorf("empty target")
	case strings.HasPrefix(target, "/"):
		return "unix://" + target, nil
	case strings.HasPrefix(target, "tcp://"):
		hostport := strings.TrimPrefix(target, "tcp://")
		if _, _, err := net.SplitHostPort(hostport); err != nil {
			return "", fmt.Errorf("target %q: want tcp://host:port: %w", target, err)
		}
		return "dns:///" + hostport, nil
	case strings.HasPrefix(target, "unix:"), strings.HasPrefix(target, "unix-abstract:"),
		strings.Contains(target, "://"):
		return target, nil
	}
	if _, _, err := net.SplitHostPort(target); err != nil {
		return "", fmt.Errorf("target %q is neither an absolute socket path, unix:///path, tcp://host:port, nor host:port", target)
	}
	return "dns:///" + target, nil
}

// retryPolicy and methodConfig are the parts of gRPC's service config
// (https://github.com/grpc/grpc/blob/master/doc/service_config.md) we set.
type retryPolicy struct {
	MaxAttempts          int      `json:"maxAttempts"`
	InitialBackoff       string   `json:"initialBackoff"`
	MaxBackoff           string   `json:"maxBackoff"`
	BackoffMultiplier    float64  `json:"backoffMultiplier"`
	RetryableStatusCodes []string `json:"retryableStatusCodes"`
}

type methodConfig struct {
	Name        []map[string]string `json:"name"`
	RetryPolicy *retryPolicy        `json:"retryPolicy,omitempty"`
}

// serviceConfig is the JSON service config that retries every vipd call on
// Unavailable, up to maxAttempts tries in all, with exponential backoff.
// gRPC waits a random time of up to 0.25 s, 0.5 s, 1 s, 2 s, 2 s, ... before
// each retry, so the default five attempts wait up to 3.75 s in all, within
// the default 10 s deadline.
func serviceConfig(maxAttempts int) (string, error) {
	mc := methodConfig{Name: []map[string]string{
		{"service": vipdv1.LoadBalancerService_ServiceDesc.ServiceName},
		{"service": vipdv1.StatusService_ServiceDesc.ServiceName},
		{"service": vipdv1.FlowService_ServiceDesc.ServiceName},
		{"service": vipdv1.NodeService_ServiceDesc.ServiceName},
		{"service": healthpb.Health_ServiceDesc.ServiceName},
	}}
	// gRPC rejects a retry policy with fewer than two attempts.
	if maxAttempts > 1 {
		mc.RetryPolicy = &retryPolicy{
			MaxAttempts:          maxAttempts,
			InitialBackoff:       "0.25s",
			MaxBackoff:           "2s",
			BackoffMultiplier:    2,
			RetryableStatusCodes: []string{"UNAVAILABLE"},
		}
	}
	b, err := json.Marshal(map[string]any{"methodConfig": []methodConfig{mc}})
	if err != nil {
		return "", fmt.Errorf("encode service config: %w", err)
	}
	return string(b), nil
}

// defaultTimeout gives a unary call a deadline of d when its context has
// none. The deadline is set outside gRPC's retries, so it bounds them all.
func defaultTimeout(d time.Duration) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if _, ok := ctx.Deadline(); !ok && d > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, d)
			defer cancel()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// Close closes the connection. Calls in flight fail with Canceled.
func (c *Client) Close() error {
	return c.conn.Close()
}

// Conn is the underlying connection, for services this package does not wrap.
// It carries the client's deadline and retry behaviour.
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// LoadBalancerClient is the generated client of vipd.v1.LoadBalancerService,
// sharing this client's connection, default deadline and retries.
func (c *Client) LoadBalancerClient() vipdv1.LoadBalancerServiceClient { return c.lb }

// StatusClient is the generated client of vipd.v1.StatusService, sharing this
// client's connection, default deadline and retries.
func (c *Client) StatusClient() vipdv1.StatusServiceClient { return c.status }

// FlowClient is the generated client of vipd.v1.FlowService, sharing this
// client's connection, default deadline (for ListFlows) and retries.
func (c *Client) FlowClient() vipdv1.FlowServiceClient { return c.flows }

// NodeClient is the generated client of vipd.v1.NodeService, sharing this
// client's connection, default deadline and retries.
func (c *Client) NodeClient() vipdv1.NodeServiceClient { return c.node }

// InstanceIDHeader is the response header metadata key in which vipd's
// health service (Check, and Watch with its first answer) names the vipd
// that answers: GetStatusResponse.instance_id, which changes with every
// start of vipd. Read it with grpc.Header on Check, or the stream's Header
// on Watch.
const InstanceIDHeader = "vipd-instance-id"

// HealthClient is the generated client of grpc.health.v1.Health, sharing this
// client's connection. Its unary Check gets the default deadline; Watch, a
// stream, does not. Their answers carry InstanceIDHeader.
func (c *Client) HealthClient() healthpb.HealthClient { return c.health }

// UpsertService creates svc or fully replaces the service of that name, and
// returns it as stored, with defaults filled in and its new generation. An
// expectedGeneration of 0 writes unconditionally; otherwise the call fails
// with Aborted unless the stored service has that generation. A VIP:port that
// another service uses fails with AlreadyExists. An empty owner keeps the
// stored service's owner; another owner than the stored one fails with
// FailedPrecondition. To move a service to another owner, to check a write
// without making it (validate_only), or to learn whether it created,
// changed or left the service unchanged, send an UpsertServiceRequest
// through LoadBalancerClient.
func (c *Client) UpsertService(ctx context.Context, svc *vipdv1.Service, expectedGeneration uint64) (*vipdv1.Service, error) {
	resp, err := c.lb.UpsertService(ctx, &vipdv1.UpsertServiceRequest{Service: svc, ExpectedGeneration: expectedGeneration})
	if err != nil {
		return nil, err
	}
	return resp.GetService(), nil
}

// CreateService creates svc, and returns it as stored, with defaults filled
// in and its generation. Unlike UpsertService it never replaces a service:
// when one of that name exists, whoever owns it, it fails with
// AlreadyExists and changes nothing. vipd checks the name in the same
// transaction as the write, so no other call can create it in between. A
// VIP:port that another service uses fails with AlreadyExists too; the
// message tells the two apart, and a GetService of the name does too.
func (c *Client) CreateService(ctx context.Context, svc *vipdv1.Service) (*vipdv1.Service, error) {
	resp, err := c.lb.UpsertService(ctx, &vipdv1.UpsertServiceRequest{Service: svc, CreateOnly: true})
	if err != nil {
		return nil, err
	}
	return resp.GetService(), nil
}

// DeleteService removes the named service; it fails with NotFound if there is
// none, and with Aborted if expectedGeneration is nonzero and differs from
// the stored one.
func (c *Client) DeleteService(ctx context.Context, name string, expectedGeneration uint64) error {
	_, err := c.lb.DeleteService(ctx, &vipdv1.DeleteServiceRequest{Name: name, ExpectedGeneration: expectedGeneration})
	return err
}

// GetService returns the named service; it fails with NotFound if there is none.
func (c *Client) GetService(ctx context.Context, name string) (*vipdv1.Service, error) {
	resp, err := c.lb.GetService(ctx, &vipdv1.GetServiceRequest{Name: name})
	if err != nil {
		return nil, err
	}
	return resp.GetService(), nil
}

// ListServices returns the services of owner, or every service when owner is
// empty, sorted by name.
func (c *Client) ListServices(ctx context.Context, owner string) ([]*vipdv1.Service, error) {
	resp, err := c.lb.ListServices(ctx, &vipdv1.ListServicesRequest{Owner: owner})
	if err != nil {
		return nil, err
	}
	return resp.GetServices(), nil
}

// SyncServices atomically makes owner's services exactly svcs: it creates,
// updates and deletes as needed, never touches other owners' services, and
// reports which names fell in each class. Services with an empty owner get
// owner; a service with another owner is InvalidArgument.
func (c *Client) SyncServices(ctx context.Context, owner string, svcs []*vipdv1.Service) (*vipdv1.SyncServicesResponse, error) {
	return c.lb.SyncServices(ctx, &vipdv1.SyncServicesRequest{Owner: owner, Services: svcs})
}

// SyncChunk is the number of services SyncServicesStream sends per chunk.
const SyncChunk = 1000

// SyncServicesStream is SyncServices over the SyncServicesStream RPC: the
// services go in chunks of SyncChunk, so that no message holds the whole
// list; vipd syncs them all at once, all or nothing, when the stream ends.
// Use it for lists too big for one message (see --max-recv-msg-size).
// Cancelling ctx before it returns changes nothing.
func (c *Client) SyncServicesStream(ctx context.Context, owner string, svcs []*vipdv1.Service) (*vipdv1.SyncServicesResponse, error) {
	stream, err := c.lb.SyncServicesStream(ctx)
	if err != nil {
		return nil, err
	}
	for first := true; first || len(svcs) > 0; first = false {
		n := min(len(svcs), SyncChunk)
		req := &vipdv1.SyncServicesStreamRequest{Services: svcs[:n]}
		if first {
			req.Owner = owner
		}
		if err := stream.Send(req); err != nil {
			// The server ended the call: CloseAndRecv says why.
			break
		}
		svcs = svcs[n:]
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return nil, err
	}
	return &vipdv1.SyncServicesResponse{Created: resp.Created, Updated: resp.Updated, Deleted: resp.Deleted, Unchanged: resp.Unchanged}, nil
}

// UpdateBackends changes part of the named service's backend set: it adds
// the upsert backends or replaces those with the same IP, removes the remove
// IPs (ignoring absent ones), and returns the service as stored.
// expectedGeneration works as in UpsertService. LoadBalancerClient's
// UpdateBackends also says which IPs were absent, and can check a change
// without making it (validate_only).
func (c *Client) UpdateBackends(ctx context.Context, name string, upsert []*vipdv1.Backend, remove []string, expectedGeneration uint64) (*vipdv1.Service, error) {
	resp, err := c.lb.UpdateBackends(ctx, &vipdv1.UpdateBackendsRequest{
		Name:               name,
		Upsert:             upsert,
		Remove:             remove,
		ExpectedGeneration: expectedGeneration,
	})
	if err != nil {
		return nil, err
	}
	return resp.GetService(), nil
}

// Status reports the dataplane, counts, version and the last sync.
func (c *Client) Status(ctx context.Context) (*vipdv1.GetStatusResponse, error) {
	return c.status.GetStatus(ctx, &vipdv1.GetStatusRequest{})
}

// SetNodeTopology makes zone the node's topology zone ("" for none) and
// returns once the dataplane has applied it; it answers the zone it
// replaced. vipd does not keep it across a restart (see
// vipd.v1.NodeService).
func (c *Client) SetNodeTopology(ctx context.Context, zone string) (previous string, err error) {
	resp, err := c.node.SetNodeTopology(ctx, &vipdv1.SetNodeTopologyRequest{Zone: zone})
	if err != nil {
		return "", err
	}
	return resp.GetPreviousZone(), nil
}

// Health reports vipd's overall health (the "" service of grpc.health.v1):
// NOT_SERVING until the restored state has been applied, and again while it
// shuts down.
func (c *Client) Health(ctx context.Context) (healthpb.HealthCheckResponse_ServingStatus, error) {
	resp, err := c.health.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return healthpb.HealthCheckResponse_UNKNOWN, err
	}
	return resp.GetStatus(), nil
}

// WaitServing polls Health until vipd reports SERVING (it has applied its
// restored state) and returns nil then. When ctx ends first it returns an
// error wrapping ctx's, with the last answer or failure of the health check.
// Each check has at most half a second; checks are 10 ms apart.
func (c *Client) WaitServing(ctx context.Context) error {
	var last error
	for {
		callCtx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		st, err := c.Health(callCtx)
		cancel()
		if err == nil && st == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		last = err
		if err == nil {
			last = fmt.Errorf("health %v", st)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("vipd not serving: %w (last health check: %v)", ctx.Err(), last)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Explain says what would happen to a new connection from a client to a
// VIP:port: the service and port that claim it, every backend with its
// eligibility and probability, the client's session-affinity entry and the
// backend the connection would get, where the dataplane can tell. It fails
// with NotFound when no service claims the VIP:port/protocol.
func (c *Client) Explain(ctx context.Context, req *vipdv1.ExplainRequest) (*vipdv1.ExplainResponse, error) {
	return c.status.Explain(ctx, req)
}

// ListFlows returns the flows through VIPs that are live now and match
// filter (nil: all), oldest first, as FLOW_EVENT_TYPE_EXISTING events with
// their counters so far; at most limit of them (0: vipd's maximum). The
// response says whether more matched. A dataplane that cannot report flows
// answers Unimplemented.
func (c *Client) ListFlows(ctx context.Context, filter *vipdv1.FlowFilter, limit uint32) (*vipdv1.ListFlowsResponse, error) {
	return c.flows.ListFlows(ctx, &vipdv1.ListFlowsRequest{Filter: filter, Limit: limit})
}

// FlowStream is an open WatchFlows stream. Recv returns the next flow event
// or LostEvents report; it returns io.EOF when vipd ends the stream
// normally, and a status error otherwise (Unavailable when vipd shuts down
// or lost its flow source: watch again, and expect to have missed events).
type FlowStream = vipdv1.FlowService_WatchFlowsClient

// WatchFlows opens a stream of flow events; cancel ctx to end it. It returns
// once vipd has subscribed the stream, so every event of traffic that starts
// after it returns reaches the stream (or is reported lost). Unlike the
// unary calls it has no default deadline: it lasts as long as ctx. It is
// retried while vipd answers Unavailable before the first event only.
//
// vipd buffers a bounded number of events for each stream. A stream that
// is read too slowly misses events, and gets a LostEvents with their exact
// count, of source LOST_EVENTS_SOURCE_SUBSCRIBER, where they were lost;
// events the kernel dropped come as LostEvents of source
// LOST_EVENTS_SOURCE_KERNEL.
func (c *Client) WatchFlows(ctx context.Context, req *vipdv1.WatchFlowsRequest) (FlowStream, error) {
	s, err := c.flows.WatchFlows(ctx, req)
	if err != nil {
		return nil, err
	}
	// vipd sends headers once the subscription is in place: waiting for
	// them means no event of traffic started after WatchFlows returns is
	// missed. (A stream that fails instead yields its error on Recv.)
	if _, err := s.Header(); err != nil {
		return nil, err
	}
	return s, nil
}
