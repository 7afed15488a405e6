package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/hashicorp/go-hclog"
)

// DefaultAddr is the default address of the metrics listener: loopback
// only, since metrics name services and the endpoint has no
// authentication.
const DefaultAddr = "127.0.0.1:9640"

const (
	readHeaderTimeout = 10 * time.Second
	shutdownTimeout   = 5 * time.Second
)

// HandlerOption configures NewHandler and Listen.
type HandlerOption func(*handlerConfig)

type handlerConfig struct {
	pprof bool
}

// WithPprof also serves the Go runtime's profiles (net/http/pprof) under
// /debug/pprof/. It is off by default: a CPU profile costs the daemon CPU
// while it runs, and the endpoint has no authentication, so it belongs on
// a loopback address only.
func WithPprof() HandlerOption { return func(c *handlerConfig) { c.pprof = true } }

// NewHandler serves:
//   - /metrics: m's registry;
//   - /healthz: 200 while the process is up;
//   - /readyz: 200 once ready returns true (after the first successful
//     apply), 503 before;
//   - /debug/pprof/: profiles, with WithPprof only.
//
// ready is called on every /readyz request and must be cheap and safe for
// concurrent use.
func NewHandler(m *Metrics, ready func() bool, opts ...HandlerOption) http.Handler {
	var cfg handlerConfig
	for _, o := range opts {
		o(&cfg)
	}
	mux := http.NewServeMux()
	if cfg.pprof {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	mux.Handle("GET /metrics", m.Handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !ready() {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready: the initial state has not been applied")
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// Server is the HTTP listener for NewHandler. Create it with Listen, run it
// with Serve.
type Server struct {
	log  hclog.Logger
	l    net.Listener
	http *http.Server
}

// Listen opens addr (host:port; port 0 picks one) for NewHandler(m, ready,
// opts...). It fails at once if the address cannot be bound, so that a
// daemon can refuse to start. ready must not be nil.
func Listen(log hclog.Logger, addr string, m *Metrics, ready func() bool, opts ...HandlerOption) (*Server, error) {
	if ready == nil {
		return nil, errors.New("metrics listener needs a ready func")
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for metrics on %s: %w", addr, err)
	}
	return &Server{
		log: log,
		l:   l,
		http: &http.Server{
			Handler:           NewHandler(m, ready, opts...),
			ReadHeaderTimeout: readHeaderTimeout,
			ErrorLog:          log.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}),
		},
	}, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.l.Addr() }

// Serve serves until ctx ends, then lets requests in flight finish for a
// few seconds and closes the listener. It returns nil after ctx ends, or
// the error that stopped serving.
func (s *Server) Serve(ctx context.Context) error {
	s.log.Info("serving metrics and health", "addr", s.l.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- s.http.Serve(s.l) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve metrics: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := s.http.Shutdown(sctx); err != nil {
		s.http.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve metrics: %w", err)
	}
	return nil
}

// Close stops the server at once, without waiting for requests in flight,
// and closes its listener. It is for a Server whose Serve never ran (the
// daemon failed to start); otherwise end Serve's ctx.
func (s *Server) Close() error {
	err := s.http.Close()
	if lerr := s.l.Close(); lerr != nil && !errors.Is(lerr, net.ErrClosed) {
		err = errors.Join(err, lerr)
	}
	return err
}
