package kubeadapter

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/version"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Defaults of the vipd-k8s command.
const (
	// DefaultHealthzAddress is kube-proxy's healthz address.
	DefaultHealthzAddress = "0.0.0.0:10256"
	// DefaultMetricsAddress is kube-proxy's metrics address: loopback only.
	DefaultMetricsAddress = "127.0.0.1:10249"
)

var _ VIPD = (*client.Client)(nil)

// Config is what the vipd-k8s command sets.
type Config struct {
	// Kubeconfig is a kubeconfig file; empty uses the in-cluster config.
	Kubeconfig string
	// NodeName is this node's name (required).
	NodeName string
	// VIPD is vipd's target, as client.New takes it; TLS, when not nil,
	// secures a TCP target.
	VIPD string
	TLS  *tls.Config
	// MinSyncPeriod, FullSyncPeriod: see WithMinSyncPeriod, WithFullSyncPeriod.
	MinSyncPeriod, FullSyncPeriod time.Duration
	// ServiceProxyName, when not empty, makes the adapter the proxy of
	// that name: see WithServiceProxyName.
	ServiceProxyName string
	// ZoneFromNode sets vipd's zone from the node's
	// topology.kubernetes.io/zone label: see WithZoneFromNode.
	ZoneFromNode bool
	// HealthzAddress serves /healthz, MetricsAddress /metrics (host:port;
	// empty disables either).
	HealthzAddress, MetricsAddress string
}

// Serve runs the adapter as a process: the Kubernetes and vipd clients,
// the Adapter, and the /healthz and /metrics listeners, until ctx ends. It
// fails at once when a listener cannot be bound or a client cannot be
// built.
func Serve(ctx context.Context, log hclog.Logger, cfg Config) error {
	if cfg.NodeName == "" {
		return errors.New("node name is required")
	}
	restCfg, err := kubeConfig(cfg.Kubeconfig)
	if err != nil {
		return err
	}
	restCfg.UserAgent = "vipd-k8s/" + version.String()
	restCfg.ContentType = "application/vnd.kubernetes.protobuf"
	restCfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	kube, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	var copts []client.Option
	if cfg.TLS != nil {
		copts = append(copts, client.WithTLS(cfg.TLS))
	}
	vipd, err := client.New(cfg.VIPD, copts...)
	if err != nil {
		return err
	}
	defer vipd.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	opts := []Option{WithNodeName(cfg.NodeName), WithMinSyncPeriod(cfg.MinSyncPeriod), WithFullSyncPeriod(cfg.FullSyncPeriod),
		WithServiceProxyName(cfg.ServiceProxyName)}
	if cfg.ZoneFromNode {
		opts = append(opts, WithZoneFromNode())
	}
	a, err := New(log.Named("adapter"), kube, vipd, reg, opts...)
	if err != nil {
		return err
	}
	var servers []*http.Server
	var listeners []net.Listener
	closeAll := func() {
		for _, l := range listeners {
			l.Close()
		}
	}
	for _, s := range []struct {
		addr, path string
		h          http.Handler
	}{
		{cfg.HealthzAddress, "/healthz", a.Healthz()},
		{cfg.MetricsAddress, "/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})},
	} {
		if s.addr == "" {
			continue
		}
		l, err := net.Listen("tcp", s.addr)
		if err != nil {
			closeAll()
			return fmt.Errorf("listen for %s on %s: %w", s.path, s.addr, err)
		}
		mux := http.NewServeMux()
		mux.Handle(s.path, s.h)
		listeners = append(listeners, l)
		servers = append(servers, &http.Server{
			Handler:           mux,
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          log.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}),
		})
		log.Info("serving", "path", s.path, "addr", l.Addr().String())
	}
	var wg sync.WaitGroup
	for i, srv := range servers {
		wg.Go(func() {
			if err := srv.Serve(listeners[i]); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("http server failed", "addr", listeners[i].Addr().String(), "error", err)
			}
		})
	}
	log.Info("starting", "node", cfg.NodeName, "vipd", cfg.VIPD, "service_proxy_name", cfg.ServiceProxyName, "zone_from_node", cfg.ZoneFromNode, "version", version.String())
	runErr := a.Run(ctx)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	for _, srv := range servers {
		srv.Shutdown(sctx)
	}
	wg.Wait()
	return runErr
}

func kubeConfig(path string) (*rest.Config, error) {
	if path != "" {
		c, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
		return c, nil
	}
	c, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("in-cluster config (give --kubeconfig outside a cluster): %w", err)
	}
	return c, nil
}
