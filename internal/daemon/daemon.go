package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/ebpf"
	"github.com/vipd/vipd/dataplane/fake"
	"github.com/vipd/vipd/dataplane/iptables"
	"github.com/vipd/vipd/internal/metrics"
	"github.com/vipd/vipd/internal/version"
	"github.com/vipd/vipd/server"
	"github.com/vipd/vipd/server/flows"
	"github.com/vipd/vipd/server/reconcile"
	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
	"github.com/vishvananda/netns"
)

// Config is everything vipd run is told on its command line.
type Config struct {
	// Socket is the Unix socket path; SocketMode its file mode (0: 0600,
	// or 0660 with a SocketGroup).
	Socket     string
	SocketMode os.FileMode
	// SocketGroup, a group name or numeric GID, owns the socket when set.
	SocketGroup string
	// Remote configures a TCP listener with mutual TLS and authorization.
	Remote Remote
	// Limits bounds concurrent calls.
	Limits Limits
	// Recover starts over an unreadable state file instead of refusing:
	// see Run.
	Recover bool
	// StateDir holds the persisted desired state.
	StateDir string
	// Dataplane is auto, ebpf, iptables or fake.
	Dataplane string
	// NetNS, when set, is the network namespace to program instead of the current one.
	NetNS string
	// MaxBackends bounds the backends of one service (0: no limit).
	MaxBackends int
	// MaxPorts bounds the ports of one service (0: no limit).
	MaxPorts int
	// MaxServices bounds the services of all owners together (0: no limit).
	MaxServices int
	// MaxTotalBackends bounds the backends of all services together (0: no limit).
	MaxTotalBackends int
	// ServiceCIDRs, when set, are the only ranges VIPs may come from.
	ServiceCIDRs []netip.Prefix
	// MaxRecvMsgSize bounds a request's size in bytes (0: no limit).
	MaxRecvMsgSize int
	// ResyncPeriod re-applies the whole state periodically; zero disables it.
	ResyncPeriod time.Duration
	// DriftCheckPeriod is how often the dataplane's own objects and the
	// node's prerequisites are checked; zero disables the periodic checks
	// (the node's prerequisites are still checked once at start).
	DriftCheckPeriod time.Duration
	// SetSysctls lets vipd set the sysctls it needs (forwarding, conntrack
	// accounting) in NetNS, at start and at every check, instead of only
	// warning that they are unset.
	SetSysctls bool
	// ShutdownTimeout bounds the graceful stop of the gRPC server.
	ShutdownTimeout time.Duration
	// IPTablesMode picks the iptables binaries: auto, nft or legacy.
	IPTablesMode iptables.Mode
	// EBPF configures the eBPF dataplane (its NetNS is taken from NetNS).
	EBPF ebpf.Config
	// MetricsAddr is where /metrics, /healthz and /readyz are served;
	// empty disables the listener.
	MetricsAddr string
	// FlowBuffer bounds each WatchFlows subscriber's buffer, in events; at
	// least 1.
	FlowBuffer int
	// Pprof serves the Go runtime's profiles under /debug/pprof/ on
	// MetricsAddr, which must then be set.
	Pprof bool
	// Memory tunes the Go runtime's garbage collector; see Memory.
	Memory Memory
	// Reload, when not nil, makes vipd read its TLS and authz files again
	// (Remote) on every signal it receives; cmd/vipd sends SIGHUP there.
	Reload <-chan os.Signal
}

// Memory tunes the Go garbage collector for the daemon. The zero value
// leaves the runtime's own settings (the GOGC and GOMEMLIMIT environment
// variables) alone.
//
// The trade-off: the collector lets the heap grow to GCPercent percent
// above the live heap before it runs again, so peak memory during a big
// SyncServices is about (1 + GCPercent/100) times what is live. A lower
// GCPercent, or a Limit the heap approaches, makes the collector run more
// often: less memory, more CPU. Limit is soft. When the live heap itself
// exceeds it the runtime does not fail, but it caps the collector at about
// half the CPU, so a limit set below what the state needs costs throughput
// rather than correctness.
type Memory struct {
	// GCPercent is GOGC: the heap growth, in percent of the live heap,
	// that triggers a collection. Zero keeps the runtime's setting; a
	// negative value turns the proportional trigger off, leaving only Limit.
	GCPercent int
	// Limit is GOMEMLIMIT in bytes: a soft limit on the memory the Go
	// runtime uses. Zero keeps the runtime's setting.
	Limit int64
}

// ParseSize parses a byte count for Memory.Limit: a plain number of bytes,
// or a number with one of the suffixes KiB, MiB, GiB (powers of 1024).
func ParseSize(s string) (int64, error) {
	num, mult := s, int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, mult = n, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("size %q: want a number of bytes, optionally with KiB, MiB or GiB", s)
	}
	return n * mult, nil
}

// apply sets the runtime's knobs that m configures.
func (m Memory) apply(log hclog.Logger) {
	if m.GCPercent != 0 {
		debug.SetGCPercent(m.GCPercent)
	}
	if m.Limit > 0 {
		debug.SetMemoryLimit(m.Limit)
	}
	log.Debug("go runtime memory", "gc_percent", m.GCPercent, "limit", debug.SetMemoryLimit(-1))
}

// Dataplane names accepted by Config.Dataplane.
const (
	DataplaneAuto     = "auto"
	DataplaneEBPF     = "ebpf"
	DataplaneIPTables = "iptables"
	DataplaneFake     = fake.Name
)

// Cleanup removes everything vipd's dataplanes put into the kernel of the
// namespace at netns (the current one when empty): the iptables hooks and
// chains, in every iptables mode that works there, and the eBPF dataplane's
// tc programs, socket hooks and pinned maps under bpffs.
func Cleanup(ctx context.Context, log hclog.Logger, netns, bpffs string) error {
	return errors.Join(
		iptables.Cleanup(ctx, log.Named("iptables"), netns, iptables.ModeAuto),
		ebpf.Cleanup(log.Named("ebpf"), netns, bpffs),
	)
}

// Run runs vipd until ctx ends, then shuts down gracefully, leaving the
// dataplane programmed. It returns an error if vipd cannot start, including
// when the state file is corrupt: vipd never starts empty over a state it
// cannot read.
//
// With cfg.Recover it starts anyway: it moves the unreadable state file and
// journal aside (to <name>.corrupt-<time>, logged), starts with an empty
// desired state, and holds the dataplane (reconcile.WithHold): the kernel
// keeps every rule it has, and only a SyncServices is accepted, until the
// first one has been applied as a full sync. Until then health is
// NOT_SERVING and GetStatus says why. A marker file in the state directory
// keeps a restart during the hold from applying the empty state: without
// --recover it refuses, with it it holds again.
func Run(ctx context.Context, log hclog.Logger, cfg Config) error {
	if err := cfg.Check(); err != nil {
		return err
	}
	cfg.warnUnsafe(log)
	if cfg.Pprof && cfg.MetricsAddr == "" {
		return errors.New("pprof is served on the metrics listener: set a metrics address (such as 127.0.0.1:9640) to use it")
	}
	remoteOpts, reload, err := cfg.Remote.serverOptions(log)
	if err != nil {
		return err
	}
	defer watchReload(ctx, log, cfg.Reload, reload)()
	gid := -1
	if cfg.SocketGroup != "" {
		if gid, err = LookupGroup(cfg.SocketGroup); err != nil {
			return err
		}
	}
	cfg.Memory.apply(log)
	dir, err := store.OpenDir(cfg.StateDir, store.WithLogger(log.Named("store")))
	if err != nil {
		return err
	}
	defer dir.Close()
	pending, err := markerExists(cfg.StateDir)
	if err != nil {
		return err
	}
	snap, err := dir.Load()
	var holdReason string
	switch {
	case errors.Is(err, store.ErrCorrupt) && !cfg.Recover:
		return fmt.Errorf("refusing to start: %w. vipd does not start with an empty state over a state file it cannot read, "+
			"because that would remove every service from the kernel. Restore the file from a backup, or start with --recover: "+
			"vipd then moves it aside, keeps the kernel's rules, and applies nothing until the control plane's first SyncServices", err)
	case errors.Is(err, store.ErrCorrupt):
		log.Warn("--recover: the state is unreadable; moving it aside", "error", err)
		moved, merr := moveAside(log, cfg.StateDir, time.Now())
		if merr != nil {
			return fmt.Errorf("--recover: %w", merr)
		}
		if snap, err = dir.Load(); err != nil {
			return fmt.Errorf("--recover: load the state after moving %v aside: %w", moved, err)
		}
		holdReason = fmt.Sprintf("started with --recover over an unreadable state (moved to %s); "+
			"the kernel keeps its rules until the first SyncServices", strings.Join(moved, ", "))
	case err != nil:
		return err
	case pending && !cfg.Recover:
		return fmt.Errorf("refusing to start: %s says an earlier vipd --recover has not had its first SyncServices yet, "+
			"so the state in %s is not the control plane's, and applying it would remove services from the kernel. "+
			"Start with --recover again", filepath.Join(cfg.StateDir, recoverMarker), cfg.StateDir)
	case pending:
		holdReason = "an earlier --recover start has not had its first SyncServices yet; the kernel keeps its rules until one arrives"
	case cfg.Recover:
		log.Info("--recover: the state is readable; starting normally")
	}
	log.Info("state restored", "path", dir.Path(), "services", snap.Len(), "backends", snap.BackendCount(), "generation", snap.Revision())

	dp, err := openDataplane(ctx, log.Named("dataplane"), cfg)
	if err != nil {
		return err
	}
	defer func() {
		if err := dp.Close(); err != nil {
			log.Error("close dataplane", "error", err)
		}
	}()
	log.Info("dataplane opened", "dataplane", dp.Name(), "netns", cfg.NetNS)

	m := metrics.New()
	if dd, ok := dp.(dataplane.DriftDetector); ok {
		m.InitDataplane(dp.Name(), dd.DriftKinds())
	}
	recOpts := []reconcile.Option{reconcile.WithResyncPeriod(cfg.ResyncPeriod), reconcile.WithObserver(m),
		reconcile.WithDriftCheck(cfg.DriftCheckPeriod)}
	if holdReason != "" {
		log.Warn("not touching the dataplane until the first SyncServices; other changes get FailedPrecondition", "reason", holdReason)
		recOpts = append(recOpts, reconcile.WithHold(holdReason))
	}
	limits := validation.Limits{MaxBackends: cfg.MaxBackends, MaxPorts: cfg.MaxPorts, MaxServices: cfg.MaxServices,
		MaxTotalBackends: cfg.MaxTotalBackends, ServiceCIDRs: cfg.ServiceCIDRs}
	rec := reconcile.New(log.Named("reconcile"), dp, dir, snap.WithLimits(limits), recOpts...)
	var apiOpts []server.APIOption
	stopHub := func() {}
	if src, ok := dp.(dataplane.FlowSource); ok {
		hub := flows.New(log.Named("flows"), src, flows.WithBuffer(cfg.FlowBuffer),
			flows.WithResolver(server.FlowResolver(rec.Snapshot)), flows.WithObserver(m))
		apiOpts = append(apiOpts, server.WithFlows(hub))
		hubCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		hubDone := make(chan struct{})
		go func() {
			defer close(hubDone)
			if err := hub.Run(hubCtx); err != nil && !errors.Is(err, context.Canceled) {
				log.Error("flow events", "error", err)
			}
		}()
		// Stopped before the gRPC server: it ends open WatchFlows streams,
		// which a graceful stop would otherwise wait for.
		stopHub = func() { cancel(); <-hubDone }
		defer stopHub()
	}
	if ex, ok := dp.(dataplane.Explainer); ok {
		apiOpts = append(apiOpts, server.WithExplainer(ex))
	}
	checker, stopNodeCheck := startNodeCheck(ctx, log.Named("nodecheck"), cfg, dp.Name(), rec.Snapshot)
	defer stopNodeCheck()
	if checker != nil {
		apiOpts = append(apiOpts, server.WithStatusWarnings(statusWarnings(checker)))
	}
	api := server.NewAPI(log.Named("api"), rec, dp.Name(), dp.Capabilities(), limits, version.String(), apiOpts...)
	srvOpts := []server.Option{
		server.WithUnixSocketGroup(cfg.Socket, cfg.socketMode(), gid),
		server.WithMaxRecvMsgSize(cfg.MaxRecvMsgSize),
		server.WithInterceptors(m.GRPCInterceptors()),
	}
	srvOpts = append(srvOpts, remoteOpts...)
	srvOpts = append(srvOpts, cfg.Limits.serverOptions()...)
	srv, err := server.New(log, api, srvOpts...)
	if err != nil {
		return err
	}
	m.InitializeGRPC(srv)
	if cfg.MetricsAddr != "" {
		var opts []metrics.HandlerOption
		if cfg.Pprof {
			opts = append(opts, metrics.WithPprof())
			log.Warn("serving Go profiles under /debug/pprof/ on the metrics listener", "addr", cfg.MetricsAddr)
		}
		ms, err := metrics.Listen(log.Named("metrics"), cfg.MetricsAddr, m, func() bool {
			select {
			case <-rec.Ready():
				return true
			default:
				return false
			}
		}, opts...)
		if err != nil {
			srv.Shutdown(0)
			return fmt.Errorf("metrics listener: %w", err)
		}
		metricsCtx, stopMetrics := context.WithCancel(context.WithoutCancel(ctx))
		metricsDone := make(chan struct{})
		go func() {
			defer close(metricsDone)
			if err := ms.Serve(metricsCtx); err != nil {
				log.Error("metrics listener", "error", err)
			}
		}()
		defer func() { stopMetrics(); <-metricsDone }()
	}

	recCtx, stopRec := context.WithCancel(context.WithoutCancel(ctx))
	recDone := make(chan error, 1)
	go func() { recDone <- rec.Run(recCtx) }()
	serveDone := make(chan error, 1)
	go func() { serveDone <- srv.Serve() }()

	var runErr error
	select {
	case <-rec.Ready():
		if holdReason != "" {
			// The first SyncServices is applied and saved: the state on
			// disk is the control plane's again.
			if err := removeMarker(cfg.StateDir); err != nil {
				log.Error("the first SyncServices is applied, but the recover marker stays; the next start needs --recover", "error", err)
			}
		}
		srv.MarkReady()
		log.Info("ready")
		select {
		case <-ctx.Done():
		case runErr = <-serveDone:
		}
	case <-ctx.Done():
	case runErr = <-serveDone:
	}

	log.Info("shutting down; the dataplane stays programmed")
	stopHub()
	srv.Shutdown(cfg.ShutdownTimeout)
	stopRec()
	<-recDone
	return runErr
}

func openDataplane(ctx context.Context, log hclog.Logger, cfg Config) (dataplane.Dataplane, error) {
	if cfg.NetNS != "" {
		h, err := netns.GetFromPath(cfg.NetNS)
		if err != nil {
			return nil, fmt.Errorf("open network namespace %s: %w", cfg.NetNS, err)
		}
		h.Close()
	}
	switch cfg.Dataplane {
	case DataplaneFake:
		log.Warn("using the fake dataplane: nothing is programmed into the kernel")
		return fake.New(), nil
	case DataplaneEBPF:
		return openEBPF(ctx, log, cfg)
	case DataplaneAuto:
		dp, err := openEBPF(ctx, log, cfg)
		if err != nil {
			log.Warn("auto falls back to the iptables dataplane: the eBPF dataplane cannot run here", "reason", err)
			return openIPTables(ctx, log, cfg)
		}
		log.Info("auto selected the eBPF dataplane")
		return dp, nil
	case DataplaneIPTables:
		return openIPTables(ctx, log, cfg)
	}
	return nil, fmt.Errorf("unknown dataplane %q; use auto, ebpf, iptables or fake", cfg.Dataplane)
}

func openIPTables(ctx context.Context, log hclog.Logger, cfg Config) (dataplane.Dataplane, error) {
	dp, err := iptables.New(ctx, log.Named("iptables"), iptables.Config{NetNS: cfg.NetNS, Mode: cmp.Or(cfg.IPTablesMode, iptables.ModeAuto), SetFlowSysctls: cfg.SetSysctls})
	if err != nil {
		return nil, fmt.Errorf("open iptables dataplane: %w", err)
	}
	log.Info("iptables dataplane ready", "mode", dp.Mode())
	return dp, nil
}

func openEBPF(ctx context.Context, log hclog.Logger, cfg Config) (dataplane.Dataplane, error) {
	ecfg := cfg.EBPF
	ecfg.NetNS = cfg.NetNS
	dp, err := ebpf.New(ctx, log.Named("ebpf"), ecfg)
	if err != nil {
		return nil, fmt.Errorf("open ebpf dataplane: %w", err)
	}
	return dp, nil
}
