// Package childproc starts helper processes that must not outlive the
// process that started them (test clients, a vipd under test), even when
// that process is killed. It owns nothing else.
package childproc

import (
	"os/exec"
	"runtime"
	"syscall"
)

// Start starts cmd with Pdeathsig SIGKILL (added to cmd.SysProcAttr, which
// may carry other settings such as a cgroup). The signal follows the OS
// thread that started the child, not the process, so Start runs cmd.Start
// on a thread it keeps locked, and alive, until the child has exited. The
// returned channel yields cmd.Wait's result once.
func Start(cmd *exec.Cmd) (<-chan error, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	started, exited := make(chan error, 1), make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		exited <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return exited, nil
}
