package hcnodeport

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/internal/nsdo"
)

// Check is the Check of the warnings a Server reports.
const Check = "hc-node-port"

// retryPeriod is how often listeners that failed are tried again while
// the state does not change.
const retryPeriod = 10 * time.Second

// Warning is a listener that could not be opened.
type Warning struct {
	Check, Message, Remedy string
	Since                  time.Time
}

// Answer is what the health-check node port of one service answers.
type Answer struct {
	// Service is the vipd service's name.
	Service string
	// LocalEndpoints is the number of distinct node-local backend
	// addresses that may take external traffic.
	LocalEndpoints int
}

// Body is the JSON body of a, kube-proxy's: the service name split at its
// first "/" into namespace and name (no "/": namespace "").
func (a Answer) Body() []byte {
	ns, name, ok := strings.Cut(a.Service, "/")
	if !ok {
		ns, name = "", a.Service
	}
	b, _ := json.Marshal(body{Service: serviceRef{Namespace: ns, Name: name}, LocalEndpoints: a.LocalEndpoints, ServiceProxyHealthy: true})
	return b
}

// body is kube-proxy's answer, fields in its order.
type body struct {
	Service             serviceRef `json:"service"`
	LocalEndpoints      int        `json:"localEndpoints"`
	ServiceProxyHealthy bool       `json:"serviceProxyHealthy"`
}

type serviceRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// Answers returns the health-check node ports that s asks for, each with
// its answer: one per service with an ExternalTrafficPolicy of Local and a
// HealthCheckNodePort. Services that share a port: the first by name
// wins, and the others are returned in conflicts.
func Answers(s *dataplane.State) (answers map[uint16]Answer, conflicts []string) {
	answers = map[uint16]Answer{}
	for name, svc := range s.All() {
		if svc.ExternalTrafficPolicy != dataplane.TrafficPolicyLocal || svc.HealthCheckNodePort == 0 {
			continue
		}
		if a, ok := answers[svc.HealthCheckNodePort]; ok {
			conflicts = append(conflicts, fmt.Sprintf("services %s and %s both ask for health-check node port %d; %s is served", a.Service, name, svc.HealthCheckNodePort, a.Service))
			continue
		}
		answers[svc.HealthCheckNodePort] = Answer{Service: name, LocalEndpoints: localEndpoints(svc)}
	}
	return answers, conflicts
}

// localEndpoints counts the distinct addresses of svc's backends that may
// take external traffic under policy Local, over every port and family.
func localEndpoints(svc *dataplane.Service) int {
	seen := map[netip.Addr]struct{}{}
	for _, p := range svc.Ports {
		for _, is6 := range []bool{false, true} {
			for _, b := range svc.ExternalBackends(p, is6, dataplane.TrafficPolicyLocal) {
				seen[b.IP] = struct{}{}
			}
		}
	}
	return len(seen)
}

// Server serves the health-check node ports. Create it with New, hand it
// states with Update, and run it with Run.
type Server struct {
	log   hclog.Logger
	netns string

	update  chan *dataplane.State // holds at most the latest state
	answers atomic.Pointer[map[uint16]Answer]

	// Run's goroutine only.
	listeners map[netip.AddrPort]*listener
	failed    map[netip.AddrPort]error

	mu       sync.Mutex
	warnings map[string]Warning // by message's key: the address:port or "conflict:<service>"
}

type listener struct {
	srv  *http.Server
	done chan struct{}
}

// New returns a Server that listens in the network namespace at netns
// (the caller's own when empty). It serves nothing until Run and Update.
func New(log hclog.Logger, netns string) *Server {
	s := &Server{
		log:       log,
		netns:     netns,
		update:    make(chan *dataplane.State, 1),
		listeners: map[netip.AddrPort]*listener{},
		failed:    map[netip.AddrPort]error{},
		warnings:  map[string]Warning{},
	}
	s.answers.Store(&map[uint16]Answer{})
	return s
}

// Update hands s the state the dataplane now has; Run follows it. It never
// blocks: a state not yet taken is replaced by the newer one. s keeps st
// and reads it later, as ServiceSet allows.
func (s *Server) Update(st *dataplane.State) {
	for {
		select {
		case s.update <- st:
			return
		default:
		}
		select {
		case <-s.update:
		default:
		}
	}
}

// Warnings returns the listeners that failed and the conflicting services,
// sorted by message.
func (s *Server) Warnings() []Warning {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Collect(maps.Values(s.warnings))
	slices.SortFunc(out, func(a, b Warning) int { return cmp.Compare(a.Message, b.Message) })
	return out
}

// Run follows the states handed to Update until ctx ends, then closes
// every listener.
func (s *Server) Run(ctx context.Context) {
	retry := time.NewTicker(retryPeriod)
	defer retry.Stop()
	var last *dataplane.State
	defer s.closeAll()
	for {
		select {
		case <-ctx.Done():
			return
		case st := <-s.update:
			last = st
			s.sync(st)
		case <-retry.C:
			if last != nil && len(s.failed) > 0 {
				s.sync(last)
			}
		}
	}
}

// sync makes the listeners match st: one per node-port address and
// health-check node port.
func (s *Server) sync(st *dataplane.State) {
	answers, conflicts := Answers(st)
	// Before any new listener opens: it never answers from an older state.
	s.answers.Store(&answers)
	want := map[netip.AddrPort]bool{}
	for port := range answers {
		for _, a := range st.Node.NodePortAddresses {
			want[netip.AddrPortFrom(a, port)] = true
		}
	}
	for ap, l := range s.listeners {
		if !want[ap] {
			s.close(ap, l)
		}
	}
	for ap := range s.failed {
		if !want[ap] {
			delete(s.failed, ap)
		}
	}
	for _, ap := range slices.SortedFunc(maps.Keys(want), netip.AddrPort.Compare) {
		if _, ok := s.listeners[ap]; ok {
			continue
		}
		if err := s.open(ap); err != nil {
			if _, was := s.failed[ap]; !was {
				s.log.Error("listen on a health-check node port; retrying", "address", ap, "service", answers[ap.Port()].Service, "error", err)
			}
			s.failed[ap] = err
			continue
		}
		if _, was := s.failed[ap]; was {
			s.log.Info("listening on a health-check node port after all", "address", ap)
		}
		delete(s.failed, ap)
	}
	s.setWarnings(answers, conflicts)
}

func (s *Server) setWarnings(answers map[uint16]Answer, conflicts []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.warnings
	s.warnings = map[string]Warning{}
	now := time.Now()
	add := func(key string, w Warning) {
		w.Check, w.Since = Check, now
		if o, ok := old[key]; ok && o.Message == w.Message {
			w.Since = o.Since
		}
		s.warnings[key] = w
	}
	for ap, err := range s.failed {
		add(ap.String(), Warning{
			Message: fmt.Sprintf("cannot serve the health-check node port of service %s on %s: %v", answers[ap.Port()].Service, ap, err),
			Remedy:  "free the port on that address (another process listens there?), or give the service another health_check_node_port",
		})
	}
	for _, c := range conflicts {
		add("conflict:"+c, Warning{Message: c, Remedy: "give each service its own health_check_node_port"})
	}
}

// open listens on ap inside the namespace and serves it.
func (s *Server) open(ap netip.AddrPort) error {
	network := "tcp4"
	if ap.Addr().Is6() {
		network = "tcp6"
	}
	var ln net.Listener
	err := nsdo.Do(s.netns, func() error {
		// The socket is made on this thread, in the namespace; it is
		// served from any thread afterwards.
		var err error
		ln, err = net.Listen(network, ap.String())
		return err
	})
	if err != nil {
		return err
	}
	port := ap.Port()
	l := &listener{
		srv: &http.Server{
			Handler:           http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { s.serve(w, port) }),
			ReadHeaderTimeout: 5 * time.Second,
			ErrorLog:          s.log.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Debug}),
		},
		done: make(chan struct{}),
	}
	go func() {
		defer close(l.done)
		if err := l.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("health-check node port server", "address", ap, "error", err)
		}
	}()
	s.listeners[ap] = l
	s.log.Debug("serving a health-check node port", "address", ap, "service", (*s.answers.Load())[port].Service)
	return nil
}

// serve answers a request to the health-check node port port.
func (s *Server) serve(w http.ResponseWriter, port uint16) {
	a, ok := (*s.answers.Load())[port]
	if !ok {
		// The service is gone; its listener is closing.
		http.Error(w, "no service", http.StatusServiceUnavailable)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	if a.LocalEndpoints == 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	w.Write(a.Body())
}

func (s *Server) close(ap netip.AddrPort, l *listener) {
	l.srv.Close()
	<-l.done
	delete(s.listeners, ap)
	s.log.Debug("closed a health-check node port", "address", ap)
}

func (s *Server) closeAll() {
	for ap, l := range s.listeners {
		s.close(ap, l)
	}
}
