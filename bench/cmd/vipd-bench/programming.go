package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/vipd/vipd/bench/kubeproxy"
	"github.com/vipd/vipd/bench/load"
	"github.com/vipd/vipd/internal/testkit/netlab"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// progVIP is the VIP of the service whose backend the programming
// benchmark moves.
var progVIP = netip.MustParseAddrPort("198.19.255.1:80")

// landTimeout bounds the wait for a change to reach the data path.
const landTimeout = 2 * time.Minute

// progSample is one change: from the start of the request to the connect()
// of the first connection that reached the new backend, and the request's
// own latency (an UpsertService RPC, or a kube-proxy-style restore).
type progSample struct {
	land, call time.Duration
	probes     int
}

// progCell is the outcome of one dataplane at one size.
type progCell struct {
	samples []progSample
	// early counts the changes whose sample was dropped (errEarlyLand).
	early int
	err   error
}

func (c progCell) quantiles() (land50, land99, call50, call99 time.Duration) {
	var land, call []time.Duration
	for _, s := range c.samples {
		land = append(land, s.land)
		call = append(call, s.call)
	}
	return quantile(land, 0.5), quantile(land, 0.99), quantile(call, 0.5), quantile(call, 0.99)
}

// progFlags are the command line's choices for the programming section:
// sizes, dataplanes and changes instead of the defaults, and whether the
// eBPF cells run with vipd and the prober pinned to CPUs of their own.
var progFlags struct {
	sizes      intList
	dataplanes string
	samples    int
	pin        string
}

func init() {
	flag.Var(&progFlags.sizes, "prog-sizes", "comma-separated service counts of the programming section, instead of its defaults (for example 10000)")
	flag.StringVar(&progFlags.dataplanes, "prog-dataplanes", "ebpf,iptables,kube-proxy", "comma-separated dataplanes of the programming section")
	flag.IntVar(&progFlags.samples, "prog-samples", 0, "changes per cell of the programming section, instead of its default (0: default; the slow cells keep theirs unless it is larger)")
	flag.StringVar(&progFlags.pin, "prog-pin", "both", "eBPF cells of the programming section: \"off\" shares the CPUs as scheduled, \"on\" pins vipd to CPU 0 and the benchmark (prober, backends) to CPU 1, \"both\" measures each")
}

// pinModes returns the pin settings the eBPF cells run with.
func pinModes() ([]bool, error) {
	switch progFlags.pin {
	case "off":
		return []bool{false}, nil
	case "on":
		return []bool{true}, nil
	case "both", "":
		return []bool{false, true}, nil
	}
	return nil, fmt.Errorf("-prog-pin %q: want off, on or both", progFlags.pin)
}

// pinnedCPUs is where vipd and the benchmark run in a pinned cell.
const pinVipdCPU, pinBenchCPU = 0, 1

// programmingLab is a node with a client pod and two backend pods, be1 and
// be2, serving on 8080.
func (b *bench) programmingLab(ctx context.Context) (*netlab.Lab, error) {
	lab, err := netlab.Build(ctx, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: []string{"client", "be1", "be2"}}}}, nil)
	if err != nil {
		return nil, err
	}
	for _, name := range []string{"be1", "be2"} {
		if _, err := lab.Pod(name).StartEcho(name, 8080); err != nil {
			lab.Close()
			return nil, err
		}
	}
	return lab, nil
}

// programmingVipd measures vipd with dataplane dp and n other services
// present (5 backends each): samples changes of the tested service's
// backend between be1 and be2.
// With pin, vipd runs on CPU pinVipdCPU alone and this process (the
// prober, the backends and the API client) on pinBenchCPU, from the start
// of the changes to their end.
func (b *bench) programmingVipd(ctx context.Context, dp string, n, samples int, pin bool) (cell progCell) {
	lab, err := b.programmingLab(ctx)
	if err != nil {
		return progCell{err: err}
	}
	defer lab.Close()
	node := lab.Node(1)
	d, err := newDaemon(b.vipd, b.vipdArgs, dp, node, b.work)
	if err != nil {
		return progCell{err: err}
	}
	defer func() {
		if err := d.close(); err != nil && cell.err == nil {
			cell.err = err
		}
	}()
	if _, err := d.start(); err != nil {
		return progCell{err: err}
	}
	svc := func(pod string) *vipdv1.Service {
		return &vipdv1.Service{
			Name: owner + "/prog", Owner: owner, Vips: []string{progVIP.Addr().String()},
			Ports:    []*vipdv1.Port{{Port: uint32(progVIP.Port()), TargetPort: 8080}},
			Backends: backendsOf(lab.Pod(pod).IPv4()),
		}
	}
	if _, err := d.api.SyncServices(ctx, owner, append(fillers(n, 5), svc("be1"))); err != nil {
		return progCell{err: fmt.Errorf("sync %d services: %w", n+1, err)}
	}
	client := node.Pod("client")
	if _, _, err := load.Probe(client.NS, progVIP, "be1", time.Now().Add(landTimeout)); err != nil {
		return progCell{err: err}
	}
	if pin {
		unpinVipd, err := pinProcess(d.cmd.Process.Pid, pinVipdCPU)
		if err != nil {
			return progCell{err: fmt.Errorf("pin vipd: %w", err)}
		}
		unpinBench, err := pinProcess(os.Getpid(), pinBenchCPU)
		if err != nil {
			unpinVipd()
			return progCell{err: fmt.Errorf("pin the benchmark: %w", err)}
		}
		defer func() {
			if err := errors.Join(unpinBench(), unpinVipd()); err != nil && cell.err == nil {
				cell.err = fmt.Errorf("unpin: %w", err)
			}
		}()
	}
	for i := range samples {
		target := []string{"be2", "be1"}[i%2]
		s, err := measureChange(client.NS, target, func() error {
			_, err := d.api.UpsertService(ctx, svc(target), 0)
			return err
		})
		if errors.Is(err, errEarlyLand) {
			cell.early++
			continue
		}
		if err != nil {
			return progCell{samples: cell.samples, err: err}
		}
		cell.samples = append(cell.samples, s)
	}
	return cell
}

// programmingKubeProxy measures the kube-proxy-shaped peer with n other
// services present: each change is the partial iptables-restore --noflush
// that kube-proxy runs when one service's endpoints change (the whole
// KUBE-SERVICES chain and the service's chains rewritten).
func (b *bench) programmingKubeProxy(ctx context.Context, n, samples int) progCell {
	lab, err := b.programmingLab(ctx)
	if err != nil {
		return progCell{err: err}
	}
	defer lab.Close()
	node := lab.Node(1)
	svcs := kubeProxyFillers(n, 5)
	ep := func(pod string) []netip.AddrPort {
		return []netip.AddrPort{netip.AddrPortFrom(lab.Pod(pod).IPv4(), 8080)}
	}
	svcs = append(svcs, kubeproxy.Service{Namespace: owner, Name: "prog", PortName: "http", VIP: progVIP.Addr(), Port: progVIP.Port(), Protocol: "tcp", Endpoints: ep("be1")})
	last := len(svcs) - 1
	if _, err := kubeproxy.Restore(ctx, node.Path(), kubeproxy.Full(svcs, clusterCIDR), false); err != nil {
		return progCell{err: fmt.Errorf("load %d kube-proxy services: %w", len(svcs), err)}
	}
	client := node.Pod("client")
	if _, _, err := load.Probe(client.NS, progVIP, "be1", time.Now().Add(landTimeout)); err != nil {
		return progCell{err: err}
	}
	var cell progCell
	for i := range samples {
		target := []string{"be2", "be1"}[i%2]
		old := svcs[last].Endpoints
		svcs[last].Endpoints = ep(target)
		rules := kubeproxy.Partial(svcs, last, old, clusterCIDR)
		s, err := measureChange(client.NS, target, func() error {
			_, err := kubeproxy.Restore(ctx, node.Path(), rules, true)
			return err
		})
		if errors.Is(err, errEarlyLand) {
			cell.early++
			continue
		}
		if err != nil {
			return progCell{samples: cell.samples, err: err}
		}
		cell.samples = append(cell.samples, s)
	}
	return cell
}

// clusterCIDR is the pod range the kube-proxy-shaped rules treat as
// in-cluster.
var clusterCIDR = netip.MustParsePrefix("198.18.0.0/16")

// errEarlyLand is a sample that measureChange cannot time: a probe that
// began before the change reached the new backend.
var errEarlyLand = errors.New("a probe begun before the change reached the new backend")

// measureChange probes the VIP from ns back to back until a connection
// reaches target, and makes the change as soon as the prober's goroutine
// runs: the change is sent from this goroutine, already running, so that
// land does not count the wake-up of a goroutine of the benchmark before
// the request leaves. (Letting the prober run for a while first measures
// mostly how the two share the CPUs: on this machine it doubled the
// unpinned p99 and did not change the pinned one.) It returns errEarlyLand when the first probe to reach target
// began before the change was sent (its connect() came after the change
// had landed): that sample says nothing and the caller drops it.
func measureChange(ns *netlab.NS, target string, change func() error) (progSample, error) {
	type probed struct {
		landed time.Time
		probes int
		err    error
	}
	running, done := make(chan struct{}), make(chan probed, 1)
	go func() {
		close(running)
		landed, probes, err := load.Probe(ns, progVIP, target, time.Now().Add(landTimeout))
		done <- probed{landed, probes, err}
	}()
	<-running
	start := time.Now()
	cerr := change()
	call := time.Since(start)
	p := <-done
	switch {
	case cerr != nil:
		return progSample{}, fmt.Errorf("change to %s: %w", target, cerr)
	case p.err != nil:
		return progSample{}, p.err
	case p.landed.Before(start):
		return progSample{}, errEarlyLand
	}
	return progSample{land: p.landed.Sub(start), call: call, probes: p.probes}, nil
}

// programmingSection measures network programming latency for both
// dataplanes and the kube-proxy-shaped peer.
func (b *bench) programmingSection(ctx context.Context) (*table, error) {
	samples := b.cfg.progSamples
	if progFlags.samples > 0 {
		samples = progFlags.samples
	}
	t := &table{
		title: "1. Network programming latency",
		intro: fmt.Sprintf("One service's backend moves between two pods, with N other services present (5 backends each). "+
			"**land** is from sending the change to the connect() of the first new connection that reached the new backend "+
			"(a client pod probes the VIP back to back, with fresh connections, starting as the change is sent; the change is sent by a goroutine of the benchmark that is already running, and a change that a probe begun before it reached is dropped); **call** is the request's own latency: "+
			"vipd's UpsertService RPC (the dataplane applied and the state saved with fdatasync), or for the kube-proxy-shaped peer the partial "+
			"`iptables-nft-restore --noflush` that kube-proxy runs for one changed service (KUBE-SERVICES and the service's chains rewritten). "+
			"p50/p99 over %d changes per cell (%d for iptables at 100,000 and the kube-proxy-shaped peer at 10,000: each change takes seconds there); ratios are of the p99 land time.", samples, min(samples, b.cfg.progSamplesSlow)),
		header: []string{"N present", "dataplane", "land p50", "land p99", "call p50", "call p99", "land p99 vs kube-proxy"},
	}
	pins, err := pinModes()
	if err != nil {
		return t, err
	}
	sizes := b.cfg.progSizes
	if len(progFlags.sizes) > 0 {
		sizes = progFlags.sizes
	}
	rows := []string{"ebpf", "ebpf pinned", "iptables", "kube-proxy"}
	rows = slices.DeleteFunc(rows, func(row string) bool {
		dp, pinned := strings.CutSuffix(row, " pinned")
		return !slices.Contains(strings.Split(progFlags.dataplanes, ","), dp) || (dp == "ebpf" && !slices.Contains(pins, pinned))
	})
	if slices.Contains(rows, "ebpf pinned") {
		t.note("**ebpf pinned**: the same measurement with vipd pinned to CPU %d and the benchmark's process (the prober, the backends and the API client) to CPU %d, so that the prober never takes vipd's CPU; the unpinned row is the one the targets use.", pinVipdCPU, pinBenchCPU)
	}
	var firstErr error
	for _, n := range sizes {
		cells := map[string]progCell{}
		for _, row := range rows {
			dp, pinned := strings.CutSuffix(row, " pinned")
			samples := samples
			if (dp == "iptables" && n >= 100_000) || (dp == "kube-proxy" && n >= 10_000) {
				samples = min(samples, b.cfg.progSamplesSlow)
			}
			if dp == "kube-proxy" && n > b.cfg.kubeProxyMax {
				t.note("kube-proxy-shaped peer not measured at %s services: loading its ruleset alone takes longer than this benchmark's budget (%s was the largest).", count(n), count(b.cfg.kubeProxyMax))
				continue
			}
			b.logf("programming: %s with %s services present, %d changes", row, count(n), samples)
			var c progCell
			if dp == "kube-proxy" {
				c = b.programmingKubeProxy(ctx, n, samples)
			} else {
				c = b.programmingVipd(ctx, dp, n, samples, pinned)
			}
			cells[row] = c
			if c.err != nil && firstErr == nil {
				firstErr = fmt.Errorf("programming %s at %d: %w", row, n, c.err)
			}
		}
		_, kp99, _, _ := cells["kube-proxy"].quantiles()
		for _, row := range rows {
			c, ok := cells[row]
			if !ok {
				continue
			}
			if c.err != nil {
				t.add(count(n), row, "error: "+oneLine(c.err))
				continue
			}
			if c.early > 0 {
				t.note("%s at %s: %d of the changes dropped, a probe begun before the change was sent reached the new backend.", row, count(n), c.early)
			}
			l50, l99, c50, c99 := c.quantiles()
			key := strings.ReplaceAll(row, " ", "-")
			b.figure(fmt.Sprintf("prog/%s/%d/land99", key, n), l99.Seconds())
			b.figure(fmt.Sprintf("prog/%s/%d/call99", key, n), c99.Seconds())
			b.logf("programming: %s at %s: land p50 %s p99 %s, call p50 %s p99 %s", row, count(n), ms(l50), ms(l99), ms(c50), ms(c99))
			t.add(count(n), row, ms(l50), ms(l99), ms(c50), ms(c99), ratio(l99.Seconds(), kp99.Seconds()))
		}
	}
	return t, firstErr
}
