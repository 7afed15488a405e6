package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vipd/vipd/internal/testkit/netlab"
	"golang.org/x/sys/unix"
)

// showPinned lists what the eBPF dataplane pinned in the bpffs directory
// dir: its maps (vipd_*) with their sizes and, in links/, the tcx links of
// the pod interfaces of node and the cgroup links of the socket hooks on the
// cgroup cgroupDir.
func showPinned(dir string, node *netlab.Node, cgroupDir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	fmt.Printf("$ ls %s   (a bpffs)\n", dir)
	fmt.Printf("  %-18s %-14s %10s %9s %10s %8s\n", "MAP", "TYPE", "MAX", "KEY+VAL", "MEMLOCK", "ENTRIES")
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "vipd_") {
			continue
		}
		if err := showMap(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	links := filepath.Join(dir, "links")
	entries, err = os.ReadDir(links)
	if err != nil {
		return err
	}
	fmt.Printf("$ ls %s\n", links)
	for _, e := range entries {
		if err := showLink(filepath.Join(links, e.Name()), node, cgroupDir); err != nil {
			return err
		}
	}
	return nil
}

func showMap(path string) error {
	m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return fmt.Errorf("open pinned map %s: %w", path, err)
	}
	defer m.Close()
	info, err := m.Info()
	if err != nil {
		return fmt.Errorf("pinned map %s: %w", path, err)
	}
	memlock := "?"
	if b, ok := info.Memlock(); ok {
		memlock = fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	}
	// Counting takes a syscall per entry, and arrays are always full.
	entries := "-"
	switch info.Type {
	case ebpf.Hash, ebpf.LRUHash, ebpf.PerCPUHash, ebpf.LRUCPUHash, ebpf.HashOfMaps:
		n, err := countEntries(m)
		if err != nil {
			return fmt.Errorf("pinned map %s: %w", path, err)
		}
		entries = fmt.Sprint(n)
	}
	fmt.Printf("  %-18s %-14s %10d %4d+%-4d %10s %8s\n", filepath.Base(path), info.Type, info.MaxEntries, info.KeySize, info.ValueSize, memlock, entries)
	return nil
}

// countEntries counts the entries of a hash map by walking its keys.
func countEntries(m *ebpf.Map) (int, error) {
	var key any // nil asks for the first key
	for n := 0; ; n++ {
		next, err := m.NextKeyBytes(key)
		if err != nil {
			return n, err
		}
		if next == nil {
			return n, nil
		}
		key = next
	}
}

func showLink(path string, node *netlab.Node, cgroupDir string) error {
	l, err := link.LoadPinnedLink(path, nil)
	if err != nil {
		return fmt.Errorf("open pinned link %s: %w", path, err)
	}
	defer l.Close() // the pin keeps the link
	info, err := l.Info()
	if err != nil {
		return fmt.Errorf("pinned link %s: %w", path, err)
	}
	prog := fmt.Sprintf("program %d", info.Program)
	if p, err := ebpf.NewProgramFromID(info.Program); err == nil {
		if pi, err := p.Info(); err == nil && pi.Name != "" {
			prog = pi.Name
		}
		p.Close()
	}
	var where string
	switch {
	case info.TCX() != nil:
		where = fmt.Sprintf("tcx %s on %s", info.TCX().AttachType, ifaceName(node, int(info.TCX().Ifindex)))
	case info.Cgroup() != nil:
		where = fmt.Sprintf("cgroup %s on %s", info.Cgroup().AttachType, cgroupName(cgroupDir, info.Cgroup().CgroupId))
	default:
		where = fmt.Sprintf("link type %d", info.Type)
	}
	fmt.Printf("  %-20s %-23s %s\n", filepath.Base(path), prog, where)
	return nil
}

// ifaceName names the interface of node with index ifindex, or returns the
// index.
func ifaceName(node *netlab.Node, ifindex int) string {
	name := fmt.Sprintf("ifindex %d", ifindex)
	node.Do(func() error {
		ifc, err := net.InterfaceByIndex(ifindex)
		if err == nil {
			name = ifc.Name
		}
		return err
	})
	return name
}

// cgroupName names the cgroup with the given id: the base name of dir if
// it is that cgroup (a cgroup's id is its directory's inode number), or the
// id.
func cgroupName(dir string, id uint64) string {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err == nil && st.Ino == id {
		return filepath.Base(dir)
	}
	return fmt.Sprintf("cgroup id %d", id)
}
