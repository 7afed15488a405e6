package cluster

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Process is one control-plane (or vipd) process that the harness runs in
// its own process group, with its output in a log file. The process is
// killed if the test binary dies (Pdeathsig), so a crash leaves nothing.
type Process struct {
	Name string
	Bin  string
	Args []string
	Env  []string
	// LogFile receives the process's stdout and stderr (appended to on
	// each start).
	LogFile string

	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start starts the process. It fails if it is already running.
func (p *Process) Start() error {
	if p.Running() {
		return fmt.Errorf("%s: already running", p.Name)
	}
	log, err := os.OpenFile(p.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("%s: %w", p.Name, err)
	}
	fmt.Fprintf(log, "==== %s start %s %s\n", time.Now().Format(time.RFC3339Nano), p.Bin, strings.Join(p.Args, " "))
	cmd := exec.Command(p.Bin, p.Args...)
	cmd.Env = append(os.Environ(), p.Env...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	p.cmd, p.done = cmd, make(chan struct{})
	go func() {
		p.err = cmd.Wait()
		log.Close()
		close(p.done)
	}()
	return nil
}

// Running says whether the process was started and has not exited.
func (p *Process) Running() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Exited is closed when the process exits (nil before the first start).
func (p *Process) Exited() <-chan struct{} { return p.done }

// Pid is the running process's id (0 before the first start).
func (p *Process) Pid() int {
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Stop sends SIGTERM to the process group, waits up to grace, then kills
// the group. It is a no-op for a process that is not running.
func (p *Process) Stop(grace time.Duration) error {
	if !p.Running() {
		return nil
	}
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
	// Whatever the leader left in its group goes too.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	var exit *exec.ExitError
	if p.err != nil && !errors.As(p.err, &exit) {
		return fmt.Errorf("stop %s: %w", p.Name, p.err)
	}
	return nil
}

// Tail is the end of the process's log, for failure messages.
func (p *Process) Tail(n int) string {
	b, err := os.ReadFile(p.LogFile)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// FreePorts returns n distinct unused TCP ports on 127.0.0.1. They are
// free when returned; the harness binds them at once.
func FreePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// logPath is name.log in dir.
func logPath(dir, name string) string { return filepath.Join(dir, name+".log") }

// Signal sends sig to the process's group (SIGSTOP freezes it, SIGCONT
// thaws it).
func (p *Process) Signal(sig syscall.Signal) error {
	if !p.Running() {
		return fmt.Errorf("%s is not running", p.Name)
	}
	if err := syscall.Kill(-p.cmd.Process.Pid, sig); err != nil {
		return fmt.Errorf("signal %s: %w", p.Name, err)
	}
	return nil
}
