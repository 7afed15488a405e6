package kubeadapter

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vipd/vipd/internal/kubeconvert"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// VIPD is the part of *client.Client the adapter calls. Errors are gRPC
// status errors, as client returns them.
type VIPD interface {
	WaitServing(ctx context.Context) error
	Status(ctx context.Context) (*vipdv1.GetStatusResponse, error)
	HealthClient() healthpb.HealthClient
	GetService(ctx context.Context, name string) (*vipdv1.Service, error)
	ListServices(ctx context.Context, owner string) ([]*vipdv1.Service, error)
	UpsertService(ctx context.Context, svc *vipdv1.Service, expectedGeneration uint64) (*vipdv1.Service, error)
	CreateService(ctx context.Context, svc *vipdv1.Service) (*vipdv1.Service, error)
	DeleteService(ctx context.Context, name string, expectedGeneration uint64) error
	SyncServices(ctx context.Context, owner string, svcs []*vipdv1.Service) (*vipdv1.SyncServicesResponse, error)
	SetNodeTopology(ctx context.Context, zone string) (previous string, err error)
}

const (
	// DefaultFullSyncPeriod is how often a full SyncServices repairs drift
	// unless WithFullSyncPeriod says otherwise.
	DefaultFullSyncPeriod = 10 * time.Minute
	// MinHealthTimeout is the least time a change may stay pending before
	// /healthz fails, unless WithHealthTimeout says otherwise.
	MinHealthTimeout = 30 * time.Second

	// sliceByService indexes EndpointSlices by their Service, namespace/name.
	sliceByService = "service"
	// triggerAnnotation is the EndpointSlice controller's record of when the
	// change that made a slice happened.
	triggerAnnotation = corev1.EndpointsLastChangeTriggerTime
)

// config is what the options set.
type config struct {
	nodeName       string
	minSyncPeriod  time.Duration
	fullSyncPeriod time.Duration
	healthTimeout  time.Duration // 0: max(2 × minSyncPeriod, MinHealthTimeout)
	backoffMin     time.Duration
	backoffMax     time.Duration
	servingWait    time.Duration
	// serviceProxyName: see WithServiceProxyName; empty is kube-proxy's
	// choice of Services.
	serviceProxyName string
	// zoneFromNode: see WithZoneFromNode.
	zoneFromNode bool
}

// Option configures an Adapter.
type Option func(*config) error

// WithNodeName sets this node's name: endpoints on it are node-local, which
// is what internalTrafficPolicy: Local keeps. Without it no endpoint is
// node-local.
func WithNodeName(name string) Option {
	return func(c *config) error { c.nodeName = name; return nil }
}

// WithServiceProxyName makes the adapter the proxy named name for the
// label service.kubernetes.io/service-proxy-name: it programs only the
// Services whose label has that value, and leaves every other Service,
// labelled for another proxy or not labelled at all, to its proxy
// (kube-proxy for the unlabelled ones). That lets a cluster move Services
// to vipd one at a time. Without it, or with "", the adapter programs what
// kube-proxy would: the Services without the label. name must be a valid
// label value.
func WithServiceProxyName(name string) Option {
	return func(c *config) error {
		if errs := validation.IsValidLabelValue(name); len(errs) > 0 {
			return fmt.Errorf("service proxy name %q: %s", name, strings.Join(errs, "; "))
		}
		c.serviceProxyName = name
		return nil
	}
}

// WithMinSyncPeriod sets the least time between the starts of two passes
// that change vipd (kube-proxy's --iptables-min-sync-period): changes that
// arrive meanwhile are applied together. 0, the default, applies each
// change at once.
func WithMinSyncPeriod(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("min sync period %v is negative", d)
		}
		c.minSyncPeriod = d
		return nil
	}
}

// WithFullSyncPeriod sets how often a full SyncServices runs even when
// nothing changed, repairing drift such as a kubernetes-owned service
// deleted by hand. 0 disables it; the default is DefaultFullSyncPeriod.
func WithFullSyncPeriod(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("full sync period %v is negative", d)
		}
		c.fullSyncPeriod = d
		return nil
	}
}

// WithHealthTimeout sets how long a change may stay pending (seen but not
// applied to vipd) before /healthz answers 503. The default is
// max(2 × the min sync period, MinHealthTimeout).
func WithHealthTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("health timeout %v is not positive", d)
		}
		c.healthTimeout = d
		return nil
	}
}

// WithRetryBackoff sets the wait after a failed pass: min, doubled after
// each further failure up to max. The default is 100 ms to 30 s.
func WithRetryBackoff(min, max time.Duration) Option {
	return func(c *config) error {
		if min <= 0 || max < min {
			return fmt.Errorf("retry backoff %v to %v: want 0 < min <= max", min, max)
		}
		c.backoffMin, c.backoffMax = min, max
		return nil
	}
}

// Adapter keeps vipd's kubernetes-owned services equal to the Services and
// EndpointSlices of one cluster, for one node. Build it with New and run it
// with Run; Healthz may serve before Run.
type Adapter struct {
	log     hclog.Logger
	vipd    VIPD
	cfg     config
	convert kubeconvert.Options
	m       *metrics
	// factories are the Services' and the EndpointSlices' informer
	// factories, whose label selectors differ.
	factories []informers.SharedInformerFactory
	services  cache.SharedIndexInformer
	slices    cache.SharedIndexInformer
	// node watches this node's Node object (WithZoneFromNode); nil
	// without.
	node cache.SharedIndexInformer
	// started bounds the trigger times that are observed: older ones are
	// changes made before the adapter ran (kube-proxy's trackerStartTime).
	started time.Time
	ran     atomic.Bool
	wake    chan struct{}

	mu         sync.Mutex
	dirty      map[string]time.Time // Service name → when first marked since taken
	triggers   map[string]time.Time // Service name → earliest pending trigger time
	fullSince  time.Time            // a full sync is pending since; zero: none
	fullReason string
	inflight   time.Time // oldest change of the pass in progress; zero: none
	synced     bool      // a full sync has succeeded
	lastSync   time.Time // last successful pass
	inst       instances // vipd's instance IDs (vipdhealth.go)
	zone       nodeZone  // the node's zone (zone.go)

	// Owned by the sync goroutine.
	applied map[string]record // what the adapter last applied, by name
	leftOut map[string]string // names not programmed → reason
	// prevLeftOut is leftOut before the full sync in progress, so that
	// what is still left out is not logged again.
	prevLeftOut map[string]string
	refused     map[string]*vipdv1.Service // the version vipd refused, so it is not retried
	// externalLeft: names programmed without their external part → reason
	// (see external.go); prevExternalLeft is it before the full sync in
	// progress, as prevLeftOut.
	externalLeft     map[string]string
	prevExternalLeft map[string]string
	// noExternal: vipd's dataplane was last found not to serve external
	// traffic (see setNoExternal).
	noExternal bool
	// omitted: names → what their conversion leaves out, as last logged.
	omitted map[string]string
	// freed: the pass in progress deleted a service or took VIP:ports off
	// one, so what was refused for a conflict or a limit may fit now.
	freed bool
}

// record is a service as the adapter last applied it.
type record struct {
	// spec is the conversion it was applied for, compared with the next
	// one; nil forces a rewrite.
	spec *vipdv1.Service
	// sent is what vipd has: spec, or spec without its external part
	// (see externalLeft).
	sent *vipdv1.Service
	gen  uint64 // the generation vipd returned for it
}

// New returns an Adapter that watches kube and drives vipd (a
// *client.Client). Its metrics are registered with reg (nil: none are
// exported). It fails on an invalid option or when reg already has the
// adapter's metrics.
func New(log hclog.Logger, kube kubernetes.Interface, vipd VIPD, reg prometheus.Registerer, opts ...Option) (*Adapter, error) {
	cfg := config{
		fullSyncPeriod: DefaultFullSyncPeriod,
		backoffMin:     100 * time.Millisecond,
		backoffMax:     30 * time.Second,
		servingWait:    10 * time.Second,
	}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, fmt.Errorf("kubernetes adapter: %w", err)
		}
	}
	if cfg.zoneFromNode && cfg.nodeName == "" {
		return nil, errors.New("kubernetes adapter: the zone from the node needs the node's name")
	}
	if cfg.healthTimeout == 0 {
		cfg.healthTimeout = max(2*cfg.minSyncPeriod, MinHealthTimeout)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes adapter: %w", err)
	}
	a := &Adapter{
		log:      log,
		vipd:     vipd,
		cfg:      cfg,
		convert:  kubeconvert.Options{NodeName: cfg.nodeName, ServiceProxyName: cfg.serviceProxyName},
		m:        m,
		started:  time.Now(),
		wake:     make(chan struct{}, 1),
		dirty:    map[string]time.Time{},
		triggers: map[string]time.Time{},
		applied:  map[string]record{},
		leftOut:  map[string]string{},
		refused:  map[string]*vipdv1.Service{},

		externalLeft: map[string]string{},
		omitted:      map[string]string{},
	}
	a.fullSince, a.fullReason = a.started, "start"
	if err := a.informers(kube); err != nil {
		return nil, fmt.Errorf("kubernetes adapter: %w", err)
	}
	if cfg.zoneFromNode {
		if err := a.nodeInformer(kube); err != nil {
			return nil, fmt.Errorf("kubernetes adapter: %w", err)
		}
	}
	return a, nil
}

// informers sets up the Service and EndpointSlice informers and their
// handlers, which only mark Services dirty.
func (a *Adapter) informers(kube kubernetes.Interface) error {
	// As kube-proxy: Services handed to another proxy are not ours (one
	// gaining the label is deleted from the informer's view), and neither
	// are the slices of headless Services. As the proxy named
	// serviceProxyName, ours are those labelled with that name instead
	// (and one losing the label is deleted from the view). The slices are
	// then not filtered by that label: the EndpointSlice controller copies
	// it to them only after the Service has it, and hand-made slices may
	// never have it; Convert picks a Service's slices by its name anyway.
	proxyName, err := labels.NewRequirement(kubeconvert.ServiceProxyNameLabel, selection.DoesNotExist, nil)
	if a.cfg.serviceProxyName != "" {
		proxyName, err = labels.NewRequirement(kubeconvert.ServiceProxyNameLabel, selection.Equals, []string{a.cfg.serviceProxyName})
	}
	if err != nil {
		return err
	}
	noHeadless, err := labels.NewRequirement(corev1.IsHeadlessService, selection.DoesNotExist, nil)
	if err != nil {
		return err
	}
	sliceSelector := labels.NewSelector().Add(*noHeadless)
	if a.cfg.serviceProxyName == "" {
		sliceSelector = sliceSelector.Add(*proxyName)
	}
	factory := func(selector string) informers.SharedInformerFactory {
		return informers.NewSharedInformerFactoryWithOptions(kube, 0,
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }),
			informers.WithTransform(stripManagedFields))
	}
	a.factories = []informers.SharedInformerFactory{
		factory(labels.NewSelector().Add(*proxyName, *noHeadless).String()),
		factory(sliceSelector.String()),
	}
	a.services = a.factories[0].Core().V1().Services().Informer()
	a.slices = a.factories[1].Discovery().V1().EndpointSlices().Informer()
	if err := a.slices.AddIndexers(cache.Indexers{sliceByService: indexByService}); err != nil {
		return fmt.Errorf("index endpoint slices: %w", err)
	}
	if _, err := a.services.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { a.serviceChanged(nil, obj) },
		UpdateFunc: a.serviceChanged,
		DeleteFunc: func(obj any) { a.serviceChanged(nil, untomb(obj)) },
	}); err != nil {
		return fmt.Errorf("watch services: %w", err)
	}
	if _, err := a.slices.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { a.sliceChanged(nil, obj, true) },
		UpdateFunc: func(old, obj any) { a.sliceChanged(old, obj, true) },
		DeleteFunc: func(obj any) { a.sliceChanged(nil, untomb(obj), false) },
	}); err != nil {
		return fmt.Errorf("watch endpoint slices: %w", err)
	}
	for _, inf := range []struct {
		what string
		inf  cache.SharedIndexInformer
	}{{"services", a.services}, {"endpoint slices", a.slices}} {
		what := inf.what
		// A watch error means the informer relists: what it missed meanwhile
		// may be anywhere, so the next pass is a full one.
		if err := inf.inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
			a.log.Warn("apiserver watch failed; the informer relists, and a full sync follows", "watch", what, "error", err)
			a.markFull("apiserver watch of " + what + " failed")
		}); err != nil {
			return fmt.Errorf("watch %s: %w", what, err)
		}
	}
	return nil
}

// stripManagedFields drops what the adapter never reads, as kube-proxy does.
func stripManagedFields(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

func indexByService(obj any) ([]string, error) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil, nil
	}
	if name := s.Labels[discoveryv1.LabelServiceName]; name != "" {
		return []string{kubeconvert.Name(s.Namespace, name)}, nil
	}
	return nil, nil
}

func untomb(obj any) any {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return obj
}

func (a *Adapter) serviceChanged(old, obj any) {
	svc, ok := obj.(*corev1.Service)
	if !ok {
		return
	}
	var before map[string]string
	if prev, ok := old.(*corev1.Service); ok {
		before = prev.Annotations
	}
	a.markDirty(kubeconvert.Name(svc.Namespace, svc.Name), a.triggerTime(before, svc.Annotations))
}

// sliceChanged marks the slice's Service dirty, and, when the slice moved
// from one Service to another, the old one too. Trigger times count only
// for a slice that exists and changed (live).
func (a *Adapter) sliceChanged(old, obj any, live bool) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return
	}
	var trigger time.Time
	prev, hadPrev := old.(*discoveryv1.EndpointSlice)
	if live {
		var before map[string]string
		if hadPrev {
			before = prev.Annotations
		}
		trigger = a.triggerTime(before, s.Annotations)
	}
	if name := s.Labels[discoveryv1.LabelServiceName]; name != "" {
		a.markDirty(kubeconvert.Name(s.Namespace, name), trigger)
	}
	if hadPrev {
		if name := prev.Labels[discoveryv1.LabelServiceName]; name != "" && name != s.Labels[discoveryv1.LabelServiceName] {
			a.markDirty(kubeconvert.Name(prev.Namespace, name), time.Time{})
		}
	}
}

// triggerTime reads the last-change-trigger-time annotation of an object
// whose annotations went from before to after. It is zero when absent or
// unchanged (a relist delivers unchanged objects as updates), unparsable,
// or older than the adapter (a change made before it ran has no meaningful
// programming latency).
func (a *Adapter) triggerTime(before, after map[string]string) time.Time {
	v, ok := after[triggerAnnotation]
	if old, had := before[triggerAnnotation]; !ok || had && old == v {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		a.log.Debug("unparsable trigger time", "annotation", triggerAnnotation, "value", v, "error", err)
		return time.Time{}
	}
	if t.Before(a.started) {
		return time.Time{}
	}
	return t
}

func (a *Adapter) markDirty(name string, trigger time.Time) {
	now := time.Now()
	a.mu.Lock()
	if _, ok := a.dirty[name]; !ok {
		a.dirty[name] = now
	}
	if !trigger.IsZero() {
		if t, ok := a.triggers[name]; !ok || trigger.Before(t) {
			a.triggers[name] = trigger
		}
	}
	a.mu.Unlock()
	a.poke()
}

// markFull makes the next pass a full SyncServices.
func (a *Adapter) markFull(reason string) {
	a.mu.Lock()
	if a.fullSince.IsZero() {
		a.fullSince, a.fullReason = time.Now(), reason
	}
	a.mu.Unlock()
	a.poke()
}

func (a *Adapter) poke() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// Run watches the apiserver and keeps vipd in step until ctx ends, then
// returns nil; it leaves vipd's services in place, as kube-proxy leaves its
// rules, so that traffic keeps flowing. It fails only when the informers'
// caches cannot fill. An Adapter runs once.
func (a *Adapter) Run(ctx context.Context) error {
	if !a.ran.CompareAndSwap(false, true) {
		return errors.New("kubernetes adapter: Run called twice")
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		for _, f := range a.factories {
			f.Shutdown()
		}
		wg.Wait()
	}()
	for _, f := range a.factories {
		f.Start(ctx.Done())
	}
	a.log.Info("waiting for the informers' caches", "node", a.cfg.nodeName, "service_proxy_name", a.cfg.serviceProxyName, "zone_from_node", a.cfg.zoneFromNode)
	synced := []cache.InformerSynced{a.services.HasSynced, a.slices.HasSynced}
	if a.node != nil {
		synced = append(synced, a.node.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("kubernetes adapter: informer caches did not sync")
	}
	wg.Go(func() { a.watchVIPD(ctx) })
	a.loop(ctx)
	a.log.Info("stopped; vipd keeps the services it has")
	return nil
}
