// Package load generates the benchmark traffic: TCP connection loops, UDP
// request/reply loops, bulk TCP streams and programming-latency probes, all
// from inside a netlab namespace.
//
// The TCP connection loop (TCPConnections) drives many non-blocking
// connections with epoll on one thread per CPU, so that it costs as few
// system calls and context switches as a connection allows and the rate is
// bounded by the kernel's work, not the generator's; CGen, a small C
// program doing the same, cross-checks that. The other loops use blocking
// socket calls on threads locked into the namespace, one thread per worker.
// The servers (StartServers) run in a child process: TCP echo on epoll
// threads (closing first when asked), UDP echo and a discarding sink.
package load

import (
	"bytes"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/internal/testkit/netlab"
)

// PortRange is a range of client source ports, inclusive. Each kind of run
// gets its own: a port used toward a backend directly, and reused toward a
// VIP that DNATs to the same backend within TIME_WAIT, would collide with
// the first connection's conntrack entry and stall for a SYN retry.
type PortRange struct{ Lo, Hi uint16 }

// Port ranges for the kinds of run; together they fill 10000–60999, which
// the client namespace's net.ipv4.ip_local_port_range must cover: the
// kernel ignores a socket's range outside the namespace's. CrossCheckPorts
// are the C generator's (CGen) to the backends directly: its connections
// differ from the Go generator's in their TCP timestamps, which a backend's
// TIME_WAIT of the same tuple would reject.
var (
	DirectPorts     = PortRange{10000, 24999}
	CrossCheckPorts = PortRange{25000, 29999}
	VIPPorts        = PortRange{30000, 54999}
	ProbePorts      = PortRange{55000, 60999}
)

// requestLine is what the clients send; echo servers answer each line.
var requestLine = []byte("ping\n")

// ioTimeout bounds every blocking call of a client socket.
const ioTimeout = 3 * time.Second

// Result is the outcome of one loop of requests.
type Result struct {
	// OK counts the requests (or connections) that got their reply, and
	// Failed the others; FirstErr is the first failure.
	OK, Failed int
	FirstErr   error
	// Elapsed is how long the workers ran.
	Elapsed time.Duration
	// Latencies holds one duration per successful request.
	Latencies []time.Duration
	// Backends counts the replies per answering backend.
	Backends map[string]int
}

// Rate is the successful requests per second.
func (r Result) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.OK) / r.Elapsed.Seconds()
}

// Percentile returns the p-quantile (0 ≤ p ≤ 1) of the latencies, which it
// sorts, or 0 when there are none.
func (r Result) Percentile(p float64) time.Duration {
	if len(r.Latencies) == 0 {
		return 0
	}
	slices.Sort(r.Latencies)
	return r.Latencies[int(p*float64(len(r.Latencies)-1)+0.5)]
}

// worker is one worker's share of a Result.
type worker struct {
	ok, failed int
	firstErr   error
	lat        []time.Duration
	backends   map[string]int
}

func (w *worker) fail(err error) {
	w.failed++
	if w.firstErr == nil {
		w.firstErr = err
	}
}

// add merges what worker w recorded into r.
func (r *Result) add(w *worker) {
	r.OK += w.ok
	r.Failed += w.failed
	if r.FirstErr == nil {
		r.FirstErr = w.firstErr
	}
	r.Latencies = append(r.Latencies, w.lat...)
	for b, n := range w.backends {
		r.Backends[b] += n
	}
}

// run has workers goroutines, each on a thread locked into ns, call step
// until d has passed, and merges what they recorded.
func run(ns *netlab.NS, workers int, d time.Duration, step func(k int, w *worker)) Result {
	var (
		mu  sync.Mutex
		res = Result{Backends: map[string]int{}}
		wg  sync.WaitGroup
	)
	// Each worker's thread blocks in system calls most of the time: with
	// a P for each, a call that returns carries on at once instead of
	// waiting for a P to be handed over.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(runtime.GOMAXPROCS(0), workers+runtime.NumCPU())))
	start := time.Now()
	stop := start.Add(d)
	for k := range workers {
		wg.Go(func() {
			w := &worker{backends: map[string]int{}}
			err := ns.Do(func() error {
				for time.Now().Before(stop) {
					step(k, w)
				}
				return nil
			})
			if err != nil {
				w.fail(err)
			}
			mu.Lock()
			defer mu.Unlock()
			res.add(w)
		})
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	return res
}

// UDPRequests has workers exchange request and reply datagrams with dsts
// from ns for d: each worker uses one connected socket, to dsts[k %
// len(dsts)], and sends its next request when the reply to the last one
// came. Each latency is one round trip.
func UDPRequests(ns *netlab.NS, dsts []netip.AddrPort, ports PortRange, workers int, d time.Duration) Result {
	var mu sync.Mutex
	fds := map[int]int{} // worker → socket
	res := run(ns, workers, d, func(k int, w *worker) {
		mu.Lock()
		fd, ok := fds[k]
		mu.Unlock()
		if !ok {
			var err error
			if fd, err = dial(unix.SOCK_DGRAM, dsts[k%len(dsts)], ports, false); err != nil {
				w.fail(err)
				time.Sleep(10 * time.Millisecond)
				return
			}
			mu.Lock()
			fds[k] = fd
			mu.Unlock()
		}
		t0 := time.Now()
		backend, err := exchange(fd)
		if err != nil {
			w.fail(err)
			return
		}
		w.lat = append(w.lat, time.Since(t0))
		w.ok++
		w.backends[backend]++
	})
	for _, fd := range fds {
		unix.Close(fd)
	}
	return res
}

// Bulk streams data over one TCP connection from ns to dst (a Sink) for d
// and returns the bytes written per second.
func Bulk(ns *netlab.NS, dst netip.AddrPort, ports PortRange, d time.Duration) (float64, error) {
	var (
		sent    int64
		elapsed time.Duration
	)
	err := ns.Do(func() error {
		fd, err := dial(unix.SOCK_STREAM, dst, ports, false)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		buf := make([]byte, 256<<10)
		start := time.Now()
		stop := start.Add(d)
		for time.Now().Before(stop) {
			n, err := retry(func() (int, error) { return unix.Write(fd, buf) })
			if err != nil {
				return fmt.Errorf("bulk write to %s: %w", dst, err)
			}
			sent += int64(n)
		}
		elapsed = time.Since(start)
		return nil
	})
	if err != nil {
		return 0, err
	}
	return float64(sent) / elapsed.Seconds(), nil
}

// Probe connects to dst from ns until a connection is answered by backend
// want, or until deadline. It returns when the connect() of that answered
// connection started, and how many connections it took. Probes close with
// a reset, leaving no TIME_WAIT behind, and never wait between attempts:
// the time resolution is one connection's round trip.
func Probe(ns *netlab.NS, dst netip.AddrPort, want string, deadline time.Time) (landed time.Time, probes int, err error) {
	err = ns.Do(func() error {
		for {
			if time.Now().After(deadline) {
				return fmt.Errorf("no connection to %s reached %s by the deadline (%d tries)", dst, want, probes)
			}
			t0 := time.Now()
			probes++
			backend, err := tcpRequest(dst, ProbePorts, true)
			if err == nil && backend == want {
				landed = t0
				return nil
			}
		}
	})
	return landed, probes, err
}

// tcpRequest makes one connection to dst, sends one request line and
// returns the backend name of the reply. With abort it closes with a reset.
func tcpRequest(dst netip.AddrPort, ports PortRange, abort bool) (string, error) {
	fd, err := dial(unix.SOCK_STREAM, dst, ports, abort)
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	return exchange(fd)
}

// dial opens a blocking socket of typ connected to dst, with a source port
// from ports and I/O timeouts.
func dial(typ int, dst netip.AddrPort, ports PortRange, abort bool) (int, error) {
	if !dst.Addr().Is4() {
		return -1, fmt.Errorf("dial %s: IPv4 only", dst)
	}
	fd, err := unix.Socket(unix.AF_INET, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	tv := unix.NsecToTimeval(ioTimeout.Nanoseconds())
	opts := []error{
		unix.SetsockoptInt(fd, unix.SOL_IP, unix.IP_LOCAL_PORT_RANGE, int(uint32(ports.Hi)<<16|uint32(ports.Lo))),
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv),
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv),
	}
	if abort {
		opts = append(opts, unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0}))
	}
	for _, err := range opts {
		if err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("socket options: %w", err)
		}
	}
	if err := connect(fd, &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("connect %s: %w", dst, err)
	}
	return fd, nil
}

// connect connects the blocking socket fd to sa. The Go runtime's
// preemption signals interrupt blocking system calls: an interrupted
// connect() goes on in the background, so connect waits for it to finish
// and takes its outcome from SO_ERROR.
func connect(fd int, sa unix.Sockaddr) error {
	err := unix.Connect(fd, sa)
	if err != unix.EINTR {
		return err
	}
	deadline := time.Now().Add(ioTimeout)
	for {
		wait := time.Until(deadline)
		if wait <= 0 {
			return unix.ETIMEDOUT
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		n, err := unix.Poll(fds, int(wait.Milliseconds())+1)
		if err == unix.EINTR || (err == nil && n == 0) {
			continue
		}
		if err != nil {
			return err
		}
		soerr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			return err
		}
		if soerr != 0 {
			return unix.Errno(soerr)
		}
		return nil
	}
}

// retry repeats a read or write that a signal interrupted.
func retry(f func() (int, error)) (int, error) {
	for {
		n, err := f()
		if err != unix.EINTR {
			return n, err
		}
	}
}

// exchange sends one request line on fd and reads the reply line,
// returning its first word: the backend name.
func exchange(fd int) (string, error) {
	if _, err := retry(func() (int, error) { return unix.Write(fd, requestLine) }); err != nil {
		return "", fmt.Errorf("send request: %w", err)
	}
	var buf [256]byte
	n := 0
	for {
		m, err := retry(func() (int, error) { return unix.Read(fd, buf[n:]) })
		if err != nil {
			return "", fmt.Errorf("read reply: %w", err)
		}
		if m == 0 {
			return "", fmt.Errorf("read reply: connection closed after %d bytes", n)
		}
		n += m
		if i := bytes.IndexByte(buf[:n], '\n'); i >= 0 {
			line := buf[:i]
			if j := bytes.IndexByte(line, ' '); j >= 0 {
				line = line[:j]
			}
			return string(line), nil
		}
		if n == len(buf) {
			return "", fmt.Errorf("read reply: no newline in %d bytes", n)
		}
	}
}
