package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/internal/health"
	"github.com/vipd/vipd/internal/metrics"
	"github.com/vipd/vipd/internal/nodecheck"
	"github.com/vipd/vipd/internal/servicesdir"
	"github.com/vipd/vipd/internal/version"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server"
	"github.com/vipd/vipd/server/flowhub"
	"github.com/vipd/vipd/server/reconcile"
	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
)

// Option changes what Assemble builds beyond what Config says. They are
// for tests, which inject a dataplane to script and extra listeners;
// cmd/vipd uses none of them.
type Option func(*options)

type options struct {
	dp         dataplane.Dataplane
	listeners  []net.Listener
	persister  func(*store.Dir) reconcile.Persister
	serverOpts []server.Option
	version    string
	noHealth   bool
	noNodeNet  bool
	fixedNode  dataplane.Node // with noNodeNet: the Node of every State
}

// WithoutHealthChecks runs no active health checks: backends are never
// probed, whatever their services' health_check says, and no health-check
// node port is served. A test whose vipd runs in the machine's own network
// namespace (no Config.NetNS) needs it, so that no service it writes,
// fuzzed ones included, makes vipd connect to an address off the machine
// or listen on the machine's own addresses.
func WithoutHealthChecks() Option {
	return func(o *options) { o.noHealth = true }
}

// WithoutNodeNetwork follows no node network: every State carries the
// zero dataplane.Node (no node-port address, no external interface), and
// no health-check node port is served. It is for a test whose vipd runs in
// the machine's own network namespace, which must not depend on what that
// network does meanwhile.
func WithoutNodeNetwork() Option {
	return func(o *options) { o.noNodeNet = true }
}

// WithFixedNode is WithoutNodeNetwork with n, instead of the zero Node, in
// every State: a test's stand-in for the node's network.
func WithFixedNode(n dataplane.Node) Option {
	return func(o *options) { o.noNodeNet, o.fixedNode = true, n }
}

// WithDataplane makes the node apply to dp, which is already open, instead
// of opening the dataplane Config.Dataplane names (Config.NetNS is then not
// looked at). The caller keeps dp: Stop does not close it, so that a test
// can still read what was applied.
func WithDataplane(dp dataplane.Dataplane) Option {
	return func(o *options) { o.dp = dp }
}

// WithListener serves the API on l too, besides the Unix socket, with its
// clients trusted as the socket's are: a bufconn, say. The node owns l from
// Assemble on, and closes it, also when Assemble fails.
func WithListener(l net.Listener) Option {
	return func(o *options) { o.listeners = append(o.listeners, l) }
}

// WithPersister wraps the state directory the reconciler saves to, for
// example to make saves fail. The state is still loaded, locked and
// recovered through the directory itself.
func WithPersister(wrap func(*store.Dir) reconcile.Persister) Option {
	return func(o *options) { o.persister = wrap }
}

// WithServerOptions adds options to the gRPC server after those Config
// asks for, so that they win where both set the same limit. Pass
// listeners with WithListener, which closes them on a failed Assemble.
func WithServerOptions(opts ...server.Option) Option {
	return func(o *options) { o.serverOpts = append(o.serverOpts, opts...) }
}

// WithVersion sets the version GetStatus reports. The default is the
// build's version.
func WithVersion(v string) Option {
	return func(o *options) { o.version = v }
}

// Node is one vipd, assembled by Assemble: the locked state directory, the
// dataplane, the reconciler over them, the flow hub when the dataplane
// reports flows, the node checks when it programs the kernel, the watcher
// of the node's network that hands the reconciler each new
// dataplane.Node (not WithoutNodeNetwork), the health-check node port
// server (not with the none dataplane, WithoutHealthChecks nor
// WithoutNodeNetwork), the API and
// its gRPC server with their listeners open, metrics, and, when configured,
// the metrics listener. Nothing runs until Start. Stop stops what Start
// started and releases what Assemble opened; it leaves the dataplane
// programmed.
type Node struct {
	log        hclog.Logger
	cfg        Config
	dir        *store.Dir
	dp         dataplane.Dataplane
	ownDP      bool   // opened by Assemble, closed by Stop
	holdReason string // not empty: the reconciler holds (--recover)
	rec        *reconcile.Reconciler
	api        *server.API
	srv        *server.Server
	hub        *flowhub.Hub         // nil: the dataplane reports no flows
	checker    *nodecheck.Checker   // nil: the dataplane programs nothing
	prober     *health.Prober       // nil: WithoutHealthChecks
	metricsSrv *metrics.Server      // nil: no Config.MetricsAddr
	reloader   *reloader            // nil: no Config.Remote listener
	dirWatcher *servicesdir.Watcher // nil: no Config.ServicesDir
	nodeNet    *nodeNet

	startOnce sync.Once
	started   bool
	ready     chan struct{} // closed by watchReady
	readyDone chan struct{} // watchReady has returned
	stopping  chan struct{} // closed by Stop: watchReady gives up
	served    chan struct{} // srv.Serve has returned serveErr
	serveErr  error
	recDone   chan error
	// What Start started, each stopped by Stop in its turn.
	stopReload, stopHub, stopNodeCheck, stopMetrics, stopRec, stopDir, stopProber, stopNodeNet func()

	stopOnce sync.Once
	stopErr  error
}

// Assemble checks cfg (Config.Check, and that Pprof has a MetricsAddr),
// restores the desired state from cfg.StateDir by Run's rules (--recover
// and its marker), opens the dataplane, and builds every part of a vipd,
// opening its listeners, but starts nothing: call Start, then Stop.
// Errors in cfg, a corrupt state, a dataplane that cannot open and a
// listener that cannot bind are all reported here, before anything serves.
// On error everything opened so far has been released, the WithListener
// listeners included.
func Assemble(ctx context.Context, log hclog.Logger, cfg Config, opts ...Option) (_ *Node, err error) {
	o := options{version: version.String()}
	for _, opt := range opts {
		opt(&o)
	}
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	cfg.warnUnsafe(log)
	if cfg.Pprof && cfg.MetricsAddr == "" {
		return nil, errors.New("pprof is served on the metrics listener: set a metrics address (such as 127.0.0.1:9640) to use it")
	}
	n := &Node{
		log:       log,
		cfg:       cfg,
		ready:     make(chan struct{}),
		readyDone: make(chan struct{}),
		stopping:  make(chan struct{}),
		served:    make(chan struct{}),
		recDone:   make(chan error, 1),
	}
	defer func() {
		if err != nil {
			n.release()
			// server.New may have closed some of them already.
			for _, l := range o.listeners {
				l.Close()
			}
		}
	}()
	// Order matters: everything that can refuse the configuration comes
	// before the state directory is locked, and the state is restored
	// (or refused) before the dataplane is opened, so that vipd never
	// touches the kernel over a state it cannot read.
	remoteOpts, rl, err := cfg.Remote.serverOptions(log)
	if err != nil {
		return nil, err
	}
	n.reloader = rl
	gid := -1
	if cfg.SocketGroup != "" {
		if gid, err = LookupGroup(cfg.SocketGroup); err != nil {
			return nil, err
		}
	}
	cfg.Memory.apply(log)
	if n.dir, err = store.OpenDir(cfg.StateDir, store.WithLogger(log.Named("store"))); err != nil {
		return nil, err
	}
	snap, holdReason, err := restore(log, cfg, n.dir)
	if err != nil {
		return nil, err
	}
	n.holdReason = holdReason
	// One collection between the load and the programming: the load
	// leaves its garbage (the file's bytes, decoded messages, index
	// builds; tens of MB at 100,000 services), and the heap the collector
	// finds live here, the state alone, sets how far the programming may
	// grow it before the next. Left to the pacer, the restart's peak
	// depends on where a collection fell during the load.
	runtime.GC()
	log.Info("state restored", "path", n.dir.Path(), "services", snap.Len(), "backends", snap.BackendCount(), "generation", snap.Revision())
	if n.dp = o.dp; n.dp == nil {
		if n.dp, err = openDataplane(ctx, log.Named("dataplane"), cfg); err != nil {
			return nil, err
		}
		n.ownDP = true
	}
	log.Info("dataplane opened", "dataplane", n.dp.Name(), "netns", cfg.NetNS)

	m := metrics.New()
	if err := n.buildCore(m, snap, o); err != nil {
		return nil, err
	}
	if err := n.listen(m, remoteOpts, gid, o); err != nil {
		return nil, err
	}
	return n, nil
}

// buildCore builds the reconciler over snap, and the flow hub, node checks,
// API and services directory watcher over it, all reporting to m.
func (n *Node) buildCore(m *metrics.Metrics, snap *store.Snapshot, o options) error {
	cfg, log := n.cfg, n.log
	if dd, ok := n.dp.(dataplane.DriftDetector); ok {
		m.InitDataplane(n.dp.Name(), dd.DriftKinds())
	}
	if s, ok := n.dp.(metrics.SNATSource); ok {
		m.WatchSNAT(s)
	}
	recOpts := []reconcile.Option{reconcile.WithResyncPeriod(cfg.ResyncPeriod), reconcile.WithObserver(m),
		reconcile.WithDriftCheck(cfg.DriftCheckPeriod)}
	if n.holdReason != "" {
		log.Warn("not touching the dataplane until the first SyncServices; other changes get FailedPrecondition", "reason", n.holdReason)
		recOpts = append(recOpts, reconcile.WithHold(n.holdReason))
	}
	var err error
	if n.nodeNet, err = buildNodeNet(log, cfg, n.dp.Name(), o); err != nil {
		return err
	}
	recOpts = append(recOpts, n.nodeNet.reconcileOptions()...)
	recOpts = append(recOpts, reconcile.WithTopology(reconcile.Topology{NodeName: nodeName(cfg.NodeName), Zone: cfg.Zone}))
	if cfg.Zone != "" {
		log.Info("topology-aware routing", "node", nodeName(cfg.NodeName), "zone", cfg.Zone)
	}
	var persister reconcile.Persister = n.dir
	if o.persister != nil {
		persister = o.persister(n.dir)
	}
	limits := validation.Limits{MaxBackends: cfg.MaxBackends, MaxPorts: cfg.MaxPorts, MaxServices: cfg.MaxServices,
		MaxTotalBackends: cfg.MaxTotalBackends, ServiceCIDRs: cfg.ServiceCIDRs}
	n.rec = reconcile.New(log.Named("reconcile"), n.dp, persister, snap.WithLimits(limits), recOpts...)

	var apiOpts []server.APIOption
	if src, ok := n.dp.(dataplane.FlowSource); ok {
		n.hub = flowhub.New(log.Named("flows"), src, flowhub.WithBuffer(cfg.FlowBuffer),
			flowhub.WithResolver(server.FlowResolver(n.rec.Snapshot)), flowhub.WithObserver(m))
		apiOpts = append(apiOpts, server.WithFlows(n.hub))
	}
	if ex, ok := n.dp.(dataplane.Explainer); ok {
		apiOpts = append(apiOpts, server.WithExplainer(ex))
	}
	if !o.noHealth {
		hopts := []health.Option{health.WithNetNS(cfg.NetNS), health.WithObserver(m)}
		if n.hub != nil {
			hopts = append(hopts, health.WithTransitions(publishHealth(n.hub)))
		}
		n.prober = health.New(log.Named("health"), n.rec.Snapshot, n.rec, hopts...)
		apiOpts = append(apiOpts, server.WithBackendHealth(n.prober))
	}
	if n.checker = newNodeCheck(log.Named("nodecheck"), cfg, n.dp.Name()); n.checker != nil {
		apiOpts = append(apiOpts, server.WithStatusWarnings(statusWarnings(n.checker)))
	}
	if w := n.nodeNet.statusWarnings(); w != nil {
		apiOpts = append(apiOpts, server.WithStatusWarnings(w))
	}
	if cfg.ServicesDir != "" {
		// n.dirWatcher is set below, before anything can call GetStatus.
		apiOpts = append(apiOpts, server.WithStatusWarnings(func() []*vipdv1.StatusWarning { return n.dirWatcher.Warnings() }))
	}
	n.api = server.NewAPI(log.Named("api"), n.rec, n.dp.Name(), n.dp.Capabilities(), limits, o.version, apiOpts...)
	if cfg.ServicesDir == "" {
		return nil
	}
	n.dirWatcher, err = servicesdir.New(log.Named("servicesdir"), servicesdir.Config{Dir: cfg.ServicesDir, NodeName: nodeName(cfg.NodeName)}, n.api, m)
	return err
}

// publishHealth hands the prober's health transitions to the flow hub, as
// FLOW_EVENT_TYPE_HEALTH events of WatchFlows.
func publishHealth(hub *flowhub.Hub) func(health.Transition) {
	states := map[vipdv1.HealthState]flowhub.HealthState{
		vipdv1.HealthState_HEALTH_STATE_PASSING: flowhub.HealthPassing,
		vipdv1.HealthState_HEALTH_STATE_FAILING: flowhub.HealthFailing,
	}
	return func(tr health.Transition) {
		h := tr.Health
		hub.PublishHealth(tr.Service, tr.Backend, flowhub.Health{State: states[h.State], Since: tr.Time,
			LastError: h.LastError, Consecutive: h.Consecutive, Detail: h.Detail})
	}
}

// nodeName is name, or else the host name in lower case, as the kubelet
// names its node.
func nodeName(name string) string {
	if name != "" {
		return name
	}
	h, _ := os.Hostname()
	return strings.ToLower(strings.TrimSpace(h))
}

// listen builds the gRPC server, opening the Unix socket, the remote
// listener (remoteOpts) and the WithListener ones, and the metrics
// listener when Config.MetricsAddr is set. On error the caller releases
// what it opened.
func (n *Node) listen(m *metrics.Metrics, remoteOpts []server.Option, gid int, o options) error {
	cfg, log := n.cfg, n.log
	srvOpts := []server.Option{
		server.WithUnixSocketGroup(cfg.Socket, cfg.socketMode(), gid),
		server.WithMaxRecvMsgSize(cfg.MaxRecvMsgSize),
		server.WithInterceptors(m.GRPCInterceptors()),
	}
	srvOpts = append(srvOpts, remoteOpts...)
	srvOpts = append(srvOpts, cfg.Limits.serverOptions()...)
	for _, l := range o.listeners {
		srvOpts = append(srvOpts, server.WithListener(l))
	}
	srvOpts = append(srvOpts, o.serverOpts...)
	var err error
	if n.srv, err = server.New(log, n.api, srvOpts...); err != nil {
		return err
	}
	m.InitializeGRPC(n.srv)
	if cfg.MetricsAddr == "" {
		return nil
	}
	var hopts []metrics.HandlerOption
	if cfg.Pprof {
		hopts = append(hopts, metrics.WithPprof())
		log.Warn("serving Go profiles under /debug/pprof/ on the metrics listener", "addr", cfg.MetricsAddr)
	}
	ready := func() bool {
		select {
		case <-n.rec.Ready():
			return true
		default:
			return false
		}
	}
	if n.metricsSrv, err = metrics.Listen(log.Named("metrics"), cfg.MetricsAddr, m, ready, hopts...); err != nil {
		return fmt.Errorf("metrics listener: %w", err)
	}
	return nil
}

// Start runs the node: the reload of the TLS and authz files on
// Config.Reload, the flow hub, the node checks (the first one before
// serving), the metrics listener, the reconciler (whose first task is the
// initial apply, unless it holds) and the gRPC server. Once the initial
// apply (or, when holding, the first SyncServices) has succeeded, the
// node removes the recover marker, turns health to SERVING, logs "ready"
// and closes Ready. ctx gives its values to what runs; ending it stops
// nothing: Stop does. Start runs once; later calls do nothing.
func (n *Node) Start(ctx context.Context) {
	n.startOnce.Do(func() { n.start(context.WithoutCancel(ctx)) })
}

func (n *Node) start(ctx context.Context) {
	n.started = true
	var rescan func()
	if n.dirWatcher != nil {
		rescan = n.dirWatcher.Rescan
	}
	n.stopReload = watchReload(ctx, n.log, n.cfg.Reload, n.reloader, rescan)
	n.stopHub = func() {}
	if n.hub != nil {
		hubCtx, cancel := context.WithCancel(ctx)
		hubDone := make(chan struct{})
		go func() {
			defer close(hubDone)
			if err := n.hub.Run(hubCtx); err != nil && !errors.Is(err, context.Canceled) {
				n.log.Error("flow events", "error", err)
			}
		}()
		n.stopHub = func() { cancel(); <-hubDone }
	}
	n.stopNodeCheck = runNodeCheck(ctx, n.checker, n.cfg.DriftCheckPeriod, n.rec.Snapshot)
	n.stopMetrics = func() {}
	if n.metricsSrv != nil {
		metricsCtx, cancel := context.WithCancel(ctx)
		metricsDone := make(chan struct{})
		go func() {
			defer close(metricsDone)
			if err := n.metricsSrv.Serve(metricsCtx); err != nil {
				n.log.Error("metrics listener", "error", err)
			}
		}()
		n.stopMetrics = func() { cancel(); <-metricsDone }
	}
	recCtx, stopRec := context.WithCancel(ctx)
	n.stopRec = stopRec
	go func() { n.recDone <- n.rec.Run(recCtx) }()
	n.stopNodeNet = n.nodeNet.start(ctx, n.rec)
	n.stopProber = func() {}
	if n.prober != nil {
		proberCtx, cancelProber := context.WithCancel(ctx)
		proberDone := make(chan struct{})
		go func() {
			defer close(proberDone)
			n.prober.Run(proberCtx)
		}()
		n.stopProber = func() { cancelProber(); <-proberDone }
	}
	n.stopDir = func() {}
	if n.dirWatcher != nil {
		dirCtx, cancel := context.WithCancel(ctx)
		dirDone := make(chan struct{})
		go func() {
			defer close(dirDone)
			n.dirWatcher.Run(dirCtx)
		}()
		n.stopDir = func() { cancel(); <-dirDone }
	}
	go func() {
		defer close(n.served)
		n.serveErr = n.srv.Serve()
	}()
	go n.watchReady()
}

// watchReady waits for the reconciler's first apply, then makes the node
// ready; it gives up when Stop begins.
func (n *Node) watchReady() {
	defer close(n.readyDone)
	select {
	case <-n.rec.Ready():
	case <-n.stopping:
		return
	}
	if n.dirWatcher != nil {
		// Ready means the services directory is in force too.
		select {
		case <-n.dirWatcher.Synced():
		case <-n.stopping:
			return
		}
	}
	if n.holdReason != "" {
		// The first SyncServices is applied and saved: the state on disk
		// is the control plane's again.
		if err := removeMarker(n.cfg.StateDir); err != nil {
			n.log.Error("the first SyncServices is applied, but the recover marker stays; the next start needs --recover", "error", err)
		}
	}
	n.srv.MarkReady()
	n.log.Info("ready", "instance_id", n.api.InstanceID())
	close(n.ready)
}

// Ready is closed once the node is ready: its initial apply (or, holding,
// the first SyncServices) has succeeded and health says SERVING.
func (n *Node) Ready() <-chan struct{} { return n.ready }

// Done is closed once the started gRPC server has stopped serving: by
// Stop, or on its own after an error, which Stop then returns.
func (n *Node) Done() <-chan struct{} { return n.served }

// API is the handlers the gRPC server serves, for tests that call them
// without the wire.
func (n *Node) API() *server.API { return n.api }

// Snapshot is the current desired state; see reconcile.Reconciler.Snapshot.
func (n *Node) Snapshot() *store.Snapshot { return n.rec.Snapshot() }

// Flows is the flow hub that serves FlowService, or nil when the dataplane
// reports no flows.
func (n *Node) Flows() *flowhub.Hub { return n.hub }

// Stop shuts the node down as vipd does on SIGTERM, in this order: the flow
// hub stops (ending WatchFlows streams, which a graceful stop would
// otherwise wait for); health turns NOT_SERVING and calls in flight get
// Config.ShutdownTimeout to finish; the reconciler stops; then the metrics
// listener and the node checks; then the dataplane is closed, still
// programmed (unless WithDataplane gave it), and the state directory's lock
// released. Without Start it only releases what Assemble opened, which
// removes the Unix socket; a Start after Stop does nothing. It returns the error that stopped the gRPC
// server, if any, and errors from the reconciler and the state directory.
// Stop may be called more than once; every call returns what the first
// one did.
func (n *Node) Stop() error {
	n.stopOnce.Do(func() { n.stopErr = n.stop() })
	return n.stopErr
}

func (n *Node) stop() error {
	// Waits for a Start in progress, and keeps a later one from starting
	// what is being released.
	n.startOnce.Do(func() {})
	if !n.started {
		return n.release()
	}
	close(n.stopping)
	<-n.readyDone
	n.log.Info("shutting down; the dataplane stays programmed")
	n.stopHub()
	// Before the reconciler: the watcher's calls wait for it.
	n.stopDir()
	n.srv.Shutdown(n.cfg.ShutdownTimeout)
	<-n.served
	// Order matters: the prober and the node's network watcher submit
	// to the reconciler.
	n.stopProber()
	n.stopNodeNet()
	n.stopRec()
	recErr := <-n.recDone
	if errors.Is(recErr, context.Canceled) {
		recErr = nil
	}
	n.stopMetrics()
	n.stopNodeCheck()
	err := n.release()
	n.stopReload()
	return errors.Join(n.serveErr, recErr, err)
}

// release closes what Assemble opened, in the reverse order: the listeners
// (if nothing served on them), the dataplane it opened, the state
// directory. It returns the state directory's error; the dataplane's is
// only logged, as it does not change what the kernel holds.
func (n *Node) release() error {
	if !n.started {
		if n.metricsSrv != nil {
			n.metricsSrv.Close()
		}
		if n.srv != nil {
			n.srv.Shutdown(0)
		}
	}
	if n.ownDP {
		if err := n.dp.Close(); err != nil {
			n.log.Error("close dataplane", "error", err)
		}
	}
	if n.dir != nil {
		return n.dir.Close()
	}
	return nil
}
