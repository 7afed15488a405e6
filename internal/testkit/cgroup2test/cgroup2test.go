// Package cgroup2test makes throwaway cgroups for tests, the demo and the
// benchmarks to start their own client processes in, so that nothing is
// ever attached to the machine's root cgroup.
//
// Each group is a child of the cgroup2 root (of the caller's cgroup
// namespace), made through a private cgroup2 mount in the temporary
// directory, so it works whether or not the machine mounts cgroup2
// somewhere (every cgroup2 mount shows the same single hierarchy, so a child
// made there is a real child of the cgroup2 root). The mount copies the
// hierarchy's options (see cgroup2.Mount). The package never moves an
// existing process between cgroups and never changes a cgroup it did not
// create.
//
// It is test harness: New imports "testing", and no product package may
// import it.
package cgroup2test

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/internal/cgroup2"
	"github.com/vipd/vipd/internal/testkit/require"
)

// removeTimeout bounds how long a test group's cleanup waits for killed
// processes to leave the group.
const removeTimeout = 10 * time.Second

// New makes a new, empty cgroup for the test's own processes and
// returns its absolute path, inside a private cgroup2 mount. The cgroup is a
// child of the cgroup2 root (of the test's cgroup namespace) called
// "vipd-test-<pid>-<random>"; /proc/PID/cgroup shows a process in it as
// "0::/" + filepath.Base(path).
//
// Processes get into the group by being born there: start them with
// syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd} and fd an open
// descriptor of the path. When the test and its subtests have finished, a
// cleanup kills whatever is still in the group, removes the group, unmounts
// the private mount and removes its mount point. It also runs when the test
// fails.
//
// New skips the test without root, or fails it with CI=true in the
// environment (require.Root). It fails the test if cgroup2 cannot be mounted. It also
// removes the mounts and empty groups that test processes which died without
// cleaning up left behind.
func New(tb testing.TB) string {
	tb.Helper()
	require.Root(tb, "mounting cgroup2 and creating test cgroups")
	g, err := NewGroup(tb.Logf)
	if err != nil {
		tb.Fatalf("new test cgroup: %v (is the kernel built with cgroup v2, and does the test have CAP_SYS_ADMIN?)", err)
	}
	tb.Cleanup(func() {
		killed, err := g.Remove()
		if len(killed) > 0 {
			tb.Logf("test cgroup %s: killed leftover processes %v", filepath.Base(g.Dir()), killed)
		}
		if err != nil {
			tb.Errorf("remove test cgroup: %v", err)
		}
	})
	return g.Dir()
}

// Group is a throwaway cgroup, "vipd-test-<pid>-<hex>", made as a child of
// the cgroup2 root (of the caller's cgroup namespace) through a private
// cgroup2 mount in the temporary directory: something to attach socket hooks
// to and start processes in without touching the machine's root cgroup.
// Processes get into the group by being born there (see New).
type Group struct {
	mnt, dir string
}

// NewGroup mounts cgroup2 privately and makes a new, empty group there. It
// first removes the mounts and empty groups that processes which died
// without cleaning up left behind, telling logf. On error it leaves nothing
// behind; otherwise the caller must Remove the group.
func NewGroup(logf func(string, ...any)) (_ *Group, err error) {
	if err := sweepMounts(logf); err != nil {
		logf("sweep leftover cgroup2 mounts: %v", err)
	}
	mnt, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", mountPrefix, os.Getpid()))
	if err != nil {
		return nil, err
	}
	if err := cgroup2.Mount(mnt); err != nil {
		os.Remove(mnt)
		return nil, err
	}
	g := &Group{mnt: mnt}
	defer func() {
		if err != nil {
			g.Remove()
		}
	}()
	if err := sweepGroups(mnt, logf); err != nil {
		logf("sweep leftover cgroups: %v", err)
	}
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	dir := filepath.Join(mnt, fmt.Sprintf("%s%d-%s", groupPrefix, os.Getpid(), hex.EncodeToString(b[:])))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	g.dir = dir
	return g, nil
}

// Dir is the group's absolute path, inside the private mount.
func (g *Group) Dir() string { return g.dir }

// Remove kills whatever is still in the group, removes the group, unmounts
// the private mount and removes its mount point. It tries every step, and
// returns the processes it killed and every error.
func (g *Group) Remove() (killed []int, err error) {
	var errs []error
	if g.dir != "" {
		k, err := removeGroup(g.dir, removeTimeout)
		killed = k
		errs = append(errs, err)
	}
	// Only os.Remove once unmounted: RemoveAll on a mounted cgroup2 would
	// remove the machine's empty cgroups.
	errs = append(errs, unmount(g.mnt))
	return killed, errors.Join(errs...)
}

// removeGroup kills every process in the cgroup dir, which must have no child
// cgroups, and removes it once the processes are gone. It returns the
// processes it found there. A missing dir is not an error.
//
// The processes are killed with SIGKILL through cgroup.kill (Linux 5.14),
// which also catches processes that fork meanwhile, or one by one on older
// kernels. removeGroup does not reap them: that is up to their parent. It
// gives up after timeout.
func removeGroup(dir string, timeout time.Duration) (killed []int, err error) {
	deadline := time.Now().Add(timeout)
	for {
		pids, err := cgroup2.Procs(dir)
		if errors.Is(err, os.ErrNotExist) {
			return killed, nil
		}
		if err != nil {
			return killed, fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		for _, pid := range pids {
			if !slices.Contains(killed, pid) {
				killed = append(killed, pid)
			}
		}
		if len(pids) > 0 {
			if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err != nil {
				for _, pid := range pids {
					_ = unix.Kill(pid, unix.SIGKILL)
				}
			}
		}
		// Killed processes leave the cgroup only once they have died,
		// shortly after the signal; until then rmdir fails with EBUSY.
		err = unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return killed, nil
		}
		if !errors.Is(err, unix.EBUSY) {
			return killed, fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		if time.Now().After(deadline) {
			return killed, fmt.Errorf("remove cgroup %s: still busy after %v (processes %v): %w", dir, timeout, pids, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// unmount detaches the private mount mnt and removes its mount point. A
// mount point that is no longer mounted is only removed.
func unmount(mnt string) error {
	if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", mnt, err)
	}
	if err := os.Remove(mnt); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

const (
	// mountPrefix starts the name of a test group's private mount point
	// in the temporary directory, "vipd-cgroup2-<pid>-<random>".
	mountPrefix = "vipd-cgroup2-"
	// groupPrefix starts the name of a test group, "vipd-test-<pid>-<hex>".
	groupPrefix = "vipd-test-"
)

var (
	leftoverMountRE = regexp.MustCompile(`^` + mountPrefix + `([1-9][0-9]{0,9})-[0-9]+$`)
	leftoverGroupRE = regexp.MustCompile(`^` + groupPrefix + `([1-9][0-9]{0,9})-[0-9a-f]+$`)
)

// sweepMounts removes the private cgroup2 mounts that test groups of
// processes that no longer exist left behind in the temporary directory
// (after a go test timeout, say). It leaves alone the mounts of live
// processes, this one included, and mounts it did not name. As with
// netlab.Sweep, the check is by pid only.
func sweepMounts(logf func(string, ...any)) error {
	mounts, err := cgroup2.Mountinfo()
	if err != nil {
		return err
	}
	tmp := filepath.Clean(os.TempDir())
	var errs []error
	for _, m := range mounts {
		if m.FSType != "cgroup2" || filepath.Dir(m.MountPoint) != tmp {
			continue
		}
		if pid, ok := pidOf(leftoverMountRE, filepath.Base(m.MountPoint)); !ok || alive(pid) {
			continue
		}
		if err := unmount(m.MountPoint); err != nil {
			errs = append(errs, err)
			continue
		}
		logf("removed leftover cgroup2 mount %s", m.MountPoint)
	}
	return errors.Join(errs...)
}

// sweepGroups removes the test groups of processes that no longer exist
// from the cgroup2 directory root, if they are empty. It kills nothing.
func sweepGroups(root string, logf func(string, ...any)) error {
	entries, err := os.ReadDir(root)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if pid, ok := pidOf(leftoverGroupRE, e.Name()); !ok || alive(pid) {
			continue
		}
		dir := filepath.Join(root, e.Name())
		if err := unix.Rmdir(dir); err != nil {
			if !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("remove leftover cgroup %s: %w", dir, err))
			}
			continue
		}
		logf("removed leftover cgroup %s", dir)
	}
	return errors.Join(errs...)
}

func pidOf(re *regexp.Regexp, name string) (int, bool) {
	m := re.FindStringSubmatch(name)
	if m == nil {
		return 0, false
	}
	pid, err := strconv.Atoi(m[1])
	return pid, err == nil
}

// alive reports whether a process with the given pid exists.
func alive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}
