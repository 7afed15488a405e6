package soak

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/testkit/childproc"
	"github.com/vipd/vipd/internal/testkit/procstat"
	"github.com/vipd/vipd/internal/testkit/syncbuf"
)

// VipdConfig says how to run vipd.
type VipdConfig struct {
	// Bin is the vipd binary.
	Bin string
	// Dataplane is "ebpf" or "iptables".
	Dataplane string
	// NetNS is the path of the node namespace vipd programs.
	NetNS string
	// Dir holds the socket, the state directory and (eBPF) the bpffs
	// mount point. Keep it short: the socket path must fit in sun_path.
	Dir string
	// Cgroup is the cgroup v2 directory the eBPF socket hooks attach to.
	Cgroup string
	// Args are extra flags, after the defaults (which they may override).
	Args []string
}

// Vipd is one vipd process at a time, on a fixed socket, state directory
// and bpffs, so that it can be killed and started again over the same
// state. It logs JSON at debug level into a buffer that survives restarts.
// Its methods are safe for concurrent use.
type Vipd struct {
	cfg VipdConfig
	// Socket, StateDir and BPFFS are where this vipd keeps its things.
	Socket, StateDir, BPFFS string

	log syncbuf.Buffer

	mu       sync.Mutex
	proc     *os.Process
	exited   chan struct{} // closed when proc has exited
	runStart int           // offset in log of the current (or last) run
	starts   int
}

// NewVipd prepares a vipd; Start runs it.
func NewVipd(cfg VipdConfig) *Vipd {
	return &Vipd{
		cfg:      cfg,
		Socket:   filepath.Join(cfg.Dir, "vipd.sock"),
		StateDir: filepath.Join(cfg.Dir, "state"),
		BPFFS:    filepath.Join(cfg.Dir, "bpf"),
	}
}

// Args returns the command line of vipd run, flags first.
func (v *Vipd) Args() []string {
	args := []string{"run", "--dataplane", v.cfg.Dataplane, "--netns", v.cfg.NetNS,
		"--socket", v.Socket, "--state-dir", v.StateDir, "--log-level", "debug", "--log-json",
		// The kernel picks the port; MetricsAddr reads it from the log.
		"--metrics-addr", "127.0.0.1:0",
		"--iptables-mode", "nft",
	}
	if v.cfg.Dataplane == "ebpf" {
		args = append(args, "--cgroup-path", v.cfg.Cgroup, "--bpffs", v.BPFFS,
			// Small maps: the defaults cost the kernel hundreds of MiB.
			"--bpf-lb-map-max", "262144", "--bpf-backend-map-max", "16384", "--bpf-ct-map-max", "131072",
			"--bpf-affinity-map-max", "4096", "--bpf-sock-map-max", "4096",
			// No collector running while CheckKernel reads the maps.
			"--bpf-ct-gc-interval", "1h")
	}
	return append(args, v.cfg.Args...)
}

// Start starts vipd; it does not wait for it to be ready (WaitReady).
// vipd dies with the test process, even on a go test timeout.
func (v *Vipd) Start() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.proc != nil {
		return errors.New("start vipd: already running")
	}
	v.starts++
	v.runStart = len(v.log.String())
	fmt.Fprintf(&v.log, "=== start %d of vipd at %s\n", v.starts, time.Now().Format(time.StampMilli))
	cmd := exec.Command(v.cfg.Bin, v.Args()...)
	cmd.Stdout, cmd.Stderr = &v.log, &v.log
	waited, err := childproc.Start(cmd)
	if err != nil {
		return fmt.Errorf("start vipd: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		err := <-waited
		fmt.Fprintf(&v.log, "=== vipd exited at %s: %v\n", time.Now().Format(time.StampMilli), err)
		close(exited)
	}()
	v.proc, v.exited = cmd.Process, exited
	return nil
}

// WaitReady waits until vipd's health check says SERVING, through a
// connection of its own, and fails if vipd exits first.
func (v *Vipd) WaitReady(timeout time.Duration) error {
	v.mu.Lock()
	exited := v.exited
	v.mu.Unlock()
	if exited == nil {
		return errors.New("wait for vipd: not started")
	}
	api, err := NewClient(v.Socket)
	if err != nil {
		return err
	}
	defer api.Close()
	if err := childproc.WaitReady(exited, timeout, api.WaitServing); err != nil {
		return fmt.Errorf("vipd: %w", err)
	}
	return nil
}

// Kill9 kills vipd with SIGKILL and waits until it has exited. It does
// nothing if vipd is not running.
func (v *Vipd) Kill9() {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.proc == nil {
		return
	}
	v.proc.Signal(syscall.SIGKILL)
	<-v.exited
	v.proc = nil
}

// Stop is Kill9, for cleanups: vipd leaves the kernel programmed either way.
func (v *Vipd) Stop() { v.Kill9() }

// Pid is the running vipd's pid, or 0.
func (v *Vipd) Pid() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.proc == nil {
		return 0
	}
	return v.proc.Pid
}

// Log returns everything vipd wrote, over all its runs.
func (v *Vipd) Log() string { return v.log.String() }

// LogTail returns the last n lines vipd wrote.
func (v *Vipd) LogTail(n int) string {
	lines := strings.SplitAfter(v.log.String(), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "")
}

// LogEntry is one JSON log line of vipd (hclog's fields: @message,
// @module, @level, and the line's own keys).
type LogEntry map[string]any

// Message is the entry's @message.
func (e LogEntry) Message() string { s, _ := e["@message"].(string); return s }

// Module is the entry's @module, such as "dataplane.iptables".
func (e LogEntry) Module() string { s, _ := e["@module"].(string); return s }

// Entries returns the JSON log entries of the current (or last) run of
// vipd, oldest first; lines that are not JSON are skipped.
func (v *Vipd) Entries() []LogEntry {
	v.mu.Lock()
	from := v.runStart
	v.mu.Unlock()
	return parseEntries(v.log.String()[from:])
}

func parseEntries(s string) []LogEntry {
	var out []LogEntry
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 || line[0] != '{' {
			continue
		}
		var e LogEntry
		if json.Unmarshal(line, &e) == nil {
			out = append(out, e)
		}
	}
	return out
}

// MetricsAddr is the address of the current run's metrics listener, as
// vipd logged it.
func (v *Vipd) MetricsAddr() (string, error) {
	for _, e := range v.Entries() {
		if e.Message() == "serving metrics and health" {
			if a, ok := e["addr"].(string); ok {
				return a, nil
			}
		}
	}
	return "", errors.New("vipd has not logged its metrics address")
}

// Metric returns the value of one series of vipd's /metrics, named as the
// exposition format spells it: `vipd_sync_errors_total`, or with its
// labels in order, `vipd_flow_events_lost_total{source="subscriber"}`.
func (v *Vipd) Metric(series string) (float64, error) {
	addr, err := v.MetricsAddr()
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("get vipd metrics: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("read vipd metrics: %w", err)
	}
	return metricValue(string(body), series)
}

// metricValue finds series in Prometheus text exposition.
func metricValue(text, series string) (float64, error) {
	for line := range strings.Lines(text) {
		rest, ok := strings.CutPrefix(line, series+" ")
		if !ok {
			continue
		}
		return strconv.ParseFloat(strings.TrimSpace(rest), 64)
	}
	return 0, fmt.Errorf("no series %s in vipd's metrics", series)
}

// PeakRSS returns the running vipd's peak resident memory (VmHWM), in bytes.
func (v *Vipd) PeakRSS() (int64, error) {
	pid := v.Pid()
	if pid == 0 {
		return 0, errors.New("vipd is not running")
	}
	return procstat.StatusBytes(pid, "VmHWM")
}

// NewClient returns an API client for the vipd at socket that tries each
// call once (a test decides what a failure means) and reconnects within a
// quarter second once vipd is back, rather than after gRPC's default
// backoff of up to minutes.
func NewClient(socket string, opts ...client.Option) (*client.Client, error) {
	opts = append([]client.Option{client.WithMaxAttempts(1), client.WithTimeout(time.Minute),
		client.WithDialOptions(fastReconnect)}, opts...)
	api, err := client.New("unix://"+socket, opts...)
	if err != nil {
		return nil, fmt.Errorf("vipd client: %w", err)
	}
	return api, nil
}

// fastReconnect retries a lost connection to vipd every 20 to 250 ms.
var fastReconnect = grpc.WithConnectParams(grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 250 * time.Millisecond},
	MinConnectTimeout: 2 * time.Second,
})
