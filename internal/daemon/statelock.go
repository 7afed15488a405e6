package daemon

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/server/store"
)

// StateDirInUseError says that another process, a running vipd, holds the
// lock of a state directory.
type StateDirInUseError struct {
	// Dir is the state directory.
	Dir string
	// PID is the process that holds the lock, or 0 when /proc/locks does
	// not tell.
	PID int
}

func (e *StateDirInUseError) Error() string {
	who := "a running vipd"
	if e.PID > 0 {
		who = fmt.Sprintf("a running vipd (pid %d)", e.PID)
	}
	return fmt.Sprintf("%s holds the lock of state dir %s", who, e.Dir)
}

// LockStateDir takes the lock that a running vipd holds on its state
// directory for its whole life (see store.OpenDir), so that nothing that
// must not run beside a vipd (vipd cleanup) does. Call release when done.
// A directory, or lock file, that does not exist has no vipd: release is
// then a no-op. While another process holds the lock, the error is a
// *StateDirInUseError.
func LockStateDir(dir string) (release func(), err error) {
	path := store.LockPath(dir)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return func() {}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open state dir lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, &StateDirInUseError{Dir: dir, PID: flockHolder(f)}
		}
		return nil, fmt.Errorf("lock state dir %s: %w", dir, err)
	}
	return func() { f.Close() }, nil
}

// flockHolder returns the pid that /proc/locks names as the holder of a
// flock on f's file, or 0.
func flockHolder(f *os.File) int {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0
	}
	id := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	locks, err := os.Open("/proc/locks")
	if err != nil {
		return 0
	}
	defer locks.Close()
	sc := bufio.NewScanner(locks)
	for sc.Scan() {
		// "1: FLOCK  ADVISORY  WRITE 4242 00:2a:1234 0 EOF"; waiters have
		// "->" after the number and are skipped.
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[1] != "FLOCK" || fields[5] != id {
			continue
		}
		if pid, err := strconv.Atoi(fields[4]); err == nil {
			return pid
		}
	}
	return 0
}
