// Package procstat reads what the kernel reports about a process under
// /proc: its memory (status) and the memory charged for the BPF maps it
// holds open (fdinfo). Benchmarks and soak tests use it to watch vipd. It
// only reads.
package procstat

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// StatusBytes returns a "kB" field of /proc/PID/status, such as "VmHWM"
// (peak resident memory) or "VmRSS", in bytes.
func StatusBytes(pid int, field string) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(data)) {
		rest, ok := strings.CutPrefix(line, field+":")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parse %s of process %d: %w", field, pid, err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// MapMemlock sums the memory the kernel charges for the BPF maps that pid
// holds open (the memlock line of each map's fdinfo), counting each map
// once however many descriptors refer to it.
func MapMemlock(pid int) (int64, error) {
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	seen := map[string]bool{}
	var total int64
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil || !strings.Contains(string(data), "map_type:") {
			continue // closed meanwhile, or not a map
		}
		var id string
		var mem int64
		for line := range strings.Lines(string(data)) {
			k, val, _ := strings.Cut(strings.TrimSpace(line), ":")
			switch k {
			case "map_id":
				id = strings.TrimSpace(val)
			case "memlock":
				mem, _ = strconv.ParseInt(strings.TrimSpace(val), 10, 64)
			}
		}
		if !seen[id] {
			seen[id] = true
			total += mem
		}
	}
	return total, nil
}
