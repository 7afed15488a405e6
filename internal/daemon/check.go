package daemon

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strings"
	"time"
	"unicode"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane/ebpf/maglev"
	"github.com/vipd/vipd/server/validation"
)

// Check refuses a Config that makes no sense, before anything is opened:
// a negative limit (every --max-* limit takes 0 for no limit), a flow
// buffer below 1, a negative period or timeout, a socket mode that gives
// others any permission or sets bits beyond rwx, and a negative --gc-percent
// with no memory limit (the heap would grow without bound). With a
// dataplane that may be eBPF (ebpf, auto) it also refuses eBPF settings the
// dataplane cannot use (see checkEBPF). A --nodeport-addresses entry that
// is not a CIDR and an --external-interfaces glob that path.Match refuses
// are errors too. Each problem is reported, naming
// its flag.
func (c Config) Check() error {
	var errs []error
	for _, l := range []struct {
		flag string
		n    int
	}{
		{"--max-backends", c.MaxBackends},
		{"--max-ports", c.MaxPorts},
		{"--max-services", c.MaxServices},
		{"--max-total-backends", c.MaxTotalBackends},
		{"--max-inflight-requests", c.Limits.MaxInflightRequests},
		{"--max-flow-watchers", c.Limits.MaxFlowWatchers},
		{"--max-recv-msg-size", c.MaxRecvMsgSize},
	} {
		if l.n < 0 {
			errs = append(errs, fmt.Errorf("%s %d: a limit cannot be negative (0: no limit)", l.flag, l.n))
		}
	}
	if c.ServicesDir != "" {
		if fi, err := os.Stat(c.ServicesDir); err != nil {
			errs = append(errs, fmt.Errorf("--services-dir: %w", err))
		} else if !fi.IsDir() {
			errs = append(errs, fmt.Errorf("--services-dir %s: not a directory", c.ServicesDir))
		}
	}
	errs = append(errs, c.checkNodeNet()...)
	if len(c.Zone) > validation.MaxZoneLength || strings.ContainsFunc(c.Zone, unicode.IsControl) {
		errs = append(errs, fmt.Errorf("--zone %q: at most %d characters, without control characters", c.Zone, validation.MaxZoneLength))
	}
	if c.FlowBuffer < 1 {
		errs = append(errs, fmt.Errorf("--flow-buffer %d: each WatchFlows stream needs room for at least 1 event", c.FlowBuffer))
	}
	for _, d := range []struct {
		flag string
		d    time.Duration
	}{
		{"--resync-period", c.ResyncPeriod},
		{"--drift-check-period", c.DriftCheckPeriod},
		{"--shutdown-timeout", c.ShutdownTimeout},
		// The eBPF ones whatever the dataplane: negative is never meant.
		{"--bpf-ct-gc-interval", c.EBPF.GCInterval},
		{"--bpf-ct-timeout-tcp-syn", c.EBPF.ConntrackTimeouts.TCPSyn},
		{"--bpf-ct-timeout-tcp", c.EBPF.ConntrackTimeouts.TCPEstablished},
		{"--bpf-ct-timeout-tcp-close", c.EBPF.ConntrackTimeouts.TCPClose},
		{"--bpf-ct-timeout-other", c.EBPF.ConntrackTimeouts.Other},
	} {
		if d.d < 0 {
			errs = append(errs, fmt.Errorf("%s %v: cannot be negative", d.flag, d.d))
		}
	}
	if c.Dataplane == DataplaneEBPF || c.Dataplane == DataplaneAuto {
		errs = append(errs, c.checkEBPF()...)
	}
	if c.Memory.GCPercent < 0 && c.Memory.Limit == 0 && debug.SetMemoryLimit(-1) == math.MaxInt64 {
		errs = append(errs, fmt.Errorf("--gc-percent %d turns the proportional collector off, and there is no memory limit (--memory-limit or GOMEMLIMIT): "+
			"the heap would grow without bound", c.Memory.GCPercent))
	}
	switch {
	case c.SocketMode&^os.ModePerm != 0:
		errs = append(errs, fmt.Errorf("--socket-mode %#o: only permission bits (at most 0777) apply to a socket", uint32(c.SocketMode)))
	case c.SocketMode&0o007 != 0:
		errs = append(errs, fmt.Errorf("--socket-mode %#o lets every user on the node change every service: give others no permission (such as 0660)", uint32(c.SocketMode)))
	}
	return errors.Join(errs...)
}

// checkEBPF refuses eBPF settings that the dataplane would reject only
// once it opens, or that would break it later: a conntrack lifetime or
// collection interval that is not positive (a 0 from a flag is not taken
// as "the default": the flags' defaults are not zero, so a 0 was typed),
// a Maglev table size that is not a prime >= 3, a map size of 0, and an
// event ring that is not a power of two of at least the page size.
func (c Config) checkEBPF() []error {
	var errs []error
	for _, d := range []struct {
		flag string
		d    time.Duration
	}{
		{"--bpf-ct-gc-interval", c.EBPF.GCInterval},
		{"--bpf-ct-timeout-tcp-syn", c.EBPF.ConntrackTimeouts.TCPSyn},
		{"--bpf-ct-timeout-tcp", c.EBPF.ConntrackTimeouts.TCPEstablished},
		{"--bpf-ct-timeout-tcp-close", c.EBPF.ConntrackTimeouts.TCPClose},
		{"--bpf-ct-timeout-other", c.EBPF.ConntrackTimeouts.Other},
	} {
		if d.d == 0 {
			errs = append(errs, fmt.Errorf("%s 0: must be positive", d.flag))
		}
	}
	if m := c.EBPF.MaglevTableSize; m < 3 || !maglev.IsPrime(m) {
		errs = append(errs, fmt.Errorf("--maglev-table-size %d: must be a prime >= 3 (such as %d)", m, maglev.DefaultTableSize))
	}
	for _, m := range []struct {
		flag string
		n    uint32
	}{
		{"--bpf-lb-map-max", c.EBPF.Maps.LB},
		{"--bpf-backend-map-max", c.EBPF.Maps.Backends},
		{"--bpf-ct-map-max", c.EBPF.Maps.Conntrack},
		{"--bpf-affinity-map-max", c.EBPF.Maps.Affinity},
		{"--bpf-sock-map-max", c.EBPF.Maps.Sockets},
	} {
		if m.n == 0 {
			errs = append(errs, fmt.Errorf("%s 0: a map needs at least 1 entry", m.flag))
		}
	}
	if n, page := c.EBPF.Maps.Events, uint32(os.Getpagesize()); n < page || n&(n-1) != 0 {
		errs = append(errs, fmt.Errorf("--bpf-events-map-max %d: must be a power of two of at least the page size (%d)", n, page))
	}
	return errs
}

// socketMode is the Unix socket's file mode: SocketMode, or when that is
// 0, 0660 with a SocketGroup (its members are vipd's clients) and 0600
// without one (vipd's own group is not told to be its clients).
func (c Config) socketMode() os.FileMode {
	switch {
	case c.SocketMode != 0:
		return c.SocketMode
	case c.SocketGroup != "":
		return 0o660
	}
	return 0o600
}

// warnUnsafe logs what Check lets pass but is likely a mistake.
func (c Config) warnUnsafe(log hclog.Logger) {
	if c.socketMode()&0o020 != 0 && c.SocketGroup == "" {
		log.Warn("the socket is group-writable but --socket-group is not set: every member of vipd's own group may change every service; "+
			"set --socket-group to the group of vipd's clients, or --socket-mode 0600", "socket_mode", fmt.Sprintf("%#o", uint32(c.socketMode())), "gid", os.Getegid())
	}
}
