package cgroup2

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// IsCgroup2 reports whether dir is on a cgroup v2 file system: the root of a
// cgroup2 mount or a cgroup inside one.
func IsCgroup2(dir string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false, &os.PathError{Op: "statfs", Path: dir, Err: err}
	}
	return st.Type == unix.CGROUP2_SUPER_MAGIC, nil
}

// Mount mounts the cgroup v2 hierarchy at dir, an existing directory,
// unless dir is on a cgroup2 file system already, in which case it does
// nothing. The caller unmounts what Mount mounted.
//
// The new mount gets the hierarchy's current options (see the package
// documentation), so that mounting does not change them for everyone else.
func Mount(dir string) error {
	ok, err := IsCgroup2(dir)
	if err != nil {
		return fmt.Errorf("mount cgroup2 at %s: %w", dir, err)
	}
	if ok {
		return nil
	}
	data, err := hierarchyOptions()
	if err != nil {
		return fmt.Errorf("mount cgroup2 at %s: %w", dir, err)
	}
	if err := unix.Mount("cgroup2", dir, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, data); err != nil {
		return fmt.Errorf("mount cgroup2 at %s (options %q): %w", dir, data, err)
	}
	return nil
}

// hierarchyFlags are the cgroup2 mount options that set a flag of the whole
// hierarchy rather than of one mount. Every cgroup2 mount made in the initial
// cgroup namespace resets these flags to its own options.
var hierarchyFlags = []string{
	"nsdelegate",
	"favordynmods",
	"memory_localevents",
	"memory_recursiveprot",
	"memory_hugetlb_accounting",
	"pids_localevents",
}

// hierarchyOptions returns the hierarchy flags of an existing cgroup2 mount
// of this mount namespace, comma-separated, or "" when there is none.
func hierarchyOptions() (string, error) {
	mounts, err := Mountinfo()
	if err != nil {
		return "", err
	}
	for _, m := range mounts {
		if m.FSType != "cgroup2" {
			continue
		}
		var opts []string
		for o := range strings.SplitSeq(m.SuperOptions, ",") {
			if slices.Contains(hierarchyFlags, o) {
				opts = append(opts, o)
			}
		}
		return strings.Join(opts, ","), nil
	}
	return "", nil
}

// MountEntry is one line of /proc/self/mountinfo: one mount of the
// caller's mount namespace.
type MountEntry struct {
	MountPoint   string // unescaped
	FSType       string // "cgroup2", "tmpfs", ...
	SuperOptions string // comma-separated, as the kernel lists them
}

// Mountinfo returns the mounts of the caller's mount namespace, in the order
// of /proc/self/mountinfo.
func Mountinfo() ([]MountEntry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var mounts []MountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		// ID parent major:minor root mount-point options [optional...] - fstype source super-options
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		f1, f2 := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f1) < 5 || len(f2) < 3 {
			return nil, fmt.Errorf("parse /proc/self/mountinfo: malformed line %q", sc.Text())
		}
		mounts = append(mounts, MountEntry{MountPoint: unescapeMountinfo(f1[4]), FSType: f2[0], SuperOptions: f2[2]})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read /proc/self/mountinfo: %w", err)
	}
	return mounts, nil
}

// unescapeMountinfo undoes the kernel's octal escapes (\040 for a space,
// ...) in a mountinfo path.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Procs returns the processes in the cgroup dir (its cgroup.procs), not
// counting those of its descendants.
func Procs(dir string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for f := range strings.FieldsSeq(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("parse %s: %q: %w", filepath.Join(dir, "cgroup.procs"), f, err)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// ProcCgroup returns the cgroup v2 path of process pid (0 for the calling
// process) as /proc/PID/cgroup shows it: relative to the root of the
// caller's cgroup namespace, such as "/vipd-test-123-0a1b2c3d".
func ProcCgroup(pid int) (string, error) {
	p := "/proc/self/cgroup"
	if pid != 0 {
		p = "/proc/" + strconv.Itoa(pid) + "/cgroup"
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return "", err
	}
	for line := range strings.Lines(string(b)) {
		if path, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "0::"); ok {
			return path, nil
		}
	}
	return "", fmt.Errorf("%s has no cgroup v2 line (has cgroup2 never been mounted?)", p)
}
