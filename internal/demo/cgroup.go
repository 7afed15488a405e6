package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/vipd/vipd/internal/cgroup2"
	"golang.org/x/sys/unix"
)

// cgroupRemoveTimeout bounds how long removing the demo's cgroup waits for
// killed processes to leave it.
const cgroupRemoveTimeout = 10 * time.Second

// demoCgroup is the cgroup the eBPF dataplane attaches its socket hooks to
// and the node-local client process is born in: vipd-demo-<pid>, a child of
// the cgroup2 root made through a private cgroup2 mount, so that the demo
// never attaches anything to the machine's root cgroup (cgroup2.NewTestGroup
// does the same for tests).
type demoCgroup struct {
	mnt string // the private cgroup2 mount point, in the temporary directory
	dir string // the cgroup, inside mnt; empty until it exists
}

// newDemoCgroup mounts cgroup2 at a new temporary directory and makes the
// demo's cgroup there. On error it leaves nothing behind; otherwise the
// caller calls remove.
func newDemoCgroup() (_ *demoCgroup, err error) {
	mnt, err := os.MkdirTemp("", "vipd-demo-cgroup2-")
	if err != nil {
		return nil, err
	}
	// Refuse a mount point that is on cgroup2 already: cgroup2.Mount would
	// not mount there, and remove would unmount someone else's mount.
	if ok, err := cgroup2.IsCgroup2(mnt); err != nil || ok {
		os.Remove(mnt)
		return nil, fmt.Errorf("new demo cgroup: %s is already on cgroup2 (err %v)", mnt, err)
	}
	if err := cgroup2.Mount(mnt); err != nil {
		os.Remove(mnt)
		return nil, fmt.Errorf("new demo cgroup: %w", err)
	}
	c := &demoCgroup{mnt: mnt}
	defer func() {
		if err != nil {
			c.remove()
		}
	}()
	dir := filepath.Join(mnt, fmt.Sprintf("vipd-demo-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("new demo cgroup: %w", err)
	}
	c.dir = dir
	return c, nil
}

// remove kills whatever is still in the cgroup, removes it, unmounts the
// private mount and removes its mount point. It tries every step and
// returns every error.
func (c *demoCgroup) remove() error {
	var errs []error
	if c.dir != "" {
		if err := removeCgroup(c.dir, cgroupRemoveTimeout); err != nil {
			errs = append(errs, err)
		}
	}
	// Only os.Remove once unmounted: RemoveAll on a mounted cgroup2 would
	// remove the machine's empty cgroups.
	if err := unix.Unmount(c.mnt, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("unmount %s: %w", c.mnt, err))
	} else if err := os.Remove(c.mnt); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// removeCgroup kills every process in the cgroup dir, which must have no
// child cgroups, and removes it once they are gone, giving up after
// timeout. A missing dir is not an error.
func removeCgroup(dir string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pids, err := cgroup2.Procs(dir)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		if len(pids) > 0 {
			// cgroup.kill (Linux 5.14) also catches processes that fork meanwhile.
			if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err != nil {
				for _, pid := range pids {
					unix.Kill(pid, unix.SIGKILL)
				}
			}
		}
		// Killed processes leave the cgroup shortly after they die; until
		// then rmdir fails with EBUSY.
		err = unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: still busy after %v (processes %v): %w", dir, timeout, pids, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
