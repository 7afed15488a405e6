package conformance

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"testing"
)

// significance is the p-value at which a distribution check fails: a correct
// dataplane fails a check once in a thousand runs at most.
const significance = 0.001

// chiSquareFit tests observed counts against the proportions of weights
// (backend -> weight) with Pearson's chi-square goodness-of-fit test. It
// returns the statistic, the critical value for len(weights)-1 degrees of
// freedom at significance, and whether the counts fit.
func chiSquareFit(observed map[string]int, weights map[string]float64) (stat, critical float64, fits bool) {
	n, total := 0, 0.0
	for _, c := range observed {
		n += c
	}
	for _, w := range weights {
		total += w
	}
	for b, w := range weights {
		want := float64(n) * w / total
		d := float64(observed[b]) - want
		stat += d * d / want
	}
	critical = chiSquareCritical(len(weights)-1, significance)
	return stat, critical, stat <= critical
}

// chiSquareCritical returns x with P(X > x) = p for X chi-square distributed
// with df degrees of freedom, by bisection on the survival function.
func chiSquareCritical(df int, p float64) float64 {
	lo, hi := 0.0, 1.0
	for chiSquareSurvival(hi, df) > p {
		hi *= 2
	}
	for range 200 {
		mid := (lo + hi) / 2
		if chiSquareSurvival(mid, df) > p {
			lo = mid
		} else {
			hi = mid
		}
	}
	return (lo + hi) / 2
}

// chiSquareSurvival is P(X > x) for X chi-square with df degrees of freedom:
// the regularized upper incomplete gamma function Q(df/2, x/2).
func chiSquareSurvival(x float64, df int) float64 {
	if x <= 0 {
		return 1
	}
	return gammaQ(float64(df)/2, x/2)
}

// gammaQ is the regularized upper incomplete gamma function Q(a, x), by the
// series for P when x < a+1 and by Lentz's continued fraction otherwise
// (Numerical Recipes, 6.2).
func gammaQ(a, x float64) float64 {
	const eps, tiny = 1e-15, 1e-300
	lg, _ := math.Lgamma(a)
	prefix := math.Exp(-x + a*math.Log(x) - lg)
	if x < a+1 {
		sum, term := 1/a, 1/a
		for n := 1; n < 10000; n++ {
			term *= x / (a + float64(n))
			sum += term
			if math.Abs(term) < math.Abs(sum)*eps {
				break
			}
		}
		return 1 - sum*prefix
	}
	b := x + 1 - a
	c := 1 / tiny
	d := 1 / b
	h := d
	for i := 1; i < 10000; i++ {
		an := -float64(i) * (float64(i) - a)
		b += 2
		d = an*d + b
		if math.Abs(d) < tiny {
			d = tiny
		}
		c = b + an/c
		if math.Abs(c) < tiny {
			c = tiny
		}
		d = 1 / d
		del := d * c
		h *= del
		if math.Abs(del-1) < eps {
			break
		}
	}
	return h * prefix
}

// expectWeightedSplit checks that counts fit weights at significance.
func (e *env) expectWeightedSplit(what string, counts map[string]int, weights map[string]float64) {
	e.t.Helper()
	stat, crit, ok := chiSquareFit(counts, weights)
	if !ok {
		e.fatalf("%s: split %s does not fit weights %s: chi-square %.2f > %.2f (df %d, p=%g)",
			what, fmtCounts(counts), fmtWeights(weights), stat, crit, len(weights)-1, significance)
	}
	e.logf("%s: split %s fits weights %s: chi-square %.2f <= %.2f (df %d, p=%g)",
		what, fmtCounts(counts), fmtWeights(weights), stat, crit, len(weights)-1, significance)
}

func fmtWeights(w map[string]float64) string {
	s := "{"
	for i, k := range slices.Sorted(maps.Keys(w)) {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%s:%g", k, w[k])
	}
	return s + "}"
}

func TestChiSquareCritical(t *testing.T) {
	// Reference values from standard chi-square tables.
	for _, tc := range []struct {
		df   int
		p    float64
		want float64
	}{
		{1, 0.001, 10.828}, {2, 0.001, 13.816}, {3, 0.001, 16.266}, {5, 0.001, 20.515},
		{10, 0.001, 29.588}, {2, 0.05, 5.991}, {30, 0.001, 59.703}, {100, 0.001, 149.449},
	} {
		if got := chiSquareCritical(tc.df, tc.p); math.Abs(got-tc.want) > 0.001 {
			t.Errorf("chiSquareCritical(%d, %g) = %.4f, want %.3f", tc.df, tc.p, got, tc.want)
		}
	}
}

func TestChiSquareFit(t *testing.T) {
	w := map[string]float64{"a": 1, "b": 2, "c": 3}
	if stat, crit, ok := chiSquareFit(map[string]int{"a": 50, "b": 100, "c": 150}, w); !ok || stat != 0 {
		t.Errorf("exact split: stat %v crit %v fits %v, want 0, fits", stat, crit, ok)
	}
	// An even split of 300 is far from 1:2:3 (chi-square 75).
	if stat, crit, ok := chiSquareFit(map[string]int{"a": 100, "b": 100, "c": 100}, w); ok {
		t.Errorf("even split: stat %v crit %v fits, want a misfit", stat, crit)
	}
	// A backend that is never hit counts against the fit.
	if _, _, ok := chiSquareFit(map[string]int{"b": 100, "c": 200}, w); ok {
		t.Error("missing backend fits, want a misfit")
	}
}
