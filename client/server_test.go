package client_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// memServer is a small in-memory stand-in for vipd: just enough of the API
// for the client's tests and example. hook, when set, runs first in every
// handler; a non-nil result is returned instead of the normal answer.
type memServer struct {
	vipdv1.UnimplementedLoadBalancerServiceServer
	vipdv1.UnimplementedStatusServiceServer

	mu       sync.Mutex
	services map[string]*vipdv1.Service
	gen      uint64
	calls    map[string]int
	hook     func(ctx context.Context, method string) error
}

func newMemServer() *memServer {
	return &memServer{services: map[string]*vipdv1.Service{}, calls: map[string]int{}}
}

// setHook replaces the hook; safe while the server runs.
func (m *memServer) setHook(h func(ctx context.Context, method string) error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.hook = h
}

// callCount is how many times method's handler ran.
func (m *memServer) callCount(method string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls[method]
}

func (m *memServer) enter(ctx context.Context, method string) error {
	m.mu.Lock()
	m.calls[method]++
	h := m.hook
	m.mu.Unlock()
	if h != nil {
		return h(ctx, method)
	}
	return nil
}

func (m *memServer) store(svc *vipdv1.Service) *vipdv1.Service {
	s := proto.Clone(svc).(*vipdv1.Service)
	if s.Owner == "" {
		s.Owner = "default"
	}
	m.gen++
	s.Generation = m.gen
	m.services[s.Name] = s
	return proto.Clone(s).(*vipdv1.Service)
}

func (m *memServer) check(name string, expected uint64) error {
	s, ok := m.services[name]
	switch {
	case expected != 0 && (!ok || s.Generation != expected):
		return status.Errorf(codes.Aborted, "service %s: generation mismatch", name)
	case !ok:
		return status.Errorf(codes.NotFound, "service %s not found", name)
	}
	return nil
}

func (m *memServer) UpsertService(ctx context.Context, req *vipdv1.UpsertServiceRequest) (*vipdv1.UpsertServiceResponse, error) {
	if err := m.enter(ctx, "UpsertService"); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if req.ExpectedGeneration != 0 {
		if err := m.check(req.GetService().GetName(), req.ExpectedGeneration); err != nil {
			return nil, err
		}
	}
	return &vipdv1.UpsertServiceResponse{Service: m.store(req.GetService())}, nil
}

func (m *memServer) DeleteService(ctx context.Context, req *vipdv1.DeleteServiceRequest) (*vipdv1.DeleteServiceResponse, error) {
	if err := m.enter(ctx, "DeleteService"); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(req.Name, req.ExpectedGeneration); err != nil {
		return nil, err
	}
	delete(m.services, req.Name)
	return &vipdv1.DeleteServiceResponse{}, nil
}

func (m *memServer) GetService(ctx context.Context, req *vipdv1.GetServiceRequest) (*vipdv1.GetServiceResponse, error) {
	if err := m.enter(ctx, "GetService"); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(req.Name, 0); err != nil {
		return nil, err
	}
	return &vipdv1.GetServiceResponse{Service: m.services[req.Name]}, nil
}

func (m *memServer) ListServices(ctx context.Context, req *vipdv1.ListServicesRequest) (*vipdv1.ListServicesResponse, error) {
	if err := m.enter(ctx, "ListServices"); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	resp := &vipdv1.ListServicesResponse{}
	for _, s := range m.services {
		if req.Owner == "" || s.Owner == req.Owner {
			resp.Services = append(resp.Services, s)
		}
	}
	slices.SortFunc(resp.Services, func(a, b *vipdv1.Service) int { return strings.Compare(a.Name, b.Name) })
	return resp, nil
}

func (m *memServer) SyncServices(ctx context.Context, req *vipdv1.SyncServicesRequest) (*vipdv1.SyncServicesResponse, error) {
	if err := m.enter(ctx, "SyncServices"); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	resp := &vipdv1.SyncServicesResponse{}
	keep := map[string]bool{}
	for _, s := range req.Services {
		s = proto.Clone(s).(*vipdv1.Service)
		s.Owner = req.Owner
		keep[s.Name] = true
		old, ok := m.services[s.Name]
		switch {
		case !ok:
			resp.Created = append(resp.Created, s.Name)
		case proto.Equal(withoutGeneration(old), s):
			resp.Unchanged = append(resp.Unchanged, s.Name)
			continue
		default:
			resp.Updated = append(resp.Updated, s.Name)
		}
		m.store(s)
	}
	for name, s := range m.services {
		if s.Owner == req.Owner && !keep[name] {
			delete(m.services, name)
			resp.Deleted = append(resp.Deleted, name)
		}
	}
	for _, l := range [][]string{resp.Created, resp.Updated, resp.Deleted, resp.Unchanged} {
		slices.Sort(l)
	}
	return resp, nil
}

func withoutGeneration(s *vipdv1.Service) *vipdv1.Service {
	c := proto.Clone(s).(*vipdv1.Service)
	c.Generation = 0
	return c
}

func (m *memServer) UpdateBackends(ctx context.Context, req *vipdv1.UpdateBackendsRequest) (*vipdv1.UpdateBackendsResponse, error) {
	if err := m.enter(ctx, "UpdateBackends"); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(req.Name, req.ExpectedGeneration); err != nil {
		return nil, err
	}
	s := proto.Clone(m.services[req.Name]).(*vipdv1.Service)
	s.Backends = slices.DeleteFunc(s.Backends, func(b *vipdv1.Backend) bool {
		return slices.Contains(req.Remove, b.Ip) ||
			slices.ContainsFunc(req.Upsert, func(u *vipdv1.Backend) bool { return u.Ip == b.Ip })
	})
	s.Backends = append(s.Backends, req.Upsert...)
	return &vipdv1.UpdateBackendsResponse{Service: m.store(s)}, nil
}

func (m *memServer) GetStatus(ctx context.Context, _ *vipdv1.GetStatusRequest) (*vipdv1.GetStatusResponse, error) {
	if err := m.enter(ctx, "GetStatus"); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return &vipdv1.GetStatusResponse{Dataplane: "fake", Services: uint32(len(m.services)), Ready: true}, nil
}

// serve runs m with health on l until the returned stop is called.
func serve(m *memServer, l net.Listener) (stop func()) {
	g := grpc.NewServer()
	vipdv1.RegisterLoadBalancerServiceServer(g, m)
	vipdv1.RegisterStatusServiceServer(g, m)
	healthpb.RegisterHealthServer(g, health.NewServer())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = g.Serve(l)
	}()
	return func() {
		g.Stop()
		<-done
	}
}

// serveUnix serves m on a new Unix socket and returns its path. The socket
// lives in a short temporary directory because sun_path holds only 107 bytes,
// which t.TempDir's test-named paths can exceed.
func serveUnix(m *memServer) (path string, stop func(), err error) {
	dir, err := os.MkdirTemp("", "vipd")
	if err != nil {
		return "", nil, err
	}
	path = filepath.Join(dir, "vipd.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	stopServer := serve(m, l)
	return path, func() {
		stopServer()
		os.RemoveAll(dir)
	}, nil
}

// startUnix is serveUnix for tests, stopped at cleanup.
func startUnix(t *testing.T, m *memServer) string {
	t.Helper()
	path, stop, err := serveUnix(m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return path
}
