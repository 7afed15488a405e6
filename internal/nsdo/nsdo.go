// Package nsdo runs code inside a network namespace, on an OS thread locked
// for the duration. It owns nothing else.
package nsdo

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// Do runs f inside the network namespace at path (the caller's own when
// path is empty), as In does.
func Do(path string, f func() error) error {
	if path == "" {
		return f()
	}
	target, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", path, err)
	}
	defer target.Close()
	return In(target, f)
}

// In runs f on a fresh OS thread that has entered the network namespace ns
// (on the calling goroutine when ns is negative: the current namespace), and
// returns f's error. Files under /proc/sys/net and sockets belong to the
// namespace of the thread that opens them, so f opens them itself. The
// caller's thread never changes namespace. If the thread cannot return to
// its original namespace, it stays locked and the Go runtime discards it,
// so no other goroutine ever runs in the wrong namespace.
func In(ns netns.NsHandle, f func() error) error {
	if ns < 0 {
		return f()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open current network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter network namespace: %w", err)
			return
		}
		ferr := f()
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: the runtime kills it on exit.
			errc <- errors.Join(ferr, fmt.Errorf("return from network namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}
