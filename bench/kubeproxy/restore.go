package kubeproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/vipd/vipd/internal/nsdo"
)

// restoreTool is the binary kube-proxy runs in iptables mode on an
// nf_tables host.
const restoreTool = "iptables-nft-restore"

// Restore pipes rules into iptables-nft-restore inside the network
// namespace at nsPath, with kube-proxy's flags (--wait, --counters) plus
// --noflush when noflush is set, and returns how long the restore process
// ran (wall time). It refuses an empty nsPath, and a path to its own
// process's or init's network namespace, so that a mistake cannot touch the
// root namespace's rules.
//
// The tool is started from a thread inside the namespace, so the time
// covers iptables-nft-restore alone, process start included. The error of
// a failed restore carries its stderr and the payload lines around the
// line it names.
func Restore(ctx context.Context, nsPath string, rules []byte, noflush bool) (time.Duration, error) {
	t, err := RestoreTimes(ctx, nsPath, rules, noflush)
	return t.Wall, err
}

// Times are the wall and CPU times of one restore process. On a shared
// machine the CPU times are the steadier figure.
type Times struct {
	Wall, User, System time.Duration
}

// RestoreTimes is Restore, returning the restore process's CPU times too.
func RestoreTimes(ctx context.Context, nsPath string, rules []byte, noflush bool) (Times, error) {
	if err := checkPrivate(nsPath); err != nil {
		return Times{}, err
	}
	// kube-proxy's restore flags: -w 5 -W 100000 (utiliptables'
	// restoreWaitFlag), then --noflush and --counters.
	args := []string{"-w", "5", "-W", "100000"}
	if noflush {
		args = append(args, "--noflush")
	}
	args = append(args, "--counters")
	var (
		t      Times
		stderr bytes.Buffer
	)
	err := nsdo.Do(nsPath, func() error {
		// A child inherits the network namespace of the thread that
		// starts it, and nsdo.Do runs f on a thread locked in nsPath.
		cmd := exec.CommandContext(ctx, restoreTool, args...)
		cmd.Stdin = bytes.NewReader(rules)
		cmd.Stderr = &stderr
		start := time.Now()
		err := cmd.Run()
		t.Wall = time.Since(start)
		if cmd.ProcessState != nil {
			t.User, t.System = cmd.ProcessState.UserTime(), cmd.ProcessState.SystemTime()
		}
		return err
	})
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if fc := failureContext(rules, msg); fc != "" {
			msg += "\n" + fc
		}
		return t, fmt.Errorf("%s %s in %s: %w: %s", restoreTool, strings.Join(args, " "), nsPath, err, msg)
	}
	return t, nil
}

// checkPrivate returns an error unless nsPath names a network namespace
// that is neither this process's nor init's.
func checkPrivate(nsPath string) error {
	if nsPath == "" {
		return errors.New("restore kube-proxy rules: no network namespace given")
	}
	target, err := os.Stat(nsPath)
	if err != nil {
		return fmt.Errorf("restore kube-proxy rules: %w", err)
	}
	for _, own := range []string{"/proc/self/ns/net", "/proc/1/ns/net"} {
		if fi, err := os.Stat(own); err == nil && os.SameFile(fi, target) {
			return fmt.Errorf("restore kube-proxy rules: %s is the namespace of %s, not a private one", nsPath, own)
		}
	}
	return nil
}

var failedLine = regexp.MustCompile(`line (\d+) failed`)

// failureContext returns the payload lines around the one that
// iptables-restore's error output names, numbered, the failing one marked,
// as kube-proxy logs them; "" when the output names no line. (It is kept
// apart from vipd's own copy so that this peer does not depend on the
// dataplane it is compared with.)
func failureContext(payload []byte, stderr string) string {
	m := failedLine.FindStringSubmatch(stderr)
	if m == nil {
		return ""
	}
	n, _ := strconv.Atoi(m[1])
	lines := strings.Split(strings.TrimSuffix(string(payload), "\n"), "\n")
	var b strings.Builder
	for i := max(1, n-3); i <= min(len(lines), n+3); i++ {
		mark := "  "
		if i == n {
			mark = "> "
		}
		fmt.Fprintf(&b, "%s%d: %s\n", mark, i, lines[i-1])
	}
	return b.String()
}
