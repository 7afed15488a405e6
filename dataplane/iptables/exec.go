package iptables

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// Mode is the iptables backend: the nf_tables-based binaries or the legacy
// x_tables ones.
type Mode string

// Modes. ModeAuto picks one at start-up; see resolveMode.
const (
	ModeAuto   Mode = "auto"
	ModeNFT    Mode = "nft"
	ModeLegacy Mode = "legacy"
)

// ParseMode parses an --iptables-mode value.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeAuto, ModeNFT, ModeLegacy:
		return m, nil
	}
	return "", fmt.Errorf("iptables mode %q: use auto, nft or legacy", s)
}

// tool names the binary of one kind ("restore" or "save") for a mode and family.
func (m Mode) tool(f Family, kind string) string {
	prefix := "iptables"
	if f == IPv6 {
		prefix = "ip6tables"
	}
	return fmt.Sprintf("%s-%s-%s", prefix, m, kind)
}

// runner runs the iptables tools inside one network namespace.
type runner struct {
	// netns is the namespace's path; empty means the current namespace.
	netns string
	mode  Mode
}

// run executes name with args and stdin inside the namespace, returning stdout.
// The error carries stderr.
func (r runner) run(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	if r.netns != "" {
		args = append([]string{"--net=" + r.netns, "--", name}, args...)
		name = "nsenter"
	}
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), &execError{cmd: name + " " + strings.Join(args, " "), err: err, stderr: stderr.String()}
	}
	return stdout.Bytes(), nil
}

// save returns iptables-save output of every table of family f.
func (r runner) save(ctx context.Context, f Family) ([]byte, error) {
	return r.run(ctx, nil, r.mode.tool(f, "save"))
}

// saveTable returns iptables-save output of one table of family f.
func (r runner) saveTable(ctx context.Context, f Family, table string) ([]byte, error) {
	return r.run(ctx, nil, r.mode.tool(f, "save"), "-t", table)
}

// restore feeds payload to iptables-restore --noflush for family f.
func (r runner) restore(ctx context.Context, f Family, payload []byte) error {
	_, err := r.run(ctx, payload, r.mode.tool(f, "restore"), "--noflush", "--wait")
	if err != nil {
		if e, ok := err.(*execError); ok {
			e.context = FailureContext(payload, e.stderr)
		}
		return err
	}
	return nil
}

// execError is a failed tool run, with its stderr and, for restores, the
// payload lines around the failing one.
type execError struct {
	cmd, stderr, context string
	err                  error
}

func (e *execError) Error() string {
	msg := fmt.Sprintf("%s: %v: %s", e.cmd, e.err, strings.TrimSpace(e.stderr))
	if e.context != "" {
		msg += "\n" + e.context
	}
	return msg
}

func (e *execError) Unwrap() error { return e.err }
