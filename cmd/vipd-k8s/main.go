// Command vipd-k8s makes vipd a kube-proxy replacement on a node: it
// watches the cluster's Services and EndpointSlices and keeps vipd's
// services of owner "kubernetes" in step. "vipd-k8s version" prints the
// version. This file only parses flags; internal/kubeadapter does the work.
package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/kubeadapter"
	"github.com/vipd/vipd/internal/kubeconvert"
	"github.com/vipd/vipd/internal/logsetup"
	"github.com/vipd/vipd/internal/version"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

func main() {
	if err := rootCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "vipd-k8s:", err)
		os.Exit(1)
	}
}

func rootCommand() *cobra.Command {
	var (
		cfg               kubeadapter.Config
		caCert, cert, key string
		insecure          bool
		logLevel          string
		logJSON           bool
	)
	socket := client.SocketFromEnv()
	root := &cobra.Command{
		Use:   "vipd-k8s",
		Short: "vipd-k8s programs the node's vipd from the cluster's Services and EndpointSlices",
		Long: `vipd-k8s is a kube-proxy replacement: it watches Services and EndpointSlices
and keeps vipd's services of owner "kubernetes" equal to what kube-proxy would
program on this node. It never changes services of other owners. Stopping it
(SIGTERM, SIGINT) leaves vipd's services in place.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.NodeName == "" {
				return fmt.Errorf("--node-name is required (or set NODE_NAME)")
			}
			if errs := validation.IsValidLabelValue(cfg.ServiceProxyName); len(errs) > 0 {
				return fmt.Errorf("--service-proxy-name %q is not a label value: %s", cfg.ServiceProxyName, strings.Join(errs, "; "))
			}
			var err error
			if cfg.TLS, err = transport(cfg.VIPD, caCert, cert, key, insecure); err != nil {
				return err
			}
			log, err := logsetup.New("vipd-k8s", logLevel, logJSON)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			return kubeadapter.Serve(ctx, log, cfg)
		},
	}
	f := root.Flags()
	f.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: the in-cluster config)")
	f.StringVar(&cfg.NodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name: its endpoints are node-local (default: $NODE_NAME)")
	f.StringVar(&cfg.VIPD, "vipd", socket, "vipd's API: a Unix socket path, unix:///path, or tcp://host:port (env "+client.SocketEnv+" gives the default)")
	f.StringVar(&caCert, "cacert", "", "tcp:// --vipd: CA bundle (PEM) that vipd's certificate must chain to")
	f.StringVar(&cert, "cert", "", "tcp:// --vipd: this client's certificate (PEM)")
	f.StringVar(&key, "key", "", "tcp:// --vipd: this client's private key (PEM)")
	f.BoolVar(&insecure, "insecure", false, "tcp:// --vipd without TLS: only for a loopback address that vipd serves with --insecure-listen")
	f.StringVar(&cfg.ServiceProxyName, "service-proxy-name", "", "program only the Services labelled "+kubeconvert.ServiceProxyNameLabel+"=NAME, leaving the others to kube-proxy (default: what kube-proxy would program, the Services without that label)")
	f.BoolVar(&cfg.ZoneFromNode, "zone-from-node", true, "set vipd's topology zone from this node's "+corev1.LabelTopologyZone+" label, following its changes (needs get, list and watch on nodes; --zone-from-node=false leaves vipd's --zone alone)")
	f.DurationVar(&cfg.MinSyncPeriod, "min-sync-period", 0, "least time between the starts of two passes that change vipd; changes meanwhile are applied together (0: at once)")
	f.DurationVar(&cfg.FullSyncPeriod, "full-sync-period", kubeadapter.DefaultFullSyncPeriod, "send the full state (SyncServices) this often, repairing drift (0 disables)")
	f.StringVar(&cfg.HealthzAddress, "healthz-address", kubeadapter.DefaultHealthzAddress, "serve /healthz here (empty disables)")
	f.StringVar(&cfg.MetricsAddress, "metrics-address", kubeadapter.DefaultMetricsAddress, "serve Prometheus /metrics here (empty disables)")
	f.StringVar(&logLevel, "log-level", "info", "log level: trace, debug, info, warn or error")
	f.BoolVar(&logJSON, "log-json", false, "log JSON lines instead of text")
	root.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), version.String()) },
	})
	return root
}

// transport is the TLS configuration for target: mutual TLS from the three
// files, or nil for a Unix socket or an --insecure loopback address.
func transport(target, caCert, cert, key string, insecure bool) (*tls.Config, error) {
	tcp := strings.HasPrefix(target, "tcp://")
	anyTLS := caCert != "" || cert != "" || key != ""
	switch {
	case !tcp && (anyTLS || insecure):
		return nil, fmt.Errorf("--cacert, --cert, --key and --insecure apply to a tcp:// --vipd only")
	case !tcp:
		return nil, nil
	case insecure && anyTLS:
		return nil, fmt.Errorf("--insecure turns TLS off: drop it, or drop --cacert, --cert and --key")
	case insecure:
		host, _, err := net.SplitHostPort(strings.TrimPrefix(target, "tcp://"))
		if ip, perr := netip.ParseAddr(host); err != nil || host != "localhost" && (perr != nil || !ip.Unmap().IsLoopback()) {
			return nil, fmt.Errorf("--insecure is only for a loopback address, not %s", target)
		}
		return nil, nil
	case caCert == "" || cert == "" || key == "":
		return nil, fmt.Errorf("a tcp:// --vipd needs mutual TLS: set --cacert, --cert and --key (or --insecure for a loopback address)")
	}
	return client.TLSConfigFromFiles(caCert, cert, key)
}
