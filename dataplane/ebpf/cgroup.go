package ebpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// DefaultCgroupMount is where vipd mounts cgroup2 when --cgroup-path is not
// given; the socket hooks then attach to its root, and so apply to every
// process of the node.
const DefaultCgroupMount = "/run/vipd/cgroupv2"

// cgroupHook is one cgroup sock_addr program and where it attaches.
type cgroupHook struct {
	name   string
	attach ebpf.AttachType
	prog   *ebpf.Program
}

func cgroupHooks(p *bpfPrograms) []cgroupHook {
	return []cgroupHook{
		{"connect4", ebpf.AttachCGroupInet4Connect, p.VipdSockConnect4},
		{"connect6", ebpf.AttachCGroupInet6Connect, p.VipdSockConnect6},
		{"sendmsg4", ebpf.AttachCGroupUDP4Sendmsg, p.VipdSockSendmsg4},
		{"sendmsg6", ebpf.AttachCGroupUDP6Sendmsg, p.VipdSockSendmsg6},
		{"recvmsg4", ebpf.AttachCGroupUDP4Recvmsg, p.VipdSockRecvmsg4},
		{"recvmsg6", ebpf.AttachCGroupUDP6Recvmsg, p.VipdSockRecvmsg6},
		{"getpeername4", ebpf.AttachCgroupInet4GetPeername, p.VipdSockGetpeername4},
		{"getpeername6", ebpf.AttachCgroupInet6GetPeername, p.VipdSockGetpeername6},
	}
}

// attachCgroup attaches the socket hooks to the cgroup at cgroupPath with
// bpf links pinned in linkDir. Links of an earlier vipd on the same cgroup
// get the new programs in place; links on another cgroup are replaced.
func attachCgroup(cgroupPath, linkDir string, hooks []cgroupHook) error {
	if err := os.MkdirAll(linkDir, 0o700); err != nil {
		return fmt.Errorf("create link pin directory: %w", err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(cgroupPath, &st); err != nil {
		return fmt.Errorf("cgroup %s: %w", cgroupPath, err)
	}
	for _, h := range hooks {
		pin := filepath.Join(linkDir, "cgroup_"+h.name)
		if l, err := link.LoadPinnedLink(pin, nil); err == nil {
			info, ierr := l.Info()
			sameCgroup := ierr == nil && info.Cgroup() != nil && uint64(info.Cgroup().CgroupId) == st.Ino
			if sameCgroup && l.Update(h.prog) == nil {
				l.Close()
				continue
			}
			l.Close()
			unpinLink(pin)
		}
		l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupPath, Attach: h.attach, Program: h.prog})
		if err != nil {
			return fmt.Errorf("attach %s hook to cgroup %s: %w", h.name, cgroupPath, err)
		}
		err = l.Pin(pin)
		l.Close()
		if err != nil {
			return fmt.Errorf("pin %s hook: %w", h.name, err)
		}
	}
	return nil
}

// detachCgroup removes the pinned socket-hook links in linkDir.
func detachCgroup(linkDir string) error {
	entries, err := os.ReadDir(linkDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "cgroup_") {
			if err := unpinLink(filepath.Join(linkDir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}
