package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/vipd/vipd/internal/testkit/netlab"
)

// fullRun is one full programming of N services × 10 backends: by
// SyncServices from empty, then by a restart that restores the state dir.
type fullRun struct {
	sync, restart       time.Duration
	syncRSS, restartRSS int64
	mapMem              int64
	// idleCPU is the share of one CPU the restarted vipd used while
	// nothing happened (fullIdleWait after ready, for fullIdleSpan).
	idleCPU float64
}

// fullIdleWait and fullIdleSpan place the idle CPU measurement after a
// restart: past the start's own work, long enough for vipd's periodic
// checks to show.
const (
	fullIdleWait = time.Second
	fullIdleSpan = 5 * time.Second
)

// fullProgramming runs vipd with dataplane dp on an empty node, syncs n
// services × 10 backends, restarts it, and measures both.
func (b *bench) fullProgramming(ctx context.Context, dp string, n int) (run fullRun, err error) {
	lab, err := netlab.Build(ctx, netlab.Spec{}, nil)
	if err != nil {
		return run, err
	}
	defer lab.Close()
	d, err := newDaemon(b.vipd, b.vipdArgs, dp, lab.Node(1), b.work)
	if err != nil {
		return run, err
	}
	defer func() {
		if cerr := d.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	if _, err := d.start(); err != nil {
		return run, err
	}
	svcs := fillers(n, 10)
	sctx, cancel := context.WithTimeout(ctx, b.cfg.fullTimeout)
	defer cancel()
	start := time.Now()
	sync := d.api.SyncServicesStream
	if !b.cfg.fullStream {
		sync = d.api.SyncServices
	}
	if _, err := sync(sctx, owner, svcs); err != nil {
		return run, fmt.Errorf("sync %d services: %w", n, err)
	}
	run.sync = time.Since(start)
	svcs = nil
	if run.syncRSS, err = d.peakRSS(); err != nil {
		return run, err
	}
	if dp == "ebpf" {
		if run.mapMem, err = d.mapMemory(); err != nil {
			return run, err
		}
	}
	if err := d.stop(); err != nil {
		return run, err
	}
	if run.restart, err = d.start(); err != nil {
		return run, fmt.Errorf("restart: %w", err)
	}
	st, err := d.api.Status(ctx)
	if err != nil {
		return run, err
	}
	if int(st.GetServices()) != n {
		return run, fmt.Errorf("restarted vipd has %d services, want %d", st.GetServices(), n)
	}
	if run.restartRSS, err = d.peakRSS(); err != nil {
		return run, err
	}
	time.Sleep(fullIdleWait)
	cpu0, err := d.cpuTime()
	if err != nil {
		return run, err
	}
	began := time.Now()
	time.Sleep(fullIdleSpan)
	cpu1, err := d.cpuTime()
	if err != nil {
		return run, err
	}
	if err := ctx.Err(); err != nil {
		return run, err
	}
	run.idleCPU = (cpu1 - cpu0).Seconds() / time.Since(began).Seconds()
	return run, nil
}

// fullSection measures full programming for both dataplanes.
func (b *bench) fullSection(ctx context.Context) (*table, error) {
	t := &table{
		title: "2. Full programming",
		intro: fmt.Sprintf("From an empty node to N services × 10 backends: one %s (until it returns: applied and saved), "+
			"then a restart of vipd on the same state dir (SIGTERM, start, until GetStatus says ready: the restored state applied over what the kernel kept). "+
			"RSS is vipd's peak resident memory (VmHWM) during each; BPF map memory is what the kernel charges for vipd's maps (fdinfo memlock); "+
			"idle CPU is the share of one CPU the restarted vipd used from %s to %s after it was ready, with nothing changing and no traffic (its periodic checks, the flow-event reader). "+
			"Median (min–max) of %d runs.", b.fullSyncName(), fullIdleWait, fullIdleWait+fullIdleSpan, b.cfg.fullRuns),
		header: []string{"N × 10", "dataplane", "SyncServices", "peak RSS", "restart to ready", "peak RSS (restart)", "BPF map memory", "idle CPU"},
	}
	var firstErr error
	for _, n := range b.cfg.fullSizes {
		for _, dp := range b.cfg.fullDataplanes {
			runs := b.cfg.fullRuns
			if dp == "iptables" && n > b.cfg.fullIptablesMax {
				t.note("iptables not measured at %s × 10: SyncServices takes about a minute, but a restart does not become ready: its full sync diffs against iptables-nft-save, and iptables-nft-save 1.8.9 crashes (SIGSEGV, after about 2 minutes) on that ruleset of about 1.35 million rules; the old rules keep forwarding while vipd retries.", count(n))
				continue
			}
			var rs []fullRun
			var err error
			for r := range runs {
				b.logf("full programming: %s, %s × 10, run %d/%d", dp, count(n), r+1, runs)
				var run fullRun
				if run, err = b.fullProgramming(ctx, dp, n); err != nil {
					break
				}
				rs = append(rs, run)
			}
			if err != nil {
				if firstErr == nil {
					firstErr = fmt.Errorf("full programming %s at %d: %w", dp, n, err)
				}
				t.add(count(n), dp, "error: "+oneLine(err))
				continue
			}
			col := func(f func(fullRun) float64) spread {
				var xs []float64
				for _, r := range rs {
					xs = append(xs, f(r))
				}
				return spreadOf(xs)
			}
			b.figure(fmt.Sprintf("full/%s/%d/sync", dp, n), col(func(r fullRun) float64 { return r.sync.Seconds() }).med)
			b.figure(fmt.Sprintf("full/%s/%d/rss", dp, n), col(func(r fullRun) float64 { return float64(r.syncRSS) }).med)
			b.figure(fmt.Sprintf("full/%s/%d/restart", dp, n), col(func(r fullRun) float64 { return r.restart.Seconds() }).med)
			b.figure(fmt.Sprintf("full/%s/%d/restart-rss", dp, n), col(func(r fullRun) float64 { return float64(r.restartRSS) }).med)
			b.figure(fmt.Sprintf("full/%s/%d/idle-cpu", dp, n), col(func(r fullRun) float64 { return r.idleCPU }).med)
			mapMem := "–"
			if dp == "ebpf" {
				mapMem = col(func(r fullRun) float64 { return float64(r.mapMem) }).format(fmtMiB)
			}
			t.add(count(n), dp,
				col(func(r fullRun) float64 { return r.sync.Seconds() }).format(fmtSec),
				col(func(r fullRun) float64 { return float64(r.syncRSS) }).format(fmtMiB),
				col(func(r fullRun) float64 { return r.restart.Seconds() }).format(fmtSec),
				col(func(r fullRun) float64 { return float64(r.restartRSS) }).format(fmtMiB),
				mapMem,
				col(func(r fullRun) float64 { return r.idleCPU }).format(fmtPercent))
		}
	}
	return t, firstErr
}

// fullSyncName names the call the full section syncs with.
func (b *bench) fullSyncName() string {
	if b.cfg.fullStream {
		return "SyncServicesStream (chunks of 1,000 services)"
	}
	return "SyncServices RPC"
}

// fullFlags are the command line's overrides of the full section's sizes,
// runs and dataplanes (to measure one size alone).
type fullFlags struct {
	sizes      intList
	runs       int
	dataplanes string
	unary      bool
}

var fullOverride fullFlags

func (f fullFlags) apply(c *config) {
	if len(f.sizes) > 0 {
		c.fullSizes = f.sizes
	}
	if f.runs > 0 {
		c.fullRuns = f.runs
	}
	c.fullDataplanes = strings.Split(f.dataplanes, ",")
	c.fullStream = !f.unary
}

// intList is a flag of comma-separated integers.
type intList []int

func (l *intList) String() string { return fmt.Sprint([]int(*l)) }

func (l *intList) Set(s string) error {
	*l = nil
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return fmt.Errorf("%q: %w", f, err)
		}
		*l = append(*l, n)
	}
	return nil
}
