package ebpf

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/internal/testkit/netlab"
)

// TestBPFFSRefusedInPrivateMountNamespace: in a mount namespace of its own
// (what `ip netns exec` gives vipd), vipd refuses to mount a bpffs that
// would vanish with it, and to use one mounted in that namespace alone,
// saying how to mount one beforehand; a bpffs mounted from the host's
// namespace is used as it is.
func TestBPFFSRefusedInPrivateMountNamespace(t *testing.T) {
	netlab.RequireRoot(t)
	bare := filepath.Join(t.TempDir(), "bpf")
	ownMount := filepath.Join(t.TempDir(), "bpf")
	// What init's mountinfo would say: the test's (the host's) mounts.
	hostMountinfo := filepath.Join(t.TempDir(), "mountinfo")
	premounted := filepath.Join(t.TempDir(), "bpf")
	if err := os.Mkdir(premounted, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("bpf", premounted, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount a bpffs at %s: %v", premounted, err)
	}
	t.Cleanup(func() {
		if err := UnmountBPFFS(premounted); err != nil {
			t.Errorf("unmount %s: %v", premounted, err)
		}
	})

	type result struct {
		bareMounted, preMounted, ownMounted bool
		bareErr, preErr, ownErr, setup      error
	}
	done := make(chan result)
	go func() {
		// Never unlocked: the thread ends with the goroutine, and with it
		// the private mount namespace and anything mounted in it.
		runtime.LockOSThread()
		var r result
		defer func() { done <- r }()
		host, err := os.Open("/proc/thread-self/ns/mnt")
		if err != nil {
			r.setup = err
			return
		}
		defer host.Close()
		mi, err := os.ReadFile("/proc/thread-self/mountinfo")
		if err == nil {
			err = os.WriteFile(hostMountinfo, mi, 0o600)
		}
		if err != nil {
			r.setup = err
			return
		}
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			r.setup = fmt.Errorf("unshare the mount namespace: %w", err)
			return
		}
		// Nothing done here may propagate to the host.
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			r.setup = fmt.Errorf("make mounts private: %w", err)
			return
		}
		ns := mountNSFiles{self: "/proc/thread-self/ns/mnt", init: fmt.Sprintf("/proc/self/fd/%d", host.Fd()), initMountinfo: hostMountinfo}
		if private, err := ns.private(); err != nil || !private {
			r.setup = fmt.Errorf("the unshared namespace does not look private: %v, %v", private, err)
			return
		}
		r.bareMounted, r.bareErr = ensureBPFFS(hclog.NewNullLogger(), bare, ns)
		r.preMounted, r.preErr = ensureBPFFS(hclog.NewNullLogger(), premounted, ns)
		// Mounted in this namespace only: it goes with the thread.
		if err := os.Mkdir(ownMount, 0o700); err != nil {
			r.setup = err
			return
		}
		if err := unix.Mount("bpf", ownMount, "bpf", 0, "mode=0700"); err != nil {
			r.setup = fmt.Errorf("mount a bpffs in the private namespace: %w", err)
			return
		}
		r.ownMounted, r.ownErr = ensureBPFFS(hclog.NewNullLogger(), ownMount, ns)
	}()
	r := <-done
	if r.setup != nil {
		t.Fatal(r.setup)
	}
	if r.bareErr == nil || r.bareMounted {
		t.Fatalf("in a private mount namespace, ensureBPFFS(%s) mounted a bpffs (mounted %v, err %v), want a refusal", bare, r.bareMounted, r.bareErr)
	}
	for _, want := range []string{bare, "mount namespace of its own", "mount -t bpf bpf /run/vipd/bpffs", "--bpffs", "--netns"} {
		if !strings.Contains(r.bareErr.Error(), want) {
			t.Errorf("the refusal %q does not say %q", r.bareErr, want)
		}
	}
	if r.ownErr == nil || !strings.Contains(r.ownErr.Error(), "mounted only in vipd's own mount namespace") ||
		!strings.Contains(r.ownErr.Error(), "mount -t bpf bpf /run/vipd/bpffs") {
		t.Errorf("in a private mount namespace, ensureBPFFS(%s) of a bpffs mounted there alone: mounted %v, err %v; want a refusal", ownMount, r.ownMounted, r.ownErr)
	}
	if r.preErr != nil || r.preMounted {
		t.Fatalf("in a private mount namespace, ensureBPFFS(%s) of a bpffs mounted beforehand: mounted %v, err %v; want it used as it is", premounted, r.preMounted, r.preErr)
	}

	// In the host's namespace, vipd mounts the bpffs itself.
	same := mountNSFiles{self: "/proc/thread-self/ns/mnt", init: "/proc/thread-self/ns/mnt", initMountinfo: "/proc/thread-self/mountinfo"}
	mounted, err := ensureBPFFS(hclog.NewNullLogger(), bare, same)
	t.Cleanup(func() { UnmountBPFFS(bare) })
	if err != nil || !mounted {
		t.Fatalf("in the host's mount namespace, ensureBPFFS(%s): mounted %v, err %v; want a bpffs mounted", bare, mounted, err)
	}
}

// TestBPFFSRefusedUnderFreshSysfs: what `ip netns exec` does (a private
// mount namespace with a fresh sysfs on /sys) makes the default
// /sys/fs/bpf/vipd impossible to create; the error still says how to give
// vipd a bpffs that outlives it, not only "mkdir failed".
func TestBPFFSRefusedUnderFreshSysfs(t *testing.T) {
	netlab.RequireRoot(t)
	dir := "/sys/fs/bpf/vipd-test-fresh-sysfs"
	done := make(chan [2]error)
	go func() {
		// Never unlocked: the thread ends with the goroutine, and with it
		// its namespaces and the sysfs mounted in them.
		runtime.LockOSThread()
		var setup, got error
		defer func() { done <- [2]error{setup, got} }()
		host, err := os.Open("/proc/thread-self/ns/mnt")
		if err != nil {
			setup = err
			return
		}
		defer host.Close()
		if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_NEWNET); err != nil {
			setup = fmt.Errorf("unshare: %w", err)
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			setup = fmt.Errorf("make mounts private: %w", err)
			return
		}
		// As ip netns exec does (iproute2 lib/namespace.c).
		if err := unix.Unmount("/sys", unix.MNT_DETACH); err != nil {
			setup = fmt.Errorf("unmount /sys: %w", err)
			return
		}
		if err := unix.Mount("vipd-test", "/sys", "sysfs", 0, ""); err != nil {
			setup = fmt.Errorf("mount a fresh sysfs: %w", err)
			return
		}
		ns := mountNSFiles{self: "/proc/thread-self/ns/mnt", init: fmt.Sprintf("/proc/self/fd/%d", host.Fd()), initMountinfo: "/proc/1/mountinfo"}
		_, got = ensureBPFFS(hclog.NewNullLogger(), dir, ns)
	}()
	r := <-done
	if r[0] != nil {
		t.Fatal(r[0])
	}
	if r[1] == nil {
		t.Fatalf("ensureBPFFS(%s) under a fresh sysfs in a private mount namespace succeeded, want a refusal", dir)
	}
	for _, want := range []string{dir, "mount namespace of its own", "mount -t bpf bpf /run/vipd/bpffs", "--bpffs", "--netns"} {
		if !strings.Contains(r[1].Error(), want) {
			t.Errorf("the error %q does not say %q", r[1], want)
		}
	}
}
