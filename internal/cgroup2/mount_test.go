package cgroup2_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/internal/cgroup2"
	"github.com/vipd/vipd/internal/testkit/cgroup2test"
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

func TestMount(t *testing.T) {
	require.Root(t, "mounting cgroup2")
	dir := t.TempDir()
	t.Cleanup(func() {
		for len(mountsAt(t, dir)) > 0 {
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
				t.Errorf("unmount %s: %v", dir, err)
				return
			}
		}
	})
	if ok, err := cgroup2.IsCgroup2(dir); err != nil || ok {
		t.Fatalf("IsCgroup2 of a plain directory: got %v, %v", ok, err)
	}
	if _, err := cgroup2.IsCgroup2(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("IsCgroup2 of a missing directory: got %v, want ErrNotExist", err)
	}
	for range 2 { // the second Mount does nothing
		if err := cgroup2.Mount(dir); err != nil {
			t.Fatal(err)
		}
		if ok, err := cgroup2.IsCgroup2(dir); err != nil || !ok {
			t.Fatalf("IsCgroup2 after Mount: got %v, %v", ok, err)
		}
		if m := mountsAt(t, dir); len(m) != 1 || m[0].FSType != "cgroup2" {
			t.Fatalf("mounts at %s: got %+v, want one cgroup2", dir, m)
		}
	}
	// A cgroup inside a cgroup2 mount is cgroup2 too: nothing to mount.
	g := cgroup2test.New(t)
	if err := cgroup2.Mount(g); err != nil {
		t.Fatal(err)
	}
	if m := mountsAt(t, g); len(m) != 0 {
		t.Errorf("Mount mounted over the cgroup %s: %+v", g, m)
	}
}
