package cgroup2test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/internal/cgroup2"
	"github.com/vipd/vipd/internal/testkit/require"
)

// mountsAt returns the mounts of this mount namespace at path.
func mountsAt(t *testing.T, path string) []cgroup2.MountEntry {
	t.Helper()
	mounts, err := cgroup2.Mountinfo()
	if err != nil {
		t.Fatal(err)
	}
	var at []cgroup2.MountEntry
	for _, m := range mounts {
		if m.MountPoint == path {
			at = append(at, m)
		}
	}
	return at
}

// cgroup2Options returns the super options of every cgroup2 mount: one
// hierarchy, so a test group must leave them as they were.
func cgroup2Options(t *testing.T) map[string]string {
	t.Helper()
	mounts, err := cgroup2.Mountinfo()
	if err != nil {
		t.Fatal(err)
	}
	opts := map[string]string{}
	for _, m := range mounts {
		if m.FSType == "cgroup2" && !strings.HasPrefix(filepath.Base(m.MountPoint), mountPrefix) {
			opts[m.MountPoint] = m.SuperOptions
		}
	}
	return opts
}

// startIn starts `sleep 30` born in the cgroup dir.
func startIn(t *testing.T, dir string) *exec.Cmd {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	cmd := exec.Command("sleep", "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start sleep in %s: %v", dir, err)
	}
	return cmd
}

func TestNew(t *testing.T) {
	require.Root(t, "mounting cgroup2 and creating test cgroups")
	optsBefore := cgroup2Options(t)
	var dir string
	var sleeper *exec.Cmd
	t.Run("inner", func(t *testing.T) {
		dir = New(t)
		if !strings.HasPrefix(filepath.Base(dir), fmt.Sprintf("vipd-test-%d-", os.Getpid())) {
			t.Errorf("group name: got %s", dir)
		}
		if ok, err := cgroup2.IsCgroup2(dir); err != nil || !ok {
			t.Fatalf("cgroup2.IsCgroup2(%s): got %v, %v", dir, ok, err)
		}
		if m := mountsAt(t, filepath.Dir(dir)); len(m) != 1 || m[0].FSType != "cgroup2" {
			t.Fatalf("mounts at %s: got %+v, want one cgroup2", filepath.Dir(dir), m)
		}
		if pids, err := cgroup2.Procs(dir); err != nil || len(pids) != 0 {
			t.Fatalf("new group's processes: got %v, %v; want none", pids, err)
		}
		sleeper = startIn(t, dir)
		pid := sleeper.Process.Pid
		got, err := cgroup2.ProcCgroup(pid)
		if err != nil {
			t.Fatal(err)
		}
		if want := "/" + filepath.Base(dir); got != want {
			t.Errorf("/proc/%d/cgroup: got %s, want %s", pid, got, want)
		}
		if pids, err := cgroup2.Procs(dir); err != nil || !slices.Equal(pids, []int{pid}) {
			t.Errorf("group's processes: got %v, %v; want [%d]", pids, err, pid)
		}
		if self, err := cgroup2.ProcCgroup(0); err != nil || self == got {
			t.Errorf("the test process's own cgroup: got %q, %v; want it outside the group", self, err)
		}
		// The sleeper is left running: the cleanup must kill it.
	})

	if sleeper == nil {
		t.FailNow()
	}
	// The cleanup killed the sleeper but did not reap it.
	done := make(chan error, 1)
	go func() { done <- sleeper.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("sleeper: got %v, want killed by SIGKILL", err)
		}
	case <-time.After(5 * time.Second):
		sleeper.Process.Kill()
		t.Fatal("the cleanup left the sleeper running")
	}
	mnt := filepath.Dir(dir)
	if m := mountsAt(t, mnt); len(m) != 0 {
		t.Errorf("mount %s still in /proc/self/mountinfo: %+v", mnt, m)
	}
	if _, err := os.Stat(mnt); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("mount point %s: got %v, want it removed", mnt, err)
	}
	// The group is gone from the hierarchy, not just from our mount.
	probe := New(t)
	if _, err := os.Stat(filepath.Join(filepath.Dir(probe), filepath.Base(dir))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("group %s: got %v, want it removed", filepath.Base(dir), err)
	}
	if after := cgroup2Options(t); fmt.Sprint(after) != fmt.Sprint(optsBefore) {
		t.Errorf("cgroup2 mount options changed: before %v, after %v", optsBefore, after)
	}
}

func TestRemoveGroupKillsForks(t *testing.T) {
	g := New(t)
	fd, err := unix.Open(g, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	// A shell that keeps a few children of its own: removeGroup must get them
	// all, grandchildren included, though it is not their parent.
	cmd := exec.Command("sh", "-c", "sleep 30 & sleep 30 & sleep 30 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for {
		pids, err := cgroup2.Procs(g)
		if err != nil {
			t.Fatal(err)
		}
		if len(pids) == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("group's processes: got %v, want the shell and 3 sleeps", pids)
		}
		time.Sleep(5 * time.Millisecond)
	}
	start := time.Now()
	killed, err := removeGroup(g, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("removeGroup killed %v in %v", killed, time.Since(start))
	if len(killed) != 4 {
		t.Errorf("killed: got %v, want 4 processes", killed)
	}
	if _, err := os.Stat(g); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("group after removeGroup: %v", err)
	}
	if _, err := removeGroup(g, time.Second); err != nil {
		t.Errorf("removeGroup of a removed group: %v", err)
	}
}

func TestSweep(t *testing.T) {
	require.Root(t, "mounting cgroup2 and creating test cgroups")
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	dead := cmd.Process.Pid
	if alive(dead) {
		t.Skipf("pid %d was reused already", dead)
	}
	// What a test process killed during New leaves behind: a
	// private mount with an empty group in it.
	mnt, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", mountPrefix, dead))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unmount(mnt) })
	if err := cgroup2.Mount(mnt); err != nil {
		t.Fatal(err)
	}
	group := filepath.Join(mnt, fmt.Sprintf("%s%d-beef", groupPrefix, dead))
	if err := os.Mkdir(group, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Rmdir(group) })
	// And a group of a live process, this one, that must stay.
	live := filepath.Join(mnt, fmt.Sprintf("%s%d-cafe", groupPrefix, os.Getpid()))
	if err := os.Mkdir(live, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Rmdir(live) })

	g := New(t) // sweeps
	root := filepath.Dir(g)
	if m := mountsAt(t, mnt); len(m) != 0 {
		t.Errorf("leftover mount %s: still mounted", mnt)
	}
	if _, err := os.Stat(mnt); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("leftover mount point %s: %v", mnt, err)
	}
	if _, err := os.Stat(filepath.Join(root, filepath.Base(group))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("leftover group %s: %v", filepath.Base(group), err)
	}
	if _, err := os.Stat(filepath.Join(root, filepath.Base(live))); err != nil {
		t.Errorf("live process's group %s: %v", filepath.Base(live), err)
	}
	if err := unix.Rmdir(filepath.Join(root, filepath.Base(live))); err != nil {
		t.Error(err)
	}
}
