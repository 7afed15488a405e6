// Command vipd is the per-node service load-balancer daemon. "vipd run" (the
// default) serves the vipd.v1 API and programs the kernel, and reloads its
// TLS and authz files and rescans its services directory on SIGHUP; "vipd version" prints the version. This
// file only parses flags; internal/daemon does the work.
package main

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"
	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/dataplane/ebpf"
	"github.com/vipd/vipd/dataplane/ebpf/maglev"
	"github.com/vipd/vipd/dataplane/iptables"
	"github.com/vipd/vipd/internal/configfile"
	"github.com/vipd/vipd/internal/daemon"
	"github.com/vipd/vipd/internal/envflag"
	"github.com/vipd/vipd/internal/logsetup"
	"github.com/vipd/vipd/internal/metrics"
	"github.com/vipd/vipd/internal/version"
	"github.com/vipd/vipd/server"
	"github.com/vipd/vipd/server/flowhub"
	"github.com/vipd/vipd/server/validation"
)

func main() {
	if err := rootCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "vipd:", err)
		os.Exit(1)
	}
}

// envPrefix prefixes the environment variables that set vipd's flags:
// VIPD_MAX_SERVICES sets --max-services.
const envPrefix = "VIPD"

// defaultStateDir is where vipd run keeps its state, and where vipd cleanup
// looks for a running vipd's lock.
const defaultStateDir = "/var/lib/vipd"

// defaultSocket is where vipd run serves its API, and where vipd cleanup
// asks whether a vipd runs.
const defaultSocket = "/run/vipd/vipd.sock"

func rootCommand() *cobra.Command {
	run := runCommand()
	root := &cobra.Command{
		Use:           "vipd",
		Short:         "vipd programs the kernel to load-balance service VIPs to backends",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE:          run.RunE,
		Version:       version.String(),
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.Flags().AddFlagSet(run.Flags())
	root.AddCommand(run, cleanupCommand(), &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), version.String()) },
	})
	return root
}

func runCommand() *cobra.Command {
	var (
		cfg          daemon.Config
		cidrs        []string
		logLevel     string
		logJSON      bool
		socketMode   string
		iptablesMode string
		memoryLimit  string
		configPath   string
	)
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the daemon (the default)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// First, so that a SIGHUP during the start does not kill vipd.
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			cfg.Reload = hup
			// Precedence: the command line, then VIPD_<FLAG>, then the
			// file; each sets only what the ones before it left unset.
			if err := envflag.Apply(cmd.Flags(), envPrefix, os.LookupEnv); err != nil {
				return err
			}
			if configPath != "" {
				if err := configfile.Apply(cmd.Flags(), configPath, "config"); err != nil {
					return err
				}
			}
			for _, c := range cidrs {
				p, err := netip.ParsePrefix(c)
				if err != nil {
					return fmt.Errorf("--service-cidr %q: %w", c, err)
				}
				cfg.ServiceCIDRs = append(cfg.ServiceCIDRs, p.Masked())
			}
			if socketMode != "" { // else daemon's default: 0600, or 0660 with --socket-group
				mode, err := strconv.ParseUint(socketMode, 8, 32)
				if err != nil || mode == 0 {
					return fmt.Errorf("--socket-mode %q: want a nonzero octal file mode such as 0600 or 0660", socketMode)
				}
				cfg.SocketMode = os.FileMode(mode)
			}
			var err error
			if cfg.Memory.Limit, err = daemon.ParseSize(memoryLimit); err != nil {
				return fmt.Errorf("--memory-limit: %w", err)
			}
			if cfg.IPTablesMode, err = iptables.ParseMode(iptablesMode); err != nil {
				return err
			}
			log, err := logsetup.New("vipd", logLevel, logJSON)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			return daemon.Run(ctx, log, cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&configPath, "config", "", "YAML file of flag settings (max-services: 1000; lists for repeatable flags); the command line and VIPD_<FLAG> win over it, and an unknown key refuses start")
	f.StringVar(&cfg.Socket, "socket", client.DefaultSocket, "Unix socket to serve the API on")
	f.StringVar(&socketMode, "socket-mode", "", "file mode of the Unix socket, in octal; others may have no permission (default 0600, or 0660 with --socket-group)")
	f.StringVar(&cfg.SocketGroup, "socket-group", "", "group (name or GID) that owns the Unix socket, so that its members may connect (default: vipd's own group)")
	f.StringVar(&cfg.Remote.Listen, "listen", "", "also serve the API on tcp://HOST:PORT (in vipd's own network namespace); needs --tls-cert, --tls-key and --tls-client-ca")
	f.StringVar(&cfg.Remote.TLSCert, "tls-cert", "", "--listen: the server's certificate (PEM)")
	f.StringVar(&cfg.Remote.TLSKey, "tls-key", "", "--listen: the server's private key (PEM)")
	f.StringVar(&cfg.Remote.TLSClientCA, "tls-client-ca", "", "--listen: CA bundle (PEM) that every client certificate must chain to (mutual TLS)")
	f.BoolVar(&cfg.Remote.InsecureListen, "insecure-listen", false, "--listen in plaintext, without TLS; refused unless the address is loopback (tests only)")
	f.StringVar(&cfg.Remote.AuthzFile, "authz-file", "", "YAML map of client identity (certificate URI SAN, else CN) to the owners it may change, or \"*\"; without it every TCP client may change every owner")
	f.Uint32Var(&cfg.Limits.MaxConcurrentStreams, "max-concurrent-streams", server.DefaultMaxConcurrentStreams, "calls one client connection may have open at once; more wait for one to end (0: no limit)")
	f.IntVar(&cfg.Limits.MaxInflightRequests, "max-inflight-requests", server.DefaultMaxInflightRequests, "unary calls in progress over all clients; one more gets ResourceExhausted at once (health checks and GetStatus are not counted; 0: no limit)")
	f.IntVar(&cfg.Limits.MaxFlowWatchers, "max-flow-watchers", server.DefaultMaxFlowWatchers, "WatchFlows streams open at once over all clients; one more gets ResourceExhausted (0: no limit)")
	f.BoolVar(&cfg.Recover, "recover", false, "start over an unreadable state file: move it aside, keep the kernel's rules, and apply nothing until the first SyncServices")
	f.StringVar(&cfg.StateDir, "state-dir", defaultStateDir, "directory that persists the desired state")
	f.StringVar(&cfg.Dataplane, "dataplane", daemon.DataplaneAuto, "dataplane: auto, ebpf, iptables or none (none programs nothing; for control-plane tests and demos; fake, deprecated, means none)")
	f.StringVar(&cfg.NetNS, "netns", "", "program the network namespace at this path instead of the current one")
	f.IntVar(&cfg.MaxBackends, "max-backends", validation.DefaultMaxBackends, "most backends one service may have (0: no limit)")
	f.IntVar(&cfg.MaxPorts, "max-ports", validation.DefaultMaxPorts, "most ports one service may have (0: no limit)")
	f.IntVar(&cfg.MaxServices, "max-services", validation.DefaultMaxServices, "most services in all, of every owner (0: no limit)")
	f.IntVar(&cfg.MaxTotalBackends, "max-total-backends", validation.DefaultMaxTotalBackends, "most backends in all, summed over every service (0: no limit)")
	f.StringSliceVar(&cidrs, "service-cidr", nil, "allowed VIP range (repeatable); unset allows any unicast VIP")
	f.IntVar(&cfg.MaxRecvMsgSize, "max-recv-msg-size", server.DefaultMaxRecvMsgSize, "largest request accepted, in bytes (0: no limit)")
	f.DurationVar(&cfg.ResyncPeriod, "resync-period", time.Hour, "diff the whole state against the kernel this often, repairing drift (0 disables)")
	f.DurationVar(&cfg.DriftCheckPeriod, "drift-check-period", 5*time.Second, "check this often that the kernel still holds vipd's hooks, chains, programs and maps (repairing any loss with a full sync at once) and that the node's prerequisites hold (0 disables)")
	f.BoolVar(&cfg.SetSysctls, "set-sysctls", false, "set the sysctls vipd needs (IP forwarding, conntrack accounting and events) instead of only warning that they are unset")
	f.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "how long SIGTERM waits for calls in flight (0: stop at once)")
	f.StringVar(&iptablesMode, "iptables-mode", "auto", "iptables binaries: auto, nft or legacy (auto logs its choice)")
	f.StringVar(&cfg.EBPF.BPFFS, "bpffs", ebpf.DefaultBPFFS, "ebpf: directory for pinned maps and links (a bpffs is mounted there if needed)")
	f.StringVar(&cfg.EBPF.CgroupPath, "cgroup-path", "", "ebpf: cgroup v2 directory for the socket hooks (default: the root of a cgroup2 mount at "+ebpf.DefaultCgroupMount+", mounted if absent)")
	f.StringSliceVar(&cfg.EBPF.PodInterfaces, "pod-interfaces", ebpf.DefaultPodInterfaces, "ebpf: glob patterns of host-side pod interfaces to attach the tc programs to")
	f.StringVar(&cfg.EBPF.TCAttach, "tc-attach", ebpf.TCAttachAuto, "ebpf: how tc programs attach: auto (tcx where the kernel has it, else clsact), tcx or clsact")
	f.Uint32Var(&cfg.EBPF.MaglevTableSize, "maglev-table-size", maglev.DefaultTableSize, "ebpf: smallest Maglev table size (a prime >= 3; grown to a prime >= 100 x backends)")
	f.Uint32Var(&cfg.EBPF.Maps.LB, "bpf-lb-map-max", ebpf.DefaultMapSizes.LB, "ebpf: entries of the service and member maps (a frontend takes 1 + its eligible backends)")
	f.Uint32Var(&cfg.EBPF.Maps.Backends, "bpf-backend-map-max", ebpf.DefaultMapSizes.Backends, "ebpf: distinct backend address:port pairs")
	f.Uint32Var(&cfg.EBPF.Maps.Conntrack, "bpf-ct-map-max", ebpf.DefaultMapSizes.Conntrack, "ebpf: conntrack entries (two per flow; LRU)")
	f.Uint32Var(&cfg.EBPF.Maps.Affinity, "bpf-affinity-map-max", ebpf.DefaultMapSizes.Affinity, "ebpf: session-affinity entries (LRU)")
	f.Uint32Var(&cfg.EBPF.Maps.Sockets, "bpf-sock-map-max", ebpf.DefaultMapSizes.Sockets, "ebpf: node-local UDP socket translations (LRU; TCP ones live in socket storage)")
	f.DurationVar(&cfg.EBPF.ConntrackTimeouts.TCPSyn, "bpf-ct-timeout-tcp-syn", ebpf.DefaultConntrackTimeouts.TCPSyn, "ebpf: conntrack lifetime of a TCP flow not answered yet (positive)")
	f.DurationVar(&cfg.EBPF.ConntrackTimeouts.TCPEstablished, "bpf-ct-timeout-tcp", ebpf.DefaultConntrackTimeouts.TCPEstablished, "ebpf: conntrack lifetime of an idle established TCP flow (positive)")
	f.DurationVar(&cfg.EBPF.ConntrackTimeouts.TCPClose, "bpf-ct-timeout-tcp-close", ebpf.DefaultConntrackTimeouts.TCPClose, "ebpf: conntrack lifetime of a TCP flow after FIN or RST (positive)")
	f.DurationVar(&cfg.EBPF.ConntrackTimeouts.Other, "bpf-ct-timeout-other", ebpf.DefaultConntrackTimeouts.Other, "ebpf: conntrack lifetime of an idle UDP or SCTP flow (positive)")
	f.DurationVar(&cfg.EBPF.GCInterval, "bpf-ct-gc-interval", 30*time.Second, "ebpf: how often expired conntrack entries are collected (and reported closed); positive")
	f.Uint32Var(&cfg.EBPF.Maps.Events, "bpf-events-map-max", ebpf.DefaultMapSizes.Events, "ebpf: bytes of the flow-event ring buffer (a power of two, at least the page size)")
	f.IntVar(&cfg.FlowBuffer, "flow-buffer", flowhub.DefaultBuffer, "events buffered per WatchFlows subscriber (at least 1); a slower subscriber loses events and is told how many")
	f.StringVar(&cfg.MetricsAddr, "metrics-addr", metrics.DefaultAddr, "serve /metrics, /healthz and /readyz here (empty disables)")
	f.BoolVar(&cfg.Pprof, "pprof", false, "also serve Go profiles (net/http/pprof) under /debug/pprof/ on --metrics-addr; no authentication, so keep that address on loopback")
	f.IntVar(&cfg.Memory.GCPercent, "gc-percent", 0, "Go GC target (GOGC): heap growth in percent of the live heap before a collection; lower trades CPU for memory (0: vipd's default of 50, or GOGC's setting when that is set; negative turns it off, which needs a memory limit)")
	f.StringVar(&memoryLimit, "memory-limit", "0", "soft limit on the Go runtime's memory (GOMEMLIMIT), in bytes or with KiB, MiB or GiB: the GC works harder near it and never fails on it (0 keeps GOMEMLIMIT's setting)")
	f.StringVar(&cfg.ServicesDir, "services-dir", "", "apply every *.yaml, *.yml and *.json file in this directory (the format of vipctl apply -f), each as owner file:<name>, and watch it; SIGHUP rescans it")
	f.StringSliceVar(&cfg.NodePortAddresses, "nodeport-addresses", nil, "serve node ports only on the node's addresses within these CIDRs (repeatable); unset: every address of the node but loopback and IPv6 link-local")
	f.StringSliceVar(&cfg.ExternalInterfaces, "external-interfaces", nil, "globs of the interfaces that traffic from outside the node arrives on (external traffic policy, masquerade); unset: the interfaces that hold a default route")
	f.StringVar(&cfg.SNATPortRange, "snat-port-range", "", "ebpf: MIN-MAX, the source ports external flows under policy Cluster are masqueraded to (less ip_local_port_range; default 1024-65535); the iptables dataplane ignores it (MASQUERADE picks ports) and warns")
	f.StringVar(&cfg.NodeName, "node-name", "", "this node's name, for the node-local endpoints of Kubernetes EndpointSlices in --services-dir and the backends' for_nodes hints (default: the host name, in lower case)")
	f.StringVar(&cfg.Zone, "zone", "", "this node's topology zone: services with a traffic_distribution prefer backends in it, and backends' for_zones hints are matched against it (unset: no zone, so no zone preference applies)")
	f.StringVar(&logLevel, "log-level", "info", "log level: trace, debug, info, warn or error")
	f.BoolVar(&logJSON, "log-json", false, "log JSON lines instead of text")
	return cmd
}

func cleanupCommand() *cobra.Command {
	var netnsPath, bpffs, stateDir, socket string
	var force bool
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Remove every rule, hook and chain vipd programmed (refused while vipd runs)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := envflag.Apply(cmd.Flags(), envPrefix, os.LookupEnv); err != nil {
				return err
			}
			log := hclog.New(&hclog.LoggerOptions{Name: "vipd", Output: os.Stderr})
			release, err := daemon.GuardCleanup(cmd.Context(), log, stateDir, socket)
			var inUse *daemon.StateDirInUseError
			var serving *daemon.SocketInUseError
			switch {
			case (errors.As(err, &inUse) || errors.As(err, &serving)) && force:
				defer release()
				log.Warn("--force: cleaning up the dataplane of a running vipd; the running vipd will reprogram it within --drift-check-period; stop it first",
					"running", err)
			case errors.As(err, &inUse) || errors.As(err, &serving):
				release()
				return fmt.Errorf("refusing to clean up: %w; cleanup would remove the rules it serves. Stop it first, or pass --force", err)
			case err != nil:
				return err
			default:
				defer release()
			}
			return daemon.Cleanup(cmd.Context(), log, netnsPath, bpffs)
		},
	}
	cmd.Flags().StringVar(&netnsPath, "netns", "", "clean the network namespace at this path instead of the current one")
	cmd.Flags().StringVar(&bpffs, "bpffs", ebpf.DefaultBPFFS, "the eBPF dataplane's pin directory to clean")
	cmd.Flags().StringVar(&stateDir, "state-dir", defaultStateDir, "state directory of the vipd whose rules these are; cleanup refuses while a vipd holds its lock (and logs when it has none)")
	cmd.Flags().StringVar(&socket, "socket", defaultSocket, "API socket of the vipd whose rules these are; cleanup refuses while a vipd answers health checks there")
	cmd.Flags().BoolVar(&force, "force", false, "clean up even while a vipd holds the state directory's lock or answers on --socket (it will reprogram its rules within --drift-check-period: stop it first)")
	return cmd
}
