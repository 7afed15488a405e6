package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
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
// (Unavailable or DeadlineExceeded), an *unreachableError that says why:
// it connects to the endpoint once more, briefly, to find out. An
// Unavailable from a vipd that does answer is vipd's own, and is returned
// as it is. timeout is the call's deadline, for the message.
func (e endpoint) diagnose(err error, timeout time.Duration) error {
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
	conn, dialErr := net.DialTimeout(e.network, e.address, probeTimeout)
	if dialErr == nil {
		conn.Close()
		if code == codes.Unavailable {
			return err
		}
		cause := fmt.Sprintf("it accepts connections but did not answer within %v (--timeout); is it stopped or overloaded?", timeout)
		if e.tls {
			cause = fmt.Sprintf("it accepts connections but no call succeeded within %v (--timeout): does it accept this client's certificate, and --cacert its? is it stopped or overloaded?", timeout)
		}
		return &unreachableError{at: e.shown, err: err, cause: cause}
	}
	return &unreachableError{at: e.shown, cause: e.dialCause(dialErr), err: err}
}

// dialCause says why connecting failed, and what to check.
func (e endpoint) dialCause(err error) string {
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
		return fmt.Sprintf("no connection within %v", probeTimeout)
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
