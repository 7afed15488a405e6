package soak

import (
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
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/vipd/vipd/internal/testkit/netlab"
	"github.com/vipd/vipd/internal/testkit/testbin"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/validation"
)

// vipdBin is the vipd binary, built once by TestMain.
var vipdBin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, cleanup, err := testbin.Build(false, "./cmd/vipd")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cleanup()
	vipdBin = filepath.Join(dir, "vipd")
	return m.Run()
}

// forEachDataplane runs f as a subtest per dataplane, one after the other:
// the tests measure what vipd does under load, which a parallel neighbour
// would distort. eBPF is skipped where the kernel cannot run it, unless
// CI=true.
func forEachDataplane(t *testing.T, f func(t *testing.T, dp string)) {
	netlab.RequireRoot(t)
	for _, dp := range Dataplanes() {
		t.Run(dp, func(t *testing.T) {
			RequireDataplane(t, dp)
			f(t, dp)
		})
	}
}

// newRand returns a random source and logs its seed, so that a failure
// can be replayed with VIPD_SOAK_SEED.
func newRand(t *testing.T) *rand.Rand {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("VIPD_SOAK_SEED"); s != "" {
		fmt.Sscan(s, &seed)
	}
	t.Logf("random seed %d (VIPD_SOAK_SEED)", seed)
	return rand.New(rand.NewPCG(seed, seed>>1))
}

// ---- services ----

func ap(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

// service returns a TCP service on vip:80 to target port 8080.
func service(name, owner string, vip netip.Addr, backends ...*vipdv1.Backend) *vipdv1.Service {
	return &vipdv1.Service{
		Name: name, Owner: owner, Vips: []string{vip.String()},
		Ports:    []*vipdv1.Port{{Name: "http", Protocol: vipdv1.Protocol_PROTOCOL_TCP, Port: 80, TargetPort: 8080}},
		Backends: backends,
	}
}

// backend returns a READY backend at the pod's IPv4 address.
func backend(p *netlab.Pod) *vipdv1.Backend { return &vipdv1.Backend{Ip: p.IPv4().String()} }

var backendStates = []vipdv1.BackendState{
	vipdv1.BackendState_BACKEND_STATE_READY, vipdv1.BackendState_BACKEND_STATE_READY,
	vipdv1.BackendState_BACKEND_STATE_READY, vipdv1.BackendState_BACKEND_STATE_TERMINATING,
	vipdv1.BackendState_BACKEND_STATE_NOT_SERVING,
}

// randomService returns name on vip with a random spec: one or two ports,
// and a random subset of pods as backends, with random weights and states.
func randomService(rng *rand.Rand, name, owner string, vip netip.Addr, pods []*netlab.Pod) *vipdv1.Service {
	svc := service(name, owner, vip)
	if rng.IntN(3) == 0 {
		svc.Ports = append(svc.Ports, &vipdv1.Port{Name: "alt", Protocol: vipdv1.Protocol_PROTOCOL_TCP, Port: 81, TargetPort: 8081})
	}
	for _, p := range pods {
		if rng.IntN(2) == 0 {
			continue
		}
		svc.Backends = append(svc.Backends, &vipdv1.Backend{
			Ip: p.IPv4().String(), Weight: uint32(rng.IntN(3) + 1), State: backendStates[rng.IntN(len(backendStates))],
		})
	}
	return svc
}

// normalized returns svc as vipd stores it (defaults filled in, backends
// sorted), without its generation.
func normalized(t testing.TB, svc *vipdv1.Service) *vipdv1.Service {
	t.Helper()
	out, _, v := validation.Service(svc, validation.Limits{MaxPorts: -1}, "service")
	if len(v) > 0 {
		t.Fatalf("service %s does not validate: %v", svc.GetName(), v)
	}
	out.Generation = 0
	return out
}

// diffServices compares the services vipd listed with the ones the test
// expects (by name), ignoring generations, and returns a diff or "".
func diffServices(t testing.TB, want map[string]*vipdv1.Service, got []*vipdv1.Service) string {
	t.Helper()
	var w, g []*vipdv1.Service
	for _, name := range sortedKeys(want) {
		w = append(w, normalized(t, want[name]))
	}
	for _, svc := range got {
		c := normalized(t, svc)
		g = append(g, c)
	}
	return cmp.Diff(w, g, protocmp.Transform())
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// summary formats a results line for the test log, one key=value per field.
func summary(kv ...any) string {
	var b strings.Builder
	for i := 0; i+1 < len(kv); i += 2 {
		fmt.Fprintf(&b, "%v=%v ", kv[i], kv[i+1])
	}
	return strings.TrimSpace(b.String())
}
