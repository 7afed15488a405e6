package metrics

import (
	"net/http"
	"runtime"
	"sync"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/internal/version"
	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"
)

// Sync kinds, the values of vipd_sync_duration_seconds' kind label. They
// match reconcile.SyncFull and reconcile.SyncPartial.
const (
	SyncFull    = "full"
	SyncPartial = "partial"
)

// Sources of lost flow events, the values of
// vipd_flow_events_lost_total's source label.
const (
	// LostKernel counts events the kernel dropped before vipd read them
	// (ring buffer or netlink overrun).
	LostKernel = "kernel"
	// LostSubscriber counts events a WatchFlows subscriber missed because
	// its own buffer was full.
	LostSubscriber = "subscriber"
)

// durationBuckets spans 100µs (an incremental eBPF apply) to about 13s (an
// iptables-restore of a very large state), doubling each step.
var durationBuckets = prometheus.ExponentialBuckets(0.0001, 2, 18)

// Metrics holds every vipd metric in its own registry. Its methods are safe
// for concurrent use. Create it with New.
type Metrics struct {
	reg *prometheus.Registry

	syncDuration *prometheus.HistogramVec
	programming  prometheus.Histogram
	services     prometheus.Gauge
	backends     prometheus.Gauge
	syncErrors   prometheus.Counter
	flows        *prometheus.CounterVec
	lost         *prometheus.CounterVec
	active       *prometheus.GaugeVec
	driftRepairs *prometheus.CounterVec
	health       *prometheus.GaugeVec
	checks       *prometheus.CounterVec
	grpc         *grpcprom.ServerMetrics
	dirErrors    *prometheus.GaugeVec

	dirMu     sync.Mutex
	dirSeries map[[2]string]bool // the vipd_services_dir_errors series set

	// activeCount mirrors vipd_active_flows so that a CLOSED event whose
	// NEW was never seen (a flow older than vipd, or a lost NEW) cannot
	// drive the gauge below zero.
	mu          sync.Mutex
	activeCount map[string]int64
}

// New returns Metrics with every family registered on a fresh registry,
// together with the Go runtime and process collectors, and build info for
// this binary.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		syncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "vipd_sync_duration_seconds",
			Help:    "How long one dataplane apply took, failed ones included. kind is full (no change hint: initial apply, resync) or partial (a change).",
			Buckets: durationBuckets,
		}, []string{"kind"}),
		programming: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "vipd_network_programming_duration_seconds",
			Help:    "Time from an RPC's change reaching the reconciler to the end of the dataplane apply that made it live, per change.",
			Buckets: durationBuckets,
		}),
		services: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vipd_services",
			Help: "Services in the state the dataplane last applied.",
		}),
		backends: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vipd_backends",
			Help: "Backends, over all services, in the state the dataplane last applied.",
		}),
		syncErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vipd_sync_errors_total",
			Help: "Dataplane applies that failed (the previous state stayed in force).",
		}),
		flows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_flows_total",
			Help: "Flow events through a VIP, by service and event (new, closed).",
		}, []string{"service", "event"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_flow_events_lost_total",
			Help: "Flow events lost, by source: kernel (ring buffer or netlink overrun) or subscriber (a WatchFlows client's buffer was full).",
		}, []string{"source"}),
		active: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vipd_active_flows",
			Help: "Flows through a VIP that vipd saw open and not yet closed, by service.",
		}, []string{"service"}),
		driftRepairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_dataplane_drift_repairs_total",
			Help: "Full syncs that repaired the dataplane after its drift check found something missing or altered in the kernel (another tool removed a hook, chain, program or map), by dataplane and what was found (one increment per kind per repair).",
		}, []string{"dataplane", "what"}),
		dirErrors: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vipd_services_dir_errors",
			Help: "Files of the services directory (--services-dir) that vipd could not apply, one series of value 1 per file: file is its name (the directory's path when the directory itself cannot be read), field the field of its first error (empty for the file as a whole). The file's last good version stays in force. No series: no errors.",
		}, []string{"file", "field"}),
		dirSeries: map[[2]string]bool{},
		health: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vipd_backend_health",
			Help: "Health of each backend that active health checks probe, by service and backend: 1 passing (or no result yet, treated as passing), 0 failing (programmed as NOT_SERVING).",
		}, []string{"service", "backend"}),
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_health_checks_total",
			Help: "Finished active health checks, by result (pass, fail).",
		}, []string{"result"}),
		grpc:        grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram()),
		activeCount: map[string]int64{},
	}
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "vipd_build_info",
		Help:        "Always 1; the labels say which vipd build is running.",
		ConstLabels: prometheus.Labels{"version": version.String(), "goversion": runtime.Version()},
	})
	buildInfo.Set(1)
	m.reg.MustRegister(
		m.syncDuration, m.programming, m.services, m.backends, m.syncErrors,
		m.flows, m.lost, m.active, m.driftRepairs, m.dirErrors, m.health, m.checks, m.grpc, buildInfo,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	// Series that exist from the start, so that rate() and absent() work
	// before the first event of each kind.
	m.syncDuration.WithLabelValues(SyncFull)
	m.syncDuration.WithLabelValues(SyncPartial)
	m.lost.WithLabelValues(LostKernel)
	m.lost.WithLabelValues(LostSubscriber)
	m.checks.WithLabelValues("pass")
	m.checks.WithLabelValues("fail")
	return m
}

// InitDataplane creates the zero-valued vipd_dataplane_drift_repairs_total
// series of the dataplane named name, one per kind of drift it reports
// (dataplane.DriftDetector.DriftKinds), so that increase() and alerts work
// before the first repair. Other kinds get their series at their first
// repair.
func (m *Metrics) InitDataplane(name string, driftKinds []string) {
	for _, what := range driftKinds {
		m.driftRepairs.WithLabelValues(name, what)
	}
}

// Registry returns the registry that holds every metric, for tests and for
// adding collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition formats.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// ObserveSync records one dataplane apply of the given kind (SyncFull or
// SyncPartial) and counts it as an error when err is not nil. It implements
// reconcile.Observer.
func (m *Metrics) ObserveSync(kind string, d time.Duration, err error) {
	m.syncDuration.WithLabelValues(kind).Observe(d.Seconds())
	if err != nil {
		m.syncErrors.Inc()
	}
}

// ObserveProgramming records one change's time from RPC receipt to kernel
// applied. It implements reconcile.Observer.
func (m *Metrics) ObserveProgramming(d time.Duration) {
	m.programming.Observe(d.Seconds())
}

// SetState records the size of the applied state. It implements
// reconcile.Observer.
func (m *Metrics) SetState(services, backends int) {
	m.services.Set(float64(services))
	m.backends.Set(float64(backends))
}

// ObserveDriftRepair counts one repair of drift of kind what in the
// dataplane named dp. It implements reconcile.Observer.
func (m *Metrics) ObserveDriftRepair(dp, what string) {
	m.driftRepairs.WithLabelValues(dp, what).Inc()
}

// SetServicesDirErrors makes vipd_services_dir_errors hold exactly one
// series per entry of fields, a file in error mapped to the field of its
// first error. Series of files no longer in error are deleted. It
// implements servicesdir.Observer.
func (m *Metrics) SetServicesDirErrors(fields map[string]string) {
	m.dirMu.Lock()
	defer m.dirMu.Unlock()
	next := make(map[[2]string]bool, len(fields))
	for file, field := range fields {
		next[[2]string{file, field}] = true
		m.dirErrors.WithLabelValues(file, field).Set(1)
	}
	for k := range m.dirSeries {
		if !next[k] {
			m.dirErrors.DeleteLabelValues(k[0], k[1])
		}
	}
	m.dirSeries = next
}

// Flow counts one flow event of service and keeps vipd_active_flows: +1 on
// FlowNew, -1 on FlowClosed, never below zero.
func (m *Metrics) Flow(service string, t dataplane.FlowEventType) {
	m.flows.WithLabelValues(service, t.String()).Inc()
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.activeCount[service]
	switch t {
	case dataplane.FlowNew:
		n++
	case dataplane.FlowClosed:
		if n == 0 {
			// The NEW was never seen: leave the gauge at zero.
			return
		}
		n--
	default:
		return
	}
	m.activeCount[service] = n
	m.active.WithLabelValues(service).Set(float64(n))
}

// Lost counts n flow events lost at source (LostKernel or LostSubscriber).
func (m *Metrics) Lost(source string, n uint64) {
	m.lost.WithLabelValues(source).Add(float64(n))
}

// UnaryServerInterceptor records gRPC server metrics (grpc_server_*) for
// unary calls.
func (m *Metrics) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return m.grpc.UnaryServerInterceptor()
}

// StreamServerInterceptor records gRPC server metrics (grpc_server_*) for
// streaming calls.
func (m *Metrics) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return m.grpc.StreamServerInterceptor()
}

// GRPCInterceptors returns both interceptors in the shape of
// server.WithInterceptors, so that the daemon can write
// server.WithInterceptors(m.GRPCInterceptors()).
func (m *Metrics) GRPCInterceptors() ([]grpc.UnaryServerInterceptor, []grpc.StreamServerInterceptor) {
	return []grpc.UnaryServerInterceptor{m.UnaryServerInterceptor()},
		[]grpc.StreamServerInterceptor{m.StreamServerInterceptor()}
}

// InitializeGRPC creates the zero-valued grpc_server_* series of every
// method registered on s (a *server.Server or *grpc.Server), so that they
// are exported before each method's first call. Call it once, after every
// service is registered.
func (m *Metrics) InitializeGRPC(s reflection.ServiceInfoProvider) {
	m.grpc.InitializeMetrics(s)
}

// ObserveCheck counts one finished health check by result (pass, fail);
// it implements health.Observer.
func (m *Metrics) ObserveCheck(result string) { m.checks.WithLabelValues(result).Inc() }

// SetBackendHealth sets vipd_backend_health of a probed backend.
func (m *Metrics) SetBackendHealth(service, backend string, v float64) {
	m.health.WithLabelValues(service, backend).Set(v)
}

// SNATSource is a dataplane that masquerades external flows to ports it
// picks itself and counts how that goes (the eBPF one:
// ebpf.Dataplane.SNATCounters). Both counts only grow.
type SNATSource interface {
	// SNATCounters returns the new flows dropped because no SNAT port was
	// free for them, and the ports passed over because the backend's
	// TIME_WAIT of that tuple would have refused the new flow's SYN.
	SNATCounters() (exhausted, timeWaitSkips uint64, err error)
}

// WatchSNAT exports src's counters as vipd_snat_port_exhausted_total and
// vipd_snat_timewait_skips_total, read at each scrape. Call it once.
func (m *Metrics) WatchSNAT(src SNATSource) {
	m.reg.MustRegister(&snatCollector{src: src})
}

var (
	snatExhaustedDesc = prometheus.NewDesc("vipd_snat_port_exhausted_total",
		"eBPF: new external flows under policy Cluster dropped because SNAT found no free port for them (--snat-port-range held by live flows or by the backends' TIME_WAIT).", nil, nil)
	snatTimeWaitDesc = prometheus.NewDesc("vipd_snat_timewait_skips_total",
		"eBPF: SNAT ports passed over for a new TCP flow because the backend still holds the TIME_WAIT of that tuple and would refuse the flow's SYN.", nil, nil)
)

// snatCollector reads a SNATSource at each scrape. A read that fails (the
// dataplane closing) exports the last values read.
type snatCollector struct {
	src SNATSource

	mu                 sync.Mutex
	exhausted, twSkips uint64
}

func (c *snatCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- snatExhaustedDesc
	ch <- snatTimeWaitDesc
}

func (c *snatCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	if ex, tw, err := c.src.SNATCounters(); err == nil {
		c.exhausted, c.twSkips = ex, tw
	}
	ex, tw := c.exhausted, c.twSkips
	c.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(snatExhaustedDesc, prometheus.CounterValue, float64(ex))
	ch <- prometheus.MustNewConstMetric(snatTimeWaitDesc, prometheus.CounterValue, float64(tw))
}

// DeleteBackendHealth removes the series of a backend no longer probed.
func (m *Metrics) DeleteBackendHealth(service, backend string) {
	m.health.DeleteLabelValues(service, backend)
}
