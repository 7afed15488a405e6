package load

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"strings"
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

	for _, closer := range []Closer{ServerCloses, ClientCloses} {
		res := TCPConnections(client.NS, dsts, DirectPorts, 3, 300*time.Millisecond, closer)
		if res.Failed != 0 || res.OK == 0 {
			t.Fatalf("TCP, %v: %d ok, %d failed (first: %v)", closer, res.OK, res.Failed, res.FirstErr)
		}
		if res.Backends["be1"] == 0 || res.Backends["be2"] == 0 || res.Backends["be1"]+res.Backends["be2"] != res.OK || len(res.Latencies) != res.OK {
			t.Fatalf("TCP, %v: backends %v, %d latencies for %d connections", closer, res.Backends, len(res.Latencies), res.OK)
		}
		if p50, p99 := res.Percentile(0.5), res.Percentile(0.99); p50 <= 0 || p99 < p50 {
			t.Fatalf("TCP, %v: p50 %v, p99 %v", closer, p50, p99)
		}
		// The side that closes first keeps the TIME_WAIT.
		clientTW, serverTW := timeWaits(t, client.NS), timeWaits(t, node.Pod("be1").NS)
		t.Logf("TCP, %v: %.0f conn/s; TIME_WAIT: %d in the client, %d in be1", closer, res.Rate(), clientTW, serverTW)
		if closer == ServerCloses && (clientTW != 0 || serverTW == 0) {
			t.Fatalf("TCP, %v: %d TIME_WAIT sockets in the client, %d in be1: the client closed first", closer, clientTW, serverTW)
		}
		if closer == ClientCloses && clientTW < res.OK/2 {
			t.Fatalf("TCP, %v: %d TIME_WAIT sockets in the client after %d connections: the server closed first", closer, clientTW, res.OK)
		}
	}

	if _, err := exec.LookPath("gcc"); err != nil && os.Getenv("CI") != "true" {
		t.Logf("no gcc, the C generator is not checked: %v", err)
	} else {
		cg, err := BuildCGen(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		res, err := cg.TCPConnections(client.NS, dsts, CrossCheckPorts, 3, 300*time.Millisecond)
		if err != nil || res.Failed != 0 || res.OK == 0 {
			t.Fatalf("C generator: %d ok, %d failed, %v", res.OK, res.Failed, err)
		}
		t.Logf("C generator: %.0f conn/s", res.Rate())
	}

	var res Result
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

// timeWaits counts the TCP sockets in TIME_WAIT in ns.
func timeWaits(t *testing.T, ns *netlab.NS) int {
	t.Helper()
	out, err := ns.Exec(context.Background(), "ss", "-Htn", "state", "time-wait")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(out, "\n")
}
