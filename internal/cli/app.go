package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/vipd/vipd/client"
	"google.golang.org/grpc"
)

// Environment variables that give --server, --cacert, --cert and --key
// their defaults.
const (
	ServerEnv = "VIPD_SERVER"
	CACertEnv = "VIPD_CACERT"
	CertEnv   = "VIPD_CERT"
	KeyEnv    = "VIPD_KEY"
)

// DefaultTimeout is the default of --timeout: how long each call to vipd
// may take, retries included, before vipctl gives up.
const DefaultTimeout = 5 * time.Second

// Streams are the standard streams of a run.
type Streams struct {
	In       io.Reader
	Out, Err io.Writer
}

// App is one run of vipctl: the command tree with its flag values.
type App struct {
	streams Streams
	root    *cobra.Command

	socket  string
	server  string
	output  string
	timeout time.Duration

	// Mutual TLS for --server: the CA that signed vipd's certificate, and
	// the client's certificate and key; or plaintext to loopback.
	caCert, cert, key string
	insecure          bool

	// ran is set when cobra has accepted the command line and runs a
	// command; errors before that are usage errors.
	ran bool

	// endpoint is the vipd that dial connected to, for errors, and
	// prober finds out, within each call's deadline, why it did not answer.
	endpoint endpoint
	prober   *prober
}

// New builds vipctl's command tree, reading client.SocketEnv for the
// default of --socket. An App runs once.
func New(s Streams) *App {
	a := &App{streams: s}
	socket := client.SocketFromEnv()
	root := &cobra.Command{
		Use:   "vipctl",
		Short: "Control vipd, the node's service load balancer",
		Long: `vipctl controls vipd, the node's service load balancer, through its gRPC API.

Every change returns only once the kernel has applied it, and a change that
fails changes nothing. Output is a table by default; -o json and -o yaml print
vipd's answers in the API's form, which "vipctl apply -f" reads back.

Environment:
  ` + client.SocketEnv + `  the default of --socket
  ` + ServerEnv + `  the default of --server
  ` + CACertEnv + `, ` + CertEnv + `, ` + KeyEnv + `  the defaults of --cacert, --cert, --key

vipd's Unix socket needs no credentials: its file mode and group decide who
may connect. Over TCP (vipd --listen), vipd requires mutual TLS: give
--server with --cacert, --cert and --key.

` + exitCodesHelp,
		SilenceErrors: true,
		SilenceUsage:  true,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			if !slices.Contains(outputFormats, a.output) {
				return usageErrorf("unknown output format %q (want %s)", a.output, strings.Join(outputFormats, ", "))
			}
			return nil
		},
	}
	var showVersion bool
	root.Flags().BoolVar(&showVersion, "version", false, `show vipctl's version, as "vipctl version --client" does`)
	root.RunE = a.run(func(ctx context.Context, _ []string) error {
		if showVersion {
			return a.showVersion(ctx, true)
		}
		return root.Help()
	})
	root.SetIn(s.In)
	root.SetOut(s.Out)
	root.SetErr(s.Err)
	f := root.PersistentFlags()
	f.StringVar(&a.socket, "socket", socket, "vipd's Unix socket (env "+client.SocketEnv+")")
	f.StringVar(&a.server, "server", os.Getenv(ServerEnv), "vipd's TCP address, [tcp://]host:port, instead of --socket; needs --cacert, --cert and --key (env "+ServerEnv+")")
	f.StringVar(&a.caCert, "cacert", os.Getenv(CACertEnv), "--server: CA bundle (PEM) that vipd's certificate must chain to (env "+CACertEnv+")")
	f.StringVar(&a.cert, "cert", os.Getenv(CertEnv), "--server: this client's certificate (PEM), which vipd verifies (env "+CertEnv+")")
	f.StringVar(&a.key, "key", os.Getenv(KeyEnv), "--server: this client's private key (PEM) (env "+KeyEnv+")")
	f.BoolVar(&a.insecure, "insecure", false, "--server without TLS: only for a loopback address that vipd serves with --insecure-listen")
	f.StringVarP(&a.output, "output", "o", outputTable, "output format: "+strings.Join(outputFormats, ", "))
	f.DurationVar(&a.timeout, "timeout", DefaultTimeout, "deadline of each call to vipd, retries included (for flows --follow, of the start of the stream); 0 for none")
	root.MarkFlagsMutuallyExclusive("socket", "server")

	root.AddCommand(
		a.serviceCommand(),
		a.applyCommand(),
		a.backendsCommand(),
		a.statusCommand(),
		a.flowsCommand(),
		a.explainCommand(),
		a.nodeCommand(),
		a.versionCommand(),
	)
	a.root = root
	return a
}

// Command is the root command, for documentation generators and completion.
func (a *App) Command() *cobra.Command { return a.root }

// Run runs the command line args (without the program name), writes any
// error to the error stream, and returns the exit code.
func (a *App) Run(ctx context.Context, args []string) int {
	a.root.SetArgs(args)
	cmd, err := a.root.ExecuteContextC(ctx)
	if err == nil {
		return ExitOK
	}
	var usage *usageError
	if !a.ran && !errors.As(err, &usage) {
		err = &usageError{err: err}
	}
	writeError(a.streams.Err, err)
	if errors.As(err, &usage) && cmd != nil {
		fmt.Fprintf(a.streams.Err, "Run '%s --help' for usage.\n", cmd.CommandPath())
	}
	return ExitCode(err)
}

// run adapts a command's body to cobra, marking that the command line was
// accepted.
func (a *App) run(body func(ctx context.Context, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		a.ran = true
		return body(cmd.Context(), args)
	}
}

// group is a command that only holds subcommands; run without one, it is a
// usage error.
func (a *App) group(cmd *cobra.Command, subs ...*cobra.Command) *cobra.Command {
	cmd.AddCommand(subs...)
	cmd.Args = cobra.NoArgs
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		var names []string
		for _, c := range cmd.Commands() {
			names = append(names, c.Name())
		}
		return usageErrorf("%s needs a subcommand: %s", cmd.CommandPath(), strings.Join(names, ", "))
	}
	return cmd
}

// printer writes to standard output in the -o format.
func (a *App) printer() printer {
	return printer{w: a.streams.Out, format: a.output}
}

// dial connects to vipd as the global flags say. The caller closes the client.
func (a *App) dial() (*client.Client, error) {
	a.prober = &prober{ep: &a.endpoint, timeout: a.timeout}
	opts := []client.Option{client.WithTimeout(a.timeout),
		client.WithDialOptions(grpc.WithChainUnaryInterceptor(a.prober.unary), grpc.WithChainStreamInterceptor(a.prober.stream))}
	// An explicit --socket wins over a --server that comes from the
	// environment (the flags themselves exclude each other).
	useServer := a.server != "" && !a.root.PersistentFlags().Changed("socket")
	var target string
	switch {
	case a.root.PersistentFlags().Changed("server") && a.server == "":
		return nil, usageErrorf("--server is empty: give vipd's address, [tcp://]host:port, or leave the flag out for --socket")
	case !useServer && a.socket == "":
		return nil, usageErrorf("--socket is empty: give the path of vipd's socket (default %s)", client.DefaultSocket)
	}
	if useServer {
		target = a.server
		tlsOpts, err := a.transport()
		if err != nil {
			return nil, err
		}
		opts = append(opts, tlsOpts...)
	} else {
		for _, flag := range []string{"cacert", "cert", "key", "insecure"} {
			if a.root.PersistentFlags().Changed(flag) {
				return nil, usageErrorf("--%s applies to --server only; the Unix socket needs no credentials", flag)
			}
		}
		target = a.socket
		// A relative path is made absolute here, where the working
		// directory is the user's; client.New takes absolute paths only.
		if !strings.HasPrefix(target, "unix:") && !strings.HasPrefix(target, "unix-abstract:") {
			abs, err := filepath.Abs(target)
			if err != nil {
				return nil, usageErrorf("--socket %s: %w", target, err)
			}
			target = abs
		}
	}
	c, err := client.New(target, opts...)
	if err != nil {
		return nil, &usageError{err: err}
	}
	a.endpoint = endpointOf(target)
	a.endpoint.tls = useServer && !a.insecure
	return c, nil
}

// transport returns the client options that secure the --server connection:
// mutual TLS from --cacert, --cert and --key, or, with --insecure, nothing,
// for a loopback address only.
func (a *App) transport() ([]client.Option, error) {
	if a.insecure {
		if a.caCert != "" || a.cert != "" || a.key != "" {
			return nil, usageErrorf("--insecure turns TLS off: drop it, or drop --cacert, --cert and --key")
		}
		if host, ok := serverHost(a.server); ok && !loopbackHost(host) {
			return nil, usageErrorf("--insecure is only for a loopback address (127.0.0.1, [::1], localhost), not %s: use --cacert, --cert and --key", host)
		}
		return nil, nil
	}
	var missing []string
	for _, f := range []struct{ flag, value string }{{"--cacert", a.caCert}, {"--cert", a.cert}, {"--key", a.key}} {
		if f.value == "" {
			missing = append(missing, f.flag)
		}
	}
	if len(missing) > 0 {
		return nil, usageErrorf("--server needs mutual TLS: set %s (or --insecure for a plaintext loopback address)", strings.Join(missing, ", "))
	}
	cfg, err := client.TLSConfigFromFiles(a.caCert, a.cert, a.key)
	if err != nil {
		return nil, usageErrorf("%w", err)
	}
	return []client.Option{client.WithTLS(cfg)}, nil
}

// serverHost is the host of a --server value, [tcp://]host:port.
func serverHost(server string) (string, bool) {
	host, _, err := net.SplitHostPort(strings.TrimPrefix(server, "tcp://"))
	return host, err == nil
}

func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// withClient runs f with a client for vipd, and closes it. When f fails
// because vipd could not be reached, the error says so in one line, with
// the address and the cause.
func (a *App) withClient(f func(*client.Client) error) error {
	c, err := a.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	return a.endpoint.diagnose(f(c), a.timeout, a.prober)
}
