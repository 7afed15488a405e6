package load

import (
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testkit/netlab"
)

func TestMain(m *testing.M) {
	RunServersIfRequested()
	os.Exit(m.Run())
}

// TestLoadDirect runs every generator against backend servers in pods and
// checks that each one counts what happened.
func TestLoadDirect(t *testing.T) {
	lab := netlab.New(t, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: []string{"client", "be1", "be2"}}}})
	node := lab.Node(1)
	client := node.Pod("client")
	if err := client.SetSysctl("net.ipv4.ip_local_port_range", "10000 60999"); err != nil {
		t.Fatal(err)
	}
	var backends []Backend
	var dsts []netip.AddrPort
	for _, name := range []string{"be1", "be2"} {
		p := node.Pod(name)
		backends = append(backends, Backend{NetNS: p.Path(), Name: name, Addr: p.IPv4(), EchoPort: 8080, SinkPort: 9000})
		dsts = append(dsts, netip.AddrPortFrom(p.IPv4(), 8080))
	}
	servers, err := StartServers(backends)
	if err != nil {
		t.Fatal(err)
	}
	defer servers.Close()

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

	rate, err := Bulk(client.NS, netip.AddrPortFrom(dsts[0].Addr(), 9000), DirectPorts, 300*time.Millisecond)
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
