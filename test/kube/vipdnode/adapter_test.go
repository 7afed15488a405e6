package vipdnode

import (
	"slices"
	"testing"
	"time"
)

// TestNotWhileRBACWarms: refusals logged (hclog or klog) within the
// warm-up after an apiserver restart are dropped; earlier, later and
// undated ones are kept.
func TestNotWhileRBACWarms(t *testing.T) {
	restart := time.Date(time.Now().Year(), 12, 5, 2, 56, 20, 0, time.Local)
	klog := func(at time.Time) string {
		return at.Format("E0102 15:04:05.000000") + `   20124 reflector.go:227] "Failed to watch" err="nodes \"node-a\" is forbidden"`
	}
	hclog := func(at time.Time) string {
		return at.UTC().Format("2006-01-02T15:04:05.000Z") + ` [WARN]  vipd-k8s.adapter: apiserver watch failed: error="forbidden"`
	}
	before, during, after := restart.Add(-time.Minute), restart.Add(11*time.Second), restart.Add(rbacWarmup+time.Second)
	lines := []string{klog(before), klog(during), hclog(during), hclog(after), klog(after), "forbidden, no time"}
	want := []string{klog(before), hclog(after), klog(after), "forbidden, no time"}
	if got := notWhileRBACWarms(lines, []time.Time{restart}); !slices.Equal(got, want) {
		t.Fatalf("kept %q, want %q", got, want)
	}
	if got := notWhileRBACWarms(lines, nil); !slices.Equal(got, lines) {
		t.Fatalf("without a restart kept %q, want every line", got)
	}
}
