package ebpf

// BenchmarkConnCost measures what the tc programs cost per connection
// under real traffic: a netlab node with a client pod and four backend
// pods, 10,000 other services programmed, flow events read, and 16
// workers that connect, send 4 bytes, read a 3-byte answer and the
// server's FIN (the server closes first, as HTTP/1.0 and most short RPCs
// do). It reports, from the kernel's BPF run-time statistics
// (BPF_ENABLE_STATS, which ends with the benchmark), each program's ns per
// run, the runs per connection and the BPF ns per connection, and the
// connection rate through the VIP and directly to the pods (with vipd
// loaded). The rate depends on what else runs on the machine; the BPF
// numbers much less. It is a measurement, not a test: run it alone, e.g.
//
//	go test -p 1 -count=1 -run '^$' -bench ConnCost -benchtime 1x ./dataplane/ebpf/
//
// A third case, sock, is a process of the node in the socket hooks' cgroup
// making netlab echo requests (the client closes first there), for the
// cost the tc programs add to flows the socket hooks translated.
//
// VIPD_CONNCOST_SECONDS sets the seconds per case (default 5).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/internal/testkit/cgroup2test"
	"github.com/vipd/vipd/internal/testkit/netlab"
)

const (
	ccWorkers  = 16
	ccServices = 10_000
	ccPort     = 8080
	ccEchoPort = 8081
)

func BenchmarkConnCost(b *testing.B) {
	netlab.RequireRoot(b)
	secs := 5
	if s, err := strconv.Atoi(os.Getenv("VIPD_CONNCOST_SECONDS")); err == nil && s > 0 {
		secs = s
	}
	dur := time.Duration(secs) * time.Second
	bes := []string{"be1", "be2", "be3", "be4"}
	lab := netlab.New(b, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: append([]string{"cdirect", "cvip"}, bes...)}}})
	node := lab.Node(1)
	// A client pod per case: a backend's TIME_WAIT of a direct
	// connection would refuse the SYN of a VIP connection from the same
	// client port (another ISN and timestamp offset) about half the time.
	for _, c := range []string{"cdirect", "cvip"} {
		if err := node.Pod(c).SetSysctl("net.ipv4.ip_local_port_range", "1024 65535"); err != nil {
			b.Fatalf("port range: %v", err)
		}
	}
	var beAddrs []netip.AddrPort
	for _, name := range bes {
		p := node.Pod(name)
		ln, err := ccListen(p)
		if err != nil {
			b.Fatalf("listen in %s: %v", name, err)
		}
		b.Cleanup(func() { ln.Close() })
		go ccServe(ln)
		beAddrs = append(beAddrs, netip.AddrPortFrom(p.IPv4(), ccPort))
		// The sock case's client speaks netlab's echo protocol.
		if _, err := p.StartEcho(name, ccEchoPort); err != nil {
			b.Fatalf("echo in %s: %v", name, err)
		}
	}

	cg := cgroup2test.New(b)
	bpffs := filepath.Join(b.TempDir(), "bpf")
	cfg := Config{
		NetNS: node.Path(), BPFFS: bpffs, CgroupPath: cg, PodInterfaces: []string{"veth*"},
		// Conntrack and socket maps at their default sizes, as a node runs them.
		Maps:       MapSizes{LB: 1 << 18, Backends: 1 << 14, Affinity: 1024},
		GCInterval: time.Hour,
	}
	dp, err := New(context.Background(), hclog.NewNullLogger(), cfg)
	if err != nil {
		b.Fatalf("New: %v", err)
	}
	b.Cleanup(func() {
		if err := dp.Close(); err != nil {
			b.Errorf("close: %v", err)
		}
		if err := Cleanup(hclog.NewNullLogger(), node.Path(), bpffs); err != nil {
			b.Errorf("cleanup: %v", err)
		}
		_ = unix.Unmount(bpffs, unix.MNT_DETACH)
	})

	vip := netip.MustParseAddr("198.19.0.10")
	sockVIP := netip.MustParseAddr("198.19.0.11")
	st := &dataplane.State{Generation: 1, Services: map[string]*dataplane.Service{}}
	mk := func(name string, v netip.Addr, backends ...netip.AddrPort) *dataplane.Service {
		s := &dataplane.Service{
			Name: name, Owner: "bench", Generation: 1, VIPs: []netip.Addr{v},
			Ports:         []dataplane.Port{{Name: "p", Protocol: dataplane.TCP, Port: 80, TargetPort: ccPort}},
			TrafficPolicy: dataplane.TrafficPolicyCluster, LoadBalancing: dataplane.LoadBalancingRandom,
		}
		for _, be := range backends {
			s.Backends = append(s.Backends, dataplane.Backend{IP: be.Addr(), State: dataplane.BackendReady, Weight: 1})
		}
		sortBackends(s)
		return s
	}
	st.Services["target"] = mk("target", vip, beAddrs...)
	var echoAddrs []netip.AddrPort
	for _, a := range beAddrs {
		echoAddrs = append(echoAddrs, netip.AddrPortFrom(a.Addr(), ccEchoPort))
	}
	st.Services["echo"] = mk("echo", sockVIP, echoAddrs...)
	st.Services["echo"].Ports[0].TargetPort = ccEchoPort
	for i := range ccServices {
		v := netip.AddrFrom4([4]byte{198, 19, byte(1 + i/250), byte(1 + i%250)})
		name := fmt.Sprintf("filler-%d", i)
		st.Services[name] = mk(name, v, beAddrs[i%len(beAddrs)])
	}
	if err := dp.Apply(context.Background(), st); err != nil {
		b.Fatalf("apply: %v", err)
	}

	// Flow events on: a reader drains the ring, as vipd's does.
	var events atomic.Uint64
	ctx, cancel := context.WithCancel(context.Background())
	watchDone := make(chan error, 1)
	go func() {
		watchDone <- dp.WatchFlows(ctx, func(dataplane.FlowEvent) { events.Add(1) }, func(uint64) {})
	}()
	b.Cleanup(func() { cancel(); <-watchDone })

	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatalf("enable BPF stats: %v", err)
	}
	b.Cleanup(func() { stats.Close() })

	progs := map[string]*ebpf.Program{
		"vipd_from_pod": dp.objs.VipdFromPod, "vipd_to_pod": dp.objs.VipdToPod,
		"vipd_sock_connect4": dp.objs.VipdSockConnect4, "vipd_sock_getpeername4": dp.objs.VipdSockGetpeername4,
		"vipd_sock_recvmsg4": dp.objs.VipdSockRecvmsg4,
	}
	snap := func() map[string]*ebpf.ProgramStats {
		m := map[string]*ebpf.ProgramStats{}
		for n, p := range progs {
			s, err := p.Stats()
			if err != nil {
				b.Fatalf("stats of %s: %v", n, err)
			}
			m[n] = s
		}
		return m
	}

	run := func(name string, load func(time.Duration) (uint64, uint64)) {
		// Warm up (ARP, the first flows), then measure.
		load(time.Second)
		before := snap()
		evBefore := events.Load()
		n, errs := load(dur)
		after := snap()
		if n == 0 {
			b.Fatalf("%s: no connection completed (%d errors)", name, errs)
		}
		var bpfNS float64
		var runs uint64
		for pn := range progs {
			dr := after[pn].RunCount - before[pn].RunCount
			dt := after[pn].Runtime - before[pn].Runtime
			runs += dr
			bpfNS += float64(dt.Nanoseconds())
			if dr > 0 {
				b.ReportMetric(float64(dt.Nanoseconds())/float64(dr), name+"-"+pn+"-ns/run")
				b.ReportMetric(float64(dr)/float64(n), name+"-"+pn+"-runs/conn")
			}
		}
		b.ReportMetric(float64(n)/dur.Seconds(), name+"-conn/s")
		b.ReportMetric(bpfNS/float64(n), name+"-bpf-ns/conn")
		b.ReportMetric(float64(runs)/float64(n), name+"-runs/conn")
		b.ReportMetric(float64(errs), name+"-errors")
		b.Logf("%s: %d conns in %v (%d errors), %d flow events", name, n, dur, errs, events.Load()-evBefore)
	}
	vipTarget := []netip.AddrPort{netip.AddrPortFrom(vip, 80)}
	sockClient, err := node.StartClient(context.Background(), cg)
	if err != nil {
		b.Fatalf("start node client: %v", err)
	}
	b.Cleanup(func() { sockClient.Close() })
	for b.Loop() {
		run("direct", func(d time.Duration) (uint64, uint64) { return ccLoad(b, node.Pod("cdirect"), beAddrs, d) })
		run("vip", func(d time.Duration) (uint64, uint64) { return ccLoad(b, node.Pod("cvip"), vipTarget, d) })
		// A process of the node in the hooks' cgroup: the socket hooks
		// translate its connect(), the tc programs see backend addresses.
		run("sock", func(d time.Duration) (uint64, uint64) { return ccSockLoad(b, sockClient, sockVIP, d) })
	}
}

// ccListen opens a TCP listener on ccPort inside the pod's namespace.
func ccListen(p *netlab.Pod) (net.Listener, error) {
	var ln net.Listener
	err := p.Do(func() error {
		var err error
		ln, err = net.Listen("tcp4", ":"+strconv.Itoa(ccPort))
		return err
	})
	return ln, err
}

// ccServe answers each connection's 4-byte request with 3 bytes and
// closes it: the server closes first.
func ccServe(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			var buf [4]byte
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.ReadFull(c, buf[:]); err != nil {
				return
			}
			_, _ = c.Write([]byte("ok\n"))
		}()
	}
}

// ccLoad runs ccWorkers clients in the pod for d, round robin over
// targets, and returns the connections completed and the errors.
func ccLoad(b *testing.B, p *netlab.Pod, targets []netip.AddrPort, d time.Duration) (uint64, uint64) {
	var done, failed atomic.Uint64
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	for w := range ccWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := p.Do(func() error {
				var buf [8]byte
				for i := w; time.Now().Before(deadline); i++ {
					t := targets[i%len(targets)]
					c, err := net.DialTimeout("tcp4", t.String(), 2*time.Second)
					if err != nil {
						failed.Add(1)
						continue
					}
					_ = c.SetDeadline(time.Now().Add(2 * time.Second))
					if _, err := c.Write([]byte("req\n")); err != nil {
						failed.Add(1)
						c.Close()
						continue
					}
					// The 3-byte answer, then the server's FIN.
					n, err := io.ReadAtLeast(c, buf[:], 3)
					for err == nil {
						var m int
						m, err = c.Read(buf[:])
						n += m
					}
					c.Close()
					if !errors.Is(err, io.EOF) || n != 3 {
						failed.Add(1)
						continue
					}
					done.Add(1)
				}
				return nil
			})
			if err != nil {
				b.Errorf("client worker: %v", err)
			}
		}()
	}
	wg.Wait()
	return done.Load(), failed.Load()
}

// ccSockLoad makes netlab echo requests to vip:80 from the node's client
// process for d, with ccWorkers at a time (the client closes first here).
func ccSockLoad(b *testing.B, c *netlab.Client, vip netip.Addr, d time.Duration) (uint64, uint64) {
	var done, failed atomic.Uint64
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	addr := netip.AddrPortFrom(vip, 80).String()
	for range ccWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_, err := c.Request(ctx, "tcp", addr)
				cancel()
				if err != nil {
					failed.Add(1)
					continue
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	return done.Load(), failed.Load()
}
