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
	wanted := map[string]entry{}
	for name, svc := range s.All() {
		if e, ok := entryOf(name, svc); ok {
			wanted[name] = e
		}
	}
	return answersOf(wanted)
}

// entry is what one service asks of the server.
type entry struct {
	port   uint16
	answer Answer
}

// entryOf is the health-check node port that svc asks for, if any.
func entryOf(name string, svc *dataplane.Service) (entry, bool) {
	if svc.ExternalTrafficPolicy != dataplane.TrafficPolicyLocal || svc.HealthCheckNodePort == 0 {
		return entry{}, false
	}
	return entry{port: svc.HealthCheckNodePort, answer: Answer{Service: name, LocalEndpoints: localEndpoints(svc)}}, true
}

// answersOf turns the entries of the services that ask for a port into
// the answer of each port; see Answers.
func answersOf(wanted map[string]entry) (answers map[uint16]Answer, conflicts []string) {
	answers = map[uint16]Answer{}
	for _, name := range slices.Sorted(maps.Keys(wanted)) {
		e := wanted[name]
		if a, ok := answers[e.port]; ok {
			conflicts = append(conflicts, fmt.Sprintf("services %s and %s both ask for health-check node port %d; %s is served", a.Service, name, e.port, a.Service))
			continue
		}
		answers[e.port] = e.answer
	}
	return answers, conflicts
}

// localEndpoints counts svc's node-local READY backends, as kube-proxy
// counts its local ready endpoints: a backend that serves at least one
// port, counted once per family, and the larger family's count answered
// (a dual-stack pod is one endpoint, not two). TERMINATING backends do
// not count, though they still take connections while no READY one is
// left, so that a load balancer steers away from a draining node; a
// backend failing its health checks arrives here as NOT_SERVING.
func localEndpoints(svc *dataplane.Service) int {
	var perFamily [2]map[netip.Addr]struct{}
	for _, p := range svc.Ports {
		for _, b := range svc.Backends {
			if !b.NodeLocal || b.State != dataplane.BackendReady || !b.Serves(p) {
				continue
			}
			f := 0
			if b.IP.Is6() {
				f = 1
			}
			if perFamily[f] == nil {
				perFamily[f] = map[netip.Addr]struct{}{}
			}
			perFamily[f][b.IP] = struct{}{}
		}
	}
	return max(len(perFamily[0]), len(perFamily[1]))
}

// Server serves the health-check node ports. Create it with New, hand it
// states with Update, and run it with Run.
type Server struct {
	log   hclog.Logger
	netns string

	kick    chan struct{} // a pending state is waiting
	answers atomic.Pointer[map[uint16]Answer]

	pmu     sync.Mutex
	pending pending

	// Run's goroutine only.
	wanted    map[string]entry // by service: those that ask for a port
	node      dataplane.Node
	listeners map[netip.AddrPort]*listener
	failed    map[netip.AddrPort]error

	mu       sync.Mutex
	warnings map[string]Warning // by key: the address:port, or "conflict:" and the message
}

// pending is what Update handed over that Run has not taken yet: the
// latest state, and the services changed since the last one Run took (all
// of them when full): the Changed lists of the states merged, kept as
// they are (a name may repeat; following it twice costs little), not
// copied into a set, which at 100,000 names cost ~5.6 MB.
type pending struct {
	st      *dataplane.State
	changed [][]string
	names   int // in changed, repeats counted
	full    bool
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
		kick:      make(chan struct{}, 1),
		pending:   pending{full: true},
		wanted:    map[string]entry{},
		listeners: map[netip.AddrPort]*listener{},
		failed:    map[netip.AddrPort]error{},
		warnings:  map[string]Warning{},
	}
	s.answers.Store(&map[uint16]Answer{})
	return s
}

// Update hands s the state the dataplane now has; Run follows it. It never
// blocks: states not yet taken are merged, the newest state with every
// service their Changed named (all of them after one with a nil Changed,
// or once the names pending outnumber the services), so that Run costs
// what changed, not the size of the state. s keeps st, its Changed
// included, and reads it later, as ServiceSet allows.
func (s *Server) Update(st *dataplane.State) {
	s.pmu.Lock()
	p := &s.pending
	p.st = st
	switch {
	case p.full:
	case st.Changed == nil || p.names+len(st.Changed) > st.Len():
		p.full, p.changed, p.names = true, nil, 0
	default:
		p.changed = append(p.changed, st.Changed)
		p.names += len(st.Changed)
	}
	s.pmu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// take returns what Update handed over since the last take.
func (s *Server) take() pending {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	p := s.pending
	s.pending = pending{}
	return p
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
	defer s.closeAll()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
			if p := s.take(); p.st != nil {
				s.follow(p)
				s.sync()
			}
		case <-retry.C:
			if len(s.failed) > 0 {
				s.sync()
			}
		}
	}
}

// follow brings the services that ask for a port, and the Node, up to p.
func (s *Server) follow(p pending) {
	s.node = p.st.Node
	if p.full {
		s.wanted = map[string]entry{}
		for name, svc := range p.st.All() {
			if e, ok := entryOf(name, svc); ok {
				s.wanted[name] = e
			}
		}
		return
	}
	for _, names := range p.changed {
		for _, name := range names {
			svc, ok := p.st.Get(name)
			var e entry
			if ok {
				e, ok = entryOf(name, svc)
			}
			if ok {
				s.wanted[name] = e
			} else {
				delete(s.wanted, name)
			}
		}
	}
}

// sync makes the listeners match what s follows: one per node-port
// address and health-check node port.
func (s *Server) sync() {
	answers, conflicts := answersOf(s.wanted)
	// Before any new listener opens: it never answers from an older state.
	s.answers.Store(&answers)
	want := map[netip.AddrPort]bool{}
	for port := range answers {
		for _, a := range s.node.NodePortAddresses {
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
