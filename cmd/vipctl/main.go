// Command vipctl controls vipd, the node's service load balancer. The
// commands live in internal/cli; this only wires them to the process.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/vipd/vipd/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.New(cli.Streams{In: os.Stdin, Out: os.Stdout, Err: os.Stderr}).Run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}
