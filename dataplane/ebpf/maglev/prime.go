package maglev

import (
	"errors"
	"fmt"
	"math"
)

// DefaultTableSize is the default table size M, a prime. It gives at least
// 100 entries per backend for up to 163 backends; TableSize grows M beyond it
// for larger services.
const DefaultTableSize = 16381

// ErrTableSize reports a table size that is not a prime or is otherwise
// unusable. Match it with errors.Is.
var ErrTableSize = errors.New("invalid maglev table size")

// entriesPerBackend is the minimum ratio M/N that TableSize guarantees. The
// Maglev paper recommends M >= 100*N so that per-backend shares stay within
// about 1% of each other and disruption stays close to 1/N.
const entriesPerBackend = 100

// TableSize returns the smallest prime M >= max(min, 100*n): the table size
// to use for a service with n backends when min is the configured size.
//
// min must itself be a prime >= 3, and n must not be negative; otherwise
// TableSize returns an error wrapping ErrTableSize. It also fails, wrapping
// ErrTableSize, when no such prime fits in a uint32.
func TableSize(min uint32, n int) (uint32, error) {
	if min < 3 || !IsPrime(min) {
		return 0, fmt.Errorf("table size %d: must be a prime >= 3: %w", min, ErrTableSize)
	}
	if n < 0 {
		return 0, fmt.Errorf("table size for %d backends: negative backend count: %w", n, ErrTableSize)
	}
	want := max(uint64(min), entriesPerBackend*uint64(n))
	for m := want; m <= math.MaxUint32; m++ {
		if IsPrime(uint32(m)) {
			return uint32(m), nil
		}
	}
	return 0, fmt.Errorf("table size for %d backends: no prime >= %d fits in 32 bits: %w", n, want, ErrTableSize)
}

// IsPrime reports whether n is prime. It is exact for every uint32 (trial
// division by 2, 3 and 6k±1 up to sqrt(n), at most about 22k divisions).
func IsPrime(n uint32) bool {
	if n < 4 {
		return n >= 2
	}
	if n%2 == 0 || n%3 == 0 {
		return false
	}
	// Widened so that d*d cannot overflow near MaxUint32.
	for d := uint64(5); d*d <= uint64(n); d += 6 {
		if uint64(n)%d == 0 || uint64(n)%(d+2) == 0 {
			return false
		}
	}
	return true
}
