package conformance

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testkit/netlab"
	"github.com/vipd/vipd/internal/testkit/testbin"
)

// vipdBin is the vipd binary built once by TestMain.
var vipdBin string

func TestMain(m *testing.M) {
	// First: node1's requests come from client processes that run this
	// binary again (see host.Request).
	netlab.RunClientIfRequested()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, cleanup, err := testbin.Build(false, "./cmd/vipd")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cleanup()
	vipdBin = filepath.Join(dir, "vipd")
	return m.Run()
}

// dataplanes returns the dataplanes to test: VIPD_CONFORMANCE_DATAPLANES,
// comma-separated, or both iptables and ebpf.
func dataplanes() []string {
	var dps []string
	for _, dp := range strings.Split(os.Getenv("VIPD_CONFORMANCE_DATAPLANES"), ",") {
		if dp = strings.TrimSpace(dp); dp != "" && !slices.Contains(dps, dp) {
			dps = append(dps, dp)
		}
	}
	if len(dps) == 0 {
		dps = []string{"iptables", "ebpf"}
	}
	return dps
}

// TestConformance runs every scenario against every dataplane, as subtests
// named <dataplane>/<scenario>, and logs a results table at the end.
func TestConformance(t *testing.T) {
	netlab.RequireRoot(t)
	start := time.Now()
	res := newResults()
	dps := dataplanes()
	for _, dp := range dps {
		t.Run(dp, func(t *testing.T) {
			for _, sc := range scenarios() {
				t.Run(sc.name, func(t *testing.T) {
					var (
						scStart time.Time
						e       *env
					)
					// Registered first, so it runs last and sees the final outcome.
					t.Cleanup(func() { res.record(dp, sc.name, outcomeOf(t, e), time.Since(scStart)) })
					if !sc.serial {
						t.Parallel()
					}
					scStart = time.Now() // not counting the wait for a parallel slot
					e = newEnv(t, dp, sc.name, sc.vipdArgs...)
					sc.run(e)
				})
			}
		})
	}
	t.Logf("conformance results (total %v):\n%s", time.Since(start).Round(time.Millisecond), res.table(dps))
}

// scenario is one row of the conformance table.
type scenario struct {
	name string
	// serial scenarios do not run alongside others: they measure timing
	// that a busy machine could distort.
	serial bool
	// vipdArgs go on vipd's command line (see newEnv).
	vipdArgs []string
	run      func(e *env)
}

type outcome string

const (
	pass        outcome = "pass"
	fail        outcome = "FAIL"
	unsupported outcome = "unsupported"
	// refused is a pass of an external scenario by a dataplane that
	// declares no external support and refused the scenario's service, as
	// it must (see env.upsertExternal).
	refused outcome = "refused"
)

func outcomeOf(t *testing.T, e *env) outcome {
	switch {
	case t.Failed():
		return fail
	case t.Skipped():
		return unsupported
	case e != nil && e.externalRefused != "":
		return refused
	}
	return pass
}

// results collects the outcome and duration of every scenario run.
type results struct {
	mu sync.Mutex
	m  map[string]map[string]result // dataplane -> scenario -> result
}

type result struct {
	outcome outcome
	elapsed time.Duration
}

func newResults() *results { return &results{m: map[string]map[string]result{}} }

func (r *results) record(dp, sc string, o outcome, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m[dp] == nil {
		r.m[dp] = map[string]result{}
	}
	r.m[dp][sc] = result{o, d}
}

// table renders scenario × dataplane, in the scenario table's order.
func (r *results) table(dps []string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var rows [][]string
	rows = append(rows, append([]string{"scenario"}, dps...))
	counts := map[string]map[outcome]int{}
	for _, sc := range scenarios() {
		row := []string{sc.name}
		ran := false
		for _, dp := range dps {
			res, ok := r.m[dp][sc.name]
			if !ok {
				row = append(row, "-")
				continue
			}
			ran = true
			if counts[dp] == nil {
				counts[dp] = map[outcome]int{}
			}
			counts[dp][res.outcome]++
			row = append(row, fmt.Sprintf("%s %.1fs", res.outcome, res.elapsed.Seconds()))
		}
		if ran {
			rows = append(rows, row)
		}
	}
	total := []string{"(total)"}
	for _, dp := range dps {
		c := counts[dp]
		total = append(total, fmt.Sprintf("%d pass, %d fail, %d unsupported, %d refused", c[pass], c[fail], c[unsupported], c[refused]))
	}
	rows = append(rows, total)

	widths := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, cell := range row {
			widths[i] = max(widths[i], len(cell))
		}
	}
	var b strings.Builder
	for _, row := range rows {
		for i, cell := range row {
			fmt.Fprintf(&b, "%-*s  ", widths[i], cell)
		}
		b.WriteString("\n")
	}
	return b.String()
}
