package iptables

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// inNetNS runs f on an OS thread inside the network namespace ns, or on the
// calling goroutine when ns is -1 (the current namespace). Files under
// /proc/sys/net and /proc/thread-self/net belong to the namespace of the
// thread that opens them, so f opens them itself.
//
// f runs on a goroutine of its own, locked to its thread; the caller's
// thread never changes namespace. If the thread cannot be moved back, it
// stays locked, so that the runtime discards it instead of reusing it.
func inNetNS(ns netns.NsHandle, f func() error) error {
	if ns < 0 {
		return f()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			// setns failed, so the thread is still where it was.
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter netns: %w", err)
			return
		}
		ferr := f()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("restore netns: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}
