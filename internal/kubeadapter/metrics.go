package kubeadapter

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
)

// metrics are the adapter's Prometheus metrics.
type metrics struct {
	programming prometheus.Histogram
	syncs       *prometheus.CounterVec
	services    prometheus.Gauge
	leftOut     *prometheus.GaugeVec
	externalOut *prometheus.GaugeVec
	lastSync    prometheus.Gauge
	zoneUpdates *prometheus.CounterVec
}

// programmingBuckets are kube-proxy's in spirit: 1 ms doubling to about
// 16 s, then every 30 s up to 5 minutes.
func programmingBuckets() []float64 {
	return append(prometheus.ExponentialBuckets(0.001, 2, 15), prometheus.LinearBuckets(30, 30, 10)...)
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		programming: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "vipd_k8s_network_programming_duration_seconds",
			Help: "Time from a Kubernetes change (an EndpointSlice's " + triggerAnnotation +
				" annotation) until vipd has applied it to the kernel.",
			Buckets: programmingBuckets(),
		}),
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_k8s_syncs_total",
			Help: "Passes that changed vipd: full (one SyncServices) or partial (one call per changed Service), by result.",
		}, []string{"kind", "result"}),
		services: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vipd_k8s_services",
			Help: "Kubernetes Services programmed in vipd by this adapter.",
		}),
		leftOut: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vipd_k8s_services_left_out",
			Help: "Kubernetes Services that kube-proxy would program but vipd does not have, by reason: other-owner, conflict, invalid, unsupported, over-limit.",
		}, []string{"reason"}),
		externalOut: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vipd_k8s_services_external_left_out",
			Help: "Kubernetes Services programmed in vipd with their cluster IPs but without their node ports, external and load-balancer IPs, by reason: " +
				"unsupported (vipd's dataplane does not serve external traffic), conflict (another service holds one of them), invalid (vipd refused one of them).",
		}, []string{"reason"}),
		lastSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vipd_k8s_last_sync_timestamp_seconds",
			Help: "Unix time of the last successful pass.",
		}),
		zoneUpdates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_k8s_zone_updates_total",
			Help: "Calls that set vipd's zone from the node's " + corev1.LabelTopologyZone + " label (--zone-from-node), by result: ok or error.",
		}, []string{"result"}),
	}
	for _, r := range []string{"ok", "error"} {
		m.zoneUpdates.WithLabelValues(r)
	}
	for _, k := range []string{"full", "partial"} {
		for _, r := range []string{"ok", "error"} {
			m.syncs.WithLabelValues(k, r)
		}
	}
	for _, r := range reasons {
		m.leftOut.WithLabelValues(r)
	}
	for _, r := range externalReasons {
		m.externalOut.WithLabelValues(r)
	}
	for _, c := range []prometheus.Collector{m.programming, m.syncs, m.services, m.leftOut, m.externalOut, m.lastSync, m.zoneUpdates} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	return m, nil
}
