// Package nsdo runs code inside a network namespace given by path, on an
// OS thread locked for the duration. It owns nothing else.
package nsdo

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// Do runs f on a fresh OS thread that has entered the network namespace at
// path (the caller's own namespace when path is empty), and returns f's
// error. If the thread cannot return to its original namespace, it stays
// locked and the Go runtime discards it, so no other goroutine ever runs
// in the wrong namespace.
func Do(path string, f func() error) error {
	if path == "" {
		return f()
	}
	target, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", path, err)
	}
	defer target.Close()
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
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter network namespace %s: %w", path, err)
			return
		}
		ferr := f()
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: the runtime kills it on exit.
			errc <- fmt.Errorf("return from network namespace %s: %w (after: %v)", path, err, ferr)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}
