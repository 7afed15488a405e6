package daemon

import "testing"

// TestMemoryGCPercent: vipd's own GC target unless the flag or GOGC sets
// one; the flag wins over GOGC.
func TestMemoryGCPercent(t *testing.T) {
	env := func(gogc string) func(string) string {
		return func(k string) string {
			if k == "GOGC" {
				return gogc
			}
			return ""
		}
	}
	for _, c := range []struct {
		flag int
		gogc string
		want int
	}{
		{0, "", DefaultGCPercent},
		{0, "200", 0}, // the runtime follows GOGC
		{0, "off", 0},
		{80, "", 80},
		{80, "200", 80},
		{-1, "", -1},
	} {
		if got := (Memory{GCPercent: c.flag}).gcPercent(env(c.gogc)); got != c.want {
			t.Errorf("--gc-percent %d, GOGC %q: sets %d, want %d", c.flag, c.gogc, got, c.want)
		}
	}
}
