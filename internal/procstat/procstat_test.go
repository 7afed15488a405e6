package procstat

import (
	"os"
	"testing"
)

func TestStatusBytes(t *testing.T) {
	hwm, err := StatusBytes(os.Getpid(), "VmHWM")
	if err != nil {
		t.Fatal(err)
	}
	rss, err := StatusBytes(os.Getpid(), "VmRSS")
	if err != nil {
		t.Fatal(err)
	}
	// A Go test binary holds megabytes, and its peak is at least what it holds.
	if rss < 1<<20 || hwm < rss {
		t.Fatalf("VmRSS %d, VmHWM %d bytes", rss, hwm)
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
