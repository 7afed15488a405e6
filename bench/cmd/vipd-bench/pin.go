package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// pinProcess sets the CPU affinity of every thread of process pid to cpu
// alone; threads it starts later inherit it. The returned function gives
// every thread that still runs the affinity the process's first thread had
// before.
func pinProcess(pid, cpu int) (restore func() error, err error) {
	tids, err := threads(pid)
	if err != nil {
		return nil, err
	}
	var old unix.CPUSet
	if err := unix.SchedGetaffinity(tids[0], &old); err != nil {
		return nil, fmt.Errorf("affinity of thread %d of %d: %w", tids[0], pid, err)
	}
	var one unix.CPUSet
	one.Set(cpu)
	set := func(mask *unix.CPUSet) error {
		tids, err := threads(pid)
		if err != nil {
			return err
		}
		var errs []error
		for _, tid := range tids {
			// A thread may end in between: that is no failure.
			if err := unix.SchedSetaffinity(tid, mask); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("set affinity of thread %d of %d: %w", tid, pid, err))
			}
		}
		return errors.Join(errs...)
	}
	if err := set(&one); err != nil {
		set(&old)
		return nil, err
	}
	return func() error { return set(&old) }, nil
}

// threads lists the thread ids of process pid.
func threads(pid int) ([]int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, fmt.Errorf("threads of %d: %w", pid, err)
	}
	var tids []int
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	if len(tids) == 0 {
		return nil, fmt.Errorf("process %d has no threads", pid)
	}
	return tids, nil
}
