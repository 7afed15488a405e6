package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
)

// DefaultMaxRecvMsgSize bounds a request's size. It is large enough for a
// SyncServices of 100,000 services with 10 backends each.
const DefaultMaxRecvMsgSize = 64 << 20

// maxUnixPathLen is the room in sockaddr_un.sun_path, less the trailing NUL.
const maxUnixPathLen = 107

// Server is the daemon's gRPC shell. It serves the API on its listeners
// together with grpc.health.v1 and reflection. Health reports NOT_SERVING
// until MarkReady is called.
type Server struct {
	log       hclog.Logger
	grpc      *grpc.Server
	health    *health.Server
	listeners []net.Listener
	maxRecv   int
	unary     []grpc.UnaryServerInterceptor
	stream    []grpc.StreamServerInterceptor
}

// Option configures a Server.
type Option func(*Server) error

// WithUnixSocket listens on a Unix socket at path with the given file mode.
// It checks the path's length, creates the parent directory, and removes a
// stale socket file, but refuses to replace a socket that a live process
// still answers on.
func WithUnixSocket(path string, mode os.FileMode) Option {
	return func(s *Server) error {
		l, err := listenUnix(path, mode)
		if err != nil {
			return err
		}
		s.listeners = append(s.listeners, l)
		return nil
	}
}

// WithListener serves on an existing listener, such as a bufconn in tests.
func WithListener(l net.Listener) Option {
	return func(s *Server) error {
		s.listeners = append(s.listeners, l)
		return nil
	}
}

// WithMaxRecvMsgSize bounds the size of a request; larger ones get ResourceExhausted.
func WithMaxRecvMsgSize(n int) Option {
	return func(s *Server) error {
		s.maxRecv = n
		return nil
	}
}

// WithInterceptors adds interceptors, such as internal/metrics' gRPC
// metrics. They run outermost, in the order given, before logging and
// recovery, so they see every call's final status code, including that of
// a recovered panic. The option may be given more than once.
func WithInterceptors(unary []grpc.UnaryServerInterceptor, stream []grpc.StreamServerInterceptor) Option {
	return func(s *Server) error {
		s.unary = append(s.unary, unary...)
		s.stream = append(s.stream, stream...)
		return nil
	}
}

// New builds a server for api. On error every listener it opened is closed.
func New(log hclog.Logger, api *API, opts ...Option) (*Server, error) {
	s := &Server{log: log, maxRecv: DefaultMaxRecvMsgSize}
	for _, o := range opts {
		if err := o(s); err != nil {
			s.closeListeners()
			return nil, err
		}
	}
	if len(s.listeners) == 0 {
		return nil, errors.New("server has no listener")
	}
	grpcLog := log.Named("grpc")
	recoveryOpt := recovery.WithRecoveryHandler(func(p any) error {
		grpcLog.Error("panic in handler", "panic", p, "stack", string(debug.Stack()))
		return status.Errorf(codes.Internal, "internal error: %v", p)
	})
	logOpts := []logging.Option{
		logging.WithLogOnEvents(logging.FinishCall),
		logging.WithLevels(callLevel),
	}
	unary := append(slices.Clip(s.unary),
		logging.UnaryServerInterceptor(hclogAdapter(grpcLog), logOpts...),
		recovery.UnaryServerInterceptor(recoveryOpt),
	)
	stream := append(slices.Clip(s.stream),
		logging.StreamServerInterceptor(hclogAdapter(grpcLog), logOpts...),
		recovery.StreamServerInterceptor(recoveryOpt),
	)
	s.grpc = grpc.NewServer(
		grpc.MaxRecvMsgSize(s.maxRecv),
		grpc.ChainUnaryInterceptor(unary...),
		grpc.ChainStreamInterceptor(stream...),
	)
	api.Register(s.grpc)
	s.health = health.NewServer()
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	return s, nil
}

// Serve serves every listener until Shutdown. It returns the first serve error.
func (s *Server) Serve() error {
	errc := make(chan error, len(s.listeners))
	for _, l := range s.listeners {
		s.log.Info("serving gRPC", "addr", l.Addr().String())
		go func() { errc <- s.grpc.Serve(l) }()
	}
	for range s.listeners {
		if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("serve: %w", err)
		}
	}
	return nil
}

// GetServiceInfo returns the services registered on the gRPC server, so
// that metrics can be initialized for every method before its first call
// (it makes Server a reflection.ServiceInfoProvider).
func (s *Server) GetServiceInfo() map[string]grpc.ServiceInfo {
	return s.grpc.GetServiceInfo()
}

// MarkReady turns health to SERVING; call it after the first successful apply.
func (s *Server) MarkReady() {
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
}

// Shutdown turns health to NOT_SERVING, lets calls in flight finish for up
// to timeout, and then stops the server. It does not touch the dataplane.
func (s *Server) Shutdown(timeout time.Duration) {
	s.health.Shutdown()
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(timeout):
		s.log.Warn("graceful stop timed out; stopping", "timeout", timeout)
		s.grpc.Stop()
	}
}

func (s *Server) closeListeners() {
	for _, l := range s.listeners {
		l.Close()
	}
}

func listenUnix(path string, mode os.FileMode) (net.Listener, error) {
	if len(path) > maxUnixPathLen {
		return nil, fmt.Errorf("socket path %s is %d bytes; at most %d fit", path, len(path), maxUnixPathLen)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create socket dir: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("socket path %s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("socket %s is in use by another process", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	if err := os.Chmod(path, mode); err != nil {
		l.Close()
		return nil, fmt.Errorf("chmod socket: %w", err)
	}
	return l, nil
}

// callLevel logs successful calls at debug level and failures louder.
func callLevel(c codes.Code) logging.Level {
	switch c {
	case codes.OK:
		return logging.LevelDebug
	case codes.Internal, codes.Unknown, codes.DataLoss, codes.Unavailable:
		return logging.LevelError
	}
	return logging.LevelInfo
}

// hclogAdapter lets go-grpc-middleware log through hclog. Fields carry the
// method, code and duration; request bodies are never logged.
func hclogAdapter(log hclog.Logger) logging.Logger {
	return logging.LoggerFunc(func(_ context.Context, lvl logging.Level, msg string, fields ...any) {
		switch lvl {
		case logging.LevelDebug:
			log.Debug(msg, fields...)
		case logging.LevelInfo:
			log.Info(msg, fields...)
		case logging.LevelWarn:
			log.Warn(msg, fields...)
		default:
			log.Error(msg, fields...)
		}
	})
}
