package procstat

import (
	"os"
	"testing"
)

func TestStatusBytes(t *testing.T) {
	rss, err := StatusBytes(os.Getpid(), "VmRSS")
	if err != nil {
		t.Fatal(err)
	}
	hwm, err := StatusBytes(os.Getpid(), "VmHWM")
	if err != nil {
		t.Fatal(err)
	}
	// A Go test binary holds megabytes, and its peak, read after, is at
	// least about what it held (the kernel's RSS counters are per-CPU
	// approximations, so not to the byte).
	if rss < 1<<20 || hwm < rss-rss/8 {
		t.Fatalf("VmRSS %d, then VmHWM %d bytes", rss, hwm)
	}
	if _, err := StatusBytes(os.Getpid(), "NoSuchField"); err == nil {
		t.Fatal("a missing field gave no error")
	}
}

func TestMapMemlockWithoutMaps(t *testing.T) {
	// This process holds no BPF map: nothing is charged.
	if mem, err := MapMemlock(os.Getpid()); err != nil || mem != 0 {
		t.Fatalf("MapMemlock = %d, %v; want 0", mem, err)
	}
}
