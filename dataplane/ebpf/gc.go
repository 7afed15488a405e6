package ebpf

import (
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/dataplane"
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
// when full (those flows are never reported closed).
//
// A flow that expired without being reported closed (no FIN or RST seen,
// and no packet replaced it since) is reported now, with reason timeout,
// to a running WatchFlows. Its forward entry is deleted with an atomic
// lookup-and-delete, so that a packet that revives or replaces the flow
// between the scan and the deletion cannot make it reported twice: an
// entry that turns out live is put back.
func (d *Dataplane) collectGarbage() (int, error) {
	now := monotonicSeconds()
	var (
		flows, dead []bpfCtKey
		replies     = map[bpfCtKey]bpfCtEntry{}
	)
	live := map[uint32]bool{} // reverse-NAT IDs of live flows
	err := forEach(d.objs.VipdCt, func(k bpfCtKey, v bpfCtEntry) {
		if k.Dir == ctDirForward && !expired(v.Expires, now) {
			live[v.RevNatId] = true
		}
		switch {
		case !expired(v.Expires, now):
		case k.Dir == ctDirForward && v.EvFlags&ctEvClosed == 0:
			flows = append(flows, k)
		case k.Dir == ctDirReply:
			replies[k] = v
		default:
			dead = append(dead, k)
		}
	})
	if err != nil {
		return 0, err
	}
	w := d.currentWatch()
	at := ktimeNow()
	var (
		closed []dataplane.FlowEvent
		n      int
	)
	for _, k := range flows {
		var v bpfCtEntry
		if err := d.objs.VipdCt.LookupAndDelete(&k, &v); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				continue
			}
			return n, fmt.Errorf("delete conntrack entry: %w", err)
		}
		rk := replyKeyOf(&k, &v)
		if !expired(v.Expires, now) {
			// Revived or replaced since the scan: it stays, and so
			// does its reply entry. Should the packet path have made a
			// new entry in the meantime, that one wins.
			delete(replies, rk)
			if err := d.objs.VipdCt.Update(&k, &v, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
				d.log.Warn("restore a live conntrack entry", "error", err)
			}
			continue
		}
		n++
		if w == nil || v.EvFlags&ctEvClosed != 0 {
			continue
		}
		r, ok := replies[rk]
		if !ok && d.objs.VipdCt.Lookup(&rk, &r) != nil {
			r = bpfCtEntry{}
		}
		closed = append(closed, d.timedOut(&k, &v, &r, at))
	}
	for k, v := range replies {
		// A reply entry lives as long as its flow: on a flow with
		// traffic one way only, its own expiry lags behind.
		fk := forwardKeyOf(&k, &v)
		var f bpfCtEntry
		if d.objs.VipdCt.Lookup(&fk, &f) == nil && !expired(f.Expires, now) {
			continue
		}
		dead = append(dead, k)
	}
	// The packet path may have re-created any of these keys since the scan
	// (a new flow reusing the tuple): delete each atomically, and put back
	// what turns out to be live.
	deleted := 0
	for _, k := range dead {
		var v bpfCtEntry
		if err := d.objs.VipdCt.LookupAndDelete(&k, &v); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				continue
			}
			return n + deleted, fmt.Errorf("delete conntrack entry: %w", err)
		}
		if !expired(v.Expires, now) {
			if err := d.objs.VipdCt.Update(&k, &v, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
				d.log.Warn("restore a live conntrack entry", "error", err)
			}
			continue
		}
		deleted++
	}
	if w != nil && len(closed) > 0 {
		w.offer(closed)
	}
	// Deleted frontends drain until none of their flows is left.
	d.applyMu.Lock()
	drained, err := d.prog.drained(live)
	d.applyMu.Unlock()
	if err != nil {
		return n + deleted, fmt.Errorf("remove drained frontends: %w", err)
	}
	if drained > 0 {
		d.log.Debug("deleted frontends drained", "frontends", drained)
	}
	return n + deleted, nil
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
