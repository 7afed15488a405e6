// Command vipd-bench measures vipd against the direct path and a
// kube-proxy-shaped iptables ruleset, side by side in one run, and writes
// the tables as Markdown (bench/RESULTS.md for `make bench`).
//
// It measures network programming latency, full programming (time, RSS, BPF
// map memory), the data path (TCP connection rate, UDP request rate, bulk
// throughput), the TCP connection rate from outside through a node port,
// flow events (highest rate without loss, latency) and API
// throughput, for the eBPF and iptables dataplanes. Everything runs in
// throw-away netlab namespaces; vipd attaches its socket hooks to private
// cgroups and pins in private bpffs mounts, all removed at the end, on
// error and on SIGINT/SIGTERM.
//
//	vipd-bench [-quick] [-out FILE] [-vipd PATH] [-only SECTIONS]
//
// -quick runs small sizes of every measurement (under 3 minutes) and prints
// the tables; it exits non-zero if a measurement could not run, not for
// slowness. Root is required.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vipd/vipd/bench/load"
	"github.com/vipd/vipd/internal/testkit/netlab"
	"github.com/vipd/vipd/internal/testkit/testbin"
)

// config is the sizes and durations of one run.
type config struct {
	progSizes                    []int
	progSamples, progSamplesSlow int
	kubeProxyMax                 int
	fullSizes                    []int
	fullRuns, fullIptablesMax    int
	fullDataplanes               []string
	fullStream                   bool // sync by SyncServicesStream, not SyncServices
	fullTimeout                  time.Duration
	dataSizes                    []int
	dataRuns, workers            int
	tcpDuration, udpDuration     time.Duration
	bulkDuration                 time.Duration
	nodePortSize, nodePortRuns   int
	flowWorkers                  []int
	flowDuration                 time.Duration
	apiPresent, apiRuns          int
	apiClients                   []int
	apiDuration                  time.Duration
}

var fullConfig = config{
	progSizes: []int{0, 1_000, 10_000, 100_000}, progSamples: 200, progSamplesSlow: 30, kubeProxyMax: 10_000,
	fullSizes: []int{10_000, 100_000}, fullRuns: 5, fullIptablesMax: 10_000, fullTimeout: 20 * time.Minute,
	dataSizes: []int{1, 1_000, 10_000}, dataRuns: 5, workers: 16,
	tcpDuration: 3 * time.Second, udpDuration: 2 * time.Second, bulkDuration: 2 * time.Second,
	nodePortSize: 10_000, nodePortRuns: 3,
	flowWorkers: []int{1, 2, 4, 8, 16}, flowDuration: 3 * time.Second,
	apiPresent: 10_000, apiRuns: 5, apiClients: []int{1, 8}, apiDuration: 3 * time.Second,
}

var quickConfig = config{
	progSizes: []int{0, 1_000}, progSamples: 20, progSamplesSlow: 20, kubeProxyMax: 1_000,
	fullSizes: []int{1_000}, fullRuns: 1, fullIptablesMax: 1_000, fullTimeout: 5 * time.Minute,
	dataSizes: []int{1, 1_000}, dataRuns: 1, workers: 16,
	tcpDuration: time.Second, udpDuration: 500 * time.Millisecond, bulkDuration: 500 * time.Millisecond,
	nodePortSize: 100, nodePortRuns: 1,
	flowWorkers: []int{4}, flowDuration: time.Second,
	apiPresent: 1_000, apiRuns: 1, apiClients: []int{1, 8}, apiDuration: time.Second,
}

// sections are the measurements, in the order they run and are reported.
var sections = []string{"programming", "full", "datapath", "nodeport", "flows", "api"}

// bench is one run of the benchmarks.
type bench struct {
	cfg  config
	vipd string // the vipd binary
	// vipdArgs are added to every vipd's command line.
	vipdArgs []string
	work     string // a temporary directory for vipd's state, sockets and pins
	log      io.Writer
	tables   map[string][]*table
	// figures are the numbers the summary of targets reads, by key
	// ("prog/ebpf/10000/land99", seconds; see targets).
	mu      sync.Mutex
	figures map[string]float64
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "[%s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func main() {
	netlab.RunClientIfRequested()
	load.RunServersIfRequested()
	quick := flag.Bool("quick", false, "small sizes of every measurement, for a check that they all run (under 3 minutes)")
	out := flag.String("out", "", "write the Markdown report to this file too")
	vipdBin := flag.String("vipd", "", "the vipd binary (default: build ./cmd/vipd)")
	vipdArgs := flag.String("vipd-args", "", "extra arguments for every vipd, space-separated (for example \"--pprof --metrics-addr=127.0.0.1:9641\")")
	only := flag.String("only", strings.Join(sections, ","), "comma-separated sections to run: "+strings.Join(sections, ", "))
	flag.Var(&fullOverride.sizes, "full-sizes", "comma-separated service counts of the full section, instead of its defaults (for example 100000)")
	flag.IntVar(&fullOverride.runs, "full-runs", 0, "runs per size of the full section, instead of its default (0: default)")
	flag.StringVar(&fullOverride.dataplanes, "full-dataplanes", "ebpf,iptables", "comma-separated dataplanes of the full section")
	flag.BoolVar(&fullOverride.unary, "full-unary", false, "sync the full section with one SyncServices instead of SyncServicesStream")
	flag.Parse()
	if err := run(*quick, *out, *vipdBin, strings.Fields(*vipdArgs), strings.Split(*only, ",")); err != nil {
		fmt.Fprintln(os.Stderr, "vipd-bench:", err)
		os.Exit(1)
	}
}

func run(quick bool, out, vipdBin string, vipdArgs, only []string) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root: it builds network namespaces and runs vipd")
	}
	for _, s := range only {
		if !slices.Contains(sections, s) {
			return fmt.Errorf("unknown section %q (have %s)", s, strings.Join(sections, ", "))
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()

	started := time.Now()
	b := &bench{cfg: fullConfig, log: os.Stderr, vipd: vipdBin, vipdArgs: vipdArgs, tables: map[string][]*table{}, figures: map[string]float64{}}
	if quick {
		b.cfg = quickConfig
	}
	fullOverride.apply(&b.cfg)
	work, err := os.MkdirTemp("", "vipd-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	b.work = work
	if b.vipd == "" {
		dir, cleanup, err := testbin.Build(false, "./cmd/vipd")
		if err != nil {
			return err
		}
		defer cleanup()
		b.vipd = filepath.Join(dir, "vipd")
	}

	var errs []error
	for _, s := range sections {
		if !slices.Contains(only, s) {
			continue
		}
		if ctx.Err() != nil {
			errs = append(errs, ctx.Err())
			break
		}
		var ts []*table
		var err error
		switch s {
		case "programming":
			var t *table
			t, err = b.programmingSection(ctx)
			ts = []*table{t}
		case "full":
			var t *table
			t, err = b.fullSection(ctx)
			ts = []*table{t}
		case "datapath":
			ts, err = b.dataSection(ctx)
		case "nodeport":
			var t *table
			t, err = b.nodePortSection(ctx)
			ts = []*table{t}
		case "flows":
			var t *table
			t, err = b.flowSection(ctx)
			ts = []*table{t}
		case "api":
			var t *table
			t, err = b.apiSection(ctx)
			ts = []*table{t}
		}
		b.tables[s] = ts
		for _, t := range ts {
			t.markdown(os.Stdout)
		}
		if err != nil {
			b.logf("%s: %v", s, err)
			errs = append(errs, fmt.Errorf("%s: %w", s, err))
		}
	}

	if out != "" {
		f, err := os.Create(out)
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		b.report(f, quick, only, started)
		if err := f.Close(); err != nil {
			errs = append(errs, err)
		}
		b.logf("wrote %s", out)
	}
	if len(errs) > 0 {
		return fmt.Errorf("some measurements could not run: %w", errors.Join(errs...))
	}
	return nil
}

// oneLine shortens err to one line for a table cell.
func oneLine(err error) string {
	s := strings.ReplaceAll(err.Error(), "\n", " ")
	s = strings.ReplaceAll(s, "|", "/")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
