package ebpf

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/vipd/vipd/dataplane"
)

// How long vipd waits before it retries an attachment repair that failed:
// from repairRetryMin, doubling while the same gaps stay, up to
// repairRetryMax.
const (
	repairRetryMin = 10 * time.Second
	repairRetryMax = 5 * time.Minute
)

// repairBackoff holds back the repair of attachment gaps that a repair
// already failed to close (a pod interface tc refuses, a removed cgroup, an
// unmounted bpffs): while it holds, DetectDrift does not report those
// gaps, so that the reconciler does not run a full apply each drift check
// for a gap it cannot close. Gaps that differ from the failed ones are
// due at once.
type repairBackoff struct {
	gaps string        // gapKey of what the last failed repair left, or ""
	next time.Time     // when those gaps are due again
	wait time.Duration // the last wait
}

// gapKey identifies a set of attachment drifts, in any order.
func gapKey(drifts []dataplane.Drift) string {
	details := make([]string, len(drifts))
	for i, d := range drifts {
		details[i] = d.What + ": " + d.Detail
	}
	slices.Sort(details)
	return strings.Join(details, "\n")
}

// due reports whether the gaps named by key are to be reported and
// repaired at now.
func (b *repairBackoff) due(key string, now time.Time) bool {
	return key == "" || key != b.gaps || !now.Before(b.next)
}

// failed records that a repair left the gaps named by key, and returns how
// long they are held back.
func (b *repairBackoff) failed(key string, now time.Time) time.Duration {
	if key == b.gaps && b.wait > 0 {
		b.wait = min(2*b.wait, repairRetryMax)
	} else {
		b.wait = repairRetryMin
	}
	b.gaps, b.next = key, now.Add(b.wait)
	return b.wait
}

// repairAttachments checks the attachments and redoes what is missing,
// unless a repair of the same gaps failed less than the backoff ago. It
// returns what it repaired.
//
// It never fails: Apply calls it after the maps hold the new state, which
// is then in force whatever happens to the attachments. What it cannot
// repair it logs, once per attempt, and DetectDrift reports again when the
// backoff ends.
func (d *Dataplane) repairAttachments() []dataplane.Drift {
	drifts, gaps, err := d.checkAttachments()
	if err != nil {
		d.log.Warn("cannot check the attachments; the applied state is in the maps", "error", err)
		return nil
	}
	if !gaps.any() {
		d.repairs = repairBackoff{}
		return nil
	}
	now := time.Now()
	if key := gapKey(drifts); !d.repairs.due(key, now) {
		d.log.Debug("attachment repair held back after failing", "gaps", key, "retry_at", d.repairs.next)
		return nil
	}
	err = d.repair(gaps)
	if err == nil {
		d.repairs = repairBackoff{}
		return drifts
	}
	left, _, cerr := d.checkAttachments()
	if cerr != nil {
		left = drifts
	}
	wait := d.repairs.failed(gapKey(left), now)
	details := make([]string, len(left))
	for i, l := range left {
		details[i] = l.Detail
	}
	d.log.Warn("attachment repair failed: the applied state is in the maps, but traffic through these attachments "+
		"is not load-balanced; retrying after "+wait.String(), "gaps", details, "error", err)
	return slices.DeleteFunc(drifts, func(r dataplane.Drift) bool { return slices.Contains(left, r) })
}

// checkConfig compares vipd_config with what vipd wrote, and returns the
// difference as a drift, or nil.
func (d *Dataplane) checkConfig() (*dataplane.Drift, error) {
	var got bpfConfig
	if err := d.objs.VipdConfig.Lookup(uint32(0), &got); err != nil {
		return nil, fmt.Errorf("read vipd_config: %w", err)
	}
	if got == d.config {
		return nil, nil
	}
	return &dataplane.Drift{What: driftMapEntries, Detail: fmt.Sprintf("vipd_config: holds %+v, vipd wrote %+v", got, d.config)}, nil
}

// repairConfig rewrites vipd_config if it differs from what vipd wrote,
// and returns what it repaired. A failure is logged; DetectDrift reports
// the difference again.
func (d *Dataplane) repairConfig() []dataplane.Drift {
	drift, err := d.checkConfig()
	if err == nil && drift != nil {
		err = writeConfig(&d.objs.bpfMaps, d.config)
	}
	if err != nil {
		d.log.Warn("cannot repair vipd_config", "error", err)
		return nil
	}
	if drift == nil {
		return nil
	}
	return []dataplane.Drift{*drift}
}
