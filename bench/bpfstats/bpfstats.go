// Package bpfstats measures the time BPF programs spend running: it turns
// the kernel's run-time statistics on for a while, and sums run_time_ns and
// run_cnt over chosen programs, found by ID. The data-path benchmark
// divides the difference by the connections made.
//
// It turns the statistics on with BPF_ENABLE_STATS, which the kernel counts
// like a reference and ends when the returned file is closed, or when the
// process dies: it never writes kernel.bpf_stats_enabled, so there is no
// old value to restore and no race with anyone else who sets it.
package bpfstats

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Enable turns run-time statistics on until the returned Closer is closed.
func Enable() (io.Closer, error) {
	c, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return nil, fmt.Errorf("enable BPF run-time statistics: %w", err)
	}
	return c, nil
}

// Sample is the run time and run count summed over some programs.
type Sample struct {
	Runtime time.Duration
	Runs    uint64
}

// Sub returns s - o.
func (s Sample) Sub(o Sample) Sample {
	return Sample{Runtime: s.Runtime - o.Runtime, Runs: s.Runs - o.Runs}
}

// Read sums the statistics of the programs with the given IDs.
func Read(ids []ebpf.ProgramID) (Sample, error) {
	var s Sample
	for _, id := range ids {
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			return Sample{}, fmt.Errorf("program %d: %w", id, err)
		}
		st, err := p.Stats()
		p.Close()
		if err != nil {
			return Sample{}, fmt.Errorf("program %d: %w", id, err)
		}
		s.Runtime += st.Runtime
		s.Runs += st.RunCount
	}
	return s, nil
}

// IDs returns the IDs of progs.
func IDs(progs ...*ebpf.Program) ([]ebpf.ProgramID, error) {
	var ids []ebpf.ProgramID
	for _, p := range progs {
		info, err := p.Info()
		if err != nil {
			return nil, err
		}
		id, ok := info.ID()
		if !ok {
			return nil, errors.New("the kernel reports no program ID")
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// HeldBy returns the IDs of the BPF programs that process pid holds open,
// directly or through a BPF link: the prog_id lines of its file
// descriptors' fdinfo, each ID once, sorted.
func HeldBy(pid int) ([]ebpf.ProgramID, error) {
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var ids []ebpf.ProgramID
	for _, e := range entries {
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "prog_id:"); ok {
				if id, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32); err == nil && id != 0 {
					ids = append(ids, ebpf.ProgramID(id))
				}
			}
		}
		f.Close()
	}
	slices.Sort(ids)
	return slices.Compact(ids), nil
}
