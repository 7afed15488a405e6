// Package nsdo runs code inside a network namespace, on an OS thread locked
// for the duration. It is the tree's one way into a network namespace: the
// daemon, the dataplanes and the test harness (netlab) all go through it.
// It owns nothing else, and imports no test code.
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
	return OnLockedThread(func(netns.NsHandle) error {
		if err := netns.Set(ns); err != nil {
			return fmt.Errorf("enter network namespace: %w", err)
		}
		return f()
	})
}

// OnLockedThread runs f on a new goroutine locked to its OS thread, passing
// the thread's original network namespace, and returns f's error. f may
// move the thread into another namespace (netns.Set, or netns.New and
// netns.NewNamed, which enter the namespace they create); after f the
// thread moves back to orig. If it cannot, the error says so, and the
// thread stays locked so that the Go runtime discards it with the
// goroutine instead of running anything else in the wrong namespace. f must
// not unlock the thread, and must not keep orig, which is closed after f.
//
// In is OnLockedThread for the common case of running code in a namespace
// that already exists.
func OnLockedThread(f func(orig netns.NsHandle) error) error {
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
		ferr := f(orig)
		if err := netns.Set(orig); err != nil {
			// Stay locked: the thread is in a foreign namespace and must
			// die with this goroutine.
			errc <- errors.Join(ferr, fmt.Errorf("return from network namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}
