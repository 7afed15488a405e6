package netlab

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/internal/nsdo"
)

// runDir is where named network namespaces are bind-mounted, as with
// `ip netns add`.
const runDir = "/run/netns"

// DefaultTimeout bounds an operation whose context has no deadline:
// a dial, a request, an Exec.
const DefaultTimeout = 5 * time.Second

// NS is a named network namespace owned by a Lab. Node and Pod embed it, so
// its methods (Do, Exec, Dial, Request, ...) work on either.
//
// An NS stays usable until its Lab is closed or, for a pod, until the pod is
// removed. All methods are safe for concurrent use.
type NS struct {
	name string
	log  hclog.Logger
	// handle keeps the namespace alive, and is what Do enters, even if
	// someone removes the bind mount.
	handle netns.NsHandle
	// nl is a route netlink socket opened inside the namespace: every link,
	// address and route change goes through it, never through the package
	// level netlink functions, which act on the calling thread's namespace.
	// It is used only under Lab.mu, and set to nil when closed, because a
	// closed netlink.Handle quietly falls back to those package functions.
	nl *netlink.Handle

	mu      sync.Mutex // guards closed, echoes and clients
	closed  bool
	echoes  []*Echo
	clients map[*Client]struct{}
}

// Name returns the namespace's name, as `ip netns list` shows it.
func (n *NS) Name() string { return n.name }

// Path returns the namespace's bind mount, /run/netns/NAME, which other
// processes can open or pass to setns (vipd --netns PATH).
func (n *NS) Path() string { return filepath.Join(runDir, n.name) }

// String returns the namespace's name.
func (n *NS) String() string { return n.name }

// createNS creates the named namespace name and prepares it: a netlink
// socket inside it, the sysctls in nsSysctls, loopback up. On error nothing
// is left behind.
func createNS(name string, log hclog.Logger) (*NS, error) {
	h := netns.None()
	err := nsdo.OnLockedThread(func(orig netns.NsHandle) error {
		// NewNamed moves the locked thread into the new namespace;
		// OnLockedThread moves it back.
		var err error
		if h, err = netns.NewNamed(name); err != nil {
			return err
		}
		if h.Equal(orig) {
			// Paranoia: everything below would change the root namespace.
			h.Close()
			return errors.New("new namespace is the calling thread's namespace")
		}
		return nil
	})
	if err != nil {
		// NewNamed creates the mount point before it mounts; remove it
		// unless it was someone else's already.
		if !errors.Is(err, fs.ErrExist) {
			_ = deleteNamed(name)
		}
		if h.IsOpen() {
			h.Close()
		}
		return nil, fmt.Errorf("create netns %s: %w", name, err)
	}
	n := &NS{name: name, log: log.With("netns", name), handle: h}
	if err := n.prepare(); err != nil {
		return nil, errors.Join(fmt.Errorf("prepare netns %s: %w", name, err), n.close())
	}
	log.Debug("created netns", "netns", name)
	return n, nil
}

// nsSysctls are set in every lab namespace before any link is created in it.
var nsSysctls = []sysctl{
	// Devices copy net.ipv6.conf.default when they are created: IPv6
	// addresses are usable at once, without duplicate address detection.
	{"net.ipv6.conf.all.accept_dad", "0"},
	{"net.ipv6.conf.default.accept_dad", "0"},
	// ICMP errors are how a rejected or unroutable connection fails fast;
	// the default rate limits would turn some of those failures into
	// timeouts.
	{"net.ipv4.icmp_ratelimit", "0"},
	{"net.ipv6.icmp.ratelimit", "0"},
}

func (n *NS) prepare() error {
	err := n.Do(func() error {
		// With no target namespace, netlink opens the socket in the
		// current thread's namespace, which Do has made ours. (NewHandleAt
		// with a handle would switch namespaces itself and unlock the thread
		// even when switching back fails.)
		var err error
		n.nl, err = netlink.NewHandleAt(netns.None(), unix.NETLINK_ROUTE)
		return err
	})
	if err != nil {
		return fmt.Errorf("open netlink: %w", err)
	}
	if err := n.setSysctls(nsSysctls...); err != nil {
		return err
	}
	_, err = n.linkUp("lo")
	return err
}

// close ends the namespace's client processes, stops its echo servers,
// closes its sockets and removes its bind mount. The kernel destroys the
// namespace, and the links in it, once nothing else holds it. close is
// idempotent.
func (n *NS) close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	echoes, clients := n.echoes, n.clients
	n.echoes, n.clients = nil, nil
	n.mu.Unlock()

	var errs []error
	for c := range clients {
		errs = append(errs, c.Close())
	}
	for _, e := range echoes {
		errs = append(errs, e.Close())
	}
	if n.nl != nil {
		n.nl.Close()
		n.nl = nil
	}
	// Do enters a duplicate of the handle, made under mu, so that closing
	// it here cannot pull the descriptor from under a running Do.
	if err := n.handle.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close netns %s handle: %w", n.name, err))
	}
	errs = append(errs, deleteNamed(n.name))
	n.log.Debug("removed netns")
	return errors.Join(errs...)
}

// deleteNamed removes the bind mount /run/netns/name and its mount point.
// A missing or unmounted mount point is not an error.
func deleteNamed(name string) error {
	p := filepath.Join(runDir, name)
	if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", p, err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", p, err)
	}
	return nil
}

// Do runs f on an OS thread that is inside the namespace, and returns f's
// error. Sockets f creates stay in the namespace after Do returns; f must do
// its namespace work on its own goroutine (goroutines it starts run on
// ordinary threads) and must not unlock the thread.
//
// The caller's thread never changes namespace: Do is nsdo.In, which runs f
// on a fresh goroutine locked to its thread; if that thread cannot be moved
// back, it stays locked, so the runtime destroys it instead of reusing it.
//
// Do fails with ErrClosed once the namespace has been removed.
func (n *NS) Do(f func() error) error {
	h, err := n.dupHandle()
	if err != nil {
		return err
	}
	defer h.Close()
	return nsdo.In(h, f)
}

// dupHandle returns a new descriptor for the namespace, which the caller
// closes. A private descriptor cannot be closed, and its number reused for
// some other namespace, while the caller is entering it.
func (n *NS) dupHandle() (netns.NsHandle, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return netns.None(), fmt.Errorf("netns %s: %w", n.name, ErrClosed)
	}
	fd, err := unix.FcntlInt(uintptr(n.handle), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return netns.None(), fmt.Errorf("duplicate netns %s handle: %w", n.name, err)
	}
	return netns.NsHandle(fd), nil
}

// sysctl is a sysctl key, dotted as in "net.ipv4.ip_forward", and a value.
type sysctl struct{ key, value string }

// SetSysctl sets the namespace's sysctl key (dotted, as in
// "net.ipv4.ip_forward") to value.
func (n *NS) SetSysctl(key, value string) error {
	return n.setSysctls(sysctl{key, value})
}

// setSysctls sets the namespace's sysctls in order, stopping at the first
// error. Files under /proc/sys/net belong to the namespace of the thread
// that opens them, so the writes happen in Do.
func (n *NS) setSysctls(s ...sysctl) error {
	return n.Do(func() error {
		for _, s := range s {
			if err := os.WriteFile(sysctlPath(s.key), []byte(s.value), 0); err != nil {
				return fmt.Errorf("set sysctl %s=%s in netns %s: %w", s.key, s.value, n.name, err)
			}
		}
		return nil
	})
}

// Sysctl returns the namespace's value of sysctl key, without the trailing
// newline.
func (n *NS) Sysctl(key string) (string, error) {
	var b []byte
	err := n.Do(func() error {
		var err error
		b, err = os.ReadFile(sysctlPath(key))
		return err
	})
	if err != nil {
		return "", fmt.Errorf("read sysctl %s in netns %s: %w", key, n.name, err)
	}
	return strings.TrimSpace(string(b)), nil
}

func sysctlPath(key string) string {
	return filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
}

// Command returns a command that runs name with args inside the namespace
// (through `ip netns exec`, which also gives it the namespace's /sys). The
// command is killed when ctx is done. The caller starts and waits for it.
func (n *NS) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.name, name}, args...)...)
	cmd.WaitDelay = time.Second
	return cmd
}

// Exec runs name with args inside the namespace and returns its combined
// output. A failure's error includes the output. Without a deadline in ctx
// the command gets 30 s; use Command for long-running programs.
func (n *NS) Exec(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := withDefaultTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := n.Command(ctx, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("exec %q in netns %s: %w: %s",
			strings.Join(append([]string{name}, args...), " "), n.name, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// withDefaultTimeout returns ctx unchanged if it has a deadline, and
// otherwise a child of ctx that expires after d.
func withDefaultTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}
