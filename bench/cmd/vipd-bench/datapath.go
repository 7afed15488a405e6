package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"time"

	"github.com/cilium/ebpf"

	"github.com/vipd/vipd/bench/bpfstats"
	"github.com/vipd/vipd/bench/kubeproxy"
	"github.com/vipd/vipd/bench/load"
	"github.com/vipd/vipd/bench/statelessdnat"
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
	tcpDirect, tcpVIP []load.Result
	// tcpBare are direct runs in the same lab before the case was loaded.
	tcpBare             []load.Result
	udpDirect, udpVIP   []load.Result
	bulkDirect, bulkVIP []float64
	// vipdCPU is the share of one CPU vipd used during the VIP TCP runs.
	vipdCPU []float64
	// bpfDirect and bpfVIP are the BPF run time of vipd's programs per
	// direct and per VIP TCP run (eBPF only).
	bpfDirect, bpfVIP []bpfstats.Sample
	err               error
}

// startDataBackends starts the servers of the dataBackend pods of lab:
// echo on echoPort (TCP and UDP) and a sink on sinkPort, in a separate
// process.
func startDataBackends(lab *netlab.Lab) (*load.Servers, error) {
	var backends []load.Backend
	for _, name := range dataBackend {
		p := lab.Pod(name)
		backends = append(backends, load.Backend{NetNS: p.Path(), Name: name, Addr: p.IPv4(), EchoPort: echoPort, SinkPort: sinkPort})
	}
	return load.StartServers(backends)
}

// dataLab builds the data-path lab: a client pod and four backend pods,
// each serving echo on 8080 (TCP and UDP) and a sink on 9000 from a
// separate process.
func dataLab(ctx context.Context) (*netlab.Lab, func(), error) {
	lab, err := netlab.Build(ctx, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: append([]string{"client"}, dataBackend...)}}}, nil)
	if err != nil {
		return nil, nil, err
	}
	servers, err := startDataBackends(lab)
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
	var direct []netip.AddrPort
	for _, name := range dataBackend {
		direct = append(direct, netip.AddrPortFrom(lab.Pod(name).IPv4(), echoPort))
	}
	client := lab.Pod("client").NS
	cfg := b.cfg
	// The direct rate of these very namespaces with nothing loaded, just
	// before the case is: what its VIP and direct runs compare with,
	// without the drift of a shared machine between labs.
	for r := range cfg.dataRuns {
		if ctx.Err() != nil {
			return dataCase{err: ctx.Err()}
		}
		b.logf("data path: %s, %s services, direct before loading, run %d/%d", kind, count(n), r+1, cfg.dataRuns)
		res.tcpBare = append(res.tcpBare, load.TCPConnections(client, direct, load.DirectPorts, cfg.workers, cfg.tcpDuration, load.ServerCloses))
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
	vip := []netip.AddrPort{netip.AddrPortFrom(dataVIP, 80)}
	bulkDirect := netip.AddrPortFrom(lab.Pod(dataBackend[0]).IPv4(), sinkPort)
	bulkVIP := netip.AddrPortFrom(dataVIP, 90)

	// The VIP must work before anything is timed.
	if _, _, err := load.Probe(client, vip[0], dataBackend[0], time.Now().Add(time.Minute)); err != nil {
		return dataCase{err: err}
	}
	var progs []ebpf.ProgramID
	if kind == "ebpf" {
		// Every program vipd holds: its tc programs on the pods' veths
		// and its socket hooks (which this client, outside vipd's
		// cgroup, never runs).
		if progs, err = bpfstats.HeldBy(vipd.cmd.Process.Pid); err != nil || len(progs) == 0 {
			return dataCase{err: fmt.Errorf("vipd's BPF programs: %d found, %v", len(progs), err)}
		}
		stats, err := bpfstats.Enable()
		if err != nil {
			return dataCase{err: err}
		}
		defer stats.Close()
	}
	for r := range cfg.dataRuns {
		if ctx.Err() != nil {
			return dataCase{err: ctx.Err()}
		}
		b.logf("data path: %s, %s services, run %d/%d", kind, count(n), r+1, cfg.dataRuns)
		var rd load.Result
		bd, err := bpfDuring(progs, func() {
			rd = load.TCPConnections(client, direct, load.DirectPorts, cfg.workers, cfg.tcpDuration, load.ServerCloses)
		})
		if err != nil {
			return dataCase{err: err}
		}
		res.tcpDirect = append(res.tcpDirect, rd)
		var cpu0 time.Duration
		if vipd != nil {
			cpu0, _ = vipd.cpuTime()
		}
		var r load.Result
		bv, err := bpfDuring(progs, func() {
			r = load.TCPConnections(client, vip, load.VIPPorts, cfg.workers, cfg.tcpDuration, load.ServerCloses)
		})
		if err != nil {
			return dataCase{err: err}
		}
		res.tcpVIP = append(res.tcpVIP, r)
		if vipd != nil {
			if cpu1, err := vipd.cpuTime(); err == nil {
				res.vipdCPU = append(res.vipdCPU, (cpu1-cpu0).Seconds()/r.Elapsed.Seconds())
			}
		}
		if progs != nil {
			res.bpfDirect = append(res.bpfDirect, bd)
			res.bpfVIP = append(res.bpfVIP, bv)
		}
		res.udpDirect = append(res.udpDirect, load.UDPRequests(client, direct, load.DirectPorts, cfg.workers, cfg.udpDuration))
		res.udpVIP = append(res.udpVIP, load.UDPRequests(client, vip, load.VIPPorts, cfg.workers, cfg.udpDuration))
		bkd, err1 := load.Bulk(client, bulkDirect, load.DirectPorts, cfg.bulkDuration)
		bkv, err2 := load.Bulk(client, bulkVIP, load.VIPPorts, cfg.bulkDuration)
		if err := errors.Join(err1, err2); err != nil {
			return dataCase{err: err}
		}
		res.bulkDirect = append(res.bulkDirect, bkd)
		res.bulkVIP = append(res.bulkVIP, bkv)
	}
	return res
}

// bpfDuring runs f and returns the BPF run time and runs of progs during
// it; with no programs, it only runs f.
func bpfDuring(progs []ebpf.ProgramID, f func()) (bpfstats.Sample, error) {
	if len(progs) == 0 {
		f()
		return bpfstats.Sample{}, nil
	}
	s0, err := bpfstats.Read(progs)
	if err != nil {
		return bpfstats.Sample{}, err
	}
	f()
	s1, err := bpfstats.Read(progs)
	if err != nil {
		return bpfstats.Sample{}, err
	}
	return s1.Sub(s0), nil
}

// refCase is what the reference lab measured: the client pod to the
// backend pods directly with the Go and the C generator, and through the
// stateless tcx DNAT, alternating, with nothing else loaded.
type refCase struct {
	direct, cgen, stateless []load.Result
	// bpf is the stateless DNAT's BPF time per stateless run.
	bpf []bpfstats.Sample
	err error
}

// reference measures the reference lab.
func (b *bench) reference(ctx context.Context) (res refCase) {
	lab, closeLab, err := dataLab(ctx)
	if err != nil {
		return refCase{err: err}
	}
	defer closeLab()
	node := lab.Node(1)
	client := lab.Pod("client")
	var direct []netip.AddrPort
	var addrs []netip.Addr
	for _, name := range dataBackend {
		direct = append(direct, netip.AddrPortFrom(lab.Pod(name).IPv4(), echoPort))
		addrs = append(addrs, lab.Pod(name).IPv4())
	}
	vip := netip.AddrPortFrom(dataVIP, 80)
	cgen, err := load.BuildCGen(b.work)
	if err != nil {
		return refCase{err: err}
	}
	stats, err := bpfstats.Enable()
	if err != nil {
		return refCase{err: err}
	}
	defer stats.Close()
	cfg := b.cfg
	for r := range cfg.dataRuns {
		if ctx.Err() != nil {
			return refCase{err: ctx.Err()}
		}
		b.logf("data path: direct, C generator and stateless DNAT, run %d/%d", r+1, cfg.dataRuns)
		res.direct = append(res.direct, load.TCPConnections(client.NS, direct, load.DirectPorts, cfg.workers, cfg.tcpDuration, load.ServerCloses))
		c, err := cgen.TCPConnections(client.NS, direct, load.CrossCheckPorts, cfg.workers, cfg.tcpDuration)
		if err != nil {
			return refCase{err: err}
		}
		res.cgen = append(res.cgen, c)
		// Attached for its runs only, so that the direct runs see no
		// program at all.
		d, err := statelessdnat.Attach(node.Path(), client.HostVeth(), statelessdnat.Config{
			VIP: vip, Backends: addrs, TargetPort: echoPort, ReplyPortLo: load.VIPPorts.Lo, ReplyPortHi: load.VIPPorts.Hi,
		})
		if err != nil {
			return refCase{err: err}
		}
		ids, err := bpfstats.IDs(d.Programs()...)
		var s load.Result
		var bs bpfstats.Sample
		if err == nil {
			bs, err = bpfDuring(ids, func() {
				s = load.TCPConnections(client.NS, []netip.AddrPort{vip}, load.VIPPorts, cfg.workers, cfg.tcpDuration, load.ServerCloses)
			})
		}
		if err := errors.Join(err, d.Close()); err != nil {
			return refCase{err: err}
		}
		res.stateless = append(res.stateless, s)
		res.bpf = append(res.bpf, bs)
	}
	return res
}

// cpuPerConn is the machine's CPU time per connection at rate connections
// per second, in nanoseconds: every CPU busy, as the generator keeps them
// (the machine is CPU-bound at these rates).
func cpuPerConn(rate float64) float64 {
	if rate <= 0 {
		return 0
	}
	return float64(runtime.NumCPU()) * 1e9 / rate
}

// perConn renders the median BPF time and runs per connection of samples
// taken over rs.
func perConn(samples []bpfstats.Sample, rs []load.Result) (string, float64) {
	var ns, runs []float64
	for i, s := range samples {
		if i < len(rs) && rs[i].OK > 0 {
			ns = append(ns, float64(s.Runtime.Nanoseconds())/float64(rs[i].OK))
			runs = append(runs, float64(s.Runs)/float64(rs[i].OK))
		}
	}
	if len(ns) == 0 {
		return "–", 0
	}
	m := spreadOf(ns).med
	return fmt.Sprintf("%s ns (%.1f runs)", count(int(m+0.5)), spreadOf(runs).med), m
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

// dataSection measures the data path: the reference lab once, then at
// every size the three cases.
func (b *bench) dataSection(ctx context.Context) ([]*table, error) {
	cfg := b.cfg
	tcp := &table{
		title: "3a. Data path: TCP connection rate",
		intro: fmt.Sprintf("The generator (bench/load) keeps %d connections in flight from one client pod, on non-blocking sockets driven by epoll, one thread per CPU; "+
			"each connection: connect, send a 4-byte request, read the one-line reply, and the **server closes first** (as HTTP/1.0 and most short RPCs do), so the backends keep the TIME_WAITs. "+
			"%v per run, %d runs; rates are connections per second, median (min–max) of the runs; latency is one whole connection, pooled over the runs. "+
			"The **reference** lab has no dataplane: **direct** is the client pod to the 4 backend pods round robin, the physical limit; the **C generator** is an independent generator (bench/load/cgen, gcc, epoll) "+
			"making the same connections, a cross-check that the Go generator is not what bounds the rate; the **stateless tcx DNAT** (bench/statelessdnat: no conntrack, no events, no maps) is what eBPF can reach here. "+
			"They alternate within each run, the DNAT attached for its own runs only; their **vs direct** divides by the reference's direct median. "+
			"Then each case runs in its own fresh namespaces: first **direct before loading** (nothing loaded yet), then with N services (the tested one last) VIP runs alternating "+
			"with **direct runs beside it** (non-VIP pod traffic with the case loaded; in the iptables-based ones netfilter conntrack and the ruleset see it too). "+
			"A case's **vs direct** divides by its own direct before loading (the same namespaces, a minute earlier), so that the drift of a shared machine between labs does not enter; "+
			"**vs direct beside it** divides the VIP rate by the direct runs alternated with it. "+
			"**BPF time per connection**: with the kernel's BPF run-time statistics on (BPF_ENABLE_STATS, held only around the runs), the run_time_ns delta summed over the programs vipd holds "+
			"(or the DNAT's two), divided by the connections made, median of the runs, with the program runs per connection. **vipd CPU** is the share of one CPU vipd used during the VIP runs (it reads the flow events of every connection).",
			cfg.workers, cfg.tcpDuration, cfg.dataRuns),
		header: []string{"N services", "case", "conn/s", "direct before loading", "vs direct", "vs direct beside it", "vs kube-proxy", "BPF time per connection", "p50 / p99", "failed", "vipd CPU"},
	}
	udp := &table{
		title: "3b. Data path: UDP request/reply rate",
		intro: fmt.Sprintf("%d workers, each with one connected UDP socket, send a request and wait for the reply, for %v per run, %d runs; "+
			"directly to a backend (worker k to backend k mod 4) and through the VIP, in the same lab.", cfg.workers, cfg.udpDuration, cfg.dataRuns),
		header: []string{"N services", "case", "direct req/s", "VIP req/s", "VIP vs direct", "VIP vs kube-proxy", "VIP p50 / p99", "direct p50 / p99", "failed"},
	}
	bulk := &table{
		title:  "3c. Data path: bulk throughput over one TCP connection",
		intro:  fmt.Sprintf("One connection writes 256 KiB buffers for %v to a discarding server, directly to a backend and through the VIP, in the same lab; %d runs.", cfg.bulkDuration, cfg.dataRuns),
		header: []string{"N services", "case", "direct", "VIP", "VIP vs direct", "VIP vs kube-proxy"},
	}
	var firstErr error
	ref := b.reference(ctx)
	refDirect := 0.0
	if ref.err != nil {
		firstErr = fmt.Errorf("data path reference: %w", ref.err)
		tcp.add("–", "reference", "error: "+oneLine(ref.err))
	} else {
		refDirect = rates(ref.direct).med
		for _, x := range []struct {
			name string
			rs   []load.Result
			bpf  []bpfstats.Sample
		}{{"direct (no dataplane)", ref.direct, nil}, {"direct, C generator (cross-check)", ref.cgen, nil}, {"stateless tcx DNAT (VIP)", ref.stateless, ref.bpf}} {
			r := rates(x.rs)
			p50, p99, failed := pooled(x.rs)
			lat := ms(p50) + " / " + ms(p99)
			if p50 == 0 {
				lat = "–"
			}
			bpf, bpfNS := perConn(x.bpf, x.rs)
			if x.bpf != nil {
				b.figure("data/stateless/tcp/direct", r.med/refDirect)
				b.figure("data/stateless/bpfns", bpfNS)
				b.figure("data/stateless/cpuns", cpuPerConn(r.med))
			}
			tcp.add("–", x.name, r.format(fmtRate), "–", ratio(r.med, refDirect), "–", "–", bpf, lat, fmt.Sprint(failed), "–")
			notes(tcp, x.name, "–", x.rs)
		}
		b.figure("data/cgen/tcp/direct", rates(ref.cgen).med/refDirect)
	}
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
		kpVIP := rates(kp.tcpVIP).med
		names := map[string]string{"kube-proxy": "kube-proxy-shaped", "iptables": "vipd iptables", "ebpf": "vipd eBPF"}
		for _, kind := range []string{"kube-proxy", "iptables", "ebpf"} {
			c := cases[kind]
			if c.err != nil {
				for _, t := range []*table{tcp, udp, bulk} {
					t.add(count(n), names[kind], "error: "+oneLine(c.err))
				}
				continue
			}
			cpu := "–"
			if len(c.vipdCPU) > 0 {
				cpu = fmt.Sprintf("%.0f%%", 100*spreadOf(c.vipdCPU).med)
			}
			d, v, bare := rates(c.tcpDirect), rates(c.tcpVIP), rates(c.tcpBare)
			base := bare.med
			b.figure(fmt.Sprintf("data/%s/%d/tcp/direct", kind, n), v.med/base)
			b.figure(fmt.Sprintf("data/%s/%d/tcp/samelab", kind, n), v.med/d.med)
			b.figure(fmt.Sprintf("data/%s/%d/tcp/nonvip", kind, n), d.med/base)
			if kpVIP > 0 {
				b.figure(fmt.Sprintf("data/%s/%d/tcp/kube-proxy", kind, n), v.med/kpVIP)
			}
			bpfV, nsV := perConn(c.bpfVIP, c.tcpVIP)
			bpfD, nsD := perConn(c.bpfDirect, c.tcpDirect)
			if c.bpfVIP != nil {
				b.figure(fmt.Sprintf("data/%s/%d/bpfns", kind, n), nsV)
				b.figure(fmt.Sprintf("data/%s/%d/bpfns-nonvip", kind, n), nsD)
			}
			b.figure(fmt.Sprintf("data/%s/%d/cpuns", kind, n), cpuPerConn(v.med))
			b.figure(fmt.Sprintf("data/%s/%d/cpuns-nonvip", kind, n), cpuPerConn(d.med))
			if len(c.vipdCPU) > 0 {
				b.figure(fmt.Sprintf("data/%s/%d/vipdcpu", kind, n), spreadOf(c.vipdCPU).med)
			}
			v50, v99, vf := pooled(c.tcpVIP)
			d50, d99, df := pooled(c.tcpDirect)
			_, _, bf := pooled(c.tcpBare)
			tcp.add(count(n), names[kind]+" (VIP)", v.format(fmtRate), bare.format(fmtRate), ratio(v.med, base), ratio(v.med, d.med), ratio(v.med, kpVIP), bpfV, ms(v50)+" / "+ms(v99), fmt.Sprint(vf), cpu)
			tcp.add(count(n), "direct beside "+names[kind], d.format(fmtRate), "", ratio(d.med, base), "–", "–", bpfD, ms(d50)+" / "+ms(d99), fmt.Sprint(df+bf), "–")
			notes(tcp, names[kind], count(n), slices.Concat(c.tcpBare, c.tcpDirect, c.tcpVIP))

			ud, uv := rates(c.udpDirect), rates(c.udpVIP)
			b.figure(fmt.Sprintf("data/%s/%d/udp/direct", kind, n), uv.med/ud.med)
			if kpv := rates(kp.udpVIP).med; kpv > 0 {
				b.figure(fmt.Sprintf("data/%s/%d/udp/kube-proxy", kind, n), uv.med/kpv)
			}
			v50, v99, vf = pooled(c.udpVIP)
			d50, d99, df = pooled(c.udpDirect)
			udp.add(count(n), names[kind], ud.format(fmtRate), uv.format(fmtRate), ratio(uv.med, ud.med), ratio(uv.med, rates(kp.udpVIP).med),
				ms(v50)+" / "+ms(v99), ms(d50)+" / "+ms(d99), fmt.Sprint(vf+df))
			notes(udp, names[kind], count(n), append(slices.Clone(c.udpDirect), c.udpVIP...))

			bd, bv := spreadOf(c.bulkDirect), spreadOf(c.bulkVIP)
			bulk.add(count(n), names[kind], bd.format(fmtGbit), bv.format(fmtGbit), ratio(bv.med, bd.med), ratio(bv.med, spreadOf(kp.bulkVIP).med))
		}
	}
	return []*table{tcp, udp, bulk}, firstErr
}

// notes adds a note to t for every run of rs with failures.
func notes(t *table, name, n string, rs []load.Result) {
	for _, r := range rs {
		if r.Failed > 0 {
			t.note("%s, %s services: %d requests failed in one run (first: %v)", name, n, r.Failed, r.FirstErr)
		}
	}
}
