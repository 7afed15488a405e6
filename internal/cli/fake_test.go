package cli

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// fakeVipd is a small in-memory stand-in for vipd with just enough
// behaviour for vipctl's tests: owners, generations, VIP validation with
// field violations, VIP:port conflicts and expected generations.
type fakeVipd struct {
	vipdv1.UnimplementedLoadBalancerServiceServer
	vipdv1.UnimplementedStatusServiceServer

	mu       sync.Mutex
	services map[string]*vipdv1.Service
	gen      uint64
	upserts  []*vipdv1.Service // every service UpsertService received, as received
}

func newFakeVipd() *fakeVipd {
	return &fakeVipd{services: map[string]*vipdv1.Service{}}
}

// start serves f on a Unix socket in a short temporary directory (sun_path
// holds 107 bytes) and returns the socket's path.
func (f *fakeVipd) start(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "vipctl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "vipd.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	vipdv1.RegisterLoadBalancerServiceServer(g, f)
	vipdv1.RegisterStatusServiceServer(g, f)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = g.Serve(l)
	}()
	t.Cleanup(func() {
		g.Stop()
		<-done
	})
	return sock
}

// get returns a copy of the stored service, or nil.
func (f *fakeVipd) get(name string) *vipdv1.Service {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s, ok := f.services[name]; ok {
		return proto.Clone(s).(*vipdv1.Service)
	}
	return nil
}

// validate checks what the tests need checked, the way vipd reports it.
func (f *fakeVipd) validate(s *vipdv1.Service, field string) error {
	var violations []*errdetails.BadRequest_FieldViolation
	if s.GetName() == "" {
		violations = append(violations, &errdetails.BadRequest_FieldViolation{Field: field + ".name", Description: "is required"})
	}
	for i, vip := range s.GetVips() {
		if _, err := netip.ParseAddr(vip); err != nil {
			violations = append(violations, &errdetails.BadRequest_FieldViolation{
				Field: fmt.Sprintf("%s.vips[%d]", field, i), Description: fmt.Sprintf("%q is not an IP address", vip),
			})
		}
	}
	if len(violations) > 0 {
		st, err := status.New(codes.InvalidArgument, "invalid service").WithDetails(&errdetails.BadRequest{FieldViolations: violations})
		if err != nil {
			return err
		}
		return st.Err()
	}
	s = withDefaults(s)
	for _, other := range f.services {
		if other.Name == s.Name {
			continue
		}
		for _, vip := range s.GetVips() {
			for _, p := range s.GetPorts() {
				if slices.Contains(other.Vips, vip) && slices.ContainsFunc(other.Ports, func(o *vipdv1.Port) bool {
					return o.Port == p.Port && o.Protocol == p.Protocol
				}) {
					return status.Errorf(codes.AlreadyExists, "%s:%d is used by service %s", vip, p.Port, other.Name)
				}
			}
		}
	}
	return nil
}

// withDefaults is s as vipd stores it: with defaults filled in.
func withDefaults(s *vipdv1.Service) *vipdv1.Service {
	s = proto.Clone(s).(*vipdv1.Service)
	if s.Owner == "" {
		s.Owner = "default"
	}
	for _, p := range s.Ports {
		if p.Protocol == vipdv1.Protocol_PROTOCOL_UNSPECIFIED {
			p.Protocol = vipdv1.Protocol_PROTOCOL_TCP
		}
	}
	for _, b := range s.Backends {
		if b.State == vipdv1.BackendState_BACKEND_STATE_UNSPECIFIED {
			b.State = vipdv1.BackendState_BACKEND_STATE_READY
		}
		if b.Weight == 0 {
			b.Weight = 1
		}
	}
	if s.SessionAffinity == nil {
		s.SessionAffinity = &vipdv1.SessionAffinityConfig{}
	}
	if s.SessionAffinity.Mode == vipdv1.SessionAffinity_SESSION_AFFINITY_UNSPECIFIED {
		s.SessionAffinity.Mode = vipdv1.SessionAffinity_SESSION_AFFINITY_NONE
	}
	if s.InternalTrafficPolicy == vipdv1.TrafficPolicy_TRAFFIC_POLICY_UNSPECIFIED {
		s.InternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER
	}
	if s.LoadBalancing == vipdv1.LoadBalancing_LOAD_BALANCING_UNSPECIFIED {
		s.LoadBalancing = vipdv1.LoadBalancing_LOAD_BALANCING_RANDOM
	}
	s.Generation = 0
	return s
}

func (f *fakeVipd) checkGeneration(name string, expected uint64) error {
	s, ok := f.services[name]
	if expected != 0 && (!ok || s.Generation != expected) {
		return status.Errorf(codes.Aborted, "service %s: expected generation %d, have %d", name, expected, s.GetGeneration())
	}
	return nil
}

func (f *fakeVipd) store(s *vipdv1.Service) *vipdv1.Service {
	f.gen++
	s.Generation = f.gen
	f.services[s.Name] = s
	return proto.Clone(s).(*vipdv1.Service)
}

func (f *fakeVipd) UpsertService(_ context.Context, req *vipdv1.UpsertServiceRequest) (*vipdv1.UpsertServiceResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.upserts = append(f.upserts, proto.Clone(req.GetService()).(*vipdv1.Service))
	if err := f.validate(req.GetService(), "service"); err != nil {
		return nil, err
	}
	if err := f.checkGeneration(req.GetService().GetName(), req.ExpectedGeneration); err != nil {
		return nil, err
	}
	return &vipdv1.UpsertServiceResponse{Service: f.store(withDefaults(req.GetService()))}, nil
}

func (f *fakeVipd) DeleteService(_ context.Context, req *vipdv1.DeleteServiceRequest) (*vipdv1.DeleteServiceResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.services[req.Name]; !ok {
		return nil, status.Errorf(codes.NotFound, "service %s not found", req.Name)
	}
	if err := f.checkGeneration(req.Name, req.ExpectedGeneration); err != nil {
		return nil, err
	}
	delete(f.services, req.Name)
	return &vipdv1.DeleteServiceResponse{}, nil
}

func (f *fakeVipd) GetService(_ context.Context, req *vipdv1.GetServiceRequest) (*vipdv1.GetServiceResponse, error) {
	if s := f.get(req.Name); s != nil {
		return &vipdv1.GetServiceResponse{Service: s}, nil
	}
	return nil, status.Errorf(codes.NotFound, "service %s not found", req.Name)
}

func (f *fakeVipd) ListServices(_ context.Context, req *vipdv1.ListServicesRequest) (*vipdv1.ListServicesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	resp := &vipdv1.ListServicesResponse{}
	for _, s := range f.services {
		if req.Owner == "" || s.Owner == req.Owner {
			resp.Services = append(resp.Services, proto.Clone(s).(*vipdv1.Service))
		}
	}
	slices.SortFunc(resp.Services, func(a, b *vipdv1.Service) int { return strings.Compare(a.Name, b.Name) })
	return resp, nil
}

func (f *fakeVipd) SyncServices(_ context.Context, req *vipdv1.SyncServicesRequest) (*vipdv1.SyncServicesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if req.Owner == "" {
		return nil, status.Error(codes.InvalidArgument, "owner is required")
	}
	for i, s := range req.Services {
		if err := f.validate(s, fmt.Sprintf("services[%d]", i)); err != nil {
			return nil, err
		}
		if s.Owner != "" && s.Owner != req.Owner {
			return nil, status.Errorf(codes.InvalidArgument, "services[%d] has owner %s", i, s.Owner)
		}
	}
	resp := &vipdv1.SyncServicesResponse{}
	keep := map[string]bool{}
	for _, s := range req.Services {
		s = withDefaults(s)
		s.Owner = req.Owner
		keep[s.Name] = true
		old, ok := f.services[s.Name]
		switch {
		case !ok:
			resp.Created = append(resp.Created, s.Name)
		case proto.Equal(withDefaults(old), s):
			resp.Unchanged = append(resp.Unchanged, s.Name)
			continue
		default:
			resp.Updated = append(resp.Updated, s.Name)
		}
		f.store(s)
	}
	for name, s := range f.services {
		if s.Owner == req.Owner && !keep[name] {
			delete(f.services, name)
			resp.Deleted = append(resp.Deleted, name)
		}
	}
	for _, l := range [][]string{resp.Created, resp.Updated, resp.Deleted, resp.Unchanged} {
		slices.Sort(l)
	}
	return resp, nil
}

func (f *fakeVipd) UpdateBackends(_ context.Context, req *vipdv1.UpdateBackendsRequest) (*vipdv1.UpdateBackendsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	old, ok := f.services[req.Name]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "service %s not found", req.Name)
	}
	if err := f.checkGeneration(req.Name, req.ExpectedGeneration); err != nil {
		return nil, err
	}
	s := proto.Clone(old).(*vipdv1.Service)
	s.Backends = slices.DeleteFunc(s.Backends, func(b *vipdv1.Backend) bool {
		return slices.Contains(req.Remove, b.Ip) ||
			slices.ContainsFunc(req.Upsert, func(u *vipdv1.Backend) bool { return u.Ip == b.Ip })
	})
	s.Backends = append(s.Backends, req.Upsert...)
	return &vipdv1.UpdateBackendsResponse{Service: f.store(withDefaults(s))}, nil
}

func (f *fakeVipd) GetStatus(context.Context, *vipdv1.GetStatusRequest) (*vipdv1.GetStatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	backends := 0
	for _, s := range f.services {
		backends += len(s.Backends)
	}
	return &vipdv1.GetStatusResponse{
		Dataplane:              "fake",
		Services:               uint32(len(f.services)),
		Backends:               uint32(backends),
		AppliedGeneration:      f.gen,
		LastSyncDuration:       durationpb.New(1500 * time.Microsecond),
		LastSyncTime:           timestamppb.New(time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)),
		Version:                "v0.1.0",
		Ready:                  true,
		SupportedLoadBalancing: []vipdv1.LoadBalancing{vipdv1.LoadBalancing_LOAD_BALANCING_RANDOM, vipdv1.LoadBalancing_LOAD_BALANCING_MAGLEV},
		SupportedProtocols:     []vipdv1.Protocol{vipdv1.Protocol_PROTOCOL_TCP, vipdv1.Protocol_PROTOCOL_UDP},
	}, nil
}
