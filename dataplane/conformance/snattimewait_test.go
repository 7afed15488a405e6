package conformance

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// snatTimeWaitScenario is the snat-timewait scenario. Its vipd shrinks the
// masquerade's ports to 128 (eBPF) and the conntrack lifetime of closed
// TCP flows to 1 s, so that the backend-side tuples (node address:port ->
// backend) of server-closes-first connections come back while the backend
// still holds their TIME_WAIT (60 s); and serves metrics on the machine's
// loopback, at a port that was free (as the flows metrics scenario does).
func snatTimeWaitScenario() scenario {
	addr := ""
	if l, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
		addr = l.Addr().String()
		l.Close()
	}
	return scenario{
		name:     "snat-timewait",
		vipdArgs: []string{"--snat-port-range", "61000-61127", "--bpf-ct-timeout-tcp-close", "1s", "--metrics-addr", addr},
		run:      func(e *env) { snatTimeWait(e, addr) },
	}
}

const (
	// closeFirstPort is where be1's server that closes first listens.
	closeFirstPort = 8090
	// timeWaitSerial and timeWaitParallel are the connections the scenario
	// makes per family one after another, and per worker of
	// timeWaitWorkers at once; timeWaitGap paces each sequence, so that
	// the closed flows holding ports for 1 s leave most of the 128 free.
	timeWaitSerial   = 120
	timeWaitWorkers  = 4
	timeWaitParallel = 30
	timeWaitGap      = 30 * time.Millisecond
	// timeWaitSlow is the time over which a connection counts as one
	// that waited for a retransmission (TCP's first SYN retransmission
	// comes after 1 s).
	timeWaitSlow = 900 * time.Millisecond
	// reuseWorkers, reusePerWorker and reusePorts shape the port-reuse
	// phase: reuseWorkers clients at once, each making reusePerWorker
	// connections per family from its reusePorts source ports in turn
	// (from reusePortBase up, outside the namespace's ephemeral range), as
	// a busy client without TIME_WAITs of its own does.
	reuseWorkers   = 4
	reusePerWorker = 600
	reusePorts     = 16
	reusePortBase  = 20000
)

// should not stall server-closes-first TCP connections from outside through
// a masqueraded node port when the backend-side tuples are reused within
// the backend's TIME_WAIT: a SYN with a port whose TIME_WAIT would refuse
// it (PAWS: its timestamp older than the last client's of that tuple) is
// reset and retried a second later. The backend's TcpExtPAWSTimewait must
// not move, and every connection must complete. eBPF reuses the ports of
// its small pool (61000-61127) many times over; iptables' MASQUERADE draws
// from 64k ports and its conntrack keeps a closed tuple for 120 s, so this
// phase alone reuses none there.
//
// Then (iptables) the client reuses its source ports, a few at a time,
// over thousands of connections (see clientPortReuse): still no PAWS.
// This phase failed (be1's TcpExtPAWSTimewait +23 over 2,400 IPv4
// connections) with MASQUERADE --random-fully.
//
// With eBPF, vipd's metrics (at metricsAddr) must show the guard at work:
// ports skipped for the TIME_WAIT (vipd_snat_timewait_skips_total), and
// no flow dropped for want of a port (vipd_snat_port_exhausted_total).
func snatTimeWait(e *env, metricsAddr string) {
	e.startCloseFirstServer(e.be1)
	svc := e.externalService(ports(withNodePort(tcpPort(80, closeFirstPort), nodePort)), e.be1)
	if !e.upsertExternal(svc) {
		return
	}
	for _, f := range families {
		np := ap(e.node1.addr(f), nodePort)
		before := e.pawsTimewait(e.be1)
		var (
			mu     sync.Mutex
			peers  = map[netip.AddrPort]int{}
			slow   []time.Duration
			failed []error
		)
		conn := func() {
			start := time.Now()
			peer, err := closeFirstRequest(e.out, np)
			took := time.Since(start)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed = append(failed, err)
				return
			}
			peers[peer]++
			if took > timeWaitSlow {
				slow = append(slow, took)
			}
		}
		for range timeWaitSerial {
			conn()
			time.Sleep(timeWaitGap)
		}
		var wg sync.WaitGroup
		for range timeWaitWorkers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range timeWaitParallel {
					conn()
					time.Sleep(timeWaitGap * timeWaitWorkers)
				}
			}()
		}
		wg.Wait()
		after := e.pawsTimewait(e.be1)
		n := timeWaitSerial + timeWaitWorkers*timeWaitParallel
		reused := n - len(failed) - len(peers)
		e.logf("TCP %v from out: %d server-closes-first connections, %d failed, %d over %v, %d distinct backend-side tuples (%d reuses), be1's TcpExtPAWSTimewait +%d",
			np, n, len(failed), len(slow), timeWaitSlow, len(peers), reused, after-before)
		if len(failed) > 0 {
			e.fatalf("TCP %v from out: %d of %d server-closes-first connections failed, the first: %v", np, len(failed), n, failed[0])
		}
		if after != before {
			e.fatalf("TCP %v from out: be1's TcpExtPAWSTimewait went from %d to %d over %d server-closes-first connections "+
				"(%d reuses of %d backend-side tuples; %d took over %v): the masquerade handed tuples still in TIME_WAIT at the backend "+
				"to SYNs it refused", np, before, after, n, reused, len(peers), len(slow), timeWaitSlow)
		}
		if e.dp == "ebpf" {
			for p := range peers {
				if p.Port() < 61000 || p.Port() > 61127 || !slices.Contains(e.masqueraded(f), p.Addr()) {
					e.fatalf("TCP %v from out: be1 saw the client as %v, want a node address and a port of 61000-61127", np, p)
				}
			}
			// The scenario proves something only if tuples came back
			// inside their TIME_WAIT.
			if reused < n/4 {
				e.fatalf("TCP %v from out: only %d of %d connections reused a backend-side tuple, want at least %d", np, reused, n, n/4)
			}
		}
	}
	if e.dp != "ebpf" {
		// eBPF's pool is shrunk to 128 ports held 1 s each here: the
		// first phase paces its connections to fit, and this one could
		// not.
		for _, f := range families {
			e.clientPortReuse(ap(e.node1.addr(f), nodePort))
		}
		return
	}
	if metricsAddr == "" {
		e.fatalf("no free port on the machine's loopback for vipd's metrics")
	}
	samples := e.scrape(metricsAddr)
	skips, ok := sampleValue(samples, "vipd_snat_timewait_skips_total", nil)
	if !ok || skips == 0 {
		e.fatalf("vipd_snat_timewait_skips_total = %v (exported: %v), want ports skipped for the backend's TIME_WAIT\n%s",
			skips, ok, grepSamples(samples, "vipd_snat_timewait_skips_total", "vipd_snat_port_exhausted_total"))
	}
	if exhausted, ok := sampleValue(samples, "vipd_snat_port_exhausted_total", nil); !ok || exhausted != 0 {
		e.fatalf("vipd_snat_port_exhausted_total = %v (exported: %v), want 0: no flow dropped for want of a port\n%s",
			exhausted, ok, grepSamples(samples, "vipd_snat_timewait_skips_total", "vipd_snat_port_exhausted_total"))
	}
	e.logf("vipd_snat_timewait_skips_total %v", skips)
}

// clientPortReuse makes reuseWorkers × reusePerWorker server-closes-first
// connections from e.out to np (a masqueraded node port served by be1),
// each worker from its own reusePorts source ports in turn, and fails if
// any failed or be1's TcpExtPAWSTimewait moved. The client keeps no
// TIME_WAIT, so each port comes back within milliseconds, while node1's
// conntrack still holds the last flow of that client tuple in TIME_WAIT:
// the new SYN replaces that entry, and with it the flow's masqueraded
// (backend-side) tuple, whose TIME_WAIT be1 keeps for 60 s. A masquerade
// that then hands such a tuple to another client tuple (MASQUERADE
// --random-fully: a random port of 64k, so about n²/2/64k times for n
// connections, ~45 here) has be1 refuse the SYN by PAWS half the time;
// one that keeps the client's port brings the tuple back with the same
// client's timestamps.
func (e *env) clientPortReuse(np netip.AddrPort) {
	before := e.pawsTimewait(e.be1)
	var (
		mu     sync.Mutex
		peers  = map[netip.AddrPort]int{}
		slow   int
		failed []error
		wg     sync.WaitGroup
	)
	for w := range reuseWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range reusePerWorker {
				port := uint16(reusePortBase + w*reusePorts + i%reusePorts)
				start := time.Now()
				peer, err := closeFirstRequestFrom(e.out, port, np)
				took := time.Since(start)
				mu.Lock()
				if err != nil {
					failed = append(failed, err)
				} else {
					peers[peer]++
				}
				if took > timeWaitSlow {
					slow++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	after := e.pawsTimewait(e.be1)
	n := reuseWorkers * reusePerWorker
	e.logf("TCP %v from out, %d client ports reused in turn: %d server-closes-first connections, %d failed, %d over %v, %d distinct backend-side tuples, be1's TcpExtPAWSTimewait +%d",
		np, reuseWorkers*reusePorts, n, len(failed), slow, timeWaitSlow, len(peers), after-before)
	if len(failed) > 0 {
		e.fatalf("TCP %v from out, client ports reused: %d of %d server-closes-first connections failed, the first: %v", np, len(failed), n, failed[0])
	}
	if after != before {
		e.fatalf("TCP %v from out, client ports reused: be1's TcpExtPAWSTimewait went from %d to %d over %d server-closes-first connections "+
			"(%d distinct backend-side tuples; %d took over %v): the masquerade handed backend-side tuples still in TIME_WAIT at be1 "+
			"to other client tuples, whose SYNs it refused", np, before, after, n, len(peers), slow, timeWaitSlow)
	}
}

// startCloseFirstServer starts a TCP server on closeFirstPort in h (both
// families) that reads one line, answers with the peer it saw and closes
// first, as bench/load's servers do: h keeps each connection's TIME_WAIT.
func (e *env) startCloseFirstServer(h host) {
	e.t.Helper()
	var l net.Listener
	err := h.Do(func() error {
		var err error
		l, err = net.Listen("tcp", ":"+strconv.Itoa(closeFirstPort))
		return err
	})
	if err != nil {
		e.fatalf("listen in %s: %v", h.name, err)
	}
	var wg sync.WaitGroup
	e.t.Cleanup(func() {
		l.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(replyDeadline))
				if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
					return
				}
				fmt.Fprintf(c, "%s\n", c.RemoteAddr())
			}()
		}
	}()
}

// closeFirstRequest connects from h to dst, sends a line, reads the
// answer up to the server's close, then closes: the server closes first.
// It returns the peer the server saw.
func closeFirstRequest(h host, dst netip.AddrPort) (netip.AddrPort, error) {
	return closeFirstRequestFrom(h, 0, dst)
}

// closeFirstRequestFrom is closeFirstRequest from source port port (0: an
// ephemeral one), bound with SO_REUSEADDR.
func closeFirstRequestFrom(h host, port uint16, dst netip.AddrPort) (netip.AddrPort, error) {
	ctx, cancel := context.WithTimeout(context.Background(), replyDeadline)
	defer cancel()
	d := &net.Dialer{}
	if port != 0 {
		d.LocalAddr = &net.TCPAddr{Port: int(port)}
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
			}); err != nil {
				return err
			}
			return serr
		}
	}
	var c net.Conn
	err := h.Do(func() error {
		var err error
		c, err = d.DialContext(ctx, "tcp", dst.String())
		return err
	})
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("connect %v from %s: %w", dst, h.name, err)
	}
	defer c.Close()
	deadline, _ := ctx.Deadline()
	c.SetDeadline(deadline)
	if _, err := io.WriteString(c, "hello\n"); err != nil {
		return netip.AddrPort{}, fmt.Errorf("send to %v from %s: %w", dst, h.name, err)
	}
	b, err := io.ReadAll(c)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("read from %v in %s: %w", dst, h.name, err)
	}
	peer, err := netip.ParseAddrPort(strings.TrimSpace(string(b)))
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("answer of %v to %s: %q: %w", dst, h.name, b, err)
	}
	return netip.AddrPortFrom(peer.Addr().Unmap(), peer.Port()), nil
}

// pawsTimewait reads h's TcpExtPAWSTimewait: the SYNs its TIME_WAIT
// sockets refused by PAWS (their timestamps older than the last ones of
// the tuple).
func (e *env) pawsTimewait(h host) uint64 {
	e.t.Helper()
	var b []byte
	err := h.Do(func() error {
		var err error
		// thread-self: /proc/self/net is the namespace of the process's
		// main thread, not this one's.
		b, err = os.ReadFile("/proc/thread-self/net/netstat")
		return err
	})
	if err != nil {
		e.fatalf("read %s's netstat: %v", h.name, err)
	}
	v, err := netstatValue(string(b), "TcpExt", "PAWSTimewait")
	if err != nil {
		e.fatalf("%s's netstat: %v", h.name, err)
	}
	return v
}

// netstatValue finds field of group in /proc/net/netstat's text: a header
// line of names, then a line of values, each starting "group:".
func netstatValue(text, group, field string) (uint64, error) {
	lines := strings.Split(text, "\n")
	for i := 0; i+1 < len(lines); i++ {
		names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(names) == 0 || names[0] != group+":" || len(values) != len(names) || values[0] != group+":" {
			continue
		}
		for j, n := range names {
			if n == field {
				return strconv.ParseUint(values[j], 10, 64)
			}
		}
	}
	return 0, errors.New("no " + group + " " + field)
}
