package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/authz"
	"github.com/vipd/vipd/server/flowhub"
	"github.com/vipd/vipd/server/reconcile"
	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// API implements the vipd.v1 gRPC services: it validates each request, turns
// it into a mutation for the reconciler, and maps the outcome to a status.
// It never touches the kernel itself.
//
// Authorization: a call whose context carries an authz.Principal (a remote
// client; see Server) may change only the services of owners the principal
// allows. The check runs inside the mutation, on the same transaction as
// the change, so no other call can change a service's owner between the
// check and the change. An UpsertService needs both the new owner and,
// when the service exists with another owner, the existing one; a
// DeleteService or UpdateBackends the existing service's owner; a
// SyncServices its owner. Denied calls get PermissionDenied and are logged
// at warn level with the identity, method and owner. Reads are not checked.
//
// While the reconciler holds the dataplane (vipd --recover), UpsertService,
// DeleteService and UpdateBackends get FailedPrecondition, and the first
// SyncServices that succeeds ends the hold with a full sync.
//
// With validate_only, UpsertService, SyncServices and UpdateBackends run
// their mutation on the current state and throw it away (see mutate): the
// same checks, the same answer, and nothing changed, except that the
// dataplane is not asked: what only the kernel refuses when the change is
// applied (a full eBPF map, a failed iptables-restore) is not seen.
type API struct {
	vipdv1.UnimplementedLoadBalancerServiceServer
	vipdv1.UnimplementedStatusServiceServer
	vipdv1.UnimplementedFlowServiceServer
	vipdv1.UnimplementedNodeServiceServer

	log       hclog.Logger
	rec       *reconcile.Reconciler
	dataplane string
	caps      dataplane.Capabilities
	limits    validation.Limits
	version   string
	flows     *flowhub.Hub
	explainer dataplane.Explainer
	warnings  []func() []*vipdv1.StatusWarning
	health    BackendHealth
	instance  string // see InstanceID

	// zoneMu makes SetNodeTopology calls one at a time, so that each
	// reports the zone its own call replaced; zoneSetByAPI is set once
	// one succeeded (see zoneSource).
	zoneMu       sync.Mutex
	zoneSetByAPI atomic.Bool
}

// APIOption configures an API.
type APIOption func(*API)

// WithFlows serves FlowService from h, which the caller runs (Hub.Run).
// Without it, FlowService answers Unimplemented.
func WithFlows(h *flowhub.Hub) APIOption { return func(a *API) { a.flows = h } }

// WithExplainer lets StatusService.Explain ask e, normally the dataplane,
// for a client's session-affinity entry and deterministic pick. Without
// it, Explain answers from the desired state alone.
func WithExplainer(e dataplane.Explainer) APIOption { return func(a *API) { a.explainer = e } }

// BackendHealth is what active health checks found: internal/health's
// Prober.
type BackendHealth interface {
	// Health returns the health of service's probed backends, in the
	// order of its backends.
	Health(service string) []*vipdv1.BackendHealth
	// Explain says why health checks keep a backend out, and whether
	// they do.
	Explain(service string, ip netip.Addr) (string, bool)
}

// WithBackendHealth makes GetService report each backend's health and
// Explain count failing backends out, as the dataplane does.
func WithBackendHealth(h BackendHealth) APIOption { return func(a *API) { a.health = h } }

// WithStatusWarnings makes GetStatus report what f returns, such as the
// node prerequisites found unmet. It may be given once per source (the
// node checks, the services directory): GetStatus reports the warnings of
// every source, in the order the options were given. Each f is called once
// per GetStatus, from the call's goroutine, and must not block.
func WithStatusWarnings(f func() []*vipdv1.StatusWarning) APIOption {
	return func(a *API) { a.warnings = append(a.warnings, f) }
}

// NewAPI returns the API over rec, for a dataplane named dpName with caps.
// It draws the API's instance ID (see InstanceID).
func NewAPI(log hclog.Logger, rec *reconcile.Reconciler, dpName string, caps dataplane.Capabilities, limits validation.Limits, version string, opts ...APIOption) *API {
	a := &API{log: log, rec: rec, dataplane: dpName, caps: caps, limits: limits, version: version, instance: newInstanceID()}
	for _, o := range opts {
		o(a)
	}
	return a
}

// Register adds the API's services to s: LoadBalancerService,
// StatusService, FlowService and NodeService. FlowService is always
// registered; without WithFlows it answers Unimplemented.
//
// s must decode messages with the server's codec (grpc.ForceServerCodecV2
// of codec(), as New's server does): SyncServicesStream receives its
// chunks as a syncChunk, which gRPC's own codec refuses.
func (a *API) Register(s grpc.ServiceRegistrar) {
	vipdv1.RegisterLoadBalancerServiceServer(s, a)
	vipdv1.RegisterStatusServiceServer(s, a)
	vipdv1.RegisterFlowServiceServer(s, a)
	vipdv1.RegisterNodeServiceServer(s, a)
}

// validService validates svc, named field in the request, and checks that the
// dataplane can honour it.
func (a *API) validService(svc *vipdv1.Service, field string) (*vipdv1.Service, *dataplane.Service, error) {
	return a.honoured(validation.Service(svc, a.limits, field))
}

// honoured passes on what validation admitted if the dataplane can honour it.
func (a *API) honoured(out *vipdv1.Service, dp *dataplane.Service, v validation.Violations) (*vipdv1.Service, *dataplane.Service, error) {
	if len(v) > 0 {
		return nil, nil, v
	}
	if err := a.caps.Check(dp); err != nil {
		return nil, nil, err
	}
	return out, dp, nil
}

// put stages svc unless the stored service already has the same spec, and
// returns the service as stored (with its generation). svc.Owner is the
// owner stored, whatever dp says. The store takes dp over (see
// store.Txn.PutSpec: a mutation that runs more than once puts a copy the
// second time), so dp must not change afterwards. It reports whether
// anything changed.
func put(tx *store.Txn, svc *vipdv1.Service, dp *dataplane.Service) (*vipdv1.Service, bool, error) {
	if old, ok := tx.Get(svc.Name); ok && old.SameSpec(svc) {
		svc.Generation = old.Generation()
		return svc, false, nil
	}
	if dp.Owner != svc.Owner {
		c := *dp
		c.Owner, c.Generation = svc.Owner, 0
		dp = &c
	}
	if _, err := tx.Put(svc, dp); err != nil {
		return nil, false, err
	}
	return svc, true, nil
}

// newNames applies validation.NewName to what a write creates: the
// service name when newService, and the owner when setOwner (the service
// gets it) unless another stored service has it already. Only the
// validation.Name check applies to a stored name or owner, so that what an
// earlier vipd admitted stays readable and writable. prefix ("service.")
// starts the fields named. Whether the owner is stored is looked up, at
// O(n), only for an owner that NewName refuses.
func newNames(tx *store.Txn, name string, newService bool, owner string, setOwner bool, prefix string) error {
	var v validation.Violations
	if newService {
		v = append(v, validation.NewName(name, prefix+"name")...)
	}
	if setOwner {
		if ov := validation.NewOwner(owner, prefix+"owner"); len(ov) > 0 && len(tx.Names(owner)) == 0 {
			v = append(v, ov...)
		}
	}
	if len(v) > 0 {
		return v
	}
	return nil
}

func checkGeneration(tx *store.Txn, name string, expected uint64) error {
	if expected == 0 {
		return nil
	}
	var have uint64
	if e, ok := tx.Get(name); ok {
		have = e.Generation()
	}
	if have != expected {
		return generationMismatch(name, expected, have)
	}
	return nil
}

// mutate submits m to the reconciler, or with validateOnly (AIP-163) only
// runs it on the current state and changes nothing: every check of the
// write up to the dataplane's Apply runs, and m's result is what the write
// would have returned unless the kernel refuses the change.
func (a *API) mutate(ctx context.Context, validateOnly bool, m reconcile.Mutation) (any, error) {
	if validateOnly {
		return a.rec.Validate(ctx, m)
	}
	return a.rec.Do(ctx, m)
}

// fail turns a mutation's error into a status: toStatus, after the errors
// only the API knows about, a denied owner (which it logs) and a held
// dataplane.
func (a *API) fail(ctx context.Context, err error) error {
	var (
		denied *authz.DeniedError
		held   *reconcile.HeldError
	)
	switch {
	case errors.As(err, &denied):
		method, _ := grpc.Method(ctx)
		a.log.Warn("permission denied", "identity", denied.Identity, "method", method, "owner", denied.Owner)
		return status.Error(codes.PermissionDenied, denied.Error())
	case errors.As(err, &held):
		return status.Errorf(codes.FailedPrecondition, "vipd is not ready: %s; until a SyncServices has been applied it accepts no other change", held.Reason)
	}
	return toStatus(err)
}

// UpsertService implements vipdv1.LoadBalancerServiceServer.
//
// With create_only it is a create: the name must be free when the change
// is made, which is checked in the same transaction as the write, so no
// other call can create it in between. An existing service of that name
// is AlreadyExists whoever owns it, and is not changed, so the caller
// needs no permission for its owner.
//
// An upsert never moves an existing service to another owner unless it
// sets take_ownership: without it, an owner that differs from the stored
// one is FailedPrecondition naming the stored owner, checked in the same
// transaction as the write. An empty owner keeps the stored owner, and
// means validation.DefaultOwner only for a new service.
func (a *API) UpsertService(ctx context.Context, req *vipdv1.UpsertServiceRequest) (*vipdv1.UpsertServiceResponse, error) {
	var v validation.Violations
	if req.CreateOnly && req.ExpectedGeneration != 0 {
		v = append(v, validation.Violation{Field: "create_only", Description: fmt.Sprintf("cannot be combined with expected_generation %d: a create has no generation to expect", req.ExpectedGeneration)})
	}
	ownerGiven := req.GetService().GetOwner() != ""
	svc, dp, err := a.validService(req.GetService(), "service")
	var sv validation.Violations
	if errors.As(err, &sv) {
		v = append(v, sv...)
	}
	if len(v) > 0 {
		return nil, toStatus(v)
	}
	if err != nil {
		return nil, toStatus(err)
	}
	p := authz.FromContext(ctx)
	res, err := a.mutate(ctx, req.ValidateOnly, func(tx *store.Txn) (any, error) {
		old, exists := tx.Get(svc.Name)
		// First, before any owner is checked: a create of a taken name
		// changes nothing, so it needs no permission for any owner.
		if exists && req.CreateOnly {
			return nil, status.Errorf(codes.AlreadyExists, "service %s already exists (owner %s, generation %d); create_only does not replace it", svc.Name, old.Owner(), old.Generation())
		}
		// Each run sets the owner afresh: a mutation may run more than
		// once, and the service may have come or gone in between.
		svc.Owner = dp.Owner
		if exists && !ownerGiven {
			svc.Owner = old.Owner()
		}
		if err := newNames(tx, svc.Name, !exists, svc.Owner, !exists || old.Owner() != svc.Owner, "service."); err != nil {
			return nil, err
		}
		if err := p.CheckOwner(svc.Owner); err != nil {
			return nil, err
		}
		if exists && old.Owner() != svc.Owner {
			if err := p.CheckOwner(old.Owner()); err != nil {
				return nil, err
			}
		}
		// A stale generation first: the caller's view is out of date,
		// which may be all that the owner differs by.
		if err := checkGeneration(tx, svc.Name, req.ExpectedGeneration); err != nil {
			return nil, err
		}
		if exists && old.Owner() != svc.Owner && !req.TakeOwnership {
			return nil, status.Errorf(codes.FailedPrecondition, "service %q is owned by %q; set take_ownership to move it to %q", svc.Name, old.Owner(), svc.Owner)
		}
		stored, changed, err := put(tx, svc, dp)
		if err != nil {
			return nil, err
		}
		resp := &vipdv1.UpsertServiceResponse{Service: stored, Result: vipdv1.UpsertResult_UPSERT_RESULT_CONFIGURED}
		switch {
		case !exists:
			resp.Result = vipdv1.UpsertResult_UPSERT_RESULT_CREATED
		case !changed:
			resp.Result = vipdv1.UpsertResult_UPSERT_RESULT_UNCHANGED
		}
		return resp, nil
	})
	if err != nil {
		return nil, a.fail(ctx, addressViolation(err, inRequest("service", req.GetService())))
	}
	return res.(*vipdv1.UpsertServiceResponse), nil
}

// DeleteService implements vipdv1.LoadBalancerServiceServer.
func (a *API) DeleteService(ctx context.Context, req *vipdv1.DeleteServiceRequest) (*vipdv1.DeleteServiceResponse, error) {
	if v := validation.Name(req.Name, "name"); len(v) > 0 {
		return nil, toStatus(v)
	}
	p := authz.FromContext(ctx)
	_, err := a.rec.Do(ctx, func(tx *store.Txn) (any, error) {
		if old, ok := tx.Get(req.Name); ok {
			if err := p.CheckOwner(old.Owner()); err != nil {
				return nil, err
			}
		}
		if err := checkGeneration(tx, req.Name, req.ExpectedGeneration); err != nil {
			return nil, err
		}
		if !tx.Delete(req.Name) {
			return nil, notFound(req.Name)
		}
		return nil, nil
	})
	if err != nil {
		return nil, a.fail(ctx, err)
	}
	return &vipdv1.DeleteServiceResponse{}, nil
}

// GetService implements vipdv1.LoadBalancerServiceServer.
func (a *API) GetService(_ context.Context, req *vipdv1.GetServiceRequest) (*vipdv1.GetServiceResponse, error) {
	if v := validation.Name(req.Name, "name"); len(v) > 0 {
		return nil, toStatus(v)
	}
	e, ok := a.rec.Snapshot().Get(req.Name)
	if !ok {
		return nil, notFound(req.Name)
	}
	resp := &vipdv1.GetServiceResponse{Service: e.Service()}
	if a.health != nil {
		resp.BackendHealth = a.health.Health(req.Name)
	}
	return resp, nil
}

// ListServices implements vipdv1.LoadBalancerServiceServer.
func (a *API) ListServices(_ context.Context, req *vipdv1.ListServicesRequest) (*vipdv1.ListServicesResponse, error) {
	if req.Owner != "" {
		if v := validation.Owner(req.Owner, "owner"); len(v) > 0 {
			return nil, toStatus(v)
		}
	}
	entries := a.rec.Snapshot().List(req.Owner)
	resp := &vipdv1.ListServicesResponse{Services: make([]*vipdv1.Service, len(entries))}
	for i, e := range entries {
		resp.Services[i] = e.Service()
	}
	return resp, nil
}

// SyncServices implements vipdv1.LoadBalancerServiceServer.
//
// A listed name that another owner's service holds is AlreadyExists naming
// that owner, where UpsertService answers FailedPrecondition (it could take
// the service over with take_ownership; a sync cannot).
//
// A refusal because of listed services (FailedPrecondition, AlreadyExists,
// ResourceExhausted) names every one of them of the same fault in its
// details (see refusal, putAll and applyRefusal), keeping the first one's
// message, so that a control plane (internal/kubeadapter) can leave them
// out and send the rest in one more call. Refusals of the whole request
// (PermissionDenied, a full kernel table, too many requests in flight)
// name none.
func (a *API) SyncServices(ctx context.Context, req *vipdv1.SyncServicesRequest) (*vipdv1.SyncServicesResponse, error) {
	b := a.newSync(req.Owner, req.ValidateOnly)
	b.want = make([]*desiredService, 0, len(req.Services))
	for j, svc := range req.Services {
		// Each message is dropped once handled, so that the collector
		// can take the request piece by piece while its encoded form
		// grows: for 100,000 services with 10 backends each its decoded
		// messages are over 100 MB.
		req.Services[j] = nil
		b.add(svc)
	}
	req.Services = nil
	return b.commit(ctx)
}

// SyncServicesStream implements vipdv1.LoadBalancerServiceServer: a
// SyncServices whose list arrives in chunks. Each chunk is validated and
// encoded as it arrives, then dropped; nothing touches the state before the
// client ends the stream, and a stream that breaks off changes nothing.
func (a *API) SyncServicesStream(stream vipdv1.LoadBalancerService_SyncServicesStreamServer) error {
	ctx := stream.Context()
	var b *syncBuilder
	// The chunk and the services' messages are reused from chunk to
	// chunk: the builder keeps nothing of a decoded message (see add).
	var c syncChunk
	var d store.ServiceDecoder
	for chunk := 0; ; chunk++ {
		err := stream.RecvMsg(&c)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			// The client cancelled or went away: nothing was staged.
			return err
		}
		if b == nil {
			b = a.newSync(c.head.Owner, c.head.ValidateOnly)
		} else {
			b.chunk(chunk, &c.head)
		}
		for _, enc := range c.services {
			svc, err := d.Decode(enc)
			if err != nil {
				// As gRPC refuses a chunk that does not decode:
				// nothing was staged.
				return malformed(err)
			}
			b.add(svc)
		}
	}
	if b == nil {
		return toStatus(validation.Violations{{Field: "owner", Description: "the stream sent no chunk: the first one names the owner"}})
	}
	resp, err := b.commit(ctx)
	if err != nil {
		return err
	}
	return stream.SendAndClose(&vipdv1.SyncServicesStreamResponse{
		Created: resp.Created, Updated: resp.Updated, Deleted: resp.Deleted, Unchanged: resp.Unchanged})
}

// syncBuilder is one SyncServices (or SyncServicesStream) under way: the
// services listed so far, validated and encoded, and the violations found.
type syncBuilder struct {
	a            *API
	owner        string
	validateOnly bool
	v            validation.Violations
	// A desired service is kept encoded (store.NewSpec) rather than as
	// the request's message, so that the request can be dropped before the
	// dataplane programs the change.
	want []*desiredService
	// block holds the desired services, wantBlock at a time: a stream
	// does not say how many services it lists, and a slice of them grown
	// by appending copied and dropped ~50 MB for 100,000 services.
	block []desiredService
	index map[string]int
	n     int // services listed so far
	orig  []*vipdv1.Backend
	err   error // the first failure that is not the request's fault
}

// desiredService is one listed service, validated.
type desiredService struct {
	spec store.Spec
	dp   *dataplane.Service
	// index is the service's place in the list, and order its backends'
	// (requestOrder), to name a field in an error.
	index int
	order []int32
}

func (a *API) newSync(owner string, validateOnly bool) *syncBuilder {
	return &syncBuilder{a: a, owner: owner, validateOnly: validateOnly,
		v: validation.Owner(owner, "owner"), index: map[string]int{}}
}

// chunk checks a later chunk's owner and validate_only against the first's.
func (b *syncBuilder) chunk(i int, req *vipdv1.SyncServicesStreamRequest) {
	if req.Owner != "" && req.Owner != b.owner {
		b.v = append(b.v, validation.Violation{Field: "owner", Description: fmt.Sprintf("chunk %d names owner %q, the first chunk %q", i, req.Owner, b.owner)})
	}
	if req.ValidateOnly && !b.validateOnly {
		b.v = append(b.v, validation.Violation{Field: "validate_only", Description: fmt.Sprintf("chunk %d sets it, the first chunk does not", i)})
	}
}

// add validates and encodes in, the next service of the list. in is the
// call's own, given up to add (gRPC decoded it for the call, or
// SyncServicesStream's store.ServiceDecoder, which reuses it for the next
// service), so it is normalized in place rather than copied first: a sync
// of 100,000 services would otherwise copy a million backends. Nothing
// the builder keeps points into in: the spec is its encoding, the
// dataplane form is plain Go values and the decoded strings, and the
// request order is indexes.
func (b *syncBuilder) add(in *vipdv1.Service) {
	i := b.n
	b.n++
	b.orig = append(b.orig[:0], in.GetBackends()...)
	field := "services[" + strconv.Itoa(i) + "]"
	if in != nil && in.Owner != "" && in.Owner != b.owner {
		b.v = append(b.v, validation.Violation{Field: field + ".owner", Description: fmt.Sprintf("%q differs from the request's owner %q", in.Owner, b.owner)})
		return
	}
	if in != nil {
		// Given or not, the owner is the request's: one string for every
		// service's dataplane form, not a decoded copy each.
		in.Owner = b.owner
	}
	svc, dp, vs := validation.ServiceInPlace(in, b.a.limits, field)
	if len(vs) > 0 {
		b.v = append(b.v, vs...)
		return
	}
	if j, dup := b.index[svc.Name]; dup {
		b.v = append(b.v, validation.Violation{Field: field + ".name", Description: fmt.Sprintf("%q is also services[%d]", svc.Name, j)})
		return
	}
	spec, err := store.NewSpec(svc, dp)
	if err != nil {
		b.err = cmp.Or(b.err, err)
		return
	}
	b.index[svc.Name] = i
	if len(b.block) == cap(b.block) {
		b.block = make([]desiredService, 0, wantBlock)
	}
	b.block = append(b.block, desiredService{spec, dp, i, requestOrder(b.orig, svc.Backends)})
	b.want = append(b.want, &b.block[len(b.block)-1])
}

// wantBlock is how many desired services a syncBuilder allocates at a
// time.
const wantBlock = 1024

// commit syncs the owner's services to the list, all or nothing, unless
// any of it failed validation.
func (b *syncBuilder) commit(ctx context.Context) (*vipdv1.SyncServicesResponse, error) {
	a, want, index, owner := b.a, b.want, b.index, b.owner
	// From here on only the mutation below holds the validated list, so
	// that the list (~10 MB for 100,000 services: the specs and
	// dataplane forms are the store's once put) can be collected while
	// the reconciler applies and saves the change, once it has run the
	// mutation for the last time. b.index stays, for applyRefusal.
	b.want, b.block = nil, nil
	if b.err != nil {
		return nil, toStatus(b.err)
	}
	if len(b.v) > 0 {
		return nil, toStatus(b.v)
	}
	// Every service the dataplane cannot honour is named, so that a
	// control plane can leave them all out in one go; the message is the
	// first one's.
	var unsupported []culprit
	var firstUnsupported error
	for _, d := range want {
		if err := a.caps.Check(d.dp); err != nil {
			firstUnsupported = cmp.Or(firstUnsupported, err)
			unsupported = append(unsupported, unsupportedCulprit(*d, err, a.caps))
		}
	}
	if firstUnsupported != nil {
		return nil, refusal(status.Convert(toStatus(firstUnsupported)), reasonUnsupported, unsupported)
	}

	p := authz.FromContext(ctx)
	// Release: under vipd --recover, the first SyncServices ends the hold
	// with a full sync.
	release := a.rec.Release
	if b.validateOnly {
		release = a.rec.ValidateRelease
	}
	res, err := release(ctx, func(tx *store.Txn) (any, error) {
		// The owner and the names of services it does not have yet are
		// created here: see newNames.
		stored := tx.Names(owner)
		var v validation.Violations
		if len(stored) == 0 {
			v = append(v, validation.NewOwner(owner, "owner")...)
		}
		for _, d := range want {
			// The field's name is built only for a violation.
			if _, exists := tx.Get(d.dp.Name); !exists && len(validation.NewName(d.dp.Name, "")) > 0 {
				v = append(v, validation.NewName(d.dp.Name, "services["+strconv.Itoa(d.index)+"].name")...)
			}
		}
		if len(v) > 0 {
			return nil, v
		}
		if err := p.CheckOwner(owner); err != nil {
			return nil, err
		}
		resp := &vipdv1.SyncServicesResponse{}
		if len(stored) == 0 {
			resp.Created = make([]string, 0, len(want))
		}
		for _, name := range stored {
			if _, listed := index[name]; !listed {
				tx.Delete(name)
				resp.Deleted = append(resp.Deleted, name)
			}
		}
		// Release the claims of every service that is about to change before
		// any is written, so that services of this owner may swap VIPs or
		// ports in one call without a spurious conflict.
		// changes points to the services of want rather than copying
		// them: a sync of 100,000 services would otherwise copy ~10 MB.
		changes := make([]*desiredService, 0, len(want))
		var taken []culprit // listed names that other owners hold
		for _, d := range want {
			old, exists := tx.Get(d.dp.Name)
			switch {
			case !exists:
				resp.Created = append(resp.Created, d.dp.Name)
			case old.Owner() != owner:
				taken = append(taken, culprit{index: d.index, service: d.dp.Name, field: "services[" + strconv.Itoa(d.index) + "].name",
					desc: fmt.Sprintf("service %s belongs to owner %s; a SyncServices for owner %s does not take it over", d.dp.Name, old.Owner(), owner),
					meta: map[string]string{"owner": old.Owner()}})
				continue
			case old.SameEncodedSpec(d.spec):
				resp.Unchanged = append(resp.Unchanged, d.dp.Name)
				continue
			default:
				resp.Updated = append(resp.Updated, d.dp.Name)
				tx.Delete(d.dp.Name)
			}
			changes = append(changes, d)
		}
		if len(taken) > 0 {
			return nil, refusal(status.New(codes.AlreadyExists, taken[0].desc), reasonOwnedByOther, taken)
		}
		claims := 0
		for _, d := range changes {
			claims += store.ClaimCount(d.dp)
		}
		tx.Grow(len(changes), claims)
		if err := putAll(tx, changes, index); err != nil {
			return nil, err
		}
		for _, l := range [][]string{resp.Created, resp.Updated, resp.Deleted, resp.Unchanged} {
			slices.Sort(l)
		}
		return resp, nil
	})
	if err != nil {
		return nil, b.applyRefusal(ctx, err)
	}
	return res.(*vipdv1.SyncServicesResponse), nil
}

// putAll stores the services of a sync that change, and fails with the
// refusal of the first that cannot be stored, naming every one refused
// for the same kind of fault. A service that cannot be stored is skipped
// and the next ones are tried on what was stored, so that the refusal
// names exactly the services without which the rest can be stored, in the
// list's order: the ones whose addresses another service uses otherwise
// (InvalidArgument, BadRequest only, as validation), whose VIP:port, node
// port or external IP:port another service holds (AlreadyExists,
// SERVICE_CONFLICT), or that do not fit under vipd's totals after those
// before them (ResourceExhausted, OVER_LIMIT, and a QuotaFailure as
// UpsertService's). index gives the place in the list of each listed name.
func putAll(tx *store.Txn, changes []*desiredService, index map[string]int) error {
	var (
		first     error
		addresses validation.Violations
		culprits  []culprit
	)
	for _, d := range changes {
		// The store takes d.dp over, and copies it if the mutation runs
		// again (see put).
		_, err := tx.PutSpec(d.spec, d.dp)
		if err == nil {
			continue
		}
		err = addressViolation(err, inSyncRequest(d.index, d.dp, d.order))
		var (
			v        validation.Violations
			conflict *store.ConflictError
			limit    *store.LimitError
		)
		switch {
		case errors.As(err, &v):
			if first == nil || errors.As(first, new(validation.Violations)) {
				addresses = append(addresses, v...)
			}
		case errors.As(err, &conflict):
			if first == nil || errors.As(first, new(*store.ConflictError)) {
				culprits = append(culprits, conflictCulprit(*d, conflict, index))
			}
		case errors.As(err, &limit):
			if first == nil || errors.As(first, new(*store.LimitError)) {
				culprits = append(culprits, limitCulprit(*d, limit))
			}
		default:
			return err
		}
		first = cmp.Or(first, err)
	}
	var limit *store.LimitError
	switch {
	case first == nil:
		return nil
	case len(addresses) > 0:
		return addresses
	case errors.As(first, &limit):
		return refusal(status.Convert(overLimit(limit)), reasonOverLimit, culprits)
	}
	return refusal(status.New(codes.AlreadyExists, first.Error()), reasonConflict, culprits)
}

// applyRefusal is the status of a sync's failure after validation: a.fail's,
// and for what the dataplane refused when it applied the sync, details
// that name the listed service the dataplane could not honour
// (FailedPrecondition, UNSUPPORTED_BY_DATAPLANE), or, for a full kernel
// table, an ErrorInfo DATAPLANE_EXHAUSTED that names no service: the
// tables hold every service's entries, and no one service is at fault.
func (b *syncBuilder) applyRefusal(ctx context.Context, err error) error {
	var (
		applyErr    *reconcile.ApplyError
		unsupported *dataplane.UnsupportedError
	)
	out := b.a.fail(ctx, err)
	if !errors.As(err, &applyErr) {
		return out
	}
	st := status.Convert(out)
	switch {
	case st.Code() == codes.ResourceExhausted:
		return refusal(st, reasonExhausted, nil)
	case st.Code() != codes.FailedPrecondition:
		return out
	case errors.As(err, &unsupported):
		if i, ok := b.index[unsupported.Service]; ok {
			return refusal(st, reasonUnsupported, []culprit{{index: i, service: unsupported.Service, field: "services[" + strconv.Itoa(i) + "]",
				desc: unsupported.Error(), meta: map[string]string{"feature": unsupported.Feature}}})
		}
	}
	return refusal(st, reasonUnsupported, nil)
}

// UpdateBackends implements vipdv1.LoadBalancerServiceServer.
func (a *API) UpdateBackends(ctx context.Context, req *vipdv1.UpdateBackendsRequest) (*vipdv1.UpdateBackendsResponse, error) {
	if v := validation.Name(req.Name, "name"); len(v) > 0 {
		return nil, toStatus(v)
	}
	var v validation.Violations
	remove := map[netip.Addr]bool{}
	removeOrder := make([]netip.Addr, 0, len(req.Remove)) // remove's addresses as listed, for absent
	for i, s := range req.Remove {
		ip, vs := validation.RemovedBackendIP(s, fmt.Sprintf("remove[%d]", i))
		if len(vs) > 0 {
			v = append(v, vs...)
			continue
		}
		remove[ip] = true
		removeOrder = append(removeOrder, ip)
	}
	if len(v) > 0 {
		return nil, toStatus(v)
	}
	p := authz.FromContext(ctx)
	res, err := a.mutate(ctx, req.ValidateOnly, func(tx *store.Txn) (any, error) {
		old, ok := tx.Get(req.Name)
		if !ok {
			return nil, notFound(req.Name)
		}
		if err := p.CheckOwner(old.Owner()); err != nil {
			return nil, err
		}
		if err := checkGeneration(tx, req.Name, req.ExpectedGeneration); err != nil {
			return nil, err
		}
		merged, err := a.mergeBackends(old, req.Upsert, remove)
		if err != nil {
			return nil, err
		}
		// Only the backends are new: the rest of the service keeps the
		// policy it was stored under (an earlier vipd's, perhaps).
		svc, dp, err := a.honoured(validation.UpdatedBackends(merged, a.limits, "service"))
		var v validation.Violations
		if errors.As(err, &v) {
			// The request has no field "service": the merged backend set
			// comes from upsert, so a violation of it names upsert.
			for i := range v {
				if v[i].Field == "service.backends" {
					v[i].Field = "upsert"
				}
			}
		}
		if err != nil {
			return nil, err
		}
		stored, _, err := put(tx, svc, dp)
		if err != nil {
			return nil, err
		}
		return &vipdv1.UpdateBackendsResponse{Service: stored, Absent: absent(old.Dataplane, req.Remove, removeOrder)}, nil
	})
	if err != nil {
		// Only upsert adds addresses: what the service had may stay.
		return nil, a.fail(ctx, addressViolation(err, func(_ store.AddrRole, ip netip.Addr) string { return backendField("upsert", req.Upsert, ip) }))
	}
	return res.(*vipdv1.UpdateBackendsResponse), nil
}

// absent returns the entries of remove, as written, whose addresses (ips,
// index for index) svc has no backend of, each address once.
func absent(svc *dataplane.Service, remove []string, ips []netip.Addr) []string {
	if len(ips) == 0 {
		return nil
	}
	have := make(map[netip.Addr]bool, len(svc.Backends))
	for _, b := range svc.Backends {
		have[b.IP] = true
	}
	var res []string
	for i, ip := range ips {
		if !have[ip] {
			res = append(res, remove[i])
			have[ip] = true // listed once
		}
	}
	return res
}

// mergeBackends returns a copy of e's service with the backends in remove
// taken out and upsert written over it, each upsert validated against the
// service and named "upsert[i]" in violations.
func (a *API) mergeBackends(e *store.Entry, upsert []*vipdv1.Backend, remove map[netip.Addr]bool) (*vipdv1.Service, error) {
	var v validation.Violations
	ctx := validation.NewBackendContext(e.Dataplane)
	byIP := map[netip.Addr]*vipdv1.Backend{}
	for i, in := range upsert {
		field := fmt.Sprintf("upsert[%d]", i)
		b, _ := proto.Clone(in).(*vipdv1.Backend)
		db, vs := validation.Backend(b, ctx, field)
		if len(vs) > 0 {
			v = append(v, vs...)
			continue
		}
		switch {
		case byIP[db.IP] != nil:
			v = append(v, validation.Violation{Field: field + ".ip", Description: fmt.Sprintf("%s is listed twice in upsert", db.IP)})
		case remove[db.IP]:
			v = append(v, validation.Violation{Field: field + ".ip", Description: fmt.Sprintf("%s is also in remove", db.IP)})
		default:
			byIP[db.IP] = b
		}
	}
	if len(v) > 0 {
		return nil, v
	}
	merged := e.Service()
	merged.Backends = slices.DeleteFunc(merged.Backends, func(b *vipdv1.Backend) bool {
		ip := netip.MustParseAddr(b.Ip)
		return remove[ip] || byIP[ip] != nil
	})
	for _, b := range byIP {
		merged.Backends = append(merged.Backends, b)
	}
	return merged, nil
}

// GetStatus implements vipdv1.StatusServiceServer.
func (a *API) GetStatus(context.Context, *vipdv1.GetStatusRequest) (*vipdv1.GetStatusResponse, error) {
	st := a.rec.Status()
	resp := &vipdv1.GetStatusResponse{
		Dataplane:         a.dataplane,
		Services:          uint32(st.Services),
		Backends:          uint32(st.Backends),
		AppliedGeneration: st.AppliedGeneration,
		LastSyncDuration:  durationpb.New(st.LastSyncDuration),
		Version:           a.version,
		Ready:             st.Ready,
		InstanceId:        a.instance,
		Zone:              st.Topology.Zone,
		ZoneSource:        a.zoneSource(st.Topology.Zone),
		NodeName:          st.Topology.NodeName,
	}
	if !st.LastSync.IsZero() {
		resp.LastSyncTime = timestamppb.New(st.LastSync)
	}
	if st.LastError != nil {
		resp.LastError = st.LastError.Error()
	}
	if st.HeldReason != "" {
		// GetStatus has no field of its own for why vipd is not ready.
		msg := "not ready: " + st.HeldReason
		if resp.LastError != "" {
			msg += "; last apply: " + resp.LastError
		}
		resp.LastError = msg
	}
	for _, f := range a.warnings {
		resp.Warnings = append(resp.Warnings, f()...)
	}
	for _, lb := range a.caps.LoadBalancing {
		resp.SupportedLoadBalancing = append(resp.SupportedLoadBalancing, loadBalancingToProto[lb])
	}
	for _, p := range a.caps.Protocols {
		resp.SupportedProtocols = append(resp.SupportedProtocols, protocolToProto[p])
	}
	return resp, nil
}

var loadBalancingToProto = map[dataplane.LoadBalancing]vipdv1.LoadBalancing{
	dataplane.LoadBalancingRandom: vipdv1.LoadBalancing_LOAD_BALANCING_RANDOM,
	dataplane.LoadBalancingMaglev: vipdv1.LoadBalancing_LOAD_BALANCING_MAGLEV,
}

var protocolToProto = map[dataplane.Protocol]vipdv1.Protocol{
	dataplane.TCP:  vipdv1.Protocol_PROTOCOL_TCP,
	dataplane.UDP:  vipdv1.Protocol_PROTOCOL_UDP,
	dataplane.SCTP: vipdv1.Protocol_PROTOCOL_SCTP,
}
