// Package childproc starts helper processes that must not outlive the
// process that started them (test clients, a vipd under test), even when
// that process is killed, and waits for them to become ready. It owns
// nothing else.
package childproc

import (
	"context"
	"fmt"
	"os/exec"
	"runtime"
	"syscall"
	"time"
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

// WaitReady calls ready, which must block until the child is ready or its
// context ends, with a context that ends after timeout or as soon as
// exited is closed. Its error says which of the two it was: a child that
// exited before it was ready, or one that was not ready in time.
func WaitReady(exited <-chan struct{}, timeout time.Duration, ready func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	go func() {
		select {
		case <-exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := ready(ctx); err != nil {
		select {
		case <-exited:
			return fmt.Errorf("exited before it became ready: %w", err)
		default:
		}
		return fmt.Errorf("not ready within %v: %w", timeout, err)
	}
	return nil
}
