package conformance

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testkit/syncbuf"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/dataplane/ebpf"
	"github.com/vipd/vipd/internal/testkit/cgroup2test"
	"github.com/vipd/vipd/internal/testkit/childproc"
	"github.com/vipd/vipd/internal/testkit/netlab"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

const (
	// svcName and owner name the service most scenarios program.
	svcName = "conformance/web"
	owner   = "conformance"

	// connectDeadline bounds a connection that must be refused: a REJECT
	// answers at once, so a refusal that takes longer is a hang. It is
	// under TCP's first SYN retransmission (1 s), so that a refusal the
	// client only learns of from a retransmitted SYN fails too.
	connectDeadline = 900 * time.Millisecond
	// replyDeadline bounds a request that must succeed.
	replyDeadline = 3 * time.Second
	// deadWait is how long a request that must not reach any backend is
	// given to do so.
	deadWait = time.Second
	// rpcTimeout bounds one vipd RPC; with 1,000 services an apply takes a while.
	rpcTimeout = 2 * time.Minute
	// readyTimeout bounds vipd's start until health reports SERVING.
	readyTimeout = time.Minute
	// clientStartTimeout bounds the start of node1's client process, which
	// runs this test binary again, on a machine busy with parallel scenarios.
	clientStartTimeout = 30 * time.Second
)

// echoPorts are the ports every backend's echo servers listen on, TCP and
// UDP, IPv4 and IPv6. The server on port p of pod x answers as "x:p", so a
// reply names both the backend and the target port the dataplane chose.
// Ports 80 and 81 are VIP ports too: a dataplane that forwarded an
// undeclared port, keeping the port, would reach a listener.
var echoPorts = []uint16{80, 81, 8080, 8081, 8082}

// VIP ranges: never assigned to any interface. The last octet or group of a
// VIP is the n of family.vip(n).
var (
	vipRange4 = netip.MustParsePrefix("198.19.0.0/16")
	vipRange6 = netip.MustParsePrefix("fd00:198:ff::/64")
)

type family int

const (
	ipv4 family = iota
	ipv6
)

func (f family) String() string {
	if f == ipv6 {
		return "IPv6"
	}
	return "IPv4"
}

// vip returns the family's VIP number n: 198.19.x.y with x.y = n, or
// fd00:198:ff::n.
func (f family) vip(n int) netip.Addr {
	if f == ipv6 {
		b := vipRange6.Addr().As16()
		b[14], b[15] = byte(n>>8), byte(n)
		return netip.AddrFrom16(b)
	}
	b := vipRange4.Addr().As4()
	b[2], b[3] = byte(n>>8), byte(n)
	return netip.AddrFrom4(b)
}

// host is a namespace that sends or answers traffic: a pod or a node.
type host struct {
	*netlab.NS
	name   string
	v4, v6 netip.Addr
	// cg, if set, makes the host's requests come from a client process in
	// a cgroup, as a program on a node does, rather than from the test
	// process: socket-level load balancing hooks into that cgroup.
	cg *cgroupClient
}

// Request is netlab.NS.Request, made by the host's client process if the
// host has a cgroup.
func (h host) Request(ctx context.Context, network, addr string, opts ...netlab.DialOption) (netlab.Reply, error) {
	if h.cg == nil {
		return h.NS.Request(ctx, network, addr, opts...)
	}
	c, err := h.cg.client(h.NS)
	if err != nil {
		return netlab.Reply{}, err
	}
	return c.Request(ctx, network, addr, opts...)
}

// Dial is netlab.NS.Dial. It fails for a host with a cgroup: its client
// process only makes request-reply exchanges, and cannot hand the test a
// connection.
func (h host) Dial(ctx context.Context, network, addr string, opts ...netlab.DialOption) (*netlab.Conn, error) {
	if h.cg != nil {
		return nil, fmt.Errorf("unsupported: %s's traffic comes from a client process in cgroup %s, "+
			"which makes single requests (request, expectBackends, ...) but cannot hold a connection for the test", h.name, h.cg.dir)
	}
	return h.NS.Dial(ctx, network, addr, opts...)
}

// cgroupClient is the client process of a host with a cgroup, started on
// the host's first request.
type cgroupClient struct {
	dir string // the cgroup v2 directory

	mu  sync.Mutex
	c   *netlab.Client
	err error
}

func (cc *cgroupClient) client(ns *netlab.NS) (*netlab.Client, error) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.c == nil && cc.err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), clientStartTimeout)
		defer cancel()
		cc.c, cc.err = ns.StartClient(ctx, cc.dir)
	}
	return cc.c, cc.err
}

// close ends the client process, if it was started.
func (cc *cgroupClient) close() error {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.c == nil {
		return nil
	}
	return cc.c.Close()
}

func (h host) addr(f family) netip.Addr {
	if f == ipv6 {
		return h.v6
	}
	return h.v4
}

// echo names the echo server of h on port.
func (h host) echo(port uint16) string { return h.name + ":" + strconv.Itoa(int(port)) }

// echoes names the echo servers of hosts on port.
func echoes(port uint16, hosts ...host) []string {
	var names []string
	for _, h := range hosts {
		names = append(names, h.echo(port))
	}
	return names
}

func podHost(p *netlab.Pod) host {
	return host{NS: p.NS, name: p.PodName(), v4: p.IPv4(), v6: p.IPv6()}
}

func extHost(h *netlab.ExternalHost) host {
	return host{NS: h.NS, name: h.HostName(), v4: h.IPv4(), v6: h.IPv6()}
}

// env is one scenario's world: a fresh lab, a vipd programming node1, and a
// client for vipd's API.
//
//	node1: client, client2 (clients); be1, be2, be3 (backends)
//	node2: be4 (a backend on another node)
//	outside: out, out2 (external hosts behind the upstream router)
//
// The upstream router sends the external and load-balancer IP ranges
// (extRange4/6) to node1, and node1 has secondary addresses on its uplink
// besides its primary ones (see netlab's address plan).
//
// node1's own requests come from a client process in the env's test cgroup,
// which is the cgroup vipd's eBPF dataplane attaches its socket hooks to;
// its pinned objects go to the env's private bpffs directory.
type env struct {
	t    *testing.T
	dp   string
	name string // <dataplane>/<scenario>, the prefix of every failure

	lab                    *netlab.Lab
	cgroup                 string // node1's client process runs here; eBPF hooks attach here
	node1, node2           host
	client, client2        host
	be1, be2, be3, be4     host
	out, out2              host // external hosts
	vipd                   *daemon
	api                    *client.Client
	supportedLoadBalancing []vipdv1.LoadBalancing
	supportedProtocols     []vipdv1.Protocol
	// externalRefused is the error with which the dataplane refused an
	// external service as unsupported (upsertExternal), if it did.
	externalRefused string
}

// newEnv builds a fresh env for scenario on dataplane dp. vipdArgs go on
// vipd's command line after the env's own flags, so they may override them
// (--metrics-addr, say).
func newEnv(t *testing.T, dp, scenario string, vipdArgs ...string) *env {
	e := &env{t: t, dp: dp, name: dp + "/" + scenario}
	e.lab = netlab.New(t, netlab.Spec{
		Nodes: []netlab.NodeSpec{
			{Pods: []string{"client", "client2", "be1", "be2", "be3"}},
			{Pods: []string{"be4"}},
		},
		ExternalHosts: []string{"out", "out2"},
	})
	n1, n2 := e.lab.Node(1), e.lab.Node(2)
	for _, r := range []netip.Prefix{extRange4, extRange6} {
		if err := e.lab.RouteToNode(r, n1); err != nil {
			e.fatalf("%v", err)
		}
	}
	{
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := n1.AddSecondaryAddresses(ctx)
		cancel()
		if err != nil {
			e.fatalf("%v", err)
		}
	}
	e.cgroup = cgroup2test.New(t)
	node1Client := &cgroupClient{dir: e.cgroup}
	t.Cleanup(func() {
		// Before the cgroup goes, which would kill the client anyway.
		if err := node1Client.close(); err != nil {
			e.errorf("close node1's client process: %v", err)
		}
	})
	e.node1 = host{NS: n1.NS, name: "node1", v4: n1.IPv4(), v6: n1.IPv6(), cg: node1Client}
	e.node2 = host{NS: n2.NS, name: "node2", v4: n2.IPv4(), v6: n2.IPv6()}
	e.client, e.client2 = podHost(n1.Pod("client")), podHost(n1.Pod("client2"))
	e.be1, e.be2, e.be3 = podHost(n1.Pod("be1")), podHost(n1.Pod("be2")), podHost(n1.Pod("be3"))
	e.be4 = podHost(n2.Pod("be4"))
	e.out, e.out2 = extHost(e.lab.ExternalHost("out")), extHost(e.lab.ExternalHost("out2"))
	for _, p := range []*netlab.Pod{n1.Pod("be1"), n1.Pod("be2"), n1.Pod("be3"), n2.Pod("be4")} {
		for _, port := range echoPorts {
			if _, err := p.StartEcho(podHost(p).echo(port), port); err != nil {
				e.fatalf("start echo: %v", err)
			}
		}
	}

	dir, err := os.MkdirTemp("", "vipdc") // short: the socket path must fit in sun_path
	if err != nil {
		e.fatalf("%v", err)
	}
	bpffs := filepath.Join(dir, "bpf") // vipd mounts a bpffs here
	if err := os.Mkdir(bpffs, 0o700); err != nil {
		e.fatalf("%v", err)
	}
	// Registered before vipd's stop, so it runs after it.
	t.Cleanup(func() {
		if err := ebpf.UnmountBPFFS(bpffs); err != nil {
			e.errorf("%v (leaving %s)", err, dir)
			return
		}
		os.RemoveAll(dir)
	})
	e.vipd = &daemon{dp: dp, netns: n1.Path(), socket: filepath.Join(dir, "vipd.sock"), stateDir: filepath.Join(dir, "state"),
		cgroup: e.cgroup, bpffs: bpffs, args: vipdArgs}
	e.api, err = client.New("unix://"+e.vipd.socket, client.WithTimeout(rpcTimeout))
	if err != nil {
		e.fatalf("vipd client: %v", err)
	}
	t.Cleanup(func() { e.api.Close() })
	t.Cleanup(e.vipd.stop)
	e.startVipd()
	t.Cleanup(e.diagnose)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := e.api.Status(ctx)
	if err != nil {
		e.fatalf("GetStatus: %v", err)
	}
	if st.GetDataplane() != dp {
		e.fatalf("vipd runs dataplane %q, want %q", st.GetDataplane(), dp)
	}
	e.supportedLoadBalancing = st.GetSupportedLoadBalancing()
	e.supportedProtocols = st.GetSupportedProtocols()
	return e
}

// startVipd starts vipd and waits until its health check reports SERVING.
func (e *env) startVipd() {
	e.t.Helper()
	if err := e.vipd.start(); err != nil {
		e.fatalf("start vipd: %v", err)
	}
	if err := e.vipd.waitReady(e.api, readyTimeout); err != nil {
		e.fatalf("%v\nvipd log:\n%s", err, e.vipd.logTail(40))
	}
}

// diagnose logs, for a failed scenario, what vipd said and what the kernel
// of node1 holds, before any of it is torn down.
func (e *env) diagnose() {
	if !e.t.Failed() {
		return
	}
	e.t.Logf("%s: vipd log (tail):\n%s", e.name, e.vipd.logTail(60))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, cmd := range [][]string{
		{"iptables-nft-save"}, {"ip6tables-nft-save"},
		{"iptables-legacy-save"}, {"ip6tables-legacy-save"},
		{"conntrack", "-L"}, {"conntrack", "-L", "-f", "ipv6"},
	} {
		out, err := e.node1.Exec(ctx, cmd[0], cmd[1:]...)
		if err != nil || strings.TrimSpace(out) == "" || strings.Contains(out, " 0 flow entries") ||
			(strings.Contains(cmd[0], "save") && !strings.Contains(out, "VIPD")) {
			continue
		}
		e.t.Logf("%s: node1 %s:\n%s", e.name, strings.Join(cmd, " "), head(out, 150))
	}
}

// head returns the first n lines of s, saying how many it left out.
func head(s string, n int) string {
	lines := strings.SplitAfter(s, "\n")
	if len(lines) <= n {
		return s
	}
	return strings.Join(lines[:n], "") + fmt.Sprintf("... (%d more lines)\n", len(lines)-n)
}

func (e *env) fatalf(format string, args ...any) {
	e.t.Helper()
	e.t.Fatalf("%s: %s", e.name, fmt.Sprintf(format, args...))
}

func (e *env) errorf(format string, args ...any) {
	e.t.Helper()
	e.t.Errorf("%s: %s", e.name, fmt.Sprintf(format, args...))
}

func (e *env) logf(format string, args ...any) {
	e.t.Helper()
	e.t.Logf("%s: %s", e.name, fmt.Sprintf(format, args...))
}

// requireLoadBalancing skips the scenario when the dataplane declares lb
// unsupported. Only Maglev may be missing: for anything else, and under
// CI=true, a missing feature fails the scenario instead.
func (e *env) requireLoadBalancing(lb vipdv1.LoadBalancing) {
	e.t.Helper()
	if !slices.Contains(e.supportedLoadBalancing, lb) {
		e.unsupported(lb.String(), lb == vipdv1.LoadBalancing_LOAD_BALANCING_MAGLEV)
	}
}

// requireProtocol is requireLoadBalancing for a protocol; every dataplane
// must forward every protocol.
func (e *env) requireProtocol(p vipdv1.Protocol) {
	e.t.Helper()
	if !slices.Contains(e.supportedProtocols, p) {
		e.unsupported(p.String(), false)
	}
}

func (e *env) unsupported(feature string, mayBeMissing bool) {
	e.t.Helper()
	if !mayBeMissing {
		e.fatalf("unsupported by %s: %s, which every dataplane must support", e.dp, feature)
	}
	e.t.Skipf("unsupported by %s: %s (GetStatus does not list it)", e.dp, feature)
}

// ---- services ----

func service(vips []netip.Addr, ports []*vipdv1.Port, backends ...*vipdv1.Backend) *vipdv1.Service {
	s := &vipdv1.Service{Name: svcName, Owner: owner, Ports: ports, Backends: backends}
	for _, v := range vips {
		s.Vips = append(s.Vips, v.String())
	}
	return s
}

func port(name string, proto vipdv1.Protocol, p, target uint16) *vipdv1.Port {
	return &vipdv1.Port{Name: name, Protocol: proto, Port: uint32(p), TargetPort: uint32(target)}
}

func tcpPort(p, target uint16) *vipdv1.Port {
	return port("tcp", vipdv1.Protocol_PROTOCOL_TCP, p, target)
}
func udpPort(p, target uint16) *vipdv1.Port {
	return port("udp", vipdv1.Protocol_PROTOCOL_UDP, p, target)
}
func sctpPort(p, target uint16) *vipdv1.Port {
	return port("sctp", vipdv1.Protocol_PROTOCOL_SCTP, p, target)
}

func ports(p ...*vipdv1.Port) []*vipdv1.Port { return p }
func vips(v ...netip.Addr) []netip.Addr      { return v }

type backendOpt func(*vipdv1.Backend)

func backend(h host, f family, opts ...backendOpt) *vipdv1.Backend {
	b := &vipdv1.Backend{Ip: h.addr(f).String()}
	for _, o := range opts {
		o(b)
	}
	return b
}

func weight(w uint32) backendOpt { return func(b *vipdv1.Backend) { b.Weight = w } }

var (
	terminating = func(b *vipdv1.Backend) { b.State = vipdv1.BackendState_BACKEND_STATE_TERMINATING }
	notServing  = func(b *vipdv1.Backend) { b.State = vipdv1.BackendState_BACKEND_STATE_NOT_SERVING }
	nodeLocal   = func(b *vipdv1.Backend) { b.NodeLocal = true }
)

func targetPorts(m map[string]uint32) backendOpt {
	return func(b *vipdv1.Backend) { b.Ports = m }
}

// upsert applies svc and fails the scenario if vipd refuses it. When it
// returns, the change is live in the kernel.
func (e *env) upsert(svc *vipdv1.Service) *vipdv1.Service {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	got, err := e.api.UpsertService(ctx, svc, 0)
	if err != nil {
		e.fatalf("UpsertService %s: %v", svc.GetName(), err)
	}
	return got
}

func (e *env) updateBackends(name string, upsert []*vipdv1.Backend, remove ...netip.Addr) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	var rm []string
	for _, a := range remove {
		rm = append(rm, a.String())
	}
	if _, err := e.api.UpdateBackends(ctx, name, upsert, rm, 0); err != nil {
		e.fatalf("UpdateBackends %s: %v", name, err)
	}
}

func (e *env) deleteService(name string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	if err := e.api.DeleteService(ctx, name, 0); err != nil {
		e.fatalf("DeleteService %s: %v", name, err)
	}
}

// ---- traffic ----

// request sends one request from h to dst over proto ("tcp" or "udp"): a new
// connection for TCP, a datagram from a new socket for UDP.
func request(h host, proto string, dst netip.AddrPort, timeout time.Duration, opts ...netlab.DialOption) (netlab.Reply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return h.Request(ctx, proto, dst.String(), opts...)
}

func upper(proto string) string { return strings.ToUpper(proto) }

// expectBackends makes n new connections (TCP) or requests from new sockets
// (UDP) from h to dst. Every one must be answered, from dst itself, and the
// set of echo servers that answered must be exactly want. It returns how
// often each answered. Callers pick n so that missing a backend by chance
// is vanishingly unlikely (k equal backends are all hit in n tries with
// probability at least 1 - k(1-1/k)^n).
func (e *env) expectBackends(h host, proto string, dst netip.AddrPort, n int, want ...string) map[string]int {
	e.t.Helper()
	counts := e.collect(h, proto, dst, n)
	var extra, missing []string
	for b := range counts {
		if !slices.Contains(want, b) {
			extra = append(extra, b)
		}
	}
	for _, b := range want {
		if counts[b] == 0 {
			missing = append(missing, b)
		}
	}
	if len(extra) > 0 || len(missing) > 0 {
		slices.Sort(want)
		e.fatalf("%s %v from %s: want exactly %v to answer %d requests, got %s (unexpected %v, never hit %v)",
			upper(proto), dst, h.name, want, n, fmtCounts(counts), extra, missing)
	}
	return counts
}

// collect makes n requests from h to dst and counts the answering backends.
// Each must be answered, from dst.
func (e *env) collect(h host, proto string, dst netip.AddrPort, n int) map[string]int {
	e.t.Helper()
	counts := map[string]int{}
	for i := range n {
		r, err := request(h, proto, dst, replyDeadline)
		if err != nil {
			e.fatalf("%s %v from %s: request %d of %d: want a reply from a backend, got %v (so far %s)",
				upper(proto), dst, h.name, i+1, n, err, fmtCounts(counts))
		}
		if r.Remote != dst {
			e.fatalf("%s %v from %s: reply from %s came from %v, want it from the VIP %v",
				upper(proto), dst, h.name, r.Backend, r.Remote, dst)
		}
		counts[r.Backend]++
	}
	return counts
}

// expectOne makes n requests from h to dst and requires one backend to answer
// them all; it returns that backend.
func (e *env) expectOne(h host, proto string, dst netip.AddrPort, n int) string {
	e.t.Helper()
	counts := e.collect(h, proto, dst, n)
	if len(counts) != 1 {
		e.fatalf("%s %v from %s: want one backend to answer all %d requests, got %s", upper(proto), dst, h.name, n, fmtCounts(counts))
	}
	for b := range counts {
		return b
	}
	panic("unreachable")
}

func fmtCounts(m map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s×%d", k, m[k]))
	}
	return "{" + strings.Join(parts, " ") + "}"
}

// expectRefused requires a connection (TCP) or request (UDP) from h to dst to
// be refused within connectDeadline: a TCP reset or ICMP port unreachable,
// never a timeout.
func (e *env) expectRefused(h host, proto string, dst netip.AddrPort) {
	e.t.Helper()
	what := "request"
	if proto == "tcp" {
		what = "connect"
	}
	start := time.Now()
	r, err := request(h, proto, dst, connectDeadline)
	took := time.Since(start).Round(time.Millisecond)
	switch {
	case err == nil:
		e.fatalf("%s %s to %v from %s: want ECONNREFUSED within %v, got a reply from backend %s", upper(proto), what, dst, h.name, connectDeadline, r.Backend)
	case errors.Is(err, syscall.ECONNREFUSED):
	case netlab.IsTimeout(err):
		e.fatalf("%s %s to %v from %s: want ECONNREFUSED within %v, got i/o timeout after %v", upper(proto), what, dst, h.name, connectDeadline, took)
	default:
		e.fatalf("%s %s to %v from %s: want ECONNREFUSED within %v, got %v after %v", upper(proto), what, dst, h.name, connectDeadline, err, took)
	}
}

// expectDead requires a connection or request from h to dst to reach no
// backend: refused, unreachable or unanswered are all fine.
func (e *env) expectDead(h host, proto string, dst netip.AddrPort) {
	e.t.Helper()
	r, err := request(h, proto, dst, deadWait)
	if err == nil {
		e.fatalf("%s %v from %s: want no backend to answer (refused or timeout), got a reply from %s (reply source %v)",
			upper(proto), dst, h.name, r.Backend, r.Remote)
	}
}

// expectClientSource requires backends to see h's own address as the source
// of n requests from h to dst, and the replies to come from dst.
func (e *env) expectClientSource(h host, f family, proto string, dst netip.AddrPort, n int) {
	e.t.Helper()
	for i := range n {
		r, err := request(h, proto, dst, replyDeadline)
		if err != nil {
			e.fatalf("%s %v from %s: request %d of %d: %v", upper(proto), dst, h.name, i+1, n, err)
		}
		if r.Peer.Addr() != h.addr(f) {
			e.fatalf("%s %v from %s (%v): backend %s saw the client as %v, want the client's own address %v",
				upper(proto), dst, h.name, h.addr(f), r.Backend, r.Peer, h.addr(f))
		}
		if r.Remote != dst {
			e.fatalf("%s %v from %s: reply from %s came from %v, want it from the VIP %v", upper(proto), dst, h.name, r.Backend, r.Remote, dst)
		}
	}
}

// dial opens a connection from h to dst that must succeed.
func (e *env) dial(h host, proto string, dst netip.AddrPort) *netlab.Conn {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), replyDeadline)
	defer cancel()
	c, err := h.Dial(ctx, proto, dst.String())
	if err != nil {
		e.fatalf("%s dial %v from %s: %v", upper(proto), dst, h.name, err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

// on sends one request on an open connection and returns the backend that
// answered; the connection must still work.
func (e *env) on(c *netlab.Conn, what string) string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), replyDeadline)
	defer cancel()
	r, err := c.Request(ctx)
	if err != nil {
		e.fatalf("request on the connection %v -> %v %s: want it to keep working, got %v", c.LocalAddr(), c.RemoteAddr(), what, err)
	}
	return r.Backend
}

// ---- vipd ----

// daemon is one vipd binary on a private socket and state directory,
// programming one namespace. It may be killed and started again.
type daemon struct {
	dp, netns, socket, stateDir string
	// cgroup and bpffs are for the eBPF dataplane: the cgroup v2 directory
	// its socket hooks attach to, and where it pins its objects.
	cgroup, bpffs string
	// args are extra flags for vipd run, after the daemon's own.
	args []string

	log syncbuf.Buffer

	mu     sync.Mutex
	proc   *os.Process
	exited chan struct{} // closed when proc has exited
}

func (d *daemon) start() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.proc != nil {
		return errors.New("vipd is already running")
	}
	fmt.Fprintf(&d.log, "=== starting vipd at %s\n", time.Now().Format(time.StampMilli))
	args := []string{"run", "--dataplane", d.dp, "--netns", d.netns, "--metrics-addr=",
		"--socket", d.socket, "--state-dir", d.stateDir, "--log-level", "debug"}
	if d.dp == "ebpf" {
		// Never the machine's root cgroup: only the test's client
		// processes are in this one.
		args = append(args, "--cgroup-path", d.cgroup, "--bpffs", d.bpffs)
	}
	if d.dp == "iptables" {
		// The flow scenarios need conntrack accounting, timestamps and
		// events, which vipd sets (here in the lab node) only when told.
		args = append(args, "--set-sysctls")
	}
	args = append(args, d.args...)
	cmd := exec.Command(vipdBin, args...)
	cmd.Stdout, cmd.Stderr = &d.log, &d.log
	// vipd dies with the test binary, even on a go test timeout.
	waited, err := childproc.Start(cmd)
	if err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() {
		err := <-waited
		fmt.Fprintf(&d.log, "=== vipd exited at %s: %v\n", time.Now().Format(time.StampMilli), err)
		close(exited)
	}()
	d.proc, d.exited = cmd.Process, exited
	return nil
}

// waitReady waits until vipd's health check reports SERVING, and fails
// if vipd exits first.
func (d *daemon) waitReady(api *client.Client, timeout time.Duration) error {
	d.mu.Lock()
	exited := d.exited
	d.mu.Unlock()
	if err := childproc.WaitReady(exited, timeout, api.WaitServing); err != nil {
		return fmt.Errorf("vipd: %w", err)
	}
	return nil
}

// kill9 kills vipd with SIGKILL and waits for it to exit.
func (d *daemon) kill9() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.proc == nil {
		return
	}
	d.proc.Signal(syscall.SIGKILL)
	<-d.exited
	d.proc = nil
}

func (d *daemon) stop() { d.kill9() }

func (d *daemon) logTail(n int) string {
	lines := strings.SplitAfter(d.log.String(), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "")
}
