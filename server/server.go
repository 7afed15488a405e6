package server

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/hashicorp/go-hclog"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/authz"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
)

// DefaultMaxRecvMsgSize bounds a request's size. It is large enough for a
// SyncServices of 100,000 services with 10 backends each.
const DefaultMaxRecvMsgSize = 64 << 20

// Default concurrency limits; see WithMaxConcurrentStreams,
// WithMaxInflightRequests and WithMaxFlowWatchers.
const (
	DefaultMaxConcurrentStreams = 128
	DefaultMaxInflightRequests  = 1024
	DefaultMaxFlowWatchers      = 256
)

// maxUnixPathLen is the room in sockaddr_un.sun_path, less the trailing NUL.
const maxUnixPathLen = 107

// handshakeTimeout bounds a new connection's TLS handshake, so that clients
// that connect and say nothing do not hold resources for long.
const handshakeTimeout = 10 * time.Second

// Server is the daemon's gRPC shell. It serves the API on its listeners
// together with grpc.health.v1 and reflection. Health reports NOT_SERVING
// until MarkReady is called; its answers carry the API's instance ID in
// the InstanceIDHeader response header.
//
// Clients of the Unix socket (and of WithListener listeners) are trusted:
// the socket's file mode and group decide who may connect. Clients of a
// WithTCP listener are remote: with TLS they must present a certificate the
// listener's tls.Config verifies, and each of their calls carries an
// authz.Principal for their certificate's identity, which the API asks
// before it changes an owner's services.
type Server struct {
	log       hclog.Logger
	grpc      *grpc.Server
	health    *health.Server
	listeners []net.Listener
	maxRecv   int
	unary     []grpc.UnaryServerInterceptor
	stream    []grpc.StreamServerInterceptor

	policy          func() *authz.Policy // nil: no policy
	maxStreams      uint32
	inflight        *limiter
	watchers        *limiter
	maxInflight     int
	maxFlowWatchers int
	tls             credentials.TransportCredentials

	// mu orders Serve and Shutdown: a Shutdown that comes first makes a
	// later Serve return at once, and one that comes later sees serving.
	mu       sync.Mutex
	serving  bool
	shutdown bool
}

// Option configures a Server.
type Option func(*Server) error

// WithUnixSocket listens on a Unix socket at path with the given file mode.
// It checks the path's length, creates the parent directory, and removes a
// stale socket file, but refuses to replace a socket that a live process
// still answers on.
func WithUnixSocket(path string, mode os.FileMode) Option {
	return func(s *Server) error {
		l, err := listenUnix(path, mode)
		if err != nil {
			return err
		}
		s.listeners = append(s.listeners, l)
		return nil
	}
}

// WithUnixSocketGroup is WithUnixSocket that also gives the socket to group
// gid (chown), so that the group's members may connect when mode allows the
// group. The group is set before the mode, so the socket is never open to
// the wrong group.
func WithUnixSocketGroup(path string, mode os.FileMode, gid int) Option {
	return func(s *Server) error {
		l, err := listenUnixGroup(path, mode, gid)
		if err != nil {
			return err
		}
		s.listeners = append(s.listeners, l)
		return nil
	}
}

// WithTCP listens on addr (host:port, IPv4 or IPv6) in the current network
// namespace. With tlsConfig, every connection must complete a TLS handshake
// with it; make it require and verify client certificates
// (tls.RequireAndVerifyClientCert) for mutual TLS, and each call then
// carries the client certificate's identity (authz.Identity). A nil
// tlsConfig serves plaintext: callers must keep that to loopback
// addresses. Its clients are anonymous: they carry a Principal with an
// empty identity.
func WithTCP(addr string, tlsConfig *tls.Config) Option {
	return func(s *Server) error {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listen on %s: %w", addr, err)
		}
		mode := modeInsecure
		if tlsConfig != nil {
			mode = modeTLS
			s.tls = credentials.NewTLS(tlsConfig)
		}
		s.listeners = append(s.listeners, &remoteListener{Listener: l, mode: mode})
		return nil
	}
}

// WithAuthorization makes policy decide which owners' services each TCP
// client may change. Without it, every TCP client that got through the
// handshake may change every owner's services.
func WithAuthorization(policy *authz.Policy) Option {
	return WithAuthorizationFrom(func() *authz.Policy { return policy })
}

// WithAuthorizationFrom is WithAuthorization with a policy that may
// change: current is asked at the start of every call, so a new policy
// (after a reload) applies from the next call on. It must be safe for
// concurrent use; a nil result lets every client change every owner's
// services.
func WithAuthorizationFrom(current func() *authz.Policy) Option {
	return func(s *Server) error {
		s.policy = current
		return nil
	}
}

// WithMaxConcurrentStreams bounds the calls (streams) one client connection
// may have open at once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS); a client
// waits for one of its calls to end before it starts another. Zero means no
// limit. The default is DefaultMaxConcurrentStreams.
func WithMaxConcurrentStreams(n uint32) Option {
	return func(s *Server) error {
		s.maxStreams = n
		if n == 0 {
			s.maxStreams = math.MaxUint32
		}
		return nil
	}
}

// WithMaxInflightRequests bounds the unary calls in progress at once, over
// all clients. A call beyond it fails at once with ResourceExhausted; it is
// never queued. Health checks and GetStatus are not counted and never
// refused, so that monitoring sees an overloaded vipd. Zero means no
// limit; a negative n is an error. The default is
// DefaultMaxInflightRequests.
func WithMaxInflightRequests(n int) Option {
	return func(s *Server) error {
		if n < 0 {
			return errors.New("max in-flight requests must not be negative (0: no limit)")
		}
		s.maxInflight = cmp.Or(n, math.MaxInt)
		return nil
	}
}

// WithMaxFlowWatchers bounds the WatchFlows streams open at once, over all
// clients; one more fails at once with ResourceExhausted. Zero means no
// limit; a negative n is an error. The default is DefaultMaxFlowWatchers.
func WithMaxFlowWatchers(n int) Option {
	return func(s *Server) error {
		if n < 0 {
			return errors.New("max flow watchers must not be negative (0: no limit)")
		}
		s.maxFlowWatchers = cmp.Or(n, math.MaxInt)
		return nil
	}
}

// WithListener serves on an existing listener, such as a bufconn in tests.
// Its clients are trusted, as the Unix socket's are.
func WithListener(l net.Listener) Option {
	return func(s *Server) error {
		s.listeners = append(s.listeners, l)
		return nil
	}
}

// WithMaxRecvMsgSize bounds the size of a request in bytes; larger ones
// get ResourceExhausted. Zero means no limit (gRPC's largest, 2 GiB); a
// negative n is an error. The default is DefaultMaxRecvMsgSize.
func WithMaxRecvMsgSize(n int) Option {
	return func(s *Server) error {
		if n < 0 {
			return errors.New("max receive message size must not be negative (0: no limit)")
		}
		s.maxRecv = cmp.Or(n, math.MaxInt32)
		return nil
	}
}

// WithInterceptors adds interceptors, such as internal/metrics' gRPC
// metrics. They run outermost, in the order given, before logging and
// recovery, so they see every call's final status code, including that of
// a recovered panic. The option may be given more than once.
func WithInterceptors(unary []grpc.UnaryServerInterceptor, stream []grpc.StreamServerInterceptor) Option {
	return func(s *Server) error {
		s.unary = append(s.unary, unary...)
		s.stream = append(s.stream, stream...)
		return nil
	}
}

// New builds a server for api. On error every listener it opened is closed.
func New(log hclog.Logger, api *API, opts ...Option) (*Server, error) {
	s := &Server{
		log:             log,
		maxRecv:         DefaultMaxRecvMsgSize,
		maxStreams:      DefaultMaxConcurrentStreams,
		maxInflight:     DefaultMaxInflightRequests,
		maxFlowWatchers: DefaultMaxFlowWatchers,
	}
	for _, o := range opts {
		if err := o(s); err != nil {
			s.closeListeners()
			return nil, err
		}
	}
	if len(s.listeners) == 0 {
		return nil, errors.New("server has no listener")
	}
	grpcLog := log.Named("grpc")
	recoveryOpt := recovery.WithRecoveryHandler(func(p any) error {
		grpcLog.Error("panic in handler", "panic", p, "stack", string(debug.Stack()))
		return status.Errorf(codes.Internal, "internal error: %v", p)
	})
	calls := &callLogger{log: grpcLog, ownerOf: api.ownerOf}
	s.inflight = newLimiter(grpcLog, "in-flight requests (--max-inflight-requests)", s.maxInflight)
	s.watchers = newLimiter(grpcLog, "flow watchers (--max-flow-watchers)", s.maxFlowWatchers)
	// Order matters: the limits come right after the caller's interceptors
	// (metrics), so that refused calls are counted but cost nothing more
	// and are not logged one by one; the principal is attached before the
	// handlers and the logging that names it. The instance header goes on
	// before anything may answer, so every health answer carries it.
	instUnary, instStream := instanceHeader(api.InstanceID())
	unary := append(slices.Clip(s.unary),
		instUnary,
		s.limitInflight,
		s.authenticateUnary,
		calls.unary,
		recovery.UnaryServerInterceptor(recoveryOpt),
	)
	stream := append(slices.Clip(s.stream),
		instStream,
		s.limitWatchers,
		s.authenticateStream,
		calls.stream,
		recovery.StreamServerInterceptor(recoveryOpt),
	)
	s.grpc = grpc.NewServer(
		grpc.Creds(&listenerCreds{tls: s.tls, failures: newLimiter(grpcLog, "", 0)}),
		grpc.ConnectionTimeout(handshakeTimeout),
		grpc.MaxConcurrentStreams(s.maxStreams),
		grpc.MaxRecvMsgSize(s.maxRecv),
		// SyncServicesStream receives its chunks encoded: see syncChunk.
		grpc.ForceServerCodecV2(codec()),
		grpc.ChainUnaryInterceptor(unary...),
		grpc.ChainStreamInterceptor(stream...),
	)
	api.Register(s.grpc)
	s.health = health.NewServer()
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	return s, nil
}

// Serve serves every listener until Shutdown. It returns the first serve
// error, and nil at once after a Shutdown.
func (s *Server) Serve() error {
	s.mu.Lock()
	if s.shutdown {
		s.mu.Unlock()
		return nil
	}
	s.serving = true
	s.mu.Unlock()
	errc := make(chan error, len(s.listeners))
	for _, l := range s.listeners {
		s.log.Info("serving gRPC", "addr", l.Addr().String())
		go func() { errc <- s.grpc.Serve(l) }()
	}
	for range s.listeners {
		if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("serve: %w", err)
		}
	}
	return nil
}

// GetServiceInfo returns the services registered on the gRPC server, so
// that metrics can be initialized for every method before its first call
// (it makes Server a reflection.ServiceInfoProvider).
func (s *Server) GetServiceInfo() map[string]grpc.ServiceInfo {
	return s.grpc.GetServiceInfo()
}

// MarkReady turns health to SERVING; call it after the first successful apply.
func (s *Server) MarkReady() {
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
}

// Shutdown turns health to NOT_SERVING, lets calls in flight finish for up
// to timeout (none when it is 0), and then stops the server. It does not
// touch the dataplane. On a server that never served (a start that failed
// after New) it only closes the listeners, which removes the Unix socket
// file.
func (s *Server) Shutdown(timeout time.Duration) {
	s.health.Shutdown()
	s.mu.Lock()
	s.shutdown = true
	serving := s.serving
	s.mu.Unlock()
	if !serving {
		s.closeListeners()
		s.grpc.Stop()
		return
	}
	if timeout == 0 {
		s.grpc.Stop()
		return
	}
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(timeout):
		s.log.Warn("graceful stop timed out; stopping", "timeout", timeout)
		s.grpc.Stop()
	}
}

func (s *Server) closeListeners() {
	for _, l := range s.listeners {
		l.Close()
	}
}

func listenUnix(path string, mode os.FileMode) (net.Listener, error) {
	return listenUnixGroup(path, mode, -1)
}

// listenUnixGroup listens on a Unix socket at path, owned by group gid
// (-1 leaves it) and with mode.
func listenUnixGroup(path string, mode os.FileMode, gid int) (net.Listener, error) {
	if len(path) > maxUnixPathLen {
		return nil, fmt.Errorf("socket path %s is %d bytes; at most %d fit", path, len(path), maxUnixPathLen)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create socket dir: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("socket path %s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("socket %s is in use by another process", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	if gid >= 0 {
		if err := os.Lchown(path, -1, gid); err != nil {
			l.Close()
			return nil, fmt.Errorf("give socket %s to group %d: %w", path, gid, err)
		}
	}
	if err := os.Chmod(path, mode); err != nil {
		l.Close()
		return nil, fmt.Errorf("chmod socket: %w", err)
	}
	return l, nil
}

// connMode is how a remote listener's connections are secured.
type connMode int

const (
	modeTLS connMode = iota
	modeInsecure
)

// remoteListener marks the connections of a WithTCP listener, so that
// listenerCreds treats them as remote. One grpc.Server serves every
// listener, and gRPC's transport credentials are per server, not per
// listener.
type remoteListener struct {
	net.Listener
	mode connMode
}

func (l *remoteListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &remoteConn{Conn: c, mode: l.mode}, nil
}

type remoteConn struct {
	net.Conn
	mode connMode
}

// localAuthInfo is the AuthInfo of a trusted local connection (the Unix
// socket, or a WithListener listener). cred is the Unix socket client's
// process (SO_PEERCRED), nil for other listeners.
type localAuthInfo struct {
	credentials.CommonAuthInfo
	cred *unix.Ucred
}

func (localAuthInfo) AuthType() string { return "local" }

// insecureAuthInfo is the AuthInfo of a plaintext TCP connection
// (--insecure-listen on loopback): its client has no identity.
type insecureAuthInfo struct{ credentials.CommonAuthInfo }

func (insecureAuthInfo) AuthType() string { return "insecure" }

// listenerCreds secures each connection as its listener says: TLS for a
// WithTCP listener with a tls.Config, nothing for a plaintext TCP listener
// and for local listeners, each with an AuthInfo that tells them apart.
//
// Failed TLS handshakes (no certificate, an unknown CA, an expired
// certificate) are logged at warn level, at most one line per
// limiterLogEvery with the count since the last one, so that a client
// whose certificate is wrong shows up in the log without flooding it.
type listenerCreds struct {
	tls      credentials.TransportCredentials // nil without a TLS listener
	failures *limiter                         // only its log throttle is used
}

func (c *listenerCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	rc, ok := raw.(*remoteConn)
	if !ok {
		return raw, localAuthInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}, cred: peerCred(raw)}, nil
	}
	if rc.mode == modeTLS {
		conn, info, err := c.tls.ServerHandshake(rc.Conn)
		if err != nil && c.failures != nil {
			c.failures.logRefusal("TLS handshake failed; connection refused", "peer", rc.RemoteAddr().String(), "error", err)
		}
		return conn, info, err
	}
	return rc.Conn, insecureAuthInfo{credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, nil
}

func (c *listenerCreds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("vipd's server credentials cannot dial")
}

func (c *listenerCreds) Info() credentials.ProtocolInfo {
	if c.tls != nil {
		return c.tls.Info()
	}
	return credentials.ProtocolInfo{SecurityProtocol: "insecure"}
}

func (c *listenerCreds) Clone() credentials.TransportCredentials {
	out := &listenerCreds{failures: c.failures}
	if c.tls != nil {
		out.tls = c.tls.Clone()
	}
	return out
}

func (c *listenerCreds) OverrideServerName(string) error { return nil }

// principal returns the authz.Principal of a call's client: nil for a
// trusted local client, the certificate's identity for a TLS client, and an
// empty identity for a plaintext TCP client.
func (s *Server) principal(ctx context.Context) *authz.Principal {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	var policy *authz.Policy
	if s.policy != nil {
		policy = s.policy()
	}
	switch info := p.AuthInfo.(type) {
	case credentials.TLSInfo:
		id := ""
		if chains := info.State.VerifiedChains; len(chains) > 0 && len(chains[0]) > 0 {
			id = authz.Identity(chains[0][0])
		}
		return authz.NewPrincipal(id, policy)
	case insecureAuthInfo:
		return authz.NewPrincipal("", policy)
	}
	return nil
}

func (s *Server) authenticateUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if p := s.principal(ctx); p != nil {
		ctx = authz.NewContext(ctx, p)
	}
	return handler(ctx, req)
}

func (s *Server) authenticateStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if p := s.principal(ss.Context()); p != nil {
		ss = &contextStream{ServerStream: ss, ctx: authz.NewContext(ss.Context(), p)}
	}
	return handler(srv, ss)
}

type contextStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (c *contextStream) Context() context.Context { return c.ctx }

// Methods the in-flight limit never refuses: they are cheap, and they are
// how an operator sees that vipd is overloaded.
var unlimitedMethods = map[string]bool{
	healthpb.Health_Check_FullMethodName: true,
	"/vipd.v1.StatusService/GetStatus":   true,
}

func (s *Server) limitInflight(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if unlimitedMethods[info.FullMethod] {
		return handler(ctx, req)
	}
	if !s.inflight.acquire() {
		return nil, status.Errorf(codes.ResourceExhausted, "vipd has %d requests in progress, its limit (--max-inflight-requests); retry later", s.inflight.max)
	}
	defer s.inflight.release()
	return handler(ctx, req)
}

func (s *Server) limitWatchers(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if info.FullMethod == vipdv1.LoadBalancerService_SyncServicesStream_FullMethodName {
		// A change like the unary ones: under their in-flight limit.
		if !s.inflight.acquire() {
			return status.Errorf(codes.ResourceExhausted, "vipd has %d requests in progress, its limit (--max-inflight-requests); retry later", s.inflight.max)
		}
		defer s.inflight.release()
		return handler(srv, ss)
	}
	if info.FullMethod != vipdv1.FlowService_WatchFlows_FullMethodName {
		return handler(srv, ss)
	}
	if !s.watchers.acquire() {
		return status.Errorf(codes.ResourceExhausted, "vipd has %d WatchFlows streams open, its limit (--max-flow-watchers); end one or retry later", s.watchers.max)
	}
	defer s.watchers.release()
	return handler(srv, ss)
}

// limiter counts what is in progress against a maximum, refusing at once
// beyond it. Refusals are logged at most every limiterLogEvery, with their
// count, so that an overload does not also flood the log.
type limiter struct {
	log     hclog.Logger
	what    string
	max     int64
	n       atomic.Int64
	refused atomic.Int64
	lastLog atomic.Int64 // unix nanoseconds
}

const limiterLogEvery = 10 * time.Second

func newLimiter(log hclog.Logger, what string, max int) *limiter {
	return &limiter{log: log, what: what, max: int64(max)}
}

func (l *limiter) acquire() bool {
	if l.n.Add(1) <= l.max {
		return true
	}
	l.n.Add(-1)
	l.logRefusal("limit reached; refusing calls with ResourceExhausted", "limit", l.what, "max", l.max)
	return false
}

// logRefusal counts a refusal and logs msg with args, and the count of
// refusals since the last line, unless a line was logged less than
// limiterLogEvery ago.
func (l *limiter) logRefusal(msg string, args ...any) {
	l.refused.Add(1)
	now, last := time.Now().UnixNano(), l.lastLog.Load()
	if now-last >= int64(limiterLogEvery) && l.lastLog.CompareAndSwap(last, now) {
		l.log.Warn(msg, append(args, "refused", l.refused.Swap(0))...)
	}
}

func (l *limiter) release() { l.n.Add(-1) }
