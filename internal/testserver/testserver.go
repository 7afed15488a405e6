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
	"github.com/vipd/vipd/dataplane/fake"
	"github.com/vipd/vipd/internal/version"
	"github.com/vipd/vipd/server"
	"github.com/vipd/vipd/server/flows"
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
	ready    <-chan struct{}
	state    *store.Dir
	shell    *server.Server

	// extra are the WithListener listeners. The shell closes them once it
	// runs; until then Close does.
	extra []net.Listener

	stopReconciler context.CancelFunc
	reconcilerDone chan error
	serveDone      chan error
	hub            *flows.Hub
	stopFlows      context.CancelFunc
	flowsDone      chan error

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
}

// Option configures a Server.
type Option func(*config)

// WithLimits sets the limits an operator configures with --max-backends,
// --max-ports and --service-cidr. The default is vipd's:
// validation.DefaultMaxBackends backends and validation.DefaultMaxPorts
// ports a service, VIPs from anywhere.
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
// vipd's --flow-buffer does. The default is flows.DefaultBuffer.
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
	s := &Server{
		dp:             cfg.dp,
		extra:          cfg.listeners,
		reconcilerDone: make(chan error, 1),
		serveDone:      make(chan error, 1),
		flowsDone:      make(chan error, 1),
	}
	if err := s.start(cfg); err != nil {
		s.Close()
		return nil, fmt.Errorf("test vipd: %w", err)
	}
	return s, nil
}

// start wires the store, reconciler, API and shell as internal/daemon does,
// and runs them. Close undoes as much as start got through.
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
	if s.state, err = store.OpenDir(s.stateDir); err != nil {
		return err
	}
	snap, err := s.state.Load()
	if err != nil {
		return err
	}
	log := hclog.NewNullLogger()
	var persister reconcile.Persister = s.state
	if cfg.persister != nil {
		persister = cfg.persister(s.state)
	}
	rec := reconcile.New(log, s.dp, persister, snap.WithLimits(cfg.limits))
	s.ready = rec.Ready()
	var apiOpts []server.APIOption
	if !cfg.noFlows {
		s.hub = flows.New(log, s.dp, flows.WithBuffer(cfg.flowBuffer), flows.WithResolver(server.FlowResolver(rec.Snapshot)))
		apiOpts = append(apiOpts, server.WithFlows(s.hub), server.WithExplainer(s.dp))
		ctx, cancel := context.WithCancel(context.Background())
		s.stopFlows = cancel
		go func() { s.flowsDone <- s.hub.Run(ctx) }()
	}
	api := server.NewAPI(log, rec, s.dp.Name(), s.dp.Capabilities(), cfg.limits, cfg.version, apiOpts...)
	listen := append([]server.Option{server.WithUnixSocket(s.Socket(), 0o660)}, cfg.serverOpts...)
	for _, l := range s.extra {
		listen = append(listen, server.WithListener(l))
	}
	if s.shell, err = server.New(log, api, listen...); err != nil {
		return err
	}

	go func() { s.serveDone <- s.shell.Serve() }()
	ctx, cancel := context.WithCancel(context.Background())
	s.stopReconciler = cancel
	go func() { s.reconcilerDone <- rec.Run(ctx) }()
	if cfg.noWait {
		go func() {
			select {
			case <-rec.Ready():
				s.shell.MarkReady()
			case <-ctx.Done():
			}
		}()
		return nil
	}
	select {
	case <-rec.Ready():
		s.shell.MarkReady()
		return nil
	case <-time.After(readyTimeout):
		return fmt.Errorf("the initial apply did not succeed within %v", readyTimeout)
	}
}

// Ready is closed once the initial apply has succeeded.
func (s *Server) Ready() <-chan struct{} { return s.ready }

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
func (s *Server) Flows() *flows.Hub { return s.hub }

// Close stops the server as vipd stops on SIGTERM: health turns NOT_SERVING,
// calls in flight get a second to finish, then the reconciler stops. It
// removes the socket and the state directory, but leaves the fake dataplane
// open, so that a test can still read what was applied. Close may be called
// more than once; every call returns what the first one did.
func (s *Server) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.stop() })
	return s.closeErr
}

func (s *Server) stop() error {
	var errs []error
	// The flow hub stops first: it ends the WatchFlows streams, which a
	// graceful stop would otherwise wait for.
	if s.stopFlows != nil {
		s.stopFlows()
		if err := <-s.flowsDone; !errors.Is(err, context.Canceled) {
			errs = append(errs, err)
		}
	}
	if s.shell != nil {
		s.shell.Shutdown(shutdownTimeout)
		errs = append(errs, <-s.serveDone)
	} else {
		// server.New may have closed some of them already.
		for _, l := range s.extra {
			l.Close()
		}
	}
	if s.stopReconciler != nil {
		s.stopReconciler()
		if err := <-s.reconcilerDone; !errors.Is(err, context.Canceled) {
			errs = append(errs, err)
		}
	}
	if s.state != nil {
		errs = append(errs, s.state.Close())
	}
	if s.dir != "" {
		errs = append(errs, os.RemoveAll(s.dir))
	}
	return errors.Join(errs...)
}
