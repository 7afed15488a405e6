package testserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/fake"
	"github.com/vipd/vipd/internal/daemon"
	"github.com/vipd/vipd/internal/version"
	"github.com/vipd/vipd/server"
	"github.com/vipd/vipd/server/flowhub"
	"github.com/vipd/vipd/server/reconcile"
	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
)

const (
	// readyTimeout bounds New's wait for the initial apply.
	readyTimeout = 10 * time.Second
	// shutdownTimeout bounds the graceful stop in Close; calls still in
	// flight after it are cancelled.
	shutdownTimeout = time.Second
)

// Server is one running vipd API. Create it with Start, or with New where
// there is no testing.TB (a runnable example).
type Server struct {
	dir      string // temporary; holds the socket and, by default, the state directory
	stateDir string
	dp       *fake.Dataplane
	node     *daemon.Node

	// extra are the WithListener listeners. The node owns them once
	// daemon.Assemble has been called; until then Close closes them.
	extra []net.Listener

	closeOnce sync.Once
	closeErr  error
}

type config struct {
	limits     validation.Limits
	dp         *fake.Dataplane
	version    string
	listeners  []net.Listener
	stateDir   string
	persister  func(*store.Dir) reconcile.Persister
	serverOpts []server.Option
	noWait     bool
	flowBuffer int
	noFlows    bool
	node       dataplane.Node
	nodeName   string
	zone       string
}

// Option configures a Server.
type Option func(*config)

// WithNode makes every State the test vipd applies carry n, as if the
// node's network were n (the default is the zero Node: no node-port
// address, no external interface).
func WithNode(n dataplane.Node) Option {
	return func(c *config) { c.node = n }
}

// WithTopology makes the test vipd run as vipd run --node-name nodeName
// --zone zone would: its node name and start zone for topology-aware
// routing. The default is the host name and no zone.
func WithTopology(nodeName, zone string) Option {
	return func(c *config) { c.nodeName, c.zone = nodeName, zone }
}

// WithLimits sets the limits an operator configures with --max-backends,
// --max-ports and --service-cidr. The default is vipd's:
// validation.DefaultMaxBackends backends and validation.DefaultMaxPorts
// ports a service, VIPs from anywhere. They become the daemon.Config flags
// they stand for (0: no limit), so that a limit vipd refuses makes New fail.
func WithLimits(l validation.Limits) Option {
	return func(c *config) { c.limits = l }
}

// WithDataplane runs the API over dp instead of a new fake.New(), for
// example one with other capabilities. A hook or failures queued on dp take
// effect from the initial apply on.
func WithDataplane(dp *fake.Dataplane) Option {
	return func(c *config) { c.dp = dp }
}

// WithVersion sets the version GetStatus reports. The default is the build's
// version, as vipd reports it.
func WithVersion(v string) Option {
	return func(c *config) { c.version = v }
}

// WithListener serves on l too, besides the Unix socket: a TCP or bufconn
// listener, say. The Server owns l from then on and closes it.
func WithListener(l net.Listener) Option {
	return func(c *config) { c.listeners = append(c.listeners, l) }
}

// WithStateDir keeps the state in dir, which Close leaves in place, so that a
// second Server over the same dir shows a restart. The default is a
// temporary directory that Close removes.
func WithStateDir(dir string) Option {
	return func(c *config) { c.stateDir = dir }
}

// WithPersister wraps the state directory the reconciler saves to, for
// example to make saves fail.
func WithPersister(wrap func(*store.Dir) reconcile.Persister) Option {
	return func(c *config) { c.persister = wrap }
}

// WithServerOptions adds options to the gRPC shell, such as
// server.WithMaxRecvMsgSize.
func WithServerOptions(opts ...server.Option) Option {
	return func(c *config) { c.serverOpts = append(c.serverOpts, opts...) }
}

// WithoutWaiting makes Start and New return before the initial apply; Ready
// tells when it is done. Health says NOT_SERVING until then.
func WithoutWaiting() Option {
	return func(c *config) { c.noWait = true }
}

// WithFlowBuffer sets the size of each WatchFlows stream's buffer, as
// vipd's --flow-buffer does. The default is flowhub.DefaultBuffer.
func WithFlowBuffer(n int) Option {
	return func(c *config) { c.flowBuffer = n }
}

// WithoutFlows serves the API as for a dataplane that neither reports flows
// nor explains its picks: FlowService answers Unimplemented, and Explain
// answers from the desired state alone.
func WithoutFlows() Option {
	return func(c *config) { c.noFlows = true }
}

// Start runs a Server for the test and stops it at the test's cleanup. It
// returns once the (empty) initial state is applied and health says SERVING.
func Start(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	s, err := New(opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Errorf("stop test vipd: %v", err)
		}
	})
	return s
}

// New runs a Server until Close, which the caller must call. It returns once
// the (empty) initial state is applied and health says SERVING. On error it
// has released everything, the WithListener listeners included.
func New(opts ...Option) (*Server, error) {
	cfg := config{
		limits:  validation.Limits{MaxBackends: validation.DefaultMaxBackends, MaxPorts: validation.DefaultMaxPorts},
		version: version.String(),
	}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.dp == nil {
		cfg.dp = fake.New()
	}
	s := &Server{dp: cfg.dp, extra: cfg.listeners}
	if err := s.start(cfg); err != nil {
		s.Close()
		return nil, fmt.Errorf("test vipd: %w", err)
	}
	return s, nil
}

// start assembles and starts a vipd node, as internal/daemon's Run does,
// over the fake dataplane and a socket in a new temporary directory. Close
// undoes as much as start got through.
func (s *Server) start(cfg config) error {
	// A short directory under os.TempDir, not t.TempDir, whose test-named
	// paths can overflow the 107 bytes of sun_path.
	dir, err := os.MkdirTemp("", "vipdtest")
	if err != nil {
		return err
	}
	s.dir = dir
	s.stateDir = cfg.stateDir
	if s.stateDir == "" {
		s.stateDir = filepath.Join(dir, "state")
	}
	var dp dataplane.Dataplane = s.dp
	if cfg.noFlows {
		dp = withoutFlows{s.dp, s.dp}
	}
	// The test vipd runs in the machine's own network namespace: it must
	// never probe a backend, which could be any address, nor listen on or
	// follow the machine's own network.
	opts := []daemon.Option{daemon.WithDataplane(dp), daemon.WithVersion(cfg.version), daemon.WithPersister(cfg.persister),
		daemon.WithServerOptions(cfg.serverOpts...), daemon.WithoutHealthChecks(), daemon.WithFixedNode(cfg.node)}
	for _, l := range s.extra {
		opts = append(opts, daemon.WithListener(l))
	}
	node, err := daemon.Assemble(context.Background(), hclog.NewNullLogger(), nodeConfig(s.Socket(), s.stateDir, cfg), opts...)
	if err != nil {
		return err
	}
	s.node = node
	node.Start(context.Background())
	if cfg.noWait {
		return nil
	}
	select {
	case <-node.Ready():
		return nil
	case <-time.After(readyTimeout):
		return fmt.Errorf("the initial apply did not succeed within %v", readyTimeout)
	}
}

// nodeConfig is the daemon.Config of a test vipd: the socket and state
// directory it is given, the limits of cfg, and otherwise the gRPC
// server's defaults, with no metrics listener, no periodic resync or
// drift check, and a graceful stop of shutdownTimeout.
func nodeConfig(socket, stateDir string, cfg config) daemon.Config {
	l := cfg.limits
	maxPorts := max(l.MaxPorts, 0) // validation's negative "no limit" is the daemon's 0
	flowBuffer := cfg.flowBuffer
	if flowBuffer < 1 {
		flowBuffer = flowhub.DefaultBuffer
	}
	return daemon.Config{
		Socket:     socket,
		SocketMode: 0o660,
		StateDir:   stateDir,
		Limits: daemon.Limits{
			MaxConcurrentStreams: server.DefaultMaxConcurrentStreams,
			MaxInflightRequests:  server.DefaultMaxInflightRequests,
			MaxFlowWatchers:      server.DefaultMaxFlowWatchers,
		},
		MaxBackends:      l.MaxBackends,
		MaxPorts:         maxPorts,
		MaxServices:      l.MaxServices,
		MaxTotalBackends: l.MaxTotalBackends,
		ServiceCIDRs:     l.ServiceCIDRs,
		MaxRecvMsgSize:   server.DefaultMaxRecvMsgSize,
		FlowBuffer:       flowBuffer,
		ShutdownTimeout:  shutdownTimeout,
		NodeName:         cfg.nodeName,
		Zone:             cfg.zone,
	}
}

// withoutFlows hides the fake's FlowSource and Explainer from the daemon,
// for WithoutFlows.
type withoutFlows struct {
	dataplane.Dataplane
	dataplane.DriftDetector
}

// Ready is closed once the initial apply has succeeded.
func (s *Server) Ready() <-chan struct{} { return s.node.Ready() }

// Socket is the path of the Unix socket the API listens on.
func (s *Server) Socket() string { return filepath.Join(s.dir, "vipd.sock") }

// Target is the socket as a gRPC target, "unix:///...".
func (s *Server) Target() string { return "unix://" + s.Socket() }

// StateDir is the state directory, which holds the state file and the
// journal once a change is saved. To make saves fail, use WithPersister.
func (s *Server) StateDir() string { return s.stateDir }

// Dataplane is the fake dataplane the API applies to. Use it to script
// failures (FailNext, SetHook), flow events (Emit, Lose, SetFlows) and
// explanations (SetExplain), and to see what was applied (Applied, Records).
// The first Record is the initial apply of the empty state.
func (s *Server) Dataplane() *fake.Dataplane { return s.dp }

// Flows is the hub that serves FlowService from the fake dataplane's
// events, or nil WithoutFlows. Tests wait on its Subscribers to know that a
// WatchFlows stream is subscribed.
func (s *Server) Flows() *flowhub.Hub { return s.node.Flows() }

// Node is the vipd node that serves, as daemon.Assemble built it.
func (s *Server) Node() *daemon.Node { return s.node }

// API is the handlers the gRPC server serves, for tests (fuzzers) that
// call them without the wire.
func (s *Server) API() *server.API { return s.node.API() }

// Snapshot is the current desired state, which is also the applied one
// once no change is in flight.
func (s *Server) Snapshot() *store.Snapshot { return s.node.Snapshot() }

// Close stops the server as vipd stops on SIGTERM (daemon.Node.Stop): the
// flow hub stops, health turns NOT_SERVING, calls in flight get a second to
// finish, then the reconciler stops. It
// removes the socket and the state directory, but leaves the fake dataplane
// open, so that a test can still read what was applied. Close may be called
// more than once; every call returns what the first one did.
func (s *Server) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.stop() })
	return s.closeErr
}

func (s *Server) stop() error {
	var errs []error
	if s.node != nil {
		errs = append(errs, s.node.Stop())
	} else {
		// daemon.Assemble may have closed them already.
		for _, l := range s.extra {
			l.Close()
		}
	}
	if s.dir != "" {
		errs = append(errs, os.RemoveAll(s.dir))
	}
	return errors.Join(errs...)
}
