package ebpf

import (
	"time"

	"golang.org/x/sys/unix"
)

// monotonicSeconds is the clock of the BPF programs (bpf_ktime_get_ns).
func monotonicSeconds() uint32 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint32(ts.Sec)
}

// expired reports whether an entry's expiry lies in the past, with
// wrap-around arithmetic like the programs'.
func expired(expires, now uint32) bool { return int32(expires-now) < 0 }

// collectGarbage deletes conntrack entries past their lifetime (the
// programs ignore them already; this frees their slots) and returns how
// many it deleted. The LRU map also evicts the oldest entries by itself
// when full.
func (d *Dataplane) collectGarbage() (int, error) {
	now := monotonicSeconds()
	var dead []bpfCtKey
	err := forEach(d.objs.VipdCt, func(k bpfCtKey, v bpfCtEntry) {
		if expired(v.Expires, now) {
			dead = append(dead, k)
		}
	})
	if err != nil {
		return 0, err
	}
	if err := batchDelete(d.objs.VipdCt, dead); err != nil {
		return 0, err
	}
	return len(dead), nil
}

// gcLoop runs collectGarbage every interval until stop is closed.
func (d *Dataplane) gcLoop(interval time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			start := time.Now()
			n, err := d.collectGarbage()
			if err != nil {
				d.log.Warn("conntrack garbage collection", "error", err)
				continue
			}
			if n > 0 {
				d.log.Debug("conntrack garbage collected", "entries", n, "elapsed", time.Since(start))
			}
		}
	}
}
