package nodecheck

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/internal/testkit/syncbuf"
)

// TestSetSysctlsFailureLoggedOncePerRun checks that with SetSysctls, a
// sysctl that cannot be written (a read-only /proc/sys) is logged at error
// level once, not at every check, and again after it could be set once.
// The checker reads a /proc/sys of the test's and writes through a fake,
// so nothing in the kernel changes.
func TestSetSysctlsFailureLoggedOncePerRun(t *testing.T) {
	procSys := t.TempDir()
	path := filepath.Join(procSys, "net", "ipv4", "ip_forward")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var log syncbuf.Buffer
	c := New(hclog.New(&hclog.LoggerOptions{Output: &log, Level: hclog.Info}), Config{SetSysctls: true})
	c.procSys = procSys
	readOnly := true
	c.writeFile = func(name string, data []byte, perm os.FileMode) error {
		if readOnly {
			return &os.PathError{Op: "open", Path: name, Err: syscall.EROFS}
		}
		return os.WriteFile(name, data, perm)
	}
	errors := func() int { return strings.Count(log.String(), "[ERROR] --set-sysctls: set sysctl") }

	for range 3 {
		c.Check(nil)
	}
	if n := errors(); n != 1 {
		t.Fatalf("3 checks on a read-only /proc/sys logged %d errors, want 1:\n%s", n, log.String())
	}
	if _, ok := find(c.Warnings(), "sysctl/net.ipv4.ip_forward"); !ok {
		t.Fatalf("no warning for the sysctl that could not be set: %+v", c.Warnings())
	}

	readOnly = false
	c.Check(nil)
	if err := os.WriteFile(path, []byte("0\n"), 0o644); err != nil { // someone turns it off again
		t.Fatal(err)
	}
	readOnly = true
	c.Check(nil)
	c.Check(nil)
	if n := errors(); n != 2 {
		t.Fatalf("a second run of failures: %d errors in all, want 2:\n%s", n, log.String())
	}
}

func find(ws []Warning, check string) (Warning, bool) {
	for _, w := range ws {
		if w.Check == check {
			return w, true
		}
	}
	return Warning{}, false
}
