package load

import (
	"net/netip"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/netlab"
)

// TestLoadDirect runs every generator against real servers in pods and
// checks that each one counts what happened.
func TestLoadDirect(t *testing.T) {
	lab := netlab.New(t, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: []string{"client", "be1", "be2"}}}})
	node := lab.Node(1)
	client := node.Pod("client")
	var dsts []netip.AddrPort
	for _, name := range []string{"be1", "be2"} {
		p := node.Pod(name)
		if _, err := p.StartEcho(name, 8080); err != nil {
			t.Fatal(err)
		}
		dsts = append(dsts, netip.AddrPortFrom(p.IPv4(), 8080))
	}
	be1 := node.Pod("be1")
	sink, err := StartSink(be1.NS, netip.AddrPortFrom(be1.IPv4(), 9000))
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()

	res := TCPConnections(client.NS, dsts, DirectPorts, 2, 300*time.Millisecond)
	if res.Failed != 0 || res.OK == 0 {
		t.Fatalf("TCP: %d ok, %d failed (first: %v)", res.OK, res.Failed, res.FirstErr)
	}
	if res.Backends["be1"] == 0 || res.Backends["be2"] == 0 || len(res.Latencies) != res.OK {
		t.Fatalf("TCP: backends %v, %d latencies for %d connections", res.Backends, len(res.Latencies), res.OK)
	}
	if p50, p99 := res.Percentile(0.5), res.Percentile(0.99); p50 <= 0 || p99 < p50 {
		t.Fatalf("TCP: p50 %v, p99 %v", p50, p99)
	}
	t.Logf("TCP: %.0f conn/s", res.Rate())

	res = UDPRequests(client.NS, dsts, DirectPorts, 2, 300*time.Millisecond)
	if res.Failed != 0 || res.OK == 0 || res.Backends["be1"] == 0 || res.Backends["be2"] == 0 {
		t.Fatalf("UDP: %d ok, %d failed (first: %v), backends %v", res.OK, res.Failed, res.FirstErr, res.Backends)
	}

	rate, err := Bulk(client.NS, netip.AddrPortFrom(be1.IPv4(), 9000), DirectPorts, 300*time.Millisecond)
	if err != nil || rate <= 0 {
		t.Fatalf("bulk: %v B/s, %v", rate, err)
	}

	landed, n, err := Probe(client.NS, dsts[1], "be2", time.Now().Add(5*time.Second))
	if err != nil || n != 1 || landed.IsZero() {
		t.Fatalf("probe: %v after %d tries, %v", landed, n, err)
	}
	if _, _, err := Probe(client.NS, dsts[0], "be2", time.Now().Add(100*time.Millisecond)); err == nil {
		t.Fatal("probe of be1 reported landing on be2")
	}
}
