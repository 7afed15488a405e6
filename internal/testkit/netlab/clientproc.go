package netlab

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/internal/cgroup2"
	"github.com/vipd/vipd/internal/testkit/childproc"
)

// clientEnv names the environment variable that makes a process started by
// StartClient a client process. It holds the clientConfig, as JSON.
const clientEnv = "VIPD_NETLAB_CLIENT"

// The descriptors a client process inherits, besides stdin (requests, one
// JSON clientRequest a line), stdout and stderr.
const (
	clientResultFD = 3 // results: a hello, then one JSON clientResult a line
	clientNetnsFD  = 4 // the namespace to make requests from
)

// clientGrace is how long past a request's deadline Client.Request waits for
// the client process's answer, so that a timeout is reported by the client
// itself, as the error Request would return.
const clientGrace = time.Second

// clientCloseTimeout bounds how long Client.Close waits for the client
// process to exit before it kills it.
const clientCloseTimeout = 5 * time.Second

// clientExecutable returns the binary that StartClient runs as a client
// process: the running one. Tests replace it.
var clientExecutable = sync.OnceValues(os.Executable)

// clientConfig is the configuration of a client process.
type clientConfig struct {
	NS string `json:"ns"` // the namespace's name, for messages
}

// clientRequest is one request to a client process.
type clientRequest struct {
	ID       uint64 `json:"id"`
	Network  string `json:"network"`
	Addr     string `json:"addr"`
	Deadline int64  `json:"deadline"` // Unix nanoseconds
	// The dialConfig.
	LocalPort uint16 `json:"local_port,omitempty"`
	PortLo    uint16 `json:"port_lo,omitempty"`
	PortHi    uint16 `json:"port_hi,omitempty"`
}

// clientResult is what a client process reports: first a hello (ID 0) with
// its pid and cgroup, then the result of each request.
type clientResult struct {
	ID    uint64       `json:"id"`
	Reply Reply        `json:"reply"`
	Error *clientError `json:"error,omitempty"`
	// Hello only: the client process's pid and its cgroup as its
	// /proc/self/cgroup shows it.
	Pid    int    `json:"pid,omitempty"`
	Cgroup string `json:"cgroup,omitempty"`
}

// clientError is the error a client process's request failed with, carried
// back to the process that started it. It unwraps to the errno and, for a
// timeout, to os.ErrDeadlineExceeded, so that errors.Is(err,
// syscall.ECONNREFUSED) and IsTimeout(err) tell what they would have told
// of Request's error.
type clientError struct {
	Msg     string        `json:"msg"`
	Errno   syscall.Errno `json:"errno,omitempty"`
	Timeout bool          `json:"timeout,omitempty"`
}

func newClientError(err error) *clientError {
	e := &clientError{Msg: err.Error(), Timeout: IsTimeout(err)}
	errors.As(err, &e.Errno)
	return e
}

func (e *clientError) Error() string { return e.Msg }

func (e *clientError) Unwrap() []error {
	var errs []error
	if e.Errno != 0 {
		errs = append(errs, e.Errno)
	}
	if e.Timeout {
		errs = append(errs, os.ErrDeadlineExceeded)
	}
	return errs
}

// Client is a client process of its own that makes requests from inside a
// namespace, born in a cgroup v2 directory and never outside it. That is
// what a program on the node looks like to hooks attached to the cgroup,
// such as eBPF sock_addr programs: a socket belongs to the cgroup of the
// process that creates it, whatever namespace it is created in, so requests
// of the test process itself could not stand in for it.
//
// The client process is the running binary again (os.Executable), which
// must call RunClientIfRequested first thing in TestMain or main. It serves
// any number of requests, concurrently, and exits when the Client is closed,
// when its NS is closed, or when this process dies (the kernel kills it).
// A Client is safe for concurrent use.
type Client struct {
	ns     *NS
	cgroup string // its cgroup as its /proc/self/cgroup showed it
	proc   *os.Process

	writeMu sync.Mutex
	stdin   *os.File

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan<- clientResult
	closing bool
	err     error         // why the client is gone, set before done is closed
	done    chan struct{} // closed once the process has exited
}

// StartClient starts a client process in the cgroup v2 directory cgroupDir
// that makes requests from inside the namespace, and returns once it is
// ready. ctx bounds the start only; without a deadline, the start gives up
// after DefaultTimeout. The caller closes the Client; closing the NS closes
// it too.
//
// Starting a client process costs about as much as starting the binary;
// a request through a running one costs a fraction of a millisecond more
// than Request.
func (n *NS) StartClient(ctx context.Context, cgroupDir string) (*Client, error) {
	c, err := n.startClient(ctx, cgroupDir)
	if err != nil {
		return nil, fmt.Errorf("start client in cgroup %s, netns %s: %w", cgroupDir, n.name, err)
	}
	return c, nil
}

func (n *NS) startClient(ctx context.Context, cgroupDir string) (*Client, error) {
	ctx, cancel := withDefaultTimeout(ctx, DefaultTimeout)
	defer cancel()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	exe, err := clientExecutable()
	if err != nil {
		return nil, fmt.Errorf("find the running binary: %w", err)
	}
	cfg, err := json.Marshal(clientConfig{NS: n.name})
	if err != nil {
		return nil, err
	}
	cg, err := openCgroup(cgroupDir)
	if err != nil {
		return nil, err
	}
	defer unix.Close(cg)
	h, err := n.dupHandle()
	if err != nil {
		return nil, err
	}
	nsFile := os.NewFile(uintptr(h), "netns "+n.name)
	defer nsFile.Close()
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer inR.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		inW.Close()
		return nil, err
	}
	defer outW.Close()

	var stderr bytes.Buffer // read only once the process has exited
	// The test flag keeps a test binary that does not call
	// RunClientIfRequested from running its tests again.
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), clientEnv+"="+string(cfg))
	cmd.Stdin, cmd.Stderr = inR, &stderr
	cmd.ExtraFiles = []*os.File{clientResultFD - 3: outW, clientNetnsFD - 3: nsFile}
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: cg}
	cmd.WaitDelay = time.Second
	exited, err := childproc.Start(cmd)
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, fmt.Errorf("start client process: %w", err)
	}
	// The client holds the only other ends now: EOF on outR means that it
	// exited, and closing inW tells it to.
	inR.Close()
	outW.Close()
	c := &Client{
		ns: n, proc: cmd.Process, stdin: inW,
		pending: make(map[uint64]chan<- clientResult), done: make(chan struct{}),
	}
	out := bufio.NewReader(outR)
	abort := func(err error) (*Client, error) {
		inW.Close()
		cmd.Process.Kill()
		werr := <-exited
		outR.Close()
		return nil, fmt.Errorf("client process %d: %w (exit: %v; stderr: %q)", cmd.Process.Pid, err, werr, tail(stderr.String(), 2000))
	}
	dl, _ := ctx.Deadline()
	outR.SetReadDeadline(dl)
	hello, err := readResult(out)
	switch {
	case errors.Is(err, io.EOF):
		return abort(errors.New("exited without reporting (does its binary call netlab.RunClientIfRequested first thing in TestMain?)"))
	case errors.Is(err, os.ErrDeadlineExceeded):
		return abort(fmt.Errorf("not ready: %w", context.DeadlineExceeded))
	case err != nil:
		return abort(err)
	case hello.ID != 0 || hello.Pid != cmd.Process.Pid:
		return abort(fmt.Errorf("unexpected hello %+v", hello))
	}
	outR.SetReadDeadline(time.Time{})
	c.cgroup = hello.Cgroup
	if err := n.addClient(c); err != nil {
		return abort(err)
	}
	go c.read(out, outR, exited, &stderr)
	return c, nil
}

// openCgroup opens the cgroup v2 directory dir, for CLONE_INTO_CGROUP.
func openCgroup(dir string) (int, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open cgroup %s: %w", dir, err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		unix.Close(fd)
		return -1, fmt.Errorf("open cgroup %s: not a cgroup v2 directory (file system type %#x, %v)", dir, st.Type, err)
	}
	return fd, nil
}

func readResult(r *bufio.Reader) (clientResult, error) {
	var res clientResult
	line, err := r.ReadBytes('\n')
	if err != nil {
		return res, err
	}
	if err := json.Unmarshal(line, &res); err != nil {
		return res, fmt.Errorf("malformed result %q: %w", line, err)
	}
	return res, nil
}

// read hands the client's results to the waiting requests until the client
// exits, and then fails the requests still waiting.
func (c *Client) read(out *bufio.Reader, outR *os.File, exited <-chan error, stderr *bytes.Buffer) {
	var rerr error
	for {
		res, err := readResult(out)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				rerr = err
				c.proc.Kill()
			}
			break
		}
		c.mu.Lock()
		if ch, ok := c.pending[res.ID]; ok {
			ch <- res // buffered, and each ID is answered once
			delete(c.pending, res.ID)
		}
		c.mu.Unlock()
	}
	werr := <-exited
	outR.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		c.err = ErrClosed
	} else {
		c.err = fmt.Errorf("client process %d exited: %w (stderr: %q)", c.proc.Pid, errors.Join(werr, rerr), tail(stderr.String(), 2000))
	}
	close(c.done)
}

// Pid returns the client process's pid.
func (c *Client) Pid() int { return c.proc.Pid }

// Request is NS.Request, made by the client process; see NS.Request. The
// reply means what Request's does, and errors keep their cause in the same
// way: errors.Is(err, syscall.ECONNREFUSED) tells a refusal, and
// IsTimeout(err) a timeout. It fails with ErrClosed once the Client is
// closed.
//
// Without a deadline in ctx, Request gives up after DefaultTimeout.
func (c *Client) Request(ctx context.Context, network, addr string, opts ...DialOption) (Reply, error) {
	fnet, dst, cfg, err := parseDial(network, addr, opts)
	if err != nil {
		return Reply{}, err
	}
	fail := func(err error) (Reply, error) {
		return Reply{}, fmt.Errorf("request %s %s from netns %s, client %d in cgroup %s: %w", fnet, dst, c.ns.name, c.proc.Pid, c.cgroup, err)
	}
	ctx, cancel := withDefaultTimeout(ctx, DefaultTimeout)
	defer cancel()
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	deadline, _ := ctx.Deadline()
	ch := make(chan clientResult, 1)
	c.mu.Lock()
	if c.closing || c.err != nil {
		err := c.err
		if c.closing {
			err = ErrClosed
		}
		c.mu.Unlock()
		return fail(err)
	}
	c.nextID++
	id := c.nextID
	c.pending[id] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
	}()

	req, err := json.Marshal(clientRequest{
		ID: id, Network: fnet, Addr: dst.String(), Deadline: deadline.UnixNano(),
		LocalPort: cfg.localPort, PortLo: cfg.portLo, PortHi: cfg.portHi,
	})
	if err != nil {
		return fail(err)
	}
	c.writeMu.Lock()
	_, err = c.stdin.Write(append(req, '\n'))
	c.writeMu.Unlock()
	if err != nil {
		// A client that has died fails the write (EPIPE) before the
		// reader has seen it exit; its exit status is the better error.
		select {
		case <-c.done:
			return fail(c.err)
		case <-time.After(clientGrace):
		}
		return fail(fmt.Errorf("send to client process: %w", err))
	}
	// An expired ctx only starts the grace period: the client's own
	// timeout error is the better one.
	grace := time.NewTimer(time.Until(deadline) + clientGrace)
	defer grace.Stop()
	ctxDone := ctx.Done()
	answer := func(res clientResult) (Reply, error) {
		if res.Error != nil {
			return Reply{}, fmt.Errorf("client in cgroup %s: %w", c.cgroup, res.Error)
		}
		return res.Reply, nil
	}
	for {
		select {
		case res := <-ch:
			return answer(res)
		case <-c.done:
			// The reader hands out every result before done is closed.
			select {
			case res := <-ch:
				return answer(res)
			default:
			}
			return fail(c.err)
		case <-ctxDone:
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fail(ctx.Err())
			}
			ctxDone = nil
		case <-grace.C:
			return fail(fmt.Errorf("no answer from the client process: %w", context.DeadlineExceeded))
		}
	}
}

// Close ends the client process and waits for it to exit; requests still
// waiting fail with ErrClosed. A client that does not exit within 5 s is
// killed. Calling Close again does nothing.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		<-c.done
		return nil
	}
	c.closing = true
	c.mu.Unlock()
	c.ns.removeClient(c)
	// The client exits when its input ends.
	c.writeMu.Lock()
	c.stdin.Close()
	c.writeMu.Unlock()
	t := time.NewTimer(clientCloseTimeout)
	defer t.Stop()
	select {
	case <-c.done:
		return nil
	case <-t.C:
		c.proc.Kill()
		<-c.done
		return fmt.Errorf("close client process %d: still running after %v: killed", c.proc.Pid, clientCloseTimeout)
	}
}

// RequestInCgroup is Request, made by a new client process in the cgroup v2
// directory cgroupDir that exits when the request is done: StartClient,
// Client.Request and Client.Close in one. Starting the process costs about
// as much as starting the binary; for more than a few requests, keep a
// Client.
func (n *NS) RequestInCgroup(ctx context.Context, cgroupDir, network, addr string, opts ...DialOption) (Reply, error) {
	if _, _, _, err := parseDial(network, addr, opts); err != nil {
		return Reply{}, err
	}
	ctx, cancel := withDefaultTimeout(ctx, DefaultTimeout)
	defer cancel()
	c, err := n.StartClient(ctx, cgroupDir)
	if err != nil {
		return Reply{}, err
	}
	defer c.Close()
	return c.Request(ctx, network, addr, opts...)
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

// RunClientIfRequested turns the process into a client process if
// StartClient started it as one: then it serves requests until told to stop
// and exits, never returning. Otherwise it returns at once.
//
// Every binary that uses StartClient or RequestInCgroup must call it first
// thing, before anything that takes time or has effects:
//
//	func TestMain(m *testing.M) {
//		netlab.RunClientIfRequested()
//		...
//	}
func RunClientIfRequested() {
	cfg, ok := os.LookupEnv(clientEnv)
	if !ok {
		return
	}
	if err := serveClient(cfg); err != nil {
		fmt.Fprintf(os.Stderr, "netlab client process: %v\n", err)
		os.Exit(2)
	}
	os.Exit(0)
}

// serveClient is a client process's life: it reports hello, then serves
// each request on stdin in a goroutine of its own, until stdin ends.
func serveClient(cfgJSON string) error {
	var st unix.Stat_t
	if err := unix.Fstat(clientResultFD, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		return fmt.Errorf("descriptor %d is not the result pipe of StartClient (%v)", clientResultFD, err)
	}
	var cfg clientConfig
	if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
		return fmt.Errorf("parse %s: %w", clientEnv, err)
	}
	out := os.NewFile(clientResultFD, "results")
	var outMu sync.Mutex
	report := func(res clientResult) {
		b, err := json.Marshal(res)
		if err == nil {
			outMu.Lock()
			_, err = out.Write(append(b, '\n'))
			outMu.Unlock()
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "netlab client process: report result: %v\n", err)
			os.Exit(2)
		}
	}
	cgroup, err := cgroup2.ProcCgroup(0)
	if err != nil {
		return err
	}
	report(clientResult{Pid: os.Getpid(), Cgroup: cgroup})

	// Never closed: closing an NS would remove its bind mount.
	n := &NS{name: cfg.NS, log: hclog.NewNullLogger(), handle: netns.NsHandle(clientNetnsFD)}
	in := bufio.NewReader(os.Stdin)
	for {
		line, err := in.ReadBytes('\n')
		if errors.Is(err, io.EOF) && len(line) == 0 {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read request: %w", err)
		}
		var req clientRequest
		if err := json.Unmarshal(line, &req); err != nil || req.ID == 0 {
			return fmt.Errorf("malformed request %q: %v", line, err)
		}
		go func() {
			var opts []DialOption
			if req.LocalPort != 0 {
				opts = append(opts, WithLocalPort(req.LocalPort))
			}
			if req.PortHi != 0 {
				opts = append(opts, WithLocalPortRange(req.PortLo, req.PortHi))
			}
			ctx, cancel := context.WithDeadline(context.Background(), time.Unix(0, req.Deadline))
			defer cancel()
			res := clientResult{ID: req.ID}
			if r, err := n.Request(ctx, req.Network, req.Addr, opts...); err != nil {
				res.Error = newClientError(err)
			} else {
				res.Reply = r
			}
			report(res)
		}()
	}
}

// addClient registers c to be closed with n.
func (n *NS) addClient(c *Client) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	if n.clients == nil {
		n.clients = make(map[*Client]struct{})
	}
	n.clients[c] = struct{}{}
	return nil
}

// removeClient forgets c, which is being closed.
func (n *NS) removeClient(c *Client) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.clients, c)
}
