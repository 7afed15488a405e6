package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/server/store"
)

// recoverMarker is the file, in the state directory, that says a --recover
// start has moved an unreadable state aside and has not had its first
// SyncServices yet. While it exists the (empty) state on disk is not the
// control plane's, so a start without --recover refuses rather than apply
// it, and a start with --recover holds again.
const recoverMarker = "recover-pending"

// restore loads the desired state from dir, the open state directory
// cfg.StateDir, by the rules Run documents for an unreadable state and for
// --recover. It returns the snapshot to start from and, when the dataplane
// must be held until the first SyncServices, why; an empty holdReason means
// apply the snapshot as usual.
func restore(log hclog.Logger, cfg Config, dir *store.Dir) (snap *store.Snapshot, holdReason string, err error) {
	pending, err := markerExists(cfg.StateDir)
	if err != nil {
		return nil, "", err
	}
	snap, err = dir.Load()
	switch {
	case errors.Is(err, store.ErrCorrupt) && !cfg.Recover:
		return nil, "", fmt.Errorf("refusing to start: %w. vipd does not start with an empty state over a state file it cannot read, "+
			"because that would remove every service from the kernel. Restore the file from a backup, or start with --recover: "+
			"vipd then moves it aside, keeps the kernel's rules, and applies nothing until the control plane's first SyncServices", err)
	case errors.Is(err, store.ErrCorrupt):
		log.Warn("--recover: the state is unreadable; moving it aside", "error", err)
		moved, merr := moveAside(log, cfg.StateDir, time.Now())
		if merr != nil {
			return nil, "", fmt.Errorf("--recover: %w", merr)
		}
		if snap, err = dir.Load(); err != nil {
			return nil, "", fmt.Errorf("--recover: load the state after moving %v aside: %w", moved, err)
		}
		holdReason = fmt.Sprintf("started with --recover over an unreadable state (moved to %s); "+
			"the kernel keeps its rules until the first SyncServices", strings.Join(moved, ", "))
	case err != nil:
		return nil, "", err
	case pending && !cfg.Recover:
		return nil, "", fmt.Errorf("refusing to start: %s says an earlier vipd --recover has not had its first SyncServices yet, "+
			"so the state in %s is not the control plane's, and applying it would remove services from the kernel. "+
			"Start with --recover again", filepath.Join(cfg.StateDir, recoverMarker), cfg.StateDir)
	case pending:
		holdReason = "an earlier --recover start has not had its first SyncServices yet; the kernel keeps its rules until one arrives"
	case cfg.Recover:
		log.Info("--recover: the state is readable; starting normally")
	}
	return snap, holdReason, nil
}

// moveAside renames the state files in dir to <name>.corrupt-<UTC time>,
// after writing the recover marker, and syncs the directory. It returns the
// new names.
func moveAside(log hclog.Logger, dir string, now time.Time) ([]string, error) {
	if err := writeMarker(dir, now); err != nil {
		return nil, err
	}
	suffix := ".corrupt-" + now.UTC().Format("20060102T150405.000000000Z")
	var moved []string
	for _, name := range store.StateFiles() {
		from := filepath.Join(dir, name)
		if _, err := os.Lstat(from); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		to := from + suffix
		if err := os.Rename(from, to); err != nil {
			return moved, fmt.Errorf("move %s aside: %w", from, err)
		}
		log.Warn("moved the unreadable state aside", "from", from, "to", to)
		moved = append(moved, to)
	}
	return moved, syncDir(dir)
}

// writeMarker creates the recover marker durably.
func writeMarker(dir string, now time.Time) error {
	path := filepath.Join(dir, recoverMarker)
	content := fmt.Sprintf("vipd --recover moved an unreadable state aside at %s and waits for the control plane's first SyncServices.\n"+
		"Until then the kernel keeps the rules it had. Start vipd with --recover again; this file is removed once a SyncServices has been applied.\n",
		now.UTC().Format(time.RFC3339))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("create recover marker: %w", err)
	}
	_, werr := f.WriteString(content)
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		return fmt.Errorf("write recover marker %s: %w", path, err)
	}
	return syncDir(dir)
}

// markerExists reports whether dir holds the recover marker.
func markerExists(dir string) (bool, error) {
	_, err := os.Lstat(filepath.Join(dir, recoverMarker))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	}
	return false, fmt.Errorf("check recover marker: %w", err)
}

// removeMarker removes the recover marker durably; the first SyncServices
// has been applied and saved.
func removeMarker(dir string) error {
	if err := os.Remove(filepath.Join(dir, recoverMarker)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove recover marker: %w", err)
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open state dir %s: %w", dir, err)
	}
	defer unix.Close(fd)
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("sync state dir %s: %w", dir, err)
	}
	return nil
}
