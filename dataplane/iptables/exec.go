package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/internal/nsdo"
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

// tool names a binary of a mode and family: with kind "" the one that runs
// one command, such as iptables-nft or ip6tables-legacy, else the one of
// that kind ("restore" or "save"), such as iptables-nft-save.
func (m Mode) tool(f Family, kind string) string {
	name := "iptables-" + string(m)
	if f == IPv6 {
		name = "ip6tables-" + string(m)
	}
	if kind != "" {
		name += "-" + kind
	}
	return name
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

// listChain returns the rules of one chain of table t in family f, each as
// iptables-save prints what follows "-A <chain> ", and whether the chain
// exists. It asks for that chain alone (`iptables -S <chain>`), which
// iptables-nft reads without the rest of the table, so its cost does not
// grow with the number of services.
func (r runner) listChain(ctx context.Context, f Family, t Table, chain string) (rules []string, exists bool, err error) {
	out, err := r.run(ctx, nil, r.mode.tool(f, ""), "--wait", "-t", string(t), "-S", chain)
	if err != nil {
		var e *execError
		if errors.As(err, &e) && r.mode == ModeNFT && incompatible(e.stderr) {
			// Missing, or holding rules added with nft: ask nf_tables.
			_, exists, err := r.nftRules(f, t, chain)
			if err == nil && exists {
				err = fmt.Errorf("%s %s %s: %w", f, t, chain, errIncompatible)
			}
			return nil, exists, err
		}
		if errors.As(err, &e) && noSuchChain(e.stderr) {
			return nil, false, nil
		}
		return nil, false, err
	}
	prefix := "-A " + chain + " "
	for line := range strings.Lines(string(out)) {
		if rule, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), prefix); ok {
			rules = append(rules, rule)
		}
	}
	return rules, true, nil
}

// noSuchChain tells from an iptables command's stderr that the chain it
// named does not exist. iptables-nft 1.8.9 calls a missing chain
// "incompatible", as it calls one with nft-native rules (listChain tells
// them apart); legacy and later versions say "No chain/target/match".
func noSuchChain(stderr string) bool {
	return strings.Contains(stderr, "No chain/target/match by that name") ||
		strings.Contains(stderr, "is incompatible, use 'nft' tool")
}

// legacyTables lists the x_tables tables of family f that exist in the
// namespace, from /proc/net/ip_tables_names (ip6_tables_names), without
// touching them: x_tables creates a table in a namespace the first time a
// tool asks for it by name, even to list it.
func (r runner) legacyTables(f Family) ([]string, error) {
	// thread-self: /proc/self/net shows the main thread's namespace, not
	// the one this thread entered.
	path := "/proc/thread-self/net/ip_tables_names"
	if f == IPv6 {
		path = "/proc/thread-self/net/ip6_tables_names"
	}
	var names []byte
	err := nsdo.Do(r.netns, func() error {
		var err error
		names, err = os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil // the module is not loaded: no tables
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list legacy %s tables: %w", f, err)
	}
	return strings.Fields(string(names)), nil
}

// legacySupported checks, without creating a table, that the kernel can
// give the namespace x_tables tables of family f, which a working
// `iptables-legacy-save --version` does not show. It holds when the
// table list /proc/net/ip_tables_names (ip6_tables_names) exists (the
// module ip_tables, ip6_tables, is loaded or built in), or else when the
// module can be loaded: /sys/module has it, or the running kernel's
// modules.dep or modules.builtin under /lib/modules lists it (iptables-legacy
// loads it on first use).
func (r runner) legacySupported(f Family) error {
	module, path := "ip_tables", "/proc/thread-self/net/ip_tables_names"
	if f == IPv6 {
		module, path = "ip6_tables", "/proc/thread-self/net/ip6_tables_names"
	}
	var loaded bool
	err := nsdo.Do(r.netns, func() error {
		_, err := os.Stat(path)
		loaded = err == nil
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("check legacy %s support: %w", f, err)
	}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return fmt.Errorf("uname: %w", err)
	}
	if loaded || moduleAvailable("/sys/module", filepath.Join("/lib/modules", unix.ByteSliceToString(uts.Release[:])), module) {
		return nil
	}
	return fmt.Errorf("the kernel has no x_tables (legacy iptables) support for %s: module %s is neither loaded, "+
		"built in nor installed", f, module)
}

// moduleAvailable reports whether the kernel module name is loaded or built
// in with parameters (sysModule/name exists), or installed or built in for
// the kernel whose module directory is modDir (modules.dep or
// modules.builtin name it).
func moduleAvailable(sysModule, modDir, name string) bool {
	if _, err := os.Stat(filepath.Join(sysModule, name)); err == nil {
		return true
	}
	for _, list := range []string{"modules.dep", "modules.builtin"} {
		b, err := os.ReadFile(filepath.Join(modDir, list))
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(b)) {
			file, _, _ := strings.Cut(strings.TrimSpace(line), ":")
			base := filepath.Base(file)
			if base == name+".ko" || strings.HasPrefix(base, name+".ko.") {
				return true
			}
		}
	}
	return false
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
