package main

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/vipd/vipd/bench/kubeproxy"
	"github.com/vipd/vipd/bench/load"
	"github.com/vipd/vipd/internal/testkit/netlab"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// dataNodePort is the tested service's node port.
const dataNodePort = 30080

// nodePortKinds are the cases of the node-port table, in the order they run
// and are reported: no ruleset at all, then the three that serve the port.
var nodePortKinds = []string{"direct", "kube-proxy", "iptables", "ebpf"}

// nodePortCase is what one case of the node-port benchmark measured: TCP
// connections from an external host to the backend pods directly and to
// the node's address at the node port, alternating, in one lab.
type nodePortCase struct {
	direct, nodePort []load.Result
	vipdCPU          []float64
	err              error
}

// nodePortLab builds the node-port lab: node1 with the four backend pods
// (echo on 8080) and one external host behind the upstream router, set up
// like the data-path client (TIME_WAIT reuse, the port ranges of package
// load).
func nodePortLab(ctx context.Context) (*netlab.Lab, *netlab.ExternalHost, func(), error) {
	lab, err := netlab.Build(ctx, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: dataBackend}}}, nil)
	if err != nil {
		return nil, nil, nil, err
	}
	outside, err := lab.AddExternalHost(ctx, "outside")
	if err != nil {
		lab.Close()
		return nil, nil, nil, err
	}
	servers, err := startDataBackends(lab)
	if err != nil {
		lab.Close()
		return nil, nil, nil, err
	}
	closeAll := func() {
		servers.Close()
		lab.Close()
	}
	for _, s := range [][2]string{{"net.ipv4.tcp_tw_reuse", "1"}, {"net.ipv4.ip_local_port_range", "10000 60999"}} {
		if err := outside.SetSysctl(s[0], s[1]); err != nil {
			closeAll()
			return nil, nil, nil, err
		}
	}
	return lab, outside, closeAll, nil
}

// nodePortService is the tested service in vipd's API: TCP port 80 with
// node port 30080, external traffic policy Cluster, the four backends.
func nodePortService(lab *netlab.Lab) *vipdv1.Service {
	svc := &vipdv1.Service{
		Name: owner + "/nodeport", Owner: owner, Vips: []string{dataVIP.String()},
		Ports:                 []*vipdv1.Port{{Name: "tcp", Port: 80, TargetPort: echoPort, NodePort: dataNodePort}},
		ExternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
	}
	for _, name := range dataBackend {
		svc.Backends = append(svc.Backends, &vipdv1.Backend{Ip: lab.Pod(name).IPv4().String()})
	}
	return svc
}

// nodePortKubeProxyService is the tested service as a kube-proxy NodePort
// service port.
func nodePortKubeProxyService(lab *netlab.Lab) kubeproxy.Service {
	s := kubeproxy.Service{Namespace: owner, Name: "nodeport", PortName: "tcp", VIP: dataVIP, Port: 80, NodePort: dataNodePort, Protocol: "tcp"}
	for _, name := range dataBackend {
		s.Endpoints = append(s.Endpoints, netip.AddrPortFrom(lab.Pod(name).IPv4(), echoPort))
	}
	return s
}

// nodePortPath measures one case (one of nodePortKinds) with n services in
// all, the tested one last.
func (b *bench) nodePortPath(ctx context.Context, kind string, n int) (res nodePortCase) {
	lab, outside, closeLab, err := nodePortLab(ctx)
	if err != nil {
		return nodePortCase{err: err}
	}
	defer closeLab()
	node := lab.Node(1)
	// Conntrack sees every connection of the iptables-based cases, and
	// the masquerade of both vipd dataplanes may use it: let TIME_WAIT
	// entries go sooner so that the runs do not fill the table.
	if err := node.SetSysctl("net.netfilter.nf_conntrack_tcp_timeout_time_wait", "10"); err != nil {
		return nodePortCase{err: err}
	}
	vipd, err := b.programCase(ctx, kind, node, n, []kubeproxy.Service{nodePortKubeProxyService(lab)}, nodePortService(lab))
	if err != nil {
		return nodePortCase{err: err}
	}
	if vipd != nil {
		defer func() {
			if err := vipd.close(); err != nil && res.err == nil {
				res.err = err
			}
		}()
	}
	var direct []netip.AddrPort
	for _, name := range dataBackend {
		direct = append(direct, netip.AddrPortFrom(lab.Pod(name).IPv4(), echoPort))
	}
	np := []netip.AddrPort{netip.AddrPortFrom(node.IPv4(), dataNodePort)}
	// The pods, and the node port, must answer from outside before
	// anything is timed.
	if _, _, err := load.Probe(outside.NS, direct[0], dataBackend[0], time.Now().Add(time.Minute)); err != nil {
		return nodePortCase{err: err}
	}
	if kind != "direct" {
		if _, _, err := load.Probe(outside.NS, np[0], dataBackend[0], time.Now().Add(time.Minute)); err != nil {
			return nodePortCase{err: err}
		}
	}
	cfg := b.cfg
	for r := range cfg.nodePortRuns {
		if ctx.Err() != nil {
			return nodePortCase{err: ctx.Err()}
		}
		b.logf("node port: %s, %s services, run %d/%d", kind, count(n), r+1, cfg.nodePortRuns)
		res.direct = append(res.direct, load.TCPConnections(outside.NS, direct, load.DirectPorts, cfg.workers, cfg.tcpDuration, load.ServerCloses))
		if kind == "direct" {
			continue
		}
		var cpu0 time.Duration
		if vipd != nil {
			cpu0, _ = vipd.cpuTime()
		}
		r := load.TCPConnections(outside.NS, np, load.VIPPorts, cfg.workers, cfg.tcpDuration, load.ServerCloses)
		res.nodePort = append(res.nodePort, r)
		if vipd != nil {
			if cpu1, err := vipd.cpuTime(); err == nil {
				res.vipdCPU = append(res.vipdCPU, (cpu1-cpu0).Seconds()/r.Elapsed.Seconds())
			}
		}
	}
	return res
}

// nodePortSection measures the TCP connection rate from outside through a
// node port for every case of nodePortKinds, in one run.
func (b *bench) nodePortSection(ctx context.Context) (*table, error) {
	cfg := b.cfg
	n := cfg.nodePortSize
	t := &table{
		title: "3d. Data path from outside: TCP connection rate through a node port",
		intro: fmt.Sprintf("An external host behind the upstream router (netlab's stand-in for a machine outside the cluster) keeps %d connections in flight, each: "+
			"connect, send a request, read the reply, the server closing first (the generator of 3a); for %v per run, %d runs, alternating: to the 4 backend pods **directly** "+
			"(round robin, routed through node1) and to **node1's address at node port %d** (external traffic policy Cluster, so the source is masqueraded to the node's address; "+
			"%s services in all, the tested one last, the others ClusterIP only). The **direct** case has no ruleset and no vipd in its node; "+
			"**kube-proxy** is the kube-proxy-shaped ruleset with its external half (KUBE-SERVICES → KUBE-NODEPORTS by `addrtype LOCAL` → KUBE-EXT-* marking for masquerade → KUBE-SVC-* → KUBE-SEP-* DNAT, KUBE-POSTROUTING masquerade). "+
			"Rates are connections per second, median (min–max) of the runs. **vs direct case** compares with the direct case's median, **vs direct, same lab** with the direct runs of the same case "+
			"(in the iptables-based cases conntrack and the ruleset see those too). Each case runs in its own fresh namespaces.",
			cfg.workers, cfg.tcpDuration, cfg.nodePortRuns, dataNodePort, count(n)),
		header: []string{"case", "direct conn/s (same lab)", "node port conn/s", "vs direct case", "vs direct, same lab", "vs kube-proxy", "node port p50 / p99", "direct p50 / p99", "failed", "vipd CPU"},
	}
	cases := map[string]nodePortCase{}
	var firstErr error
	for _, kind := range nodePortKinds {
		c := b.nodePortPath(ctx, kind, n)
		if c.err != nil && firstErr == nil {
			firstErr = fmt.Errorf("node port %s at %d: %w", kind, n, c.err)
		}
		cases[kind] = c
	}
	base := rates(cases["direct"].direct).med
	kp := rates(cases["kube-proxy"].nodePort).med
	for _, kind := range nodePortKinds {
		c := cases[kind]
		if c.err != nil {
			t.add(kind, "error: "+oneLine(c.err))
			continue
		}
		d := rates(c.direct)
		d50, d99, df := pooled(c.direct)
		if kind == "direct" {
			t.add(kind, d.format(fmtRate), "–", "–", "–", "–", "–", ms(d50)+" / "+ms(d99), fmt.Sprint(df), "–")
			continue
		}
		v := rates(c.nodePort)
		v50, v99, vf := pooled(c.nodePort)
		cpu := "–"
		if len(c.vipdCPU) > 0 {
			cpu = fmt.Sprintf("%.0f%%", 100*spreadOf(c.vipdCPU).med)
		}
		b.figure(fmt.Sprintf("nodeport/%s/%d/direct", kind, n), v.med/base)
		if kp > 0 {
			b.figure(fmt.Sprintf("nodeport/%s/%d/kube-proxy", kind, n), v.med/kp)
		}
		t.add(kind, d.format(fmtRate), v.format(fmtRate), ratio(v.med, base), ratio(v.med, d.med), ratio(v.med, kp),
			ms(v50)+" / "+ms(v99), ms(d50)+" / "+ms(d99), fmt.Sprint(vf+df), cpu)
		if slow, max := retransmitted(c.nodePort); slow > 0 {
			t.note("%s: %d node-port connections took over %v (a retransmitted SYN or segment; the longest %v)", kind, slow, slowConnection, max.Round(time.Millisecond))
		}
		for _, r := range append(slices.Clone(c.direct), c.nodePort...) {
			if r.Failed > 0 {
				t.note("%s: %d connections failed in one run (first: %v)", kind, r.Failed, r.FirstErr)
			}
		}
	}
	return t, firstErr
}

// slowConnection is a connection time that only a retransmission explains:
// the kernel's first SYN retransmission comes after 1 s.
const slowConnection = 900 * time.Millisecond

// retransmitted counts the connections of rs that took over slowConnection,
// and returns the longest.
func retransmitted(rs []load.Result) (n int, longest time.Duration) {
	for _, r := range rs {
		for _, l := range r.Latencies {
			if l > slowConnection {
				n++
			}
			longest = max(longest, l)
		}
	}
	return n, longest
}
