package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
)

// endpoint is where vipd is expected, for telling why it cannot be reached.
type endpoint struct {
	network, address string // as net.Dial takes them
	shown            string // as the user may write it: unix:///run/vipd/vipd.sock
	tls              bool   // the connection is mutual TLS
}

// endpointOf is the endpoint of a client target (see client.New).
func endpointOf(target string) endpoint {
	switch {
	case strings.HasPrefix(target, "/"):
		return endpoint{network: "unix", address: target, shown: "unix://" + target}
	case strings.HasPrefix(target, "unix-abstract:"):
		return endpoint{network: "unix", address: "@" + strings.TrimPrefix(target, "unix-abstract:"), shown: target}
	case strings.HasPrefix(target, "unix://"):
		return endpoint{network: "unix", address: strings.TrimPrefix(target, "unix://"), shown: target}
	case strings.HasPrefix(target, "unix:"):
		return endpoint{network: "unix", address: strings.TrimPrefix(target, "unix:"), shown: target}
	}
	hostport := strings.TrimPrefix(target, "tcp://")
	return endpoint{network: "tcp", address: hostport, shown: "tcp://" + hostport}
}

// probeTimeout bounds the connection attempt that finds out why vipd did
// not answer.
const probeTimeout = time.Second

// probeFloor bounds the connection attempt when none could be made within
// the call's deadline: vipd had a connection, so none was started before
// the deadline, and connecting to a vipd that accepts takes far less.
const probeFloor = 100 * time.Millisecond

// prober makes the connection attempt of diagnose while a call is still
// running, so that it ends by the call's deadline (--timeout): a call
// that takes its whole deadline is not followed by a probe that takes
// more. Its interceptors see each call of the client; the calls of a run
// are made one at a time.
type prober struct {
	ep      *endpoint
	timeout time.Duration // the client's, for calls whose context has no deadline

	mu       sync.Mutex
	call     uint64    // counts the calls begun
	deadline time.Time // of the latest call; zero: none
	timer    *time.Timer
	probe    *probe // started during the latest call; nil: none
}

// probe is one connection attempt.
type probe struct {
	done   chan struct{}
	within time.Duration // its bound
	err    error         // set when done is closed
}

// begin arms the probe of a call that starts now with ctx on cc: it starts
// once only the probe's share of the deadline is left, min(probeTimeout,
// half the deadline), unless cc is connected then.
func (p *prober) begin(ctx context.Context, cc *grpc.ClientConn) {
	deadline, ok := ctx.Deadline()
	if !ok && p.timeout > 0 {
		deadline, ok = time.Now().Add(p.timeout), true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.call++
	p.stopLocked()
	p.deadline, p.probe = time.Time{}, nil
	if !ok {
		return
	}
	p.deadline = deadline
	left := time.Until(deadline)
	within := min(probeTimeout, left/2).Round(10 * time.Millisecond)
	call := p.call
	p.timer = time.AfterFunc(left-within, func() {
		if cc.GetState() == connectivity.Ready {
			return
		}
		p.mu.Lock()
		if p.call != call {
			p.mu.Unlock()
			return
		}
		pr := p.ep.start(within, deadline)
		p.probe = pr
		p.mu.Unlock()
	})
}

// end disarms the probe of the call that has ended; one already started
// goes on, for diagnose.
func (p *prober) end() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopLocked()
}

func (p *prober) stopLocked() {
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
}

// unary and stream are the client interceptors that show p the calls.
func (p *prober) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	p.begin(ctx, cc)
	defer p.end()
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (p *prober) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	p.begin(ctx, cc)
	defer p.end()
	return streamer(ctx, desc, cc, method, opts...)
}

// result is the outcome of the probe of the latest call: the one started
// while it ran, or else one started now, bounded by what is left of its
// deadline (at most probeTimeout, at least probeFloor). A nil p probes
// for probeTimeout.
func (p *prober) result(e endpoint) *probe {
	within := probeTimeout
	if p != nil {
		p.mu.Lock()
		p.stopLocked()
		pr, deadline := p.probe, p.deadline
		p.mu.Unlock()
		if pr != nil {
			<-pr.done
			return pr
		}
		if !deadline.IsZero() {
			within = max(probeFloor, min(probeTimeout, time.Until(deadline))).Round(10 * time.Millisecond)
		}
	}
	pr := e.start(within, time.Time{})
	<-pr.done
	return pr
}

// start connects to e in the background, for at most within, and not
// past deadline unless it is zero.
func (e endpoint) start(within time.Duration, deadline time.Time) *probe {
	pr := &probe{done: make(chan struct{}), within: within}
	go func() {
		defer close(pr.done)
		end := time.Now().Add(within)
		if !deadline.IsZero() && deadline.Before(end) {
			end = deadline
		}
		ctx, cancel := context.WithDeadline(context.Background(), end)
		defer cancel()
		var d net.Dialer
		conn, err := d.DialContext(ctx, e.network, e.address)
		if err == nil {
			conn.Close()
		}
		pr.err = err
	}()
	return pr
}

// unreachableError is a call that failed because vipd could not be
// reached: one line with the address and the cause. It unwraps to the
// call's error, whose code gives the exit code.
type unreachableError struct {
	at, cause string
	err       error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("cannot reach vipd at %s: %s", e.at, e.cause)
}

func (e *unreachableError) Unwrap() error { return e.err }

// diagnose returns err, or, when err says that vipd did not answer
// (Unavailable or DeadlineExceeded), an *unreachableError that says why,
// from a connection attempt to the endpoint that p made or makes (see
// prober.result). An Unavailable from a vipd that does answer is vipd's
// own, and is returned as it is. timeout is the call's deadline, for the
// message.
func (e endpoint) diagnose(err error, timeout time.Duration, p *prober) error {
	code := status.Code(err)
	if errors.Is(err, context.DeadlineExceeded) {
		code = codes.DeadlineExceeded
	}
	var placed *fileErrors
	if code != codes.Unavailable && code != codes.DeadlineExceeded || e.network == "" || errors.As(err, &placed) {
		// Placed errors say more than that, such as which services
		// apply wrote before it failed.
		return err
	}
	pr := p.result(e)
	if pr.err == nil {
		if code == codes.Unavailable {
			return err
		}
		cause := fmt.Sprintf("it accepts connections but did not answer within %v (--timeout); is it stopped or overloaded?", timeout)
		if e.tls {
			cause = fmt.Sprintf("it accepts connections but no call succeeded within %v (--timeout): does it accept this client's certificate, and --cacert its? is it stopped or overloaded?", timeout)
		}
		return &unreachableError{at: e.shown, err: err, cause: cause}
	}
	return &unreachableError{at: e.shown, cause: e.dialCause(pr.err, pr.within), err: err}
}

// dialCause says why connecting failed, for at most within, and what to
// check.
func (e endpoint) dialCause(err error, within time.Duration) string {
	unix := e.network == "unix"
	var ne net.Error
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "no such file (is vipd running? is --socket right?)"
	case errors.Is(err, syscall.ECONNREFUSED) && unix:
		return "connection refused: nothing listens on the socket (is vipd running?)"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused (is vipd running, with --listen on this address?)"
	case errors.Is(err, os.ErrPermission):
		return "permission denied (may this user use the socket? see vipd --socket-group)"
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Sprintf("no connection within %v", within)
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		err = op.Err
	}
	var se *os.SyscallError
	if errors.As(err, &se) {
		err = se.Err
	}
	return err.Error()
}
