package nsdo_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/vipd/vipd/internal/nsdo"
	"github.com/vipd/vipd/internal/testkit/require"
)

// newNS makes an unnamed network namespace, closed when the test ends:
// nothing outside the process refers to it, so the kernel then destroys it.
func newNS(t *testing.T) netns.NsHandle {
	t.Helper()
	require.Root(t, "creating network namespaces")
	ns := netns.None()
	err := nsdo.OnLockedThread(func(netns.NsHandle) error {
		var err error
		ns, err = netns.New() // moves the locked thread into ns
		return err
	})
	if err != nil {
		if ns.IsOpen() {
			ns.Close()
		}
		t.Fatalf("new netns: %v", err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

// current returns the calling thread's network namespace; the caller must
// have locked the thread.
func current(t *testing.T) netns.NsHandle {
	t.Helper()
	h, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// inside returns an f for In and Do that fails unless it runs in ns.
func inside(ns netns.NsHandle, ran *bool) func() error {
	return func() error {
		*ran = true
		cur, err := netns.Get()
		if err != nil {
			return err
		}
		defer cur.Close()
		if !cur.Equal(ns) {
			return errors.New("f ran outside the namespace")
		}
		return nil
	}
}

func TestIn(t *testing.T) {
	ns := newNS(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before := current(t)
	if before.Equal(ns) {
		t.Fatal("the new namespace is the test's own")
	}
	for range 20 {
		var ran bool
		if err := nsdo.In(ns, inside(ns, &ran)); err != nil || !ran {
			t.Fatalf("In: ran %v, %v", ran, err)
		}
	}
	if !current(t).Equal(before) {
		t.Fatal("the caller's thread changed namespace")
	}

	t.Run("CallerNamespace", func(t *testing.T) {
		var ran bool
		if err := nsdo.In(netns.None(), inside(before, &ran)); err != nil || !ran {
			t.Fatalf("In(None): ran %v, %v", ran, err)
		}
	})
	t.Run("ErrorPassesThrough", func(t *testing.T) {
		sentinel := errors.New("f failed")
		if err := nsdo.In(ns, func() error { return sentinel }); err != sentinel {
			t.Fatalf("In: got %v, want f's error itself", err)
		}
	})
	t.Run("EnterFails", func(t *testing.T) {
		f, err := os.Open(os.Args[0]) // not a namespace: setns fails
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var ran bool
		err = nsdo.In(netns.NsHandle(f.Fd()), func() error { ran = true; return nil })
		if err == nil || ran || !strings.Contains(err.Error(), "enter network namespace") {
			t.Fatalf("In with a regular file: ran %v, %v; want an enter error and f not run", ran, err)
		}
	})
}

func TestDo(t *testing.T) {
	ns := newNS(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before := current(t)

	var ran bool
	if err := nsdo.Do("/proc/self/fd/"+strconv.Itoa(int(ns)), inside(ns, &ran)); err != nil || !ran {
		t.Fatalf("Do(path): ran %v, %v", ran, err)
	}
	ran = false
	if err := nsdo.Do("", inside(before, &ran)); err != nil || !ran {
		t.Fatalf(`Do(""): ran %v, %v`, ran, err)
	}
	ran = false
	missing := filepath.Join(t.TempDir(), "missing")
	err := nsdo.Do(missing, func() error { ran = true; return nil })
	if !errors.Is(err, fs.ErrNotExist) || ran || !strings.Contains(err.Error(), missing) {
		t.Fatalf("Do(missing): ran %v, %v; want ErrNotExist naming the path, f not run", ran, err)
	}
	if !current(t).Equal(before) {
		t.Fatal("the caller's thread changed namespace")
	}
}

// TestOnLockedThreadRestores moves the locked thread into new namespaces
// and checks that no thread of the process is left in one of them.
func TestOnLockedThreadRestores(t *testing.T) {
	require.Root(t, "creating network namespaces")
	runtime.LockOSThread()
	orig := current(t)
	runtime.UnlockOSThread()
	for range 20 {
		var created netns.NsHandle
		err := nsdo.OnLockedThread(func(o netns.NsHandle) error {
			if !o.Equal(orig) {
				return errors.New("orig is not the thread's original namespace")
			}
			var err error
			created, err = netns.New()
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		created.Close()
	}
	// Every goroutine, on whatever thread it lands, is back in orig.
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for range 50 {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			h, err := netns.Get()
			if err != nil {
				errs <- err
				return
			}
			defer h.Close()
			if !h.Equal(orig) {
				errs <- errors.New("a thread was left in a foreign namespace")
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
