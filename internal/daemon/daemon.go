package daemon

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	sddaemon "github.com/coreos/go-systemd/v22/daemon"
	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane/ebpf"
	"github.com/vipd/vipd/dataplane/iptables"
	"github.com/vipd/vipd/dataplane/none"
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
	// Dataplane is auto, ebpf, iptables or none (fake is a deprecated
	// alias of none). Assemble's WithDataplane replaces it in tests.
	Dataplane string
	// NetNS, when set, is the network namespace to program instead of the
	// current one; health checks are made from it too.
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
	// ServicesDir, when set, is a directory of service files that vipd
	// applies, each file as the owner "file:<name>", and watches (see
	// internal/servicesdir); Reload rescans it.
	ServicesDir string
	// NodeName names this node for the Kubernetes manifests in ServicesDir
	// (their node-local endpoints); empty means the host name in lower case.
	NodeName string
	// Zone is this node's topology zone (vipd run --zone), for
	// topology-aware routing: services with traffic_distribution prefer
	// backends in it, and backends' for_zones hints are matched against
	// it. Empty: no zone, which no backend matches. The node's name for
	// for_nodes hints is NodeName. Check refuses one longer than 63
	// characters or with control characters.
	Zone string
	// NodePortAddresses, when set, are CIDRs: node ports are served only on
	// the node's addresses within them (vipd run --nodeport-addresses).
	// Empty: on every address of the node but loopback and IPv6
	// link-local. Check parses them.
	NodePortAddresses []string
	// ExternalInterfaces, when set, are path.Match globs of the interfaces
	// that traffic from outside the node arrives on (vipd run
	// --external-interfaces). Empty: the interfaces that hold a default
	// route. Check parses them.
	ExternalInterfaces []string
	// SNATPortRange, when set, is "MIN-MAX": the source ports the eBPF
	// dataplane masquerades external flows under policy Cluster to (vipd
	// run --snat-port-range; ebpf.Config.SNATPorts). It overrides
	// EBPF.SNATPorts. The iptables dataplane does not use it (MASQUERADE
	// picks ports itself): vipd warns. Check parses it.
	SNATPortRange string
	// Reload, when not nil, makes vipd read its TLS and authz files again
	// (Remote), and rescan ServicesDir, on every signal it receives;
	// cmd/vipd sends SIGHUP there.
	Reload <-chan os.Signal
}

// Memory tunes the Go garbage collector for the daemon. A zero GCPercent
// is DefaultGCPercent, unless the GOGC environment variable is set, which
// the runtime then follows; a zero Limit leaves the runtime's own (the
// GOMEMLIMIT environment variable) alone.
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

// DefaultGCPercent is the GC target vipd runs with when neither
// Memory.GCPercent nor GOGC sets one: half of Go's default of 100. Nearly
// all of vipd's heap is long-lived state (the services, their dataplane
// form, the dataplane's tables), so the collector rarely finds much to
// free, and at 100 it lets the heap reach twice that state before it
// runs: at 100,000 services with 10 backends, a sync or a restart peaked
// 30–40 MB higher than at 50, which costs a few percent more of a sync's
// time and about a tenth more of a restart's CPU.
const DefaultGCPercent = 50

// gcPercent is the GC target m sets: GCPercent, else DefaultGCPercent
// unless getenv says GOGC is set (zero: leave the runtime's).
func (m Memory) gcPercent(getenv func(string) string) int {
	switch {
	case m.GCPercent != 0:
		return m.GCPercent
	case getenv("GOGC") != "":
		return 0
	}
	return DefaultGCPercent
}

// apply sets the runtime's knobs that m configures.
func (m Memory) apply(log hclog.Logger) {
	pct := m.gcPercent(os.Getenv)
	if pct != 0 {
		debug.SetGCPercent(pct)
	}
	if m.Limit > 0 {
		debug.SetMemoryLimit(m.Limit)
	}
	log.Debug("go runtime memory", "gc_percent", pct, "limit", debug.SetMemoryLimit(-1))
}

// Dataplane names accepted by Config.Dataplane.
const (
	DataplaneAuto     = "auto"
	DataplaneEBPF     = "ebpf"
	DataplaneIPTables = "iptables"
	DataplaneNone     = none.Name
	// DataplaneFake is the name that DataplaneNone had; it is accepted,
	// with a warning, for one release, and means DataplaneNone.
	//
	// Deprecated: use DataplaneNone.
	DataplaneFake = "fake"
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
//
// Run is Assemble (which checks cfg first), Start, a wait for ctx to end or
// the gRPC server to fail, and Stop; see Node for the order of each.
//
// Under systemd (Type=notify: NOTIFY_SOCKET is set) Run tells the service
// manager READY=1 once the node is ready (health SERVING), and STOPPING=1
// when it begins to shut down; without NOTIFY_SOCKET it sends nothing.
func Run(ctx context.Context, log hclog.Logger, cfg Config) error {
	n, err := Assemble(ctx, log, cfg)
	if err != nil {
		return err
	}
	n.Start(ctx)
	select {
	case <-n.Ready():
		sdNotify(log, sddaemon.SdNotifyReady)
		select {
		case <-ctx.Done():
		case <-n.Done():
		}
	case <-ctx.Done():
	case <-n.Done():
	}
	sdNotify(log, sddaemon.SdNotifyStopping)
	return n.Stop()
}

// sdNotify sends state to the service manager, if NOTIFY_SOCKET names
// one. NOTIFY_SOCKET is kept, for the messages that follow. A failure is
// only logged: systemd then times the start out, which says more.
func sdNotify(log hclog.Logger, state string) {
	sent, err := sddaemon.SdNotify(false, state)
	switch {
	case err != nil:
		log.Warn("notify the service manager", "state", state, "error", err)
	case sent:
		log.Debug("notified the service manager", "state", state)
	}
}
