package netlab

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"strconv"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// labNameRE matches the names of lab namespaces, "vl<pid>-<hex>-<role>", and
// captures the pid of the process that created them.
var labNameRE = regexp.MustCompile(`^vl([1-9][0-9]{0,9})-[0-9a-f]+-`)

// Sweep removes the namespaces under /run/netns that a lab of a process that
// no longer exists left behind (because it was killed, say by go test's
// timeout), and returns their names. Namespaces of live processes, this one
// included, and namespaces netlab did not name are left alone.
//
// The check is by pid only: a leftover whose pid has been reused by an
// unrelated process survives until that process exits, and a lab made by a
// process in another pid namespace that shares /run/netns looks dead.
func Sweep(log hclog.Logger) ([]string, error) {
	entries, err := os.ReadDir(runDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sweep %s: %w", runDir, err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		m := labNameRE.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		pid, err := strconv.Atoi(m[1])
		if err != nil || alive(pid) {
			continue
		}
		if err := deleteNamed(e.Name()); err != nil {
			errs = append(errs, err)
			continue
		}
		log.Info("removed leftover netns", "netns", e.Name(), "pid", pid)
		removed = append(removed, e.Name())
	}
	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("sweep %s: %w", runDir, err)
	}
	return removed, nil
}

// alive reports whether a process with the given pid exists.
func alive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}
