package ebpf

// Dataplane tests: the whole eBPF dataplane (New, Apply, Close, Cleanup)
// in a fresh netlab node, with real sockets. Each test attaches its tc
// programs to the veths of its own lab, its socket hooks to a test cgroup
// (cgroup2test.New), and pins its maps in a bpffs of its own; a
// cleanup removes all of it, also when the test fails.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testkit/syncbuf"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/ebpf/maglev"
	"github.com/vipd/vipd/internal/nsdo"
	"github.com/vipd/vipd/internal/testkit/cgroup2test"
	"github.com/vipd/vipd/internal/testkit/childproc"
	"github.com/vipd/vipd/internal/testkit/netlab"
)

// The UDP client process of TestDataplaneConnectedUDPSocketRecovers: this
// test binary again, started with dpUDPClientEnv set to the VIP to talk to
// and dpUDPNetnsEnv to the namespace to do it from.
const (
	dpUDPClientEnv = "VIPD_DP_UDPCLIENT"
	dpUDPNetnsEnv  = "VIPD_DP_UDPCLIENT_NETNS"
)

func TestMain(m *testing.M) {
	// First: netlab's client processes and ours run this binary again.
	netlab.RunClientIfRequested()
	if vip, ok := os.LookupEnv(dpUDPClientEnv); ok {
		os.Exit(dpServeUDPClient(vip, os.Getenv(dpUDPNetnsEnv)))
	}
	os.Exit(m.Run())
}

const (
	// dpTargetPort is where every backend's echo server listens.
	dpTargetPort = 8080
	// dpReplyTimeout bounds a request that must succeed.
	dpReplyTimeout = 3 * time.Second
	// dpDeadTimeout bounds a request that must not reach a backend.
	dpDeadTimeout = time.Second
)

// VIPs of the tests' services: 198.19.0.0/16 is never assigned by netlab.
var (
	dpVIPA = netip.MustParseAddr("198.19.0.10")
	dpVIPB = netip.MustParseAddr("198.19.0.11")
	dpVIPC = netip.MustParseAddr("198.19.0.12")
)

// dpSmallMaps keeps map creation cheap: the default sizes cost seconds.
var dpSmallMaps = MapSizes{LB: 4096, Backends: 1024, Conntrack: 65536, Affinity: 1024, Sockets: 1024}

// ---- environment ----

// dpEnv is one test's world: a lab node with pods, a cgroup for the
// socket hooks, a bpffs directory, and the dataplane while it is open.
type dpEnv struct {
	t      *testing.T
	lab    *netlab.Lab
	node   *netlab.Node
	cgroup string
	bpffs  string
	cfg    Config
	dp     *Dataplane
}

// newDPEnv builds a node with the given pods; those named be* run an echo
// server on dpTargetPort, answering with their name. Nothing is loaded yet:
// see open.
func newDPEnv(t *testing.T, pods []string, sizes MapSizes) *dpEnv {
	t.Helper()
	netlab.RequireRoot(t)
	lab := netlab.New(t, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: pods}}})
	node := lab.Node(1)
	for _, p := range pods {
		if strings.HasPrefix(p, "be") {
			if _, err := node.Pod(p).StartEcho(p, dpTargetPort); err != nil {
				t.Fatalf("start echo: %v", err)
			}
		}
	}
	cg := cgroup2test.New(t)
	bpffs := filepath.Join(t.TempDir(), "bpf") // New mounts a bpffs here
	e := &dpEnv{
		t: t, lab: lab, node: node, cgroup: cg, bpffs: bpffs,
		cfg: Config{
			NetNS: node.Path(), BPFFS: bpffs, CgroupPath: cg,
			PodInterfaces: []string{"veth*"}, Maps: sizes, GCInterval: time.Hour,
		},
	}
	// Registered after the lab, the cgroup and the temporary directory: it
	// runs before they go.
	t.Cleanup(e.cleanup)
	return e
}

// cleanup closes the dataplane, removes everything it put into the kernel
// and unmounts the bpffs.
func (e *dpEnv) cleanup() {
	if e.dp != nil {
		if err := e.dp.Close(); err != nil {
			e.t.Errorf("close dataplane: %v", err)
		}
		e.dp = nil
	}
	if err := Cleanup(hclog.NewNullLogger(), e.node.Path(), e.bpffs); err != nil {
		e.t.Errorf("cleanup: %v", err)
	}
	for range 10 {
		var st unix.Statfs_t
		if err := unix.Statfs(e.bpffs, &st); err != nil || st.Type != unix.BPF_FS_MAGIC {
			return
		}
		if err := unix.Unmount(e.bpffs, unix.MNT_DETACH); err != nil {
			e.t.Errorf("unmount bpffs %s: %v", e.bpffs, err)
			return
		}
	}
}

// open runs New; a nil log discards the log.
func (e *dpEnv) open(log hclog.Logger) *Dataplane {
	e.t.Helper()
	if e.dp != nil {
		e.t.Fatal("open: the dataplane is open already")
	}
	if log == nil {
		log = hclog.NewNullLogger()
	}
	dp, err := New(context.Background(), log, e.cfg)
	if err != nil {
		prSkipIfNoPermission(e.t, err)
		e.t.Fatalf("New: %v", err)
	}
	e.dp = dp
	return dp
}

// close runs Close: programs, links and maps stay.
func (e *dpEnv) close() {
	e.t.Helper()
	err := e.dp.Close()
	e.dp = nil
	if err != nil {
		e.t.Fatalf("Close: %v", err)
	}
}

func (e *dpEnv) apply(s *dataplane.State) {
	e.t.Helper()
	if err := e.dp.Apply(context.Background(), s); err != nil {
		e.t.Fatalf("Apply generation %d: %v", s.Generation, err)
	}
}

func (e *dpEnv) pod(name string) *netlab.Pod {
	e.t.Helper()
	p := e.node.Pod(name)
	if p == nil {
		e.t.Fatalf("no pod %s", name)
	}
	return p
}

// ---- services ----

// dpBE is a backend pod of a service.
type dpBE struct {
	pod    string
	state  dataplane.BackendState
	weight uint16
}

func dpReady(pod string) dpBE { return dpBE{pod: pod, state: dataplane.BackendReady, weight: 1} }

// service returns a service on vip:80 (proto) with target port
// dpTargetPort; the backends are sorted by IP, as the State wants them.
func (e *dpEnv) service(name string, vip netip.Addr, proto dataplane.Protocol, bes ...dpBE) *dataplane.Service {
	e.t.Helper()
	svc := &dataplane.Service{
		Name: name, Owner: "test", Generation: 1,
		VIPs:          []netip.Addr{vip},
		Ports:         []dataplane.Port{{Name: "p", Protocol: proto, Port: 80, TargetPort: dpTargetPort}},
		TrafficPolicy: dataplane.TrafficPolicyCluster,
		LoadBalancing: dataplane.LoadBalancingRandom,
	}
	for _, b := range bes {
		svc.Backends = append(svc.Backends, dataplane.Backend{IP: e.pod(b.pod).IPv4(), State: b.state, Weight: b.weight})
	}
	sortBackends(svc)
	return svc
}

func sortBackends(svc *dataplane.Service) {
	slices.SortFunc(svc.Backends, func(a, b dataplane.Backend) int { return a.IP.Compare(b.IP) })
}

// dpState is a State of the services; changed nil asks for a full apply.
func dpState(gen uint64, changed []string, svcs ...*dataplane.Service) *dataplane.State {
	s := &dataplane.State{Generation: gen, Services: map[string]*dataplane.Service{}, Changed: changed}
	for _, svc := range svcs {
		s.Services[svc.Name] = svc
	}
	return s
}

// ---- traffic ----

func dpVIPPort(vip netip.Addr) string { return netip.AddrPortFrom(vip, 80).String() }

// request makes one TCP request from the client pod to vip:80.
func (e *dpEnv) request(vip netip.Addr, timeout time.Duration) (netlab.Reply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return e.pod("client").Request(ctx, "tcp", dpVIPPort(vip))
}

// expectBackends makes requests to vip:80 until every backend in want has
// answered, and fails on an error or an answer from anyone else.
func (e *dpEnv) expectBackends(vip netip.Addr, want ...string) {
	e.t.Helper()
	seen := map[string]bool{}
	for i := 0; i < 60 && len(seen) < len(want); i++ {
		r, err := e.request(vip, dpReplyTimeout)
		if err != nil {
			e.t.Fatalf("request to %s: %v", vip, err)
		}
		if !slices.Contains(want, r.Backend) {
			e.t.Fatalf("request to %s answered by %s, want one of %v", vip, r.Backend, want)
		}
		if r.Remote.Addr() != vip {
			e.t.Errorf("reply to a request to %s came from %s", vip, r.Remote)
		}
		seen[r.Backend] = true
	}
	if len(seen) < len(want) {
		e.t.Fatalf("requests to %s reached %v, want all of %v", vip, seen, want)
	}
}

// expectDead checks that a request to vip:80 reaches no backend.
func (e *dpEnv) expectDead(vip netip.Addr) {
	e.t.Helper()
	if r, err := e.request(vip, dpDeadTimeout); err == nil {
		e.t.Fatalf("request to %s answered by %s, want no translation", vip, r.Backend)
	}
}

// connRequest makes a request on an established connection.
func connRequest(t *testing.T, c *netlab.Conn, what string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), dpReplyTimeout)
	defer cancel()
	r, err := c.Request(ctx)
	if err != nil {
		t.Fatalf("established connection %s: %v", what, err)
	}
	return r.Backend
}

// ---- map snapshots ----

// dpSnap is what the service maps hold. members are every frontend's
// members, wherever they are (inline in its reverse-NAT value or in
// vipd_members); memberEntries counts the vipd_members entries.
type dpSnap struct {
	services      map[bpfSvcKey]bpfSvcVal
	members       map[bpfMemberKey]uint32
	memberEntries int
	revNat        map[uint32]feKey
	backends      map[uint32]beKey
	maglev        map[uint32]bool
}

func dpSnapshot(t *testing.T, m *bpfMaps) *dpSnap {
	t.Helper()
	s := &dpSnap{
		services: map[bpfSvcKey]bpfSvcVal{}, members: map[bpfMemberKey]uint32{},
		revNat: map[uint32]feKey{}, backends: map[uint32]beKey{}, maglev: map[uint32]bool{},
	}
	inline := map[bpfMemberKey]uint32{}
	err := errors.Join(
		forEach(m.VipdServices, func(k bpfSvcKey, v bpfSvcVal) { s.services[k] = v }),
		forEach(m.VipdMembers, func(k bpfMemberKey, v uint32) { s.members[k] = v; s.memberEntries++ }),
		forEach(m.VipdRevnat, func(id uint32, v bpfRevNat) {
			s.revNat[id] = feKey{addr: fromWords(v.Addr.W), port: fromBE16(v.Port), proto: v.Proto}
			if v.Members != revNatMembersMap {
				for j := range min(int(v.Members), revNatInlineMembers) {
					inline[bpfMemberKey{RevNatId: id, BackendId: v.MemberIds[j]}] = uint32(v.MemberFlags[j])
				}
			}
		}),
		forEachBackend(m.VipdBackends, func(id uint32, v bpfBackend) {
			s.backends[id] = beKey{addr: fromWords(v.Addr.W), port: fromBE16(v.Port)}
		}),
		forEach(m.VipdMaglev, func(id uint32, _ uint32) { s.maglev[id] = true }),
	)
	if err != nil {
		t.Fatalf("read maps: %v", err)
	}
	maps.Copy(s.members, inline)
	return s
}

// lines renders s for diffs, sorted.
func (s *dpSnap) lines() []string {
	var out []string
	for k, v := range s.services {
		fe := feKey{addr: fromWords(k.Addr.W), port: fromBE16(k.Port), proto: k.Proto}
		if k.Slot == 0 {
			out = append(out, fmt.Sprintf("service %s master: count=%d revnat=%d flags=%d timeout=%d weight=%d maglev=%d",
				fe, v.Count, v.RevNatId, v.Flags, v.AffinityTimeout, v.Weight, v.MaglevSize))
		} else {
			out = append(out, fmt.Sprintf("service %s slot %d: backend=%d cum=%d", fe, k.Slot, v.BackendId, v.Weight))
		}
	}
	for k, v := range s.members {
		out = append(out, fmt.Sprintf("member revnat=%d backend=%d flags=%d", k.RevNatId, k.BackendId, v))
	}
	for id, k := range s.revNat {
		out = append(out, fmt.Sprintf("revnat %d: %s", id, k))
	}
	for id, k := range s.backends {
		out = append(out, fmt.Sprintf("backend %d: %s", id, k))
	}
	for id := range s.maglev {
		out = append(out, fmt.Sprintf("maglev %d", id))
	}
	sort.Strings(out)
	return out
}

// only returns the entries of the frontends on vips, and the backends
// their members name.
func (s *dpSnap) only(vips ...netip.Addr) *dpSnap {
	o := &dpSnap{
		services: map[bpfSvcKey]bpfSvcVal{}, members: map[bpfMemberKey]uint32{},
		revNat: map[uint32]feKey{}, backends: map[uint32]beKey{}, maglev: map[uint32]bool{},
	}
	for k, v := range s.services {
		if slices.Contains(vips, fromWords(k.Addr.W)) {
			o.services[k] = v
		}
	}
	for id, k := range s.revNat {
		if slices.Contains(vips, k.addr) {
			o.revNat[id] = k
			if s.maglev[id] {
				o.maglev[id] = true
			}
		}
	}
	for k, v := range s.members {
		if _, ok := o.revNat[k.RevNatId]; ok {
			o.members[k] = v
			if b, ok := s.backends[k.BackendId]; ok {
				o.backends[k.BackendId] = b
			}
		}
	}
	return o
}

// backendID returns the ID of the backend at addr:dpTargetPort.
func (s *dpSnap) backendID(t *testing.T, addr netip.Addr) uint32 {
	t.Helper()
	for id, k := range s.backends {
		if k == (beKey{addr: addr, port: dpTargetPort}) {
			return id
		}
	}
	t.Fatalf("no backend %s:%d in the maps", addr, dpTargetPort)
	return 0
}

func dpWantSnap(t *testing.T, what string, got, want *dpSnap) {
	t.Helper()
	if d := cmp.Diff(want.lines(), got.lines()); d != "" {
		t.Errorf("%s: maps differ (-want +got):\n%s", what, d)
	}
}

// ---- tests ----

func TestDataplaneRestartKeepsIDsAndPrunes(t *testing.T) {
	e := newDPEnv(t, []string{"client", "be1", "be2", "be3"}, dpSmallMaps)
	a := e.service("test/a", dpVIPA, dataplane.TCP, dpReady("be1"), dpReady("be2"))
	// be2 is shared with A; be3 only B uses.
	b := e.service("test/b", dpVIPB, dataplane.TCP, dpReady("be2"), dpReady("be3"))
	e.open(nil)
	e.apply(dpState(1, nil, a, b))
	e.expectBackends(dpVIPA, "be1", "be2")
	e.expectBackends(dpVIPB, "be2", "be3")

	ctx, cancel := context.WithTimeout(context.Background(), dpReplyTimeout)
	defer cancel()
	conn, err := e.pod("client").Dial(ctx, "tcp", dpVIPPort(dpVIPA))
	if err != nil {
		t.Fatalf("dial %s: %v", dpVIPA, err)
	}
	defer conn.Close()
	x := connRequest(t, conn, "before the restart")
	other := "be1"
	if x == "be1" {
		other = "be2"
	}

	before := dpSnapshot(t, &e.dp.objs.bpfMaps)
	if len(before.revNat) != 2 || len(before.backends) != 3 {
		t.Fatalf("after the first apply: %d reverse-NAT and %d backend entries, want 2 and 3:\n%s",
			len(before.revNat), len(before.backends), strings.Join(before.lines(), "\n"))
	}
	e.close()

	// Closed: the pinned programs and maps keep translating.
	if got := e.cgroupPrograms(); len(got) != len(dpCgroupHooks) {
		t.Errorf("after Close: socket hooks on the cgroup %v, want one of each of %v", got, dpCgroupHooks)
	}
	if got := e.tcPrograms(); len(got) != 8 {
		t.Errorf("after Close: tcx programs %v, want ingress and egress of all 4 veths", got)
	}
	for _, m := range []string{"vipd_services", "vipd_members", "vipd_revnat", "vipd_backends", "vipd_ct", "vipd_config"} {
		if _, err := os.Stat(filepath.Join(e.bpffs, m)); err != nil {
			t.Errorf("after Close: pinned map %s: %v", m, err)
		}
	}
	e.expectBackends(dpVIPA, "be1", "be2")
	if got := connRequest(t, conn, "while vipd is closed"); got != x {
		t.Fatalf("established connection moved from %s to %s while vipd was closed", x, got)
	}

	dp := e.open(nil)
	wantRevNat, wantBackends := map[string]uint32{}, map[string]uint32{}
	for id, k := range before.revNat {
		wantRevNat[k.String()] = id
	}
	for id, k := range before.backends {
		wantBackends[k.String()] = id
	}
	gotRevNat, gotBackends := map[string]uint32{}, map[string]uint32{}
	for k, id := range dp.prog.revNatIDs {
		gotRevNat[k.String()] = id
	}
	for k, ref := range dp.prog.backendIDs.all() {
		gotBackends[k.String()] = ref.id
	}
	if d := cmp.Diff(wantRevNat, gotRevNat); d != "" {
		t.Errorf("restored reverse-NAT IDs (-before +restored):\n%s", d)
	}
	if d := cmp.Diff(wantBackends, gotBackends); d != "" {
		t.Errorf("restored backend IDs (-before +restored):\n%s", d)
	}

	// The first apply after a restart is full: B, which the new state
	// lacks, is pruned; A keeps every entry and ID.
	e.apply(dpState(2, nil, a))
	after := dpSnapshot(t, &dp.objs.bpfMaps)
	dpWantSnap(t, "after the full apply of A alone", after, before.only(dpVIPA))
	if _, ok := after.backends[before.backendID(t, e.pod("be3").IPv4())]; ok {
		t.Error("be3, which only B used, is still in the backend map")
	}
	e.expectBackends(dpVIPA, "be1", "be2")
	e.expectDead(dpVIPB)
	if got := connRequest(t, conn, "after the restart"); got != x {
		t.Fatalf("established connection moved from %s to %s across the restart", x, got)
	}

	// A backend-set change after the restart: the other backend leaves,
	// be3 joins. The connection keeps x, x keeps its ID.
	a2 := e.service("test/a", dpVIPA, dataplane.TCP, dpReady(x), dpReady("be3"))
	a2.Generation = 2
	e.apply(dpState(3, []string{"test/a"}, a2))
	if got := connRequest(t, conn, "after A's backends changed"); got != x {
		t.Fatalf("established connection moved from %s to %s after A's backends changed", x, got)
	}
	e.expectBackends(dpVIPA, x, "be3")
	changed := dpSnapshot(t, &dp.objs.bpfMaps)
	xAddr := e.pod(x).IPv4()
	if got, want := changed.backendID(t, xAddr), before.backendID(t, xAddr); got != want {
		t.Errorf("backend %s has ID %d, had %d", x, got, want)
	}
	if id := before.backendID(t, e.pod(other).IPv4()); changed.backends[id] != (beKey{}) {
		t.Errorf("backend %s (ID %d) left A, which was its last service, but is still in the backend map", other, id)
	}
	for id, k := range before.revNat {
		if k.addr == dpVIPA && changed.revNat[id] != k {
			t.Errorf("A's reverse-NAT ID %d changed: now %v", id, changed.revNat)
		}
	}

	// TCP flows keep their backend until they close, even when it leaves
	// the service (as a conntrack DNAT does).
	a3 := e.service("test/a", dpVIPA, dataplane.TCP, dpReady("be3"))
	a3.Generation = 3
	e.apply(dpState(4, []string{"test/a"}, a3))
	if got := connRequest(t, conn, "after its backend left A"); got != x {
		t.Fatalf("established connection moved from %s to %s after its backend left A", x, got)
	}
	e.expectBackends(dpVIPA, "be3")
}

func TestDataplaneResourceExhausted(t *testing.T) {
	// LB 32: 32 service entries, 18 members, 2 reverse-NAT entries (so
	// two VIP:ports), 2 Maglev tables; 8 backends.
	sizes := MapSizes{LB: 32, Backends: 8, Conntrack: 1024, Affinity: 64, Sockets: 64}
	e := newDPEnv(t, []string{"client", "be1", "be2", "be3"}, sizes)
	dp := e.open(nil)
	first := e.service("test/first", dpVIPA, dataplane.TCP, dpReady("be1"), dpReady("be2"))
	e.apply(dpState(1, nil, first))
	e.expectBackends(dpVIPA, "be1", "be2")
	before := dpSnapshot(t, &dp.objs.bpfMaps)

	// manyBackends needs 7 backends more than the maps have room for.
	manyBackends := e.service("test/many", dpVIPB, dataplane.TCP)
	for i := range 7 {
		manyBackends.Backends = append(manyBackends.Backends, dataplane.Backend{
			IP: netip.AddrFrom4([4]byte{198, 18, 1, byte(200 + i)}), State: dataplane.BackendReady, Weight: 1,
		})
	}
	// twoPorts needs 2 reverse-NAT entries, and 1 is left.
	twoPorts := e.service("test/twoports", dpVIPB, dataplane.TCP, dpReady("be3"))
	twoPorts.Ports = append(twoPorts.Ports, dataplane.Port{Name: "q", Protocol: dataplane.TCP, Port: 81, TargetPort: dpTargetPort})

	gen := uint64(1)
	for _, tc := range []struct {
		svc  *dataplane.Service
		flag string
	}{
		{manyBackends, "--bpf-backend-map-max"},
		{twoPorts, "--bpf-lb-map-max"},
	} {
		for _, changed := range [][]string{{tc.svc.Name}, nil} {
			gen++
			err := dp.Apply(context.Background(), dpState(gen, changed, first, tc.svc))
			what := fmt.Sprintf("adding %s (changed %v)", tc.svc.Name, changed)
			if !errors.Is(err, dataplane.ErrResourceExhausted) {
				t.Fatalf("%s: Apply returned %v, want an error wrapping ErrResourceExhausted", what, err)
			}
			if !strings.Contains(err.Error(), tc.flag) {
				t.Errorf("%s: error %q does not name %s", what, err, tc.flag)
			}
			dpWantSnap(t, what, dpSnapshot(t, &dp.objs.bpfMaps), before)
			e.expectBackends(dpVIPA, "be1", "be2")
			e.expectDead(dpVIPB)
		}
	}

	// A state that fits applies.
	second := e.service("test/second", dpVIPB, dataplane.TCP, dpReady("be3"))
	gen++
	e.apply(dpState(gen, []string{second.Name}, first, second))
	e.expectBackends(dpVIPA, "be1", "be2")
	e.expectBackends(dpVIPB, "be3")

	// So does one that swaps a service for another while the
	// reverse-NAT map is full: the state needs 2 entries, like the last.
	before = dpSnapshot(t, &dp.objs.bpfMaps)
	third := e.service("test/third", dpVIPC, dataplane.TCP, dpReady("be3"))
	gen++
	if err := dp.Apply(context.Background(), dpState(gen, []string{second.Name, third.Name}, first, third)); err != nil {
		t.Errorf("Apply of a state that fits the maps (a service swapped for another at full capacity): %v", err)
		// All-or-nothing still holds: the previous state is in force,
		// and the swap goes through in two steps.
		dpWantSnap(t, "after the failed swap", dpSnapshot(t, &dp.objs.bpfMaps), before)
		e.expectBackends(dpVIPA, "be1", "be2")
		e.expectBackends(dpVIPB, "be3")
		gen++
		e.apply(dpState(gen, []string{second.Name}, first))
		gen++
		e.apply(dpState(gen, []string{third.Name}, first, third))
	}
	e.expectBackends(dpVIPA, "be1", "be2")
	e.expectBackends(dpVIPC, "be3")
	e.expectDead(dpVIPB)
}

func TestDataplaneLayoutMismatch(t *testing.T) {
	e := newDPEnv(t, []string{"client", "be1", "be2"}, dpSmallMaps)
	svc := e.service("test/a", dpVIPA, dataplane.TCP, dpReady("be1"))
	dp := e.open(nil)
	e.apply(dpState(1, nil, svc))
	e.expectBackends(dpVIPA, "be1")
	oldInfo, err := dp.objs.VipdServices.Info()
	if err != nil {
		t.Fatalf("service map info: %v", err)
	}
	oldID, _ := oldInfo.ID()
	e.close()

	cfgMap, err := ebpf.LoadPinnedMap(filepath.Join(e.bpffs, "vipd_config"), nil)
	if err != nil {
		t.Fatalf("load pinned config map: %v", err)
	}
	var cfg bpfConfig
	if err := cfgMap.Lookup(uint32(0), &cfg); err != nil {
		t.Fatalf("read config map: %v", err)
	}
	cfg.LayoutVersion = 999
	err = cfgMap.Put(uint32(0), &cfg)
	cfgMap.Close()
	if err != nil {
		t.Fatalf("write config map: %v", err)
	}

	var logs syncbuf.Buffer
	dp = e.open(hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Debug}))
	const msg = "pinned maps have another layout version: replacing them"
	if out := logs.String(); !strings.Contains(out, msg) || !strings.Contains(out, "pinned=999") {
		t.Errorf("New logged:\n%s\nwant a warning %q with pinned=999", out, msg)
	}
	newInfo, err := dp.objs.VipdServices.Info()
	if err != nil {
		t.Fatalf("service map info: %v", err)
	}
	if newID, _ := newInfo.ID(); newID == oldID {
		t.Errorf("New kept the service map (ID %d) of another layout version", oldID)
	}
	if len(dp.prog.revNatIDs) != 0 || dp.prog.backendIDs.len() != 0 {
		t.Errorf("New restored IDs from maps of another layout version: reverse NAT %v, backends %v",
			dp.prog.revNatIDs, dp.prog.backendIDs)
	}
	if err := dp.objs.VipdConfig.Lookup(uint32(0), &cfg); err != nil || cfg.LayoutVersion != layoutVersion {
		t.Errorf("config map after New: layout version %d (err %v), want %d", cfg.LayoutVersion, err, layoutVersion)
	}
	// Until the first Apply, the programs attached before keep their
	// maps: traffic never meets the new, empty ones.
	e.expectBackends(dpVIPA, "be1")
	// A state the old maps never held proves that the attached programs
	// now use the new maps.
	svc2 := e.service("test/a", dpVIPA, dataplane.TCP, dpReady("be2"))
	svc2.Generation = 2
	e.apply(dpState(2, nil, svc2))
	e.expectBackends(dpVIPA, "be2")
}

// dpApplied is one Apply of TestDataplaneChurnNoFailures: its backend set
// may be in force from start until the next Apply has returned.
type dpApplied struct {
	start, end time.Time
	eligible   []string
}

// dpResult is one connection of TestDataplaneChurnNoFailures.
type dpResult struct {
	start, end time.Time
	backend    string
	err        error
}

func TestDataplaneChurnNoFailures(t *testing.T) {
	e := newDPEnv(t, []string{"client", "be1", "be2"}, dpSmallMaps)
	weighted := func(pod string, w uint16) dpBE { return dpBE{pod: pod, state: dataplane.BackendReady, weight: w} }
	terminating := func(pod string) dpBE { return dpBE{pod: pod, state: dataplane.BackendTerminating, weight: 1} }
	notServing := func(pod string) dpBE { return dpBE{pod: pod, state: dataplane.BackendNotServing, weight: 1} }
	type set struct {
		bes      []dpBE
		lb       dataplane.LoadBalancing
		affinity bool
		eligible []string
	}
	sets := []set{
		{bes: []dpBE{dpReady("be1")}, eligible: []string{"be1"}},
		{bes: []dpBE{dpReady("be1"), dpReady("be2")}, eligible: []string{"be1", "be2"}},
		{bes: []dpBE{dpReady("be2")}, eligible: []string{"be2"}},
		{bes: []dpBE{weighted("be1", 1), weighted("be2", 3)}, eligible: []string{"be1", "be2"}},
		{bes: []dpBE{terminating("be1"), dpReady("be2")}, eligible: []string{"be2"}},
		{bes: []dpBE{weighted("be1", 5), weighted("be2", 1)}, eligible: []string{"be1", "be2"}},
		{bes: []dpBE{terminating("be1")}, eligible: []string{"be1"}},
		{bes: []dpBE{dpReady("be1"), dpReady("be2")}, lb: dataplane.LoadBalancingMaglev, eligible: []string{"be1", "be2"}},
		{bes: []dpBE{notServing("be1"), terminating("be2")}, eligible: []string{"be2"}},
		{bes: []dpBE{dpReady("be2")}, lb: dataplane.LoadBalancingMaglev, eligible: []string{"be2"}},
		{bes: []dpBE{dpReady("be1"), notServing("be2")}, eligible: []string{"be1"}},
		{bes: []dpBE{dpReady("be1"), dpReady("be2")}, affinity: true, eligible: []string{"be1", "be2"}},
	}
	// bystander never changes: incremental applies must leave it alone.
	bystander := e.service("test/bystander", dpVIPB, dataplane.TCP, dpReady("be1"))
	const name = "test/churn"
	serviceOf := func(i int) *dataplane.Service {
		s := sets[i%len(sets)]
		svc := e.service(name, dpVIPA, dataplane.TCP, s.bes...)
		svc.Generation = uint64(i + 1)
		if s.lb != 0 {
			svc.LoadBalancing = s.lb
		}
		if s.affinity {
			svc.Affinity = dataplane.SessionAffinity{ClientIP: true, Timeout: 10 * time.Second}
		}
		return svc
	}
	e.open(nil)
	applied := []dpApplied{{eligible: sets[0].eligible}}
	e.apply(dpState(1, nil, serviceOf(0), bystander))
	e.expectBackends(dpVIPA, "be1")

	const churn = 2 * time.Second
	churnStart := time.Now()
	var (
		mu      sync.Mutex
		results []dpResult
		wg      sync.WaitGroup
		stop    = make(chan struct{})
	)
	// Two clients, so that connections are being set up at every moment.
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				r, err := e.request(dpVIPA, dpReplyTimeout)
				mu.Lock()
				results = append(results, dpResult{start: start, end: time.Now(), backend: r.Backend, err: err})
				mu.Unlock()
			}
		}()
	}
	deadline := time.Now().Add(churn)
	var applyErr error
	for i := 1; time.Now().Before(deadline); i++ {
		time.Sleep(20 * time.Millisecond)
		changed := []string{name}
		if i%5 == 0 {
			changed = nil // now and then a full apply
		}
		a := dpApplied{start: time.Now(), eligible: sets[i%len(sets)].eligible}
		if err := e.dp.Apply(context.Background(), dpState(uint64(i+1), changed, serviceOf(i), bystander)); err != nil {
			applyErr = fmt.Errorf("apply %d: %w", i, err)
			break
		}
		a.end = time.Now()
		applied = append(applied, a)
	}
	close(stop)
	wg.Wait()
	if applyErr != nil {
		t.Fatal(applyErr)
	}

	// allowed reports whether backend was eligible in a set that may have
	// been in force at some moment of [start, end].
	allowed := func(r dpResult) bool {
		for i, a := range applied {
			until := time.Now()
			if i+1 < len(applied) {
				until = applied[i+1].end
			}
			if !a.start.After(r.end) && !until.Before(r.start) && slices.Contains(a.eligible, r.backend) {
				return true
			}
		}
		return false
	}
	var failed, wrong, slow int
	var maxDur time.Duration
	perBackend := map[string]int{}
	for _, r := range results {
		d := r.end.Sub(r.start)
		maxDur = max(maxDur, d)
		switch {
		case r.err != nil:
			failed++
			if failed <= 5 {
				t.Errorf("connection started %v into the churn failed after %v: %v", r.start.Sub(churnStart).Round(time.Millisecond), d, r.err)
			}
		case !allowed(r):
			wrong++
			if wrong <= 5 {
				t.Errorf("connection started %v into the churn reached %s, which was not eligible then", r.start.Sub(churnStart).Round(time.Millisecond), r.backend)
			}
		default:
			perBackend[r.backend]++
			// A SYN the dataplane dropped is retransmitted after a
			// second: the connection succeeds, but late.
			if d >= 900*time.Millisecond {
				slow++
				if slow <= 5 {
					t.Errorf("connection started %v into the churn took %v (a dropped SYN?)", r.start.Sub(churnStart).Round(time.Millisecond), d)
				}
			}
		}
	}
	t.Logf("%d applies, %d connections (%v), slowest %v: %d failed, %d to an ineligible backend, %d slow",
		len(applied), len(results), perBackend, maxDur, failed, wrong, slow)
	if len(applied) < 20 || len(results) < 100 {
		t.Errorf("churn too thin to prove anything: %d applies, %d connections", len(applied), len(results))
	}

	// The churn leaves exactly the last state in the maps.
	last := dpSnapshot(t, &e.dp.objs.bpfMaps)
	e.close()
	e.open(nil)
	lastIdx := len(applied) - 1
	e.apply(dpState(uint64(lastIdx+1000), nil, serviceOf(lastIdx), bystander))
	want := dpSnapshot(t, &e.dp.objs.bpfMaps)
	dpWantSnap(t, "the maps after the churn, against a full apply of the last state after a restart", last, want)
}

// ---- the connected UDP socket's process ----

// dpServeUDPClient is the life of the UDP client process: it enters the
// namespace at nsPath, and then, for each line on stdin:
//
//	dial  connects a new UDP socket to vip, which later sends use
//	send  sends a datagram on the socket and reads the answer
//
// and prints one line for each: "ok", "reply <backend>", "error <errno>
// <message>" or "timeout".
func dpServeUDPClient(vip, nsPath string) int {
	code := 2
	// The whole life runs in nsPath, on nsdo's locked thread, so that
	// every socket it opens belongs to the namespace.
	err := nsdo.Do(nsPath, func() error {
		code = dpServeUDPClientIn(vip)
		return nil
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "netns %s: %v\n", nsPath, err)
		return 2
	}
	return code
}

// dpServeUDPClientIn is dpServeUDPClient once inside the namespace.
func dpServeUDPClientIn(vip string) int {
	dst, err := netip.ParseAddrPort(vip)
	if err != nil {
		fmt.Fprintf(os.Stderr, "parse %s: %v\n", vip, err)
		return 2
	}
	fail := func(what string, err error) {
		var errno syscall.Errno
		switch {
		case errors.As(err, &errno):
			fmt.Printf("error %s %s: %v\n", unix.ErrnoName(errno), what, err)
		case netlab.IsTimeout(err):
			fmt.Println("timeout")
		default:
			fmt.Printf("error - %s: %v\n", what, err)
		}
	}
	var conn *net.UDPConn
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch in.Text() {
		case "dial":
			c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(dst))
			if err != nil {
				fail("dial", err)
				continue
			}
			conn = c
			fmt.Println("ok")
		case "send":
			if conn == nil {
				fmt.Println("error - no socket")
				continue
			}
			if _, err := conn.Write([]byte("ping\n")); err != nil {
				fail("write", err)
				continue
			}
			conn.SetReadDeadline(time.Now().Add(time.Second))
			buf := make([]byte, 512)
			n, err := conn.Read(buf)
			if err != nil {
				fail("read", err)
				continue
			}
			backend, _, _ := strings.Cut(string(buf[:n]), " ")
			fmt.Printf("reply %s\n", backend)
		case "open": // an unconnected socket, for sendto
			c, err := net.ListenUDP("udp4", nil)
			if err != nil {
				fail("listen", err)
				continue
			}
			conn = c
			fmt.Println("ok")
		case "sendto":
			if conn == nil {
				fmt.Println("error - no socket")
				continue
			}
			if _, err := conn.WriteToUDPAddrPort([]byte("ping\n"), dst); err != nil {
				fail("sendto", err)
				continue
			}
			conn.SetReadDeadline(time.Now().Add(time.Second))
			buf := make([]byte, 512)
			n, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				fail("recvfrom", err)
				continue
			}
			backend, _, _ := strings.Cut(string(buf[:n]), " ")
			fmt.Printf("reply %s from %s\n", backend, from)
		default:
			fmt.Printf("error - unknown command %q\n", in.Text())
		}
	}
	return 0
}

// dpUDPClient is the test's side of the UDP client process.
type dpUDPClient struct {
	t     *testing.T
	stdin io.WriteCloser
	lines chan string
}

// startUDPClient starts the UDP client process in the env's cgroup (born
// there, so its sockets are the cgroup's) and in the node's namespace.
func (e *dpEnv) startUDPClient(vip netip.AddrPort) *dpUDPClient {
	e.t.Helper()
	exe, err := os.Executable()
	if err != nil {
		e.t.Fatal(err)
	}
	cg, err := unix.Open(e.cgroup, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		e.t.Fatalf("open cgroup: %v", err)
	}
	defer unix.Close(cg)
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), dpUDPClientEnv+"="+vip.String(), dpUDPNetnsEnv+"="+e.node.Path())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: cg}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	exited, err := childproc.Start(cmd)
	if err != nil {
		e.t.Fatalf("start UDP client process: %v", err)
	}
	c := &dpUDPClient{t: e.t, stdin: stdin, lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	e.t.Cleanup(func() {
		stdin.Close()
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if e.t.Failed() {
			e.t.Logf("UDP client process stderr: %s", stderr.String())
		}
	})
	return c
}

// do sends a command and returns the process's answer.
func (c *dpUDPClient) do(cmd string) string {
	c.t.Helper()
	if _, err := io.WriteString(c.stdin, cmd+"\n"); err != nil {
		c.t.Fatalf("UDP client process: send %s: %v", cmd, err)
	}
	select {
	case line, ok := <-c.lines:
		if !ok {
			c.t.Fatalf("UDP client process exited before answering %s", cmd)
		}
		return line
	case <-time.After(5 * time.Second):
		c.t.Fatalf("UDP client process: no answer to %s", cmd)
	}
	return ""
}

// reply sends a datagram and returns the backend that answered.
func (c *dpUDPClient) reply(what string) string {
	c.t.Helper()
	line := c.do("send")
	backend, ok := strings.CutPrefix(line, "reply ")
	if !ok {
		c.t.Fatalf("%s: the UDP client process said %q, want a reply", what, line)
	}
	return backend
}

func TestDataplaneConnectedUDPSocketRecovers(t *testing.T) {
	e := newDPEnv(t, []string{"be1", "be2"}, dpSmallMaps)
	svc := e.service("test/udp", dpVIPA, dataplane.UDP, dpReady("be1"), dpReady("be2"))
	dp := e.open(nil)
	e.apply(dpState(1, nil, svc))

	c := e.startUDPClient(netip.AddrPortFrom(dpVIPA, 80))
	if line := c.do("dial"); line != "ok" {
		t.Fatalf("dial %s: %s", dpVIPA, line)
	}
	x := c.reply("first datagram")
	if got := c.reply("second datagram"); got != x {
		t.Fatalf("the connected socket moved from %s to %s by itself", x, got)
	}
	if n := dpCount(t, dp.objs.VipdSockRevnat); n == 0 {
		t.Fatal("the socket hooks recorded no translation: the socket did not go through the dataplane")
	}
	y := "be1"
	if x == "be1" {
		y = "be2"
	}

	svc2 := e.service("test/udp", dpVIPA, dataplane.UDP, dpReady(y))
	svc2.Generation = 2
	e.apply(dpState(2, []string{svc2.Name}, svc2))
	// x still answers anyone who asks: a socket stuck on it would get a
	// reply, silently.
	line := c.do("send")
	if !strings.HasPrefix(line, "error ") {
		t.Fatalf("the socket connected to %s, which left the service, said %q; want an error (the dataplane destroys it)", x, line)
	}
	t.Logf("the old socket: %s", line)

	if line := c.do("dial"); line != "ok" {
		t.Fatalf("dial %s again: %s", dpVIPA, line)
	}
	for i := range 3 {
		if got := c.reply("new socket"); got != y {
			t.Fatalf("datagram %d of a new socket answered by %s, want %s", i, got, y)
		}
	}
}

// dpCount returns the number of entries in m.
func dpCount(t *testing.T, m *ebpf.Map) int {
	t.Helper()
	n := 0
	k, v := make([]byte, m.KeySize()), make([]byte, m.ValueSize())
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatalf("iterate %s: %v", m, err)
	}
	return n
}

// dpCgroupHooks are the attach types of the socket hooks.
var dpCgroupHooks = []ebpf.AttachType{
	ebpf.AttachCGroupInet4Connect, ebpf.AttachCGroupInet6Connect,
	ebpf.AttachCGroupUDP4Sendmsg, ebpf.AttachCGroupUDP6Sendmsg,
	ebpf.AttachCGroupUDP4Recvmsg, ebpf.AttachCGroupUDP6Recvmsg,
	ebpf.AttachCgroupInet4GetPeername, ebpf.AttachCgroupInet6GetPeername,
}

// cgroupPrograms counts the programs attached to the env's cgroup for each
// socket hook.
func (e *dpEnv) cgroupPrograms() map[ebpf.AttachType]int {
	e.t.Helper()
	fd, err := unix.Open(e.cgroup, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		e.t.Fatalf("open cgroup: %v", err)
	}
	defer unix.Close(fd)
	out := map[ebpf.AttachType]int{}
	for _, a := range dpCgroupHooks {
		res, err := link.QueryPrograms(link.QueryOptions{Target: fd, Attach: a})
		if err != nil {
			e.t.Fatalf("query %v programs of the cgroup: %v", a, err)
		}
		if n := len(res.Programs); n > 0 {
			out[a] = n
		}
	}
	return out
}

// tcPrograms counts the tcx programs on each pod veth of the node, by
// "interface/direction".
func (e *dpEnv) tcPrograms() map[string]int {
	e.t.Helper()
	out := map[string]int{}
	err := e.node.Do(func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if !strings.HasPrefix(l.Attrs().Name, "veth") {
				continue
			}
			for dir, a := range map[string]ebpf.AttachType{"ingress": ebpf.AttachTCXIngress, "egress": ebpf.AttachTCXEgress} {
				res, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: a})
				if err != nil {
					return fmt.Errorf("query %s %s: %w", l.Attrs().Name, dir, err)
				}
				if n := len(res.Programs); n > 0 {
					out[l.Attrs().Name+"/"+dir] = n
				}
			}
		}
		return nil
	})
	if err != nil {
		e.t.Fatalf("query tcx programs: %v", err)
	}
	return out
}

func TestDataplaneCleanup(t *testing.T) {
	e := newDPEnv(t, []string{"client", "be1"}, dpSmallMaps)
	svc := e.service("test/a", dpVIPA, dataplane.TCP, dpReady("be1"))
	e.open(nil)
	e.apply(dpState(1, nil, svc))
	e.expectBackends(dpVIPA, "be1")
	if got := e.cgroupPrograms(); len(got) != len(dpCgroupHooks) {
		t.Fatalf("before Cleanup: socket hooks on the cgroup %v, want one of each of %v", got, dpCgroupHooks)
	}
	if got := e.tcPrograms(); len(got) != 4 {
		t.Fatalf("before Cleanup: tcx programs %v, want ingress and egress of both veths", got)
	}
	e.close()

	if err := Cleanup(hclog.NewNullLogger(), e.node.Path(), e.bpffs); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	entries, err := os.ReadDir(e.bpffs)
	if err != nil {
		t.Fatalf("read bpffs: %v", err)
	}
	for _, en := range entries {
		if strings.HasPrefix(en.Name(), "vipd_") || en.Name() == "links" || en.Name() == progDirName {
			t.Errorf("after Cleanup, %s is still in the bpffs", en.Name())
		}
	}
	// An unpinned link is released once the bpffs inode is freed, after an
	// RCU grace period: wait for it a little.
	var hooks map[ebpf.AttachType]int
	var tc map[string]int
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		hooks, tc = e.cgroupPrograms(), e.tcPrograms()
		if (len(hooks) == 0 && len(tc) == 0) || time.Now().After(deadline) {
			break
		}
	}
	if len(hooks) > 0 {
		t.Errorf("after Cleanup, socket hooks are still attached to the cgroup: %v", hooks)
	}
	if len(tc) > 0 {
		t.Errorf("after Cleanup, tcx programs are still attached: %v", tc)
	}
	e.expectDead(dpVIPA)
}

func TestDataplaneGC(t *testing.T) {
	e := newDPEnv(t, nil, dpSmallMaps)
	dp := e.open(nil)
	now := monotonicSeconds()
	key := func(sport uint16) bpfCtKey {
		var k bpfCtKey
		k.Src.W = toWords(netip.MustParseAddr("198.18.1.10"))
		k.Dst.W = toWords(dpVIPA)
		k.Sport, k.Dport = be16(sport), be16(80)
		k.Proto = ipprotoTCP
		k.Dir = ctDirForward
		return k
	}
	expiredKey, liveKey := key(40000), key(40001)
	for _, ent := range []struct {
		k       bpfCtKey
		expires uint32
	}{{expiredKey, now - 10}, {liveKey, now + 300}} {
		v := bpfCtEntry{Expires: ent.expires, Created: now - 20, BackendId: 1, RevNatId: 1}
		if err := dp.objs.VipdCt.Put(&ent.k, &v); err != nil {
			t.Fatalf("put conntrack entry: %v", err)
		}
	}
	n, err := dp.collectGarbage()
	if err != nil {
		t.Fatalf("collectGarbage: %v", err)
	}
	if n != 1 {
		t.Errorf("collectGarbage deleted %d entries, want 1", n)
	}
	var v bpfCtEntry
	if err := dp.objs.VipdCt.Lookup(&expiredKey, &v); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("the expired entry: lookup returned %v (expires %d, now %d), want it deleted", err, v.Expires, now)
	}
	if err := dp.objs.VipdCt.Lookup(&liveKey, &v); err != nil {
		t.Errorf("the live entry: %v, want it kept", err)
	}
}

// ---- frontendsOf, without root ----

// TestRenderFirstError: render, on one goroutine or split among several,
// returns every service's frontends in order, or the error of the first
// service it cannot program.
func TestRenderFirstError(t *testing.T) {
	d := &Dataplane{cfg: Config{MaglevTableSize: maglev.DefaultTableSize}}
	svcs := make([]*dataplane.Service, 3*renderParallelMin)
	for i := range svcs {
		svcs[i] = &dataplane.Service{
			Name: fmt.Sprintf("ns/s%05d", i), VIPs: []netip.Addr{netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)})},
			Ports:         []dataplane.Port{{Protocol: dataplane.TCP, Port: 80, TargetPort: 8080}},
			Backends:      []dataplane.Backend{{IP: netip.MustParseAddr("10.0.0.1"), State: dataplane.BackendReady, Weight: 1}},
			TrafficPolicy: dataplane.TrafficPolicyCluster, LoadBalancing: dataplane.LoadBalancingRandom,
		}
	}
	out, err := d.render(svcs, &dataplane.Node{})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.ends) != len(svcs) {
		t.Fatalf("%d services rendered, want %d", len(out.ends), len(svcs))
	}
	for i := range svcs {
		if fes := out.of(i); len(fes) != 1 || fes[0].service != svcs[i].Name {
			t.Fatalf("service %d rendered as %v", i, fes)
		}
	}
	unsupported := func(i int) {
		c := *svcs[i]
		// SCTP with a target port of its own: unsupported.
		c.Ports = []dataplane.Port{{Protocol: dataplane.SCTP, Port: 80, TargetPort: 8080}}
		svcs[i] = &c
	}
	// In each part of a split, the first one first.
	unsupported(len(svcs) - 10)
	unsupported(len(svcs)/2 + 1)
	unsupported(100)
	if _, err := d.render(svcs, &dataplane.Node{}); !errors.Is(err, dataplane.ErrUnsupported) || !strings.Contains(err.Error(), svcs[100].Name) {
		t.Errorf("render: %v, want the unsupported error of %s", err, svcs[100].Name)
	}
}

func TestFrontendsOf(t *testing.T) {
	be := func(ip string, state dataplane.BackendState, weight uint16) dataplane.Backend {
		return dataplane.Backend{IP: netip.MustParseAddr(ip), State: state, Weight: weight}
	}
	svcOf := func(proto dataplane.Protocol, port, target uint16, bes ...dataplane.Backend) *dataplane.Service {
		return &dataplane.Service{
			Name: "ns/svc", VIPs: []netip.Addr{dpVIPA},
			Ports:         []dataplane.Port{{Name: "p", Protocol: proto, Port: port, TargetPort: target}},
			Backends:      bes,
			TrafficPolicy: dataplane.TrafficPolicyCluster,
			LoadBalancing: dataplane.LoadBalancingRandom,
		}
	}
	one := func(t *testing.T, svc *dataplane.Service, maglevMin uint32) *frontend {
		t.Helper()
		fes, err := frontendsOf(svc, maglevMin)
		if err != nil {
			t.Fatalf("frontendsOf: %v", err)
		}
		if len(fes) != 1 {
			t.Fatalf("frontendsOf returned %d frontends, want 1", len(fes))
		}
		return fes[0]
	}
	bk := func(ip string, port uint16) beKey { return beKey{addr: netip.MustParseAddr(ip), port: port} }
	// membersOf maps a frontend's members to their flags, and checks that
	// they are sorted, as apply's merge walks need.
	membersOf := func(fe *frontend) map[beKey]uint32 {
		if !slices.IsSortedFunc(fe.members, compareMembers) {
			t.Errorf("members %v are not sorted", fe.members)
		}
		out := map[beKey]uint32{}
		for _, m := range fe.members {
			out[m.key.unpack()] = uint32(m.flags)
		}
		return out
	}
	const ready, term, dead = dataplane.BackendReady, dataplane.BackendTerminating, dataplane.BackendNotServing

	t.Run("SCTP port rewrite is unsupported", func(t *testing.T) {
		svc := svcOf(dataplane.SCTP, 80, 8080, be("10.0.0.1", ready, 1))
		svc.Name = "shop/sctp-front"
		_, err := frontendsOf(svc, maglev.DefaultTableSize)
		if !errors.Is(err, dataplane.ErrUnsupported) {
			t.Fatalf("frontendsOf: %v, want an error wrapping ErrUnsupported", err)
		}
		if !strings.Contains(err.Error(), "shop/sctp-front") {
			t.Errorf("error %q does not name the service", err)
		}
	})
	t.Run("SCTP port override by backend is unsupported", func(t *testing.T) {
		b := be("10.0.0.1", ready, 1)
		b.Ports = map[string]uint16{"p": 9090}
		if _, err := frontendsOf(svcOf(dataplane.SCTP, 80, 80, b), maglev.DefaultTableSize); !errors.Is(err, dataplane.ErrUnsupported) {
			t.Fatalf("frontendsOf: %v, want an error wrapping ErrUnsupported", err)
		}
	})
	t.Run("SCTP without port rewrite", func(t *testing.T) {
		fe := one(t, svcOf(dataplane.SCTP, 80, 80, be("10.0.0.1", ready, 1)), maglev.DefaultTableSize)
		if fe.key.proto != ipprotoSCTP || fe.key.port != 80 || len(fe.slots) != 1 || fe.slotBackend(0) != bk("10.0.0.1", 80) {
			t.Errorf("frontend %+v", fe)
		}
	})
	t.Run("slots of weight 1, member j in slot j, are shared; others are not", func(t *testing.T) {
		fe := one(t, svcOf(dataplane.TCP, 80, 8080, be("10.0.0.1", ready, 1), be("10.0.0.2", ready, 1), be("10.0.0.3", ready, 1)), maglev.DefaultTableSize)
		if !fe.sharesIdentitySlots() || !slices.Equal(fe.slots, []slot{{0, 1, 1}, {1, 1, 2}, {2, 1, 3}}) {
			t.Errorf("all ready, weight 1: slots %v (shared %v), want identitySlots[:3]", fe.slots, fe.sharesIdentitySlots())
		}
		cases := map[string]struct {
			bes  []dataplane.Backend
			want []slot
		}{
			"a member out of the slots": {
				[]dataplane.Backend{be("10.0.0.1", ready, 1), be("10.0.0.2", dead, 1), be("10.0.0.3", ready, 1)},
				[]slot{{0, 1, 1}, {2, 1, 2}},
			},
			"listed out of key order (slots follow the listing)": {
				[]dataplane.Backend{be("10.0.0.2", ready, 1), be("10.0.0.1", ready, 1), be("10.0.0.3", ready, 1)},
				[]slot{{1, 1, 1}, {0, 1, 2}, {2, 1, 3}},
			},
			"a weight": {
				[]dataplane.Backend{be("10.0.0.1", ready, 1), be("10.0.0.2", ready, 1), be("10.0.0.3", ready, 4)},
				[]slot{{0, 1, 1}, {1, 1, 2}, {2, 4, 6}},
			},
		}
		for name, c := range cases {
			fe := one(t, svcOf(dataplane.TCP, 80, 8080, c.bes...), maglev.DefaultTableSize)
			if fe.sharesIdentitySlots() || !slices.Equal(fe.slots, c.want) {
				t.Errorf("%s: slots %v (shared %v), want %v of their own", name, fe.slots, fe.sharesIdentitySlots(), c.want)
			}
		}
	})
	t.Run("weights", func(t *testing.T) {
		fe := one(t, svcOf(dataplane.TCP, 80, 8080, be("10.0.0.1", ready, 1), be("10.0.0.2", ready, 3), be("10.0.0.3", ready, 2)), maglev.DefaultTableSize)
		if fe.flags&svcFlagWeighted == 0 {
			t.Errorf("flags %#x: not weighted", fe.flags)
		}
		type slotView struct {
			Backend     string
			Weight, Cum uint32
		}
		want := []slotView{
			{Backend: "10.0.0.1:8080", Weight: 1, Cum: 1},
			{Backend: "10.0.0.2:8080", Weight: 3, Cum: 4},
			{Backend: "10.0.0.3:8080", Weight: 2, Cum: 6},
		}
		var got []slotView
		for i, s := range fe.slots {
			got = append(got, slotView{Backend: fe.slotBackend(i).String(), Weight: uint32(s.weight), Cum: s.cum})
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("slots (-want +got):\n%s", d)
		}
		if fe.weight != 6 {
			t.Errorf("total weight %d, want 6", fe.weight)
		}
	})
	t.Run("equal weights are not weighted", func(t *testing.T) {
		fe := one(t, svcOf(dataplane.TCP, 80, 8080, be("10.0.0.1", ready, 2), be("10.0.0.2", ready, 2)), maglev.DefaultTableSize)
		if fe.flags&svcFlagWeighted != 0 {
			t.Errorf("flags %#x: weighted", fe.flags)
		}
		if fe.slots[0].cum != 2 || fe.slots[1].cum != 4 || fe.weight != 4 {
			t.Errorf("cumulative weights %d, %d, total %d; want 2, 4, 4", fe.slots[0].cum, fe.slots[1].cum, fe.weight)
		}
	})
	t.Run("weight 0 counts as 1", func(t *testing.T) {
		fe := one(t, svcOf(dataplane.TCP, 80, 8080, be("10.0.0.1", ready, 0), be("10.0.0.2", ready, 1)), maglev.DefaultTableSize)
		if fe.flags&svcFlagWeighted != 0 || fe.weight != 2 {
			t.Errorf("flags %#x, total weight %d; want unweighted, 2", fe.flags, fe.weight)
		}
	})
	t.Run("ready backends only while any is ready", func(t *testing.T) {
		fe := one(t, svcOf(dataplane.TCP, 80, 8080, be("10.0.0.1", term, 1), be("10.0.0.2", ready, 1), be("10.0.0.3", dead, 1)), maglev.DefaultTableSize)
		if len(fe.slots) != 1 || fe.slotBackend(0) != bk("10.0.0.2", 8080) {
			t.Errorf("slots %+v, want the ready backend alone", fe.slots)
		}
		want := map[beKey]uint32{bk("10.0.0.1", 8080): 0, bk("10.0.0.2", 8080): memberFlagEligible, bk("10.0.0.3", 8080): 0}
		if d := cmp.Diff(want, membersOf(fe)); d != "" {
			t.Errorf("members (-want +got):\n%s", d)
		}
	})
	t.Run("terminating only", func(t *testing.T) {
		fe := one(t, svcOf(dataplane.TCP, 80, 8080, be("10.0.0.1", term, 1), be("10.0.0.2", term, 1), be("10.0.0.3", dead, 1)), maglev.DefaultTableSize)
		if len(fe.slots) != 2 || fe.slotBackend(0) != bk("10.0.0.1", 8080) || fe.slotBackend(1) != bk("10.0.0.2", 8080) {
			t.Errorf("slots %+v, want both terminating backends", fe.slots)
		}
		if membersOf(fe)[bk("10.0.0.1", 8080)] != memberFlagEligible || membersOf(fe)[bk("10.0.0.3", 8080)] != 0 {
			t.Errorf("members %v", fe.members)
		}
	})
	t.Run("no eligible backend rejects", func(t *testing.T) {
		fe := one(t, svcOf(dataplane.TCP, 80, 8080, be("10.0.0.1", dead, 1)), maglev.DefaultTableSize)
		if len(fe.slots) != 0 || len(fe.members) != 1 {
			t.Errorf("slots %+v members %v, want no slot and one member", fe.slots, fe.members)
		}
	})
	t.Run("traffic policy Local", func(t *testing.T) {
		local := be("10.0.0.2", ready, 1)
		local.NodeLocal = true
		svc := svcOf(dataplane.TCP, 80, 8080, be("10.0.0.1", ready, 1), local)
		svc.TrafficPolicy = dataplane.TrafficPolicyLocal
		fe := one(t, svc, maglev.DefaultTableSize)
		if len(fe.slots) != 1 || fe.slotBackend(0) != bk("10.0.0.2", 8080) {
			t.Errorf("slots %+v, want the node-local backend alone", fe.slots)
		}
		if membersOf(fe)[bk("10.0.0.1", 8080)] != 0 || membersOf(fe)[bk("10.0.0.2", 8080)] != memberFlagEligible {
			t.Errorf("members %v", fe.members)
		}
	})
	t.Run("affinity timeout rounds up", func(t *testing.T) {
		for _, tc := range []struct {
			timeout time.Duration
			want    uint32
		}{
			{10 * time.Second, 10},
			{10*time.Second + 200*time.Millisecond, 11},
			{time.Millisecond, 1},
			{3 * time.Hour, 10800},
			{time.Duration(math.MaxInt64), math.MaxUint32},
		} {
			svc := svcOf(dataplane.TCP, 80, 8080, be("10.0.0.1", ready, 1))
			svc.Affinity = dataplane.SessionAffinity{ClientIP: true, Timeout: tc.timeout}
			fe := one(t, svc, maglev.DefaultTableSize)
			if fe.flags&svcFlagAffinity == 0 || fe.timeout != tc.want {
				t.Errorf("timeout %v: flags %#x, timeout %d; want affinity, %d", tc.timeout, fe.flags, fe.timeout, tc.want)
			}
		}
	})
	t.Run("Maglev table size", func(t *testing.T) {
		for _, tc := range []struct {
			min uint32
			n   int
		}{{7, 3}, {7, 10}, {maglev.DefaultTableSize, 3}, {maglev.DefaultTableSize, 200}} {
			svc := svcOf(dataplane.TCP, 80, 8080)
			for i := range tc.n {
				svc.Backends = append(svc.Backends, be(fmt.Sprintf("10.0.%d.%d", i/200, i%200+1), ready, 1))
			}
			svc.LoadBalancing = dataplane.LoadBalancingMaglev
			fe := one(t, svc, tc.min)
			if fe.flags&svcFlagMaglev == 0 {
				t.Errorf("min %d, %d backends: flags %#x, not Maglev", tc.min, tc.n, fe.flags)
			}
			if m := fe.maglevM; m < 100*uint32(tc.n) || m < tc.min || !maglev.IsPrime(m) {
				t.Errorf("min %d, %d backends: table size %d, want a prime >= max(min, 100 × backends)", tc.min, tc.n, m)
			}
		}
	})
	t.Run("Maglev without eligible backends", func(t *testing.T) {
		svc := svcOf(dataplane.TCP, 80, 8080, be("10.0.0.1", dead, 1))
		svc.LoadBalancing = dataplane.LoadBalancingMaglev
		if fe := one(t, svc, maglev.DefaultTableSize); fe.flags&svcFlagMaglev != 0 || fe.maglevM != 0 {
			t.Errorf("flags %#x, table size %d: a Maglev table for no backend", fe.flags, fe.maglevM)
		}
	})
	// frontendView is, per frontend, its slots and its members with flags.
	frontendView := func(t *testing.T, svc *dataplane.Service) (map[string]string, map[string]map[beKey]uint32) {
		t.Helper()
		fes, err := frontendsOf(svc, maglev.DefaultTableSize)
		if err != nil {
			t.Fatalf("frontendsOf: %v", err)
		}
		slots, members := map[string]string{}, map[string]map[beKey]uint32{}
		for _, fe := range fes {
			var bes []string
			for i := range fe.slots {
				bes = append(bes, fe.slotBackend(i).String())
			}
			slots[fe.key.String()] = strings.Join(bes, ",")
			members[fe.key.String()] = membersOf(fe)
		}
		return slots, members
	}
	only := func(b dataplane.Backend, ports map[string]uint16) dataplane.Backend {
		b.Ports, b.OnlyNamedPorts = ports, true
		return b
	}
	t.Run("a backend serving only named ports is no member of the other ports", func(t *testing.T) {
		svc := svcOf(dataplane.TCP, 80, 8080,
			be("10.0.0.1", ready, 1), only(be("10.0.0.2", ready, 1), map[string]uint16{"p": 8081}), only(be("10.0.0.3", ready, 1), nil))
		svc.Ports = append(svc.Ports, dataplane.Port{Name: "u", Protocol: dataplane.UDP, Port: 53, TargetPort: 5353})
		slots, members := frontendView(t, svc)
		wantSlots := map[string]string{
			"198.19.0.10:80/TCP": "10.0.0.1:8080,10.0.0.2:8081",
			"198.19.0.10:53/UDP": "10.0.0.1:5353",
		}
		if d := cmp.Diff(wantSlots, slots); d != "" {
			t.Errorf("slots (-want +got):\n%s", d)
		}
		// Not a member: its UDP flows to 53 move, and GC and socket
		// destruction treat it as removed from that port.
		wantMembers := map[string]map[beKey]uint32{
			"198.19.0.10:80/TCP": {bk("10.0.0.1", 8080): memberFlagEligible, bk("10.0.0.2", 8081): memberFlagEligible},
			"198.19.0.10:53/UDP": {bk("10.0.0.1", 5353): memberFlagEligible},
		}
		if d := cmp.Diff(wantMembers, members); d != "" {
			t.Errorf("members (-want +got):\n%s", d)
		}
	})
	t.Run("a port whose only backend does not serve it has no slot", func(t *testing.T) {
		svc := svcOf(dataplane.TCP, 80, 8080, only(be("10.0.0.1", ready, 1), map[string]uint16{"p": 8080}))
		svc.Ports = append(svc.Ports, dataplane.Port{Name: "q", Protocol: dataplane.TCP, Port: 81, TargetPort: 8081})
		svc.LoadBalancing = dataplane.LoadBalancingMaglev
		fes, err := frontendsOf(svc, maglev.DefaultTableSize)
		if err != nil {
			t.Fatalf("frontendsOf: %v", err)
		}
		for _, fe := range fes {
			switch fe.key.port {
			case 80:
				if len(fe.slots) != 1 || fe.flags&svcFlagMaglev == 0 {
					t.Errorf("port 80: slots %+v, flags %#x; want one slot, Maglev", fe.slots, fe.flags)
				}
			case 81:
				if len(fe.slots) != 0 || len(fe.members) != 0 || fe.flags&svcFlagMaglev != 0 || fe.maglevM != 0 {
					t.Errorf("port 81: slots %+v, members %v, flags %#x, Maglev size %d; want nothing (refused)", fe.slots, fe.members, fe.flags, fe.maglevM)
				}
			}
		}
	})
	t.Run("terminating fallback and traffic policy per port", func(t *testing.T) {
		local := func(b dataplane.Backend) dataplane.Backend { b.NodeLocal = true; return b }
		svc := svcOf(dataplane.TCP, 80, 8080,
			local(only(be("10.0.0.1", ready, 1), map[string]uint16{"p": 8080})), local(be("10.0.0.2", term, 1)), be("10.0.0.3", ready, 1))
		svc.Ports = append(svc.Ports, dataplane.Port{Name: "q", Protocol: dataplane.TCP, Port: 81, TargetPort: 8081})
		svc.TrafficPolicy = dataplane.TrafficPolicyLocal
		slots, members := frontendView(t, svc)
		wantSlots := map[string]string{
			"198.19.0.10:80/TCP": "10.0.0.1:8080",
			"198.19.0.10:81/TCP": "10.0.0.2:8081",
		}
		if d := cmp.Diff(wantSlots, slots); d != "" {
			t.Errorf("slots (-want +got):\n%s", d)
		}
		if m := members["198.19.0.10:81/TCP"]; len(m) != 2 || m[bk("10.0.0.3", 8081)] != 0 {
			t.Errorf("port 81 members %v, want 10.0.0.2 and 10.0.0.3 (not eligible)", m)
		}
	})
	t.Run("the unnamed port by the empty name", func(t *testing.T) {
		svc := svcOf(dataplane.TCP, 80, 8080,
			only(be("10.0.0.1", ready, 1), map[string]uint16{"": 8081}), only(be("10.0.0.2", ready, 1), nil))
		svc.Ports[0].Name = ""
		slots, _ := frontendView(t, svc)
		if d := cmp.Diff(map[string]string{"198.19.0.10:80/TCP": "10.0.0.1:8081"}, slots); d != "" {
			t.Errorf("slots (-want +got):\n%s", d)
		}
	})
	t.Run("one frontend per VIP and port, backends of the VIP's family", func(t *testing.T) {
		svc := svcOf(dataplane.TCP, 80, 8080, be("10.0.0.1", ready, 1), be("fd00::1", ready, 1))
		svc.VIPs = append(svc.VIPs, netip.MustParseAddr("fd00:198:ff::10"))
		svc.Ports = append(svc.Ports, dataplane.Port{Name: "u", Protocol: dataplane.UDP, Port: 53, TargetPort: 5353})
		svc.Backends[1].Ports = map[string]uint16{"u": 5454}
		fes, err := frontendsOf(svc, maglev.DefaultTableSize)
		if err != nil {
			t.Fatalf("frontendsOf: %v", err)
		}
		got := map[string]string{}
		for _, fe := range fes {
			var bes []string
			for i := range fe.slots {
				bes = append(bes, fe.slotBackend(i).String())
			}
			got[fe.key.String()] = strings.Join(bes, ",")
		}
		want := map[string]string{
			"198.19.0.10:80/TCP":       "10.0.0.1:8080",
			"198.19.0.10:53/UDP":       "10.0.0.1:5353",
			"[fd00:198:ff::10]:80/TCP": "[fd00::1]:8080",
			"[fd00:198:ff::10]:53/UDP": "[fd00::1]:5454",
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("frontends (-want +got):\n%s", d)
		}
	})
}
