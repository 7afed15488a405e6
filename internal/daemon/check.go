package daemon

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Check refuses a Config that makes no sense, before anything is opened:
// a negative limit (every --max-* limit takes 0 for no limit), a flow
// buffer below 1, a negative period or timeout, and a socket mode that
// gives others any permission or sets bits beyond rwx. Each problem is
// reported, naming its flag.
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
	} {
		if d.d < 0 {
			errs = append(errs, fmt.Errorf("%s %v: cannot be negative", d.flag, d.d))
		}
	}
	switch {
	case c.SocketMode&^os.ModePerm != 0:
		errs = append(errs, fmt.Errorf("--socket-mode %#o: only permission bits (at most 0777) apply to a socket", uint32(c.SocketMode)))
	case c.SocketMode&0o007 != 0:
		errs = append(errs, fmt.Errorf("--socket-mode %#o lets every user on the node change every service: give others no permission (such as 0660)", uint32(c.SocketMode)))
	}
	return errors.Join(errs...)
}

// warnUnsafe logs what Check lets pass but is likely a mistake.
func (c Config) warnUnsafe(log hclog.Logger) {
	if c.SocketMode&0o020 != 0 && c.SocketGroup == "" {
		log.Warn("the socket is group-writable but --socket-group is not set: every member of vipd's own group may change every service; "+
			"set --socket-group to the group of vipd's clients, or --socket-mode 0600", "socket_mode", fmt.Sprintf("%#o", uint32(c.SocketMode)), "gid", os.Getegid())
	}
}
