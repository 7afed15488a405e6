package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/vipd/vipd/bench/kubeproxy"
	"github.com/vipd/vipd/bench/load"
	"github.com/vipd/vipd/internal/testkit/netlab"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// The data-path service: TCP and UDP requests on port 80, bulk TCP on 90.
var (
	dataVIP     = netip.MustParseAddr("198.19.255.10")
	dataBackend = []string{"be1", "be2", "be3", "be4"}
)

const (
	echoPort = 8080
	sinkPort = 9000
)

// dataCase is what one case of the data-path benchmark measured: the same
// loads to the backends directly and through the VIP, in one lab.
type dataCase struct {
	tcpDirect, tcpVIP   []load.Result
	udpDirect, udpVIP   []load.Result
	bulkDirect, bulkVIP []float64
	// vipdCPU is the share of one CPU vipd used during the VIP TCP runs.
	vipdCPU []float64
	err     error
}

// dataLab builds the data-path lab: a client pod and four backend pods,
// each serving echo on 8080 (TCP and UDP) and a sink on 9000 from a
// separate process.
func dataLab(ctx context.Context) (*netlab.Lab, func(), error) {
	lab, err := netlab.Build(ctx, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: append([]string{"client"}, dataBackend...)}}}, nil)
	if err != nil {
		return nil, nil, err
	}
	var backends []load.Backend
	for _, name := range dataBackend {
		p := lab.Pod(name)
		backends = append(backends, load.Backend{NetNS: p.Path(), Name: name, Addr: p.IPv4(), EchoPort: echoPort, SinkPort: sinkPort})
	}
	servers, err := load.StartServers(backends)
	if err != nil {
		lab.Close()
		return nil, nil, err
	}
	closeAll := func() {
		servers.Close()
		lab.Close()
	}
	// Reuse client ports in TIME_WAIT for new connections: a run makes
	// more connections than a port range has ports. The namespace's range
	// must cover the ranges the runs pick from (load.DirectPorts, ...): the
	// kernel ignores a socket's range that lies outside it.
	client := lab.Pod("client")
	for _, s := range [][2]string{{"net.ipv4.tcp_tw_reuse", "1"}, {"net.ipv4.ip_local_port_range", "10000 60999"}} {
		if err := client.SetSysctl(s[0], s[1]); err != nil {
			closeAll()
			return nil, nil, err
		}
	}
	return lab, closeAll, nil
}

// dataService is the tested service in vipd's API.
func dataService(lab *netlab.Lab) *vipdv1.Service {
	svc := &vipdv1.Service{
		Name: owner + "/data", Owner: owner, Vips: []string{dataVIP.String()},
		Ports: []*vipdv1.Port{
			{Name: "tcp", Port: 80, TargetPort: echoPort},
			{Name: "udp", Port: 80, TargetPort: echoPort, Protocol: vipdv1.Protocol_PROTOCOL_UDP},
			{Name: "bulk", Port: 90, TargetPort: sinkPort},
		},
	}
	for _, name := range dataBackend {
		svc.Backends = append(svc.Backends, &vipdv1.Backend{Ip: lab.Pod(name).IPv4().String()})
	}
	return svc
}

// dataKubeProxyServices is the tested service as kube-proxy service ports.
func dataKubeProxyServices(lab *netlab.Lab) []kubeproxy.Service {
	var svcs []kubeproxy.Service
	for _, p := range []struct {
		name, proto  string
		port, target uint16
	}{{"tcp", "tcp", 80, echoPort}, {"udp", "udp", 80, echoPort}, {"bulk", "tcp", 90, sinkPort}} {
		s := kubeproxy.Service{Namespace: owner, Name: "data", PortName: p.name, VIP: dataVIP, Port: p.port, Protocol: p.proto}
		for _, name := range dataBackend {
			s.Endpoints = append(s.Endpoints, netip.AddrPortFrom(lab.Pod(name).IPv4(), p.target))
		}
		svcs = append(svcs, s)
	}
	return svcs
}

// dataPath measures one case ("ebpf", "iptables" or "kube-proxy") with n
// services in all, the tested one last.
func (b *bench) dataPath(ctx context.Context, kind string, n int) (res dataCase) {
	lab, closeLab, err := dataLab(ctx)
	if err != nil {
		return dataCase{err: err}
	}
	defer closeLab()
	node := lab.Node(1)
	if kind != "ebpf" {
		// Conntrack sees every connection of the iptables-based cases
		// (direct ones too); let their TIME_WAIT entries go sooner so
		// that the runs do not fill the table.
		if err := node.SetSysctl("net.netfilter.nf_conntrack_tcp_timeout_time_wait", "10"); err != nil {
			return dataCase{err: err}
		}
	}
	vipd, err := b.programCase(ctx, kind, node, n, dataKubeProxyServices(lab), dataService(lab))
	if err != nil {
		return dataCase{err: err}
	}
	if vipd != nil {
		defer func() {
			if err := vipd.close(); err != nil && res.err == nil {
				res.err = err
			}
		}()
	}
	client := lab.Pod("client").NS
	var direct []netip.AddrPort
	for _, name := range dataBackend {
		direct = append(direct, netip.AddrPortFrom(lab.Pod(name).IPv4(), echoPort))
	}
	vip := []netip.AddrPort{netip.AddrPortFrom(dataVIP, 80)}
	bulkDirect := netip.AddrPortFrom(lab.Pod(dataBackend[0]).IPv4(), sinkPort)
	bulkVIP := netip.AddrPortFrom(dataVIP, 90)

	// The VIP must work before anything is timed.
	if _, _, err := load.Probe(client, vip[0], dataBackend[0], time.Now().Add(time.Minute)); err != nil {
		return dataCase{err: err}
	}
	cfg := b.cfg
	for r := range cfg.dataRuns {
		if ctx.Err() != nil {
			return dataCase{err: ctx.Err()}
		}
		b.logf("data path: %s, %s services, run %d/%d", kind, count(n), r+1, cfg.dataRuns)
		res.tcpDirect = append(res.tcpDirect, load.TCPConnections(client, direct, load.DirectPorts, cfg.workers, cfg.tcpDuration, load.ServerCloses))
		var cpu0 time.Duration
		if vipd != nil {
			cpu0, _ = vipd.cpuTime()
		}
		r := load.TCPConnections(client, vip, load.VIPPorts, cfg.workers, cfg.tcpDuration, load.ServerCloses)
		res.tcpVIP = append(res.tcpVIP, r)
		if vipd != nil {
			if cpu1, err := vipd.cpuTime(); err == nil {
				res.vipdCPU = append(res.vipdCPU, (cpu1-cpu0).Seconds()/r.Elapsed.Seconds())
			}
		}
		res.udpDirect = append(res.udpDirect, load.UDPRequests(client, direct, load.DirectPorts, cfg.workers, cfg.udpDuration))
		res.udpVIP = append(res.udpVIP, load.UDPRequests(client, vip, load.VIPPorts, cfg.workers, cfg.udpDuration))
		bd, err1 := load.Bulk(client, bulkDirect, load.DirectPorts, cfg.bulkDuration)
		bv, err2 := load.Bulk(client, bulkVIP, load.VIPPorts, cfg.bulkDuration)
		if err := errors.Join(err1, err2); err != nil {
			return dataCase{err: err}
		}
		res.bulkDirect = append(res.bulkDirect, bd)
		res.bulkVIP = append(res.bulkVIP, bv)
	}
	return res
}

// rates returns the per-run rates of rs.
func rates(rs []load.Result) spread {
	var xs []float64
	for _, r := range rs {
		xs = append(xs, r.Rate())
	}
	return spreadOf(xs)
}

// pooled merges the latencies of rs and returns their p50 and p99, and the
// total failures.
func pooled(rs []load.Result) (p50, p99 time.Duration, failed int) {
	var all []time.Duration
	for _, r := range rs {
		all = append(all, r.Latencies...)
		failed += r.Failed
	}
	return quantile(all, 0.5), quantile(all, 0.99), failed
}

// dataSection measures the data path at every size for the three cases.
func (b *bench) dataSection(ctx context.Context) ([]*table, error) {
	cfg := b.cfg
	tcp := &table{
		title: "3a. Data path: TCP connection rate",
		intro: fmt.Sprintf("%d workers in one client pod each loop: connect, send one request line, read the reply, close; for %v per run, "+
			"to the 4 backend pods **directly** (round robin) and then **through the VIP** (N services in all, the tested one last), alternating, %d runs each. "+
			"Rates are connections per second, median (min–max) of the runs; latency is one whole connection, pooled over the runs. "+
			"Direct and VIP runs use separate client port ranges. **vipd CPU** is the share of one CPU that vipd used during the VIP runs (it reads the flow events of every connection). Each case runs in its own fresh namespaces; in the iptables-based ones "+
			"conntrack sees the direct connections too.", cfg.workers, cfg.tcpDuration, cfg.dataRuns),
		header: []string{"N services", "case", "direct conn/s", "VIP conn/s", "VIP vs direct", "VIP vs kube-proxy", "VIP p50 / p99", "direct p50 / p99", "failed", "vipd CPU"},
	}
	udp := &table{
		title: "3b. Data path: UDP request/reply rate",
		intro: fmt.Sprintf("%d workers, each with one connected UDP socket, send a request and wait for the reply, for %v per run, %d runs; "+
			"directly to a backend (worker k to backend k mod 4) and through the VIP.", cfg.workers, cfg.udpDuration, cfg.dataRuns),
		header: []string{"N services", "case", "direct req/s", "VIP req/s", "VIP vs direct", "VIP vs kube-proxy", "VIP p50 / p99", "direct p50 / p99", "failed"},
	}
	bulk := &table{
		title:  "3c. Data path: bulk throughput over one TCP connection",
		intro:  fmt.Sprintf("One connection writes 256 KiB buffers for %v to a discarding server, directly to a backend and through the VIP; %d runs.", cfg.bulkDuration, cfg.dataRuns),
		header: []string{"N services", "case", "direct", "VIP", "VIP vs direct", "VIP vs kube-proxy"},
	}
	var firstErr error
	for _, n := range cfg.dataSizes {
		cases := map[string]dataCase{}
		for _, kind := range []string{"ebpf", "iptables", "kube-proxy"} {
			c := b.dataPath(ctx, kind, n)
			if c.err != nil && firstErr == nil {
				firstErr = fmt.Errorf("data path %s at %d: %w", kind, n, c.err)
			}
			cases[kind] = c
		}
		kp := cases["kube-proxy"]
		for _, kind := range []string{"ebpf", "iptables", "kube-proxy"} {
			c := cases[kind]
			if c.err != nil {
				for _, t := range []*table{tcp, udp, bulk} {
					t.add(count(n), kind, "error: "+oneLine(c.err))
				}
				continue
			}
			cpu := "–"
			if len(c.vipdCPU) > 0 {
				cpu = fmt.Sprintf("%.0f%%", 100*spreadOf(c.vipdCPU).med)
			}
			for _, x := range []struct {
				t                *table
				direct, vip, kpv []load.Result
				key              string
			}{{tcp, c.tcpDirect, c.tcpVIP, kp.tcpVIP, "tcp"}, {udp, c.udpDirect, c.udpVIP, kp.udpVIP, "udp"}} {
				d, v := rates(x.direct), rates(x.vip)
				b.figure(fmt.Sprintf("data/%s/%d/%s/direct", kind, n, x.key), v.med/d.med)
				if kpv := rates(x.kpv).med; kpv > 0 {
					b.figure(fmt.Sprintf("data/%s/%d/%s/kube-proxy", kind, n, x.key), v.med/kpv)
				}
				v50, v99, vf := pooled(x.vip)
				d50, d99, df := pooled(x.direct)
				row := []string{count(n), kind, d.format(fmtRate), v.format(fmtRate), ratio(v.med, d.med), ratio(v.med, rates(x.kpv).med),
					ms(v50) + " / " + ms(v99), ms(d50) + " / " + ms(d99), fmt.Sprint(vf + df)}
				if x.key == "tcp" {
					row = append(row, cpu)
				}
				x.t.add(row...)
				for _, r := range append(slices.Clone(x.direct), x.vip...) {
					if r.Failed > 0 {
						x.t.note("%s, %s services: %d requests failed in one run (first: %v)", kind, count(n), r.Failed, r.FirstErr)
					}
				}
			}
			d, v := spreadOf(c.bulkDirect), spreadOf(c.bulkVIP)
			bulk.add(count(n), kind, d.format(fmtGbit), v.format(fmtGbit), ratio(v.med, d.med), ratio(v.med, spreadOf(kp.bulkVIP).med))
		}
	}
	return []*table{tcp, udp, bulk}, firstErr
}
