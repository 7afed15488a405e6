package statelessdnat_test

import (
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vipd/vipd/bench/bpfstats"
	"github.com/vipd/vipd/bench/load"
	"github.com/vipd/vipd/bench/statelessdnat"
	"github.com/vipd/vipd/internal/testkit/netlab"
)

func TestMain(m *testing.M) {
	load.RunServersIfRequested()
	os.Exit(m.Run())
}

// TestDNAT sends TCP connections to a VIP through the programs on the
// client pod's host veth, and checks that they reach every backend, that
// direct connections still work beside them, that the BPF statistics see
// the programs run, and that the VIP answers nothing once they are gone.
func TestDNAT(t *testing.T) {
	lab := netlab.New(t, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: []string{"client", "be1", "be2"}}}})
	node := lab.Node(1)
	client := node.Pod("client")
	if err := client.SetSysctl("net.ipv4.ip_local_port_range", "10000 60999"); err != nil {
		t.Fatal(err)
	}
	var backends []load.Backend
	var addrs []netip.Addr
	for _, name := range []string{"be1", "be2"} {
		p := node.Pod(name)
		backends = append(backends, load.Backend{NetNS: p.Path(), Name: name, Addr: p.IPv4(), EchoPort: 8080, SinkPort: 9000})
		addrs = append(addrs, p.IPv4())
	}
	servers, err := load.StartServers(backends)
	if err != nil {
		t.Fatal(err)
	}
	defer servers.Close()

	vip := netip.MustParseAddrPort("198.19.255.10:80")
	d, err := statelessdnat.Attach(node.Path(), client.HostVeth(), statelessdnat.Config{
		VIP: vip, Backends: addrs, TargetPort: 8080, ReplyPortLo: load.VIPPorts.Lo, ReplyPortHi: load.VIPPorts.Hi,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	stats, err := bpfstats.Enable()
	if err != nil {
		t.Fatal(err)
	}
	defer stats.Close()
	ids, err := bpfstats.IDs(d.Programs()...)
	if err != nil {
		t.Fatal(err)
	}
	s0, err := bpfstats.Read(ids)
	if err != nil {
		t.Fatal(err)
	}
	res := load.TCPConnections(client.NS, []netip.AddrPort{vip}, load.VIPPorts, 4, 300*time.Millisecond, load.ServerCloses)
	if res.Failed != 0 || res.OK == 0 || res.Backends["be1"] == 0 || res.Backends["be2"] == 0 {
		t.Fatalf("VIP: %d ok, %d failed (first: %v), backends %v", res.OK, res.Failed, res.FirstErr, res.Backends)
	}
	s1, err := bpfstats.Read(ids)
	if err != nil {
		t.Fatal(err)
	}
	delta := s1.Sub(s0)
	// At least the SYN, the request and the FIN's ACK go in, and the
	// SYN-ACK, the reply and the FIN come back.
	if delta.Runs < uint64(6*res.OK) || delta.Runtime <= 0 {
		t.Fatalf("BPF statistics: %d runs, %v for %d connections", delta.Runs, delta.Runtime, res.OK)
	}
	t.Logf("VIP: %.0f conn/s; BPF %v per connection, %.1f runs", res.Rate(), delta.Runtime/time.Duration(res.OK), float64(delta.Runs)/float64(res.OK))

	direct := []netip.AddrPort{netip.AddrPortFrom(addrs[0], 8080)}
	if res := load.TCPConnections(client.NS, direct, load.DirectPorts, 2, 200*time.Millisecond, load.ServerCloses); res.Failed != 0 || res.OK == 0 {
		t.Fatalf("direct beside the DNAT: %d ok, %d failed (first: %v)", res.OK, res.Failed, res.FirstErr)
	}

	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := load.Probe(client.NS, vip, "be1", time.Now().Add(200*time.Millisecond)); err == nil {
		t.Fatal("the VIP still answers with the programs detached")
	}
}
