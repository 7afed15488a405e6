package iptables

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vipd/vipd/dataplane"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// restoreText is the full payload of rs for both families, as golden text.
func restoreText(rs *Ruleset) string {
	var b strings.Builder
	for _, u := range Payload(nil, rs, true, nil) {
		fmt.Fprintf(&b, "# %s: input for %s-restore --noflush\n", u.Family, map[Family]string{IPv4: "iptables", IPv6: "ip6tables"}[u.Family])
		b.Write(u.Restore)
	}
	return b.String()
}

var affinity = dataplane.SessionAffinity{ClientIP: true, Timeout: 3 * time.Hour}

func goldenCases() []struct {
	name  string
	state *dataplane.State
	opts  Options
} {
	with := func(s *dataplane.Service, f func(*dataplane.Service)) *dataplane.Service { f(s); return s }
	const (
		term = dataplane.BackendTerminating
		ns   = dataplane.BackendNotServing
		rdy  = dataplane.BackendReady
	)
	override := ready("10.244.1.1")
	override.Ports = map[string]uint16{"http": 8081}
	// only serves the named ports of ports, on their target ports there.
	only := func(b dataplane.Backend, ports map[string]uint16) dataplane.Backend {
		b.Ports, b.OnlyNamedPorts = ports, true
		return b
	}
	return []struct {
		name  string
		state *dataplane.State
		opts  Options
	}{
		{"one-backend", state(service("web", []string{"10.96.0.10"}, tcp(80, 8080), ready("10.244.1.5"))), Options{}},
		{"weights", state(service("web", []string{"10.96.0.11"}, []dataplane.Port{port("http", dataplane.TCP, 80, 8080)},
			backend("10.244.1.1", rdy, 1), backend("10.244.1.2", rdy, 2), backend("10.244.1.3", rdy, 3))), Options{}},
		{"affinity", state(with(service("web", []string{"10.96.0.12"}, tcp(80, 8080), ready("10.244.1.1"), ready("10.244.1.2")),
			func(s *dataplane.Service) { s.Affinity = affinity })), Options{}},
		{"terminating-only", state(service("web", []string{"10.96.0.13"}, tcp(80, 8080),
			backend("10.244.1.1", term, 1), backend("10.244.1.2", term, 1), backend("10.244.1.3", ns, 1))), Options{}},
		{"not-serving-and-ready", state(service("web", []string{"10.96.0.14"}, tcp(80, 8080),
			backend("10.244.1.1", rdy, 1), backend("10.244.1.2", ns, 1), backend("10.244.1.3", term, 1))), Options{}},
		{"local-with-local-backends", state(with(service("web", []string{"10.96.0.15"}, tcp(80, 8080),
			ready("10.244.1.1"), local(ready("10.244.1.2")), local(backend("10.244.1.3", term, 1))),
			func(s *dataplane.Service) { s.TrafficPolicy = dataplane.TrafficPolicyLocal })), Options{}},
		{"local-without-local-backends", state(with(service("web", []string{"10.96.0.16"}, tcp(80, 8080),
			ready("10.244.1.1"), ready("10.244.1.2")),
			func(s *dataplane.Service) { s.TrafficPolicy = dataplane.TrafficPolicyLocal })), Options{}},
		{"no-backends", state(service("web", []string{"10.96.0.17"}, tcp(80, 8080))), Options{}},
		{"multi-port-override", state(service("web", []string{"10.96.0.18"}, []dataplane.Port{
			port("http", dataplane.TCP, 80, 8080), port("metrics", dataplane.TCP, 9090, 9091), port("diameter", dataplane.SCTP, 3868, 3868),
		}, override, ready("10.244.1.2"))), Options{}},
		{"tcp-udp-same-port", state(service("dns", []string{"10.96.0.53"}, []dataplane.Port{
			port("dns", dataplane.UDP, 53, 5353), port("dns-tcp", dataplane.TCP, 53, 5353),
		}, ready("10.244.1.1"))), Options{}},
		{"dual-stack", state(service("web", []string{"10.96.0.20", "fd00:96::20"}, tcp(80, 8080),
			ready("10.244.1.1"), ready("fd00:244::1"))), Options{}},
		{"ipv6-only", state(
			with(service("web6", []string{"fd00:96::30"}, tcp(443, 8443), ready("fd00:244::1"), ready("fd00:244::2")),
				func(s *dataplane.Service) { s.Affinity = affinity }),
			service("empty6", []string{"fd00:96::31"}, tcp(80, 8080)),
		), Options{}},
		{"trie", state(
			service("a", []string{"10.96.0.1"}, tcp(80, 80), ready("10.244.0.1")),
			service("b", []string{"10.96.0.2"}, tcp(80, 80), ready("10.244.0.2")),
			service("c", []string{"10.96.0.3"}, tcp(80, 80), ready("10.244.0.3")),
			service("d", []string{"10.96.1.1"}, tcp(80, 80), ready("10.244.0.4")),
			service("e", []string{"192.168.0.1"}, tcp(80, 80), ready("10.244.0.5")),
			service("f", []string{"10.96.5.1", "fd00:96::1"}, tcp(80, 80)),
			service("g", []string{"10.96.5.2", "fd00:96::2"}, tcp(80, 80)),
			service("h", []string{"10.96.5.3", "fd00:96::3"}, tcp(80, 80)),
		), Options{MaxLeafRules: 2}},
		// Kubernetes endpoints whose EndpointSlice lacks a port: each port
		// has its own backends, its own terminating fallback and, with no
		// backend left, its own reject rule; hairpin covers every backend
		// that serves some port, and none that serves no port.
		{"only-named-ports", state(
			service("web", []string{"10.96.0.21"}, []dataplane.Port{
				port("http", dataplane.TCP, 80, 8080), port("metrics", dataplane.TCP, 9090, 9091), port("dns", dataplane.UDP, 53, 5353),
			}, ready("10.244.1.1"), only(ready("10.244.1.2"), map[string]uint16{"http": 8081}), only(ready("10.244.1.3"), nil)),
			service("api", []string{"10.96.0.22"}, []dataplane.Port{port("http", dataplane.TCP, 80, 8080), port("grpc", dataplane.TCP, 9000, 9000)},
				only(ready("10.244.2.1"), map[string]uint16{"http": 8080}), backend("10.244.2.2", term, 1)),
			service("lonely", []string{"10.96.0.23"}, []dataplane.Port{port("a", dataplane.TCP, 80, 80), port("b", dataplane.TCP, 81, 81)},
				only(ready("10.244.3.1"), map[string]uint16{"a": 8080})),
			with(service("sticky", []string{"10.96.0.24"}, []dataplane.Port{port("http", dataplane.TCP, 80, 8080), port("admin", dataplane.TCP, 81, 8081)},
				ready("10.244.4.1"), only(ready("10.244.4.2"), map[string]uint16{"http": 8080})),
				func(s *dataplane.Service) { s.Affinity = affinity }),
		), Options{}},
		// A Kubernetes service's only, unnamed port: endpoints name it "".
		{"unnamed-port-by-empty-name", state(service("kube", []string{"10.96.0.25"}, tcp(80, 8080),
			only(ready("10.244.5.1"), map[string]uint16{"": 8081}), only(ready("10.244.5.2"), map[string]uint16{"": 8082}),
			only(ready("10.244.5.3"), nil))), Options{}},
		// External traffic, Cluster: node ports (both families' node-port
		// addresses), external and LB IPs, masquerade mark for what enters
		// on eth0; a port without backends rejects on every address.
		{"external-cluster", withNode(state(
			with(service("web", []string{"10.96.0.40", "fd00:96::40"}, []dataplane.Port{
				nodePort(port("http", dataplane.TCP, 80, 8080), 30080), nodePort(port("dns", dataplane.UDP, 53, 5353), 30053),
			}, ready("10.244.1.1"), local(ready("10.244.1.2")), ready("fd00:244::1")), func(s *dataplane.Service) {
				s.ExternalIPs = addrs("203.0.113.10", "2001:db8::10")
				s.LoadBalancerIPs = addrs("198.51.100.10")
			}),
			with(service("gone", []string{"10.96.0.41"}, []dataplane.Port{nodePort(port("", dataplane.TCP, 80, 8080), 30081)}),
				func(s *dataplane.Service) { s.LoadBalancerIPs = addrs("198.51.100.11") }),
		)), Options{}},
		// External traffic, Local: local backends only for what enters on
		// the external interfaces, the cluster choice for the rest; an LB
		// IP with source ranges; a Local port without a local backend drops.
		{"external-local", withNode(state(
			with(service("web", []string{"10.96.0.50"}, []dataplane.Port{nodePort(port("http", dataplane.TCP, 80, 8080), 30090)},
				ready("10.244.1.1"), local(ready("10.244.1.2"))), func(s *dataplane.Service) {
				s.ExternalTrafficPolicy = dataplane.TrafficPolicyLocal
				s.LoadBalancerIPs = addrs("198.51.100.20")
				s.LoadBalancerSourceRanges = prefixes("192.0.2.0/24", "198.18.0.0/15", "2001:db8::/32")
				s.Affinity = affinity
			}),
			with(service("remote", []string{"10.96.0.51"}, []dataplane.Port{nodePort(port("http", dataplane.TCP, 80, 8080), 30091)},
				ready("10.244.2.1")), func(s *dataplane.Service) {
				s.ExternalTrafficPolicy = dataplane.TrafficPolicyLocal
				s.ExternalIPs = addrs("203.0.113.51")
			}),
			with(service("closed", []string{"10.96.0.52"}, tcp(443, 8443)), func(s *dataplane.Service) {
				s.ExternalTrafficPolicy = dataplane.TrafficPolicyLocal
				s.LoadBalancerIPs = addrs("198.51.100.52")
				s.LoadBalancerSourceRanges = prefixes("192.0.2.0/24")
			}),
		)), Options{}},
		// Internal policy Local, external Cluster: external addresses get a
		// second SVC chain over every backend; the VIP keeps the local one.
		{"external-internal-local", withNode(state(
			with(service("web", []string{"10.96.0.60"}, []dataplane.Port{nodePort(port("http", dataplane.TCP, 80, 8080), 30100)},
				ready("10.244.1.1"), local(ready("10.244.1.2"))), func(s *dataplane.Service) {
				s.TrafficPolicy = dataplane.TrafficPolicyLocal
				s.ExternalIPs = addrs("203.0.113.60")
			}),
		)), Options{}},
		// Backends shared between services get one hairpin rule each, in a
		// trie over addresses that share little.
		{"shared-backends", state(
			service("a", []string{"10.96.0.1"}, tcp(80, 8080), ready("10.244.1.1"), ready("10.244.1.2")),
			service("b", []string{"10.96.0.2"}, tcp(80, 8080), ready("10.244.1.2"), ready("10.244.1.3"), ready("192.168.7.7")),
			service("c", []string{"10.96.0.3", "fd00:96::3"}, tcp(80, 8080), ready("10.244.1.1"), ready("172.16.0.9"),
				ready("fd00:244::1"), ready("2001:db8::9")),
		), Options{MaxLeafRules: 2}},
	}
}

func TestRenderGolden(t *testing.T) {
	for _, tc := range goldenCases() {
		t.Run(tc.name, func(t *testing.T) {
			rs := mustRender(t, tc.state, tc.opts)
			got := restoreText(rs)
			path := filepath.Join("testdata", tc.name+".golden")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if diff := cmp.Diff(string(want), got); diff != "" {
				t.Errorf("rendered rules differ from %s (-want +got):\n%s", path, diff)
			}
			// Every golden must also be accepted as is by the kernel
			// model: TestRenderGoldenInKernel (package iptables_test).
		})
	}
}

func TestRenderDeterministic(t *testing.T) {
	for _, tc := range goldenCases() {
		a, b := restoreText(mustRender(t, tc.state, tc.opts)), restoreText(mustRender(t, tc.state, tc.opts))
		if a != b {
			t.Errorf("%s: two renders differ", tc.name)
		}
	}
}

func TestRenderRefusesUnsupported(t *testing.T) {
	svc := service("maglev", []string{"10.96.0.1"}, tcp(80, 80), ready("10.244.0.1"))
	svc.LoadBalancing = dataplane.LoadBalancingMaglev
	_, err := Render(state(svc), Options{}, nil)
	if !errors.Is(err, dataplane.ErrUnsupported) || !strings.Contains(err.Error(), "--dataplane ebpf") {
		t.Errorf("Render(maglev) = %v; want ErrUnsupported with the eBPF hint", err)
	}
	if _, err := Render(state(), Options{MaxLeafRules: -1}, nil); err == nil {
		t.Error("Render with a negative MaxLeafRules succeeded")
	}
}

func TestChainNames(t *testing.T) {
	rs := mustRender(t, state(
		service(strings.Repeat("long-name.", 25), []string{"10.96.0.1", "fd00:1234:5678:9abc:def0:1234:5678:9abc"},
			[]dataplane.Port{port(strings.Repeat("p", 63), dataplane.TCP, 80, 80)}, ready("10.0.0.1"), ready("fd00::1")),
	), Options{MaxLeafRules: 1})
	for _, f := range families {
		for _, tab := range tables {
			for _, name := range rs.Chains(f, tab) {
				if len(name) > MaxChainName || !strings.HasPrefix(name, ChainPrefix) {
					t.Errorf("%s %s: chain name %q", f, tab, name)
				}
			}
		}
	}
	for _, tc := range []struct{ namePrefix, prefix, want string }{
		{"VIPD-D4", "10.96.0.0/16", "VIPD-D4-0a60-16"},
		{"VIPD-R4", "10.96.0.1/32", "VIPD-R4-0a600001-32"},
		{"VIPD-D6", "fd00::/64", "VIPD-D6-fd00000000000000-64"},
		{"VIPD-D6", "fd00::10/124", hashName("VIPD-D6-", "fd00::10/124")},
	} {
		if got := trieChainName(tc.namePrefix, netip.MustParsePrefix(tc.prefix)); got != tc.want {
			t.Errorf("trieChainName(%s, %s) = %s; want %s", tc.namePrefix, tc.prefix, got, tc.want)
		}
	}
}

func TestComment(t *testing.T) {
	for _, tc := range []struct {
		svc  string
		p    dataplane.Port
		want string
	}{
		{"web", port("http", dataplane.TCP, 80, 80), `web:http`},
		{"web", port("", dataplane.UDP, 53, 53), `web:53/udp`},
		{`we"b $(x)`, port("", dataplane.SCTP, 1, 1), `we_b___x_:1/sctp`},
		{strings.Repeat("x", 300), port("", dataplane.TCP, 1, 1), strings.Repeat("x", 255)},
	} {
		if got, want := commentMatch(tc.svc, tc.p), ` -m comment --comment "`+tc.want+`"`; got != want {
			t.Errorf("commentMatch(%q) = %s; want %s", tc.svc, got, want)
		}
	}
}

// TestRenderReuse checks that what Render reuses from prev never changes its
// output: not when a service changes, and not when only the options do.
func TestRenderReuse(t *testing.T) {
	base := baseServices(300)
	changed := service("svc-0100", []string{"10.96.0.101"}, tcp(80, 8080), ready("10.244.0.101"), ready("10.246.0.1"))
	var sparse *dataplane.State
	var external *dataplane.State
	for _, tc := range goldenCases() {
		switch tc.name {
		case "trie":
			sparse = tc.state
		case "external-local":
			external = tc.state
		}
	}
	otherNode := &dataplane.State{Services: external.Services, Node: dataplane.Node{
		NodePortAddresses: addrs("192.168.1.6"),
		Interfaces:        []dataplane.Interface{{Name: "eth1", External: true}},
	}}
	for _, tc := range []struct {
		name string
		prev *dataplane.State
		s    *dataplane.State
		opts Options
	}{
		{"same state", withServices(base), withServices(base), Options{}},
		{"one backend more", withServices(base), withServices(base, changed), Options{}},
		// Sparse addresses, where the leaf size changes every trie.
		{"other leaf size", sparse, sparse, Options{MaxLeafRules: 1}},
		// The same external services on a node with other external
		// interfaces and node-port addresses.
		{"another node", external, otherNode, Options{}},
		{"external interfaces back", otherNode, external, Options{}},
	} {
		prev := mustRender(t, tc.prev, Options{})
		got, err := Render(tc.s, tc.opts, prev)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(mustRender(t, tc.s, tc.opts).chains, got.chains); diff != "" {
			t.Errorf("%s: Render with prev differs from a fresh Render (-fresh +got):\n%s", tc.name, diff)
		}
	}
}

// TestRenderPatchesHairpin checks that a partial sync's Render patches the
// hairpin trie's sorted addresses instead of sorting every backend address
// of every service again (tens of milliseconds at 10,000 services), and that
// the patched trie is the one a fresh Render builds: through a random walk
// of backend changes where services share addresses, so that an address
// one service drops may stay for another, and one it adds may be there
// already.
func TestRenderPatchesHairpin(t *testing.T) {
	rnd := rand.New(rand.NewPCG(18, 4))
	addr := func() string { return fmt.Sprintf("10.244.%d.%d", rnd.IntN(3), rnd.IntN(40)) }
	var svcs []*dataplane.Service
	for i := range 200 {
		svcs = append(svcs, service(fmt.Sprintf("svc-%04d", i), []string{fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)},
			tcp(80, 8080), ready(addr()), ready(addr())))
	}
	s := state(svcs...)
	prev := mustRender(t, s, Options{})
	for step := range 300 {
		i := rnd.IntN(len(svcs))
		var bs []dataplane.Backend
		for range rnd.IntN(4) {
			if b := ready(addr()); !slices.ContainsFunc(bs, func(x dataplane.Backend) bool { return x.IP == b.IP }) {
				bs = append(bs, b)
			}
		}
		slices.SortFunc(bs, func(a, b dataplane.Backend) int { return a.IP.Compare(b.IP) })
		svcs[i] = service(svcs[i].Name, []string{svcs[i].VIPs[0].String()}, tcp(80, 8080), bs...)
		s = state(svcs...)
		before := fullSorts.Load()
		got, err := Render(s, Options{}, prev)
		if err != nil {
			t.Fatal(err)
		}
		if n := fullSorts.Load() - before; n != 0 {
			t.Fatalf("step %d: one service's backends changed and Render sorted the hairpin entries in full %d times, want 0", step, n)
		}
		if diff := cmp.Diff(mustRender(t, s, Options{}).chains, got.chains); diff != "" {
			t.Fatalf("step %d: Render with prev differs from a fresh Render (-fresh +got):\n%s", step, diff)
		}
		prev = got
	}
}
