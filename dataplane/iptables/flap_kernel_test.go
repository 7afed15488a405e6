package iptables_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/iptables"
	"github.com/vipd/vipd/internal/testkit/netlab"
)

// flapApplies is how many applies TestFlappingBackendsNeverUnreachable
// makes; half of them take the port's last backend away.
const flapApplies = 100

// flapLost is how long a request may take before
// TestFlappingBackendsNeverUnreachable counts it as lost. A refusal or a
// reply from a pod on the same node takes well under a millisecond, and a
// SYN that met neither the DNAT nor the REJECT gets no answer: the client
// sends it again only after TCP's initial retransmission timeout of 1 s.
// So anything under 1 s cannot hide a lost SYN, and the rest leaves room
// for a client starved of CPU on a loaded 2-CPU machine (where 200 ms
// once counted 1 request in 45,000 as lost).
const flapLost = 900 * time.Millisecond

// TestFlappingBackendsNeverUnreachable flaps the only backend of a service
// between ready and gone (or not serving) while a pod connects to the VIP
// back to back. Every connection must reach the backend or be refused at
// once by the REJECT of a port without backends: an apply that moves the
// port between the nat table's DNAT and the filter table's REJECT must
// never leave it with neither, even for the time between two commits (the
// packet would then leave the node untranslated and die upstream, or hang).
func TestFlappingBackendsNeverUnreachable(t *testing.T) {
	for _, mode := range []iptables.Mode{iptables.ModeNFT, iptables.ModeLegacy} {
		t.Run(string(mode), func(t *testing.T) { testFlappingBackends(t, mode) })
	}
}

// flapOutcomes counts how the connections of a flap test ended.
type flapOutcomes struct {
	served, refused int
	lost            int
	// lostDuring counts the lost connections by the apply under way when
	// they began; firstLost describes the first few.
	lostDuring map[int64]int
	firstLost  []string
}

func (o *flapOutcomes) total() int { return o.served + o.refused + o.lost }

// connectBackToBack makes one TCP request after another from client to
// vip until ctx ends, each given flapLost, and counts how they ended;
// applying says which apply is under way.
func connectBackToBack(ctx context.Context, client *netlab.Pod, vip string, applying *atomic.Int64) *flapOutcomes {
	out := &flapOutcomes{lostDuring: map[int64]int{}}
	for ctx.Err() == nil {
		during := applying.Load()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), flapLost)
		began := time.Now()
		r, err := client.Request(rctx, "tcp", vip)
		took := time.Since(began)
		cancel()
		switch {
		case err == nil && r.Backend == "web1":
			out.served++
		case errors.Is(err, syscall.ECONNREFUSED):
			out.refused++
		default:
			out.lost++
			out.lostDuring[during]++
			if len(out.firstLost) < 5 {
				out.firstLost = append(out.firstLost, fmt.Sprintf("during apply %d, after %v: %+v %v", during, took.Round(time.Millisecond), r, err))
			}
		}
	}
	return out
}

func testFlappingBackends(t *testing.T, mode iptables.Mode) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	x := newClientLab(ctx, t, mode, hclog.NewNullLogger())
	client, web1, dp := x.client, x.web1, x.dp

	const vip = "198.19.0.10:80"
	// A second service keeps both tables busy with something that does
	// not change, as in a real node.
	other := liveService("other", "198.19.0.11", 80)
	serving := liveService("web", "198.19.0.10", 80, web1.IPv4())
	gone := liveService("web", "198.19.0.10", 80)
	notServing := liveService("web", "198.19.0.10", 80, web1.IPv4())
	notServing.Backends[0].State = dataplane.BackendNotServing
	// Serving, then alternately gone and not serving: every other apply
	// takes the last backend away, the others bring it back.
	flap := func(i int) *dataplane.Service {
		switch i % 4 {
		case 1:
			return gone
		case 3:
			return notServing
		}
		return serving
	}
	if err := dp.Apply(ctx, liveState(nil, serving, other)); err != nil {
		t.Fatal(err)
	}
	if r, err := client.Request(ctx, "tcp", vip); err != nil || r.Backend != "web1" {
		t.Fatalf("request before flapping: %+v %v", r, err)
	}

	// Thousands of connections a second, each leaving a TIME_WAIT socket
	// behind for a minute: give the client every port there is.
	if err := client.SetSysctl("net.ipv4.ip_local_port_range", "1024 65535"); err != nil {
		t.Fatal(err)
	}
	escapedBefore := escapedSYNs(ctx, t, x.lab.Upstream())

	var applying atomic.Int64
	clientCtx, stopClient := context.WithCancel(ctx)
	outcomes := make(chan *flapOutcomes)
	go func() { outcomes <- connectBackToBack(clientCtx, client, vip, &applying) }()
	start := time.Now()
	var applyErr error
	for i := 1; i <= flapApplies && applyErr == nil; i++ {
		applying.Store(int64(i))
		svc := *flap(i)
		svc.Generation = uint64(i + 1)
		applyErr = dp.Apply(ctx, liveState([]string{"web"}, &svc, other))
	}
	elapsed := time.Since(start)
	stopClient()
	out := <-outcomes
	if applyErr != nil {
		t.Fatal(applyErr)
	}

	escaped := escapedSYNs(ctx, t, x.lab.Upstream()) - escapedBefore

	t.Logf("%s: %d applies in %v (%v each): %d connections, %d served, %d refused, %d lost; %d SYNs left the node untranslated",
		mode, flapApplies, elapsed.Round(time.Millisecond), (elapsed / flapApplies).Round(10*time.Microsecond),
		out.total(), out.served, out.refused, out.lost, escaped)
	if out.lost > 0 {
		t.Errorf("lost %d of %d connections (neither served nor refused within %v; %d SYNs left the node untranslated); by apply: %v; first: %q",
			out.lost, out.total(), flapLost, escaped, out.lostDuring, out.firstLost)
	}
	if out.served == 0 || out.refused == 0 {
		t.Errorf("the flaps were not exercised: %d served, %d refused", out.served, out.refused)
	}
}

// escapedSYNs is how many TCP SYNs to the service range the upstream router
// has received: a SYN that left the node for a VIP had been neither DNATed
// nor rejected. It counts them with a rule of its own in upstream's raw
// table, added on the first call.
func escapedSYNs(ctx context.Context, t *testing.T, upstream *netlab.NS) int {
	t.Helper()
	rule := []string{"PREROUTING", "-d", "198.19.0.0/16", "-p", "tcp", "--syn"}
	if _, err := upstream.Exec(ctx, "iptables-nft", append([]string{"-t", "raw", "-C"}, rule...)...); err != nil {
		if out, err := upstream.Exec(ctx, "iptables-nft", append([]string{"-t", "raw", "-A"}, rule...)...); err != nil {
			t.Fatalf("add the SYN counter upstream: %v\n%s", err, out)
		}
	}
	out, err := upstream.Exec(ctx, "iptables-nft", "-t", "raw", "-n", "-v", "-x", "-L", "PREROUTING")
	if err != nil {
		t.Fatalf("read the SYN counter upstream: %v\n%s", err, out)
	}
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) > 0 && strings.Contains(line, "198.19.0.0/16") {
			n, err := strconv.Atoi(f[0])
			if err != nil {
				t.Fatalf("SYN counter upstream: %q: %v", line, err)
			}
			return n
		}
	}
	t.Fatalf("no SYN counter upstream:\n%s", out)
	return 0
}
