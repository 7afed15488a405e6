package childproc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testkit/childproc"
)

func TestWaitReady(t *testing.T) {
	blockUntilDone := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }

	if err := childproc.WaitReady(make(chan struct{}), time.Minute, func(context.Context) error { return nil }); err != nil {
		t.Errorf("ready at once: %v", err)
	}

	exited := make(chan struct{})
	close(exited)
	start := time.Now()
	err := childproc.WaitReady(exited, time.Minute, blockUntilDone)
	if err == nil || !strings.Contains(err.Error(), "exited before it became ready") || time.Since(start) > 10*time.Second {
		t.Errorf("child exited: %v after %v; want the exit reported at once", err, time.Since(start))
	}

	err = childproc.WaitReady(make(chan struct{}), 50*time.Millisecond, blockUntilDone)
	if err == nil || !strings.Contains(err.Error(), "not ready within 50ms") {
		t.Errorf("never ready: %v; want a timeout naming 50ms", err)
	}
}
