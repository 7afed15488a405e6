package store

import (
	"runtime"
	"testing"
)

// CheckBytesPer runs f once and fails t if it allocated more than budget
// bytes per unit, n units in all (logging the figure otherwise). what
// names the call, unit what n counts; for example "Names" and "stored
// service". Exported for the external test package too.
func CheckBytesPer(t *testing.T, what, unit string, n int, budget float64, f func()) {
	t.Helper()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	per := float64(after.TotalAlloc-before.TotalAlloc) / float64(n)
	if per > budget {
		t.Errorf("%s allocates %.0f bytes per %s, over the budget of %g", what, per, unit, budget)
	} else {
		t.Logf("%s allocates %.0f bytes per %s (budget %g)", what, per, unit, budget)
	}
}
