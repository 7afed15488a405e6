package maglev

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// ErrDuplicateBackend reports two backends with the same Key or the same ID
// in one call to Table. Match it with errors.Is.
var ErrDuplicateBackend = errors.New("duplicate maglev backend")

// Backend is one entry to place in the table.
type Backend struct {
	ID     uint32 // stable backend ID written into the table
	Key    string // stable identity used for hashing, e.g. "198.18.1.3:8080" (never the ID)
	Weight uint16 // >= 1; 0 is treated as 1
}

// Table returns the Maglev lookup table of size m for backends: m entries,
// each the ID of one backend. It does not modify backends.
//
// The result depends only on the set of backends and m: backends are sorted
// by Key first, and the hashes are fixed (see package doc). Keys and IDs must
// each be unique, else Table returns an error wrapping ErrDuplicateBackend. m
// must be a prime >= len(backends) (see TableSize), else Table returns an error
// wrapping ErrTableSize. An empty backends returns nil and no error.
//
// Population follows the paper: each backend walks its own permutation of the
// slots, (offset + j*skip) mod m, and on its turn claims the first slot not
// yet taken; this repeats until every slot is taken. Weights decide whose turn
// it is ("weighted rounds", like Envoy's weighted MaglevTable): in
// each round every backend adds its weight to a credit and takes one turn if
// the credit reaches the largest weight, which it then pays back. Backends of
// the largest weight therefore take a turn every round and a backend of weight
// w takes w/wmax turns per round on average, so it gets m*w/W entries (W the
// sum of weights) to within 1 + N*w/W entries. With equal weights this reduces
// to the paper's plain round-robin, and every backend gets floor(m/N) or
// ceil(m/N) entries.
//
// Minimal disruption is approximate, as in the paper: adding or removing one
// of N backends, or changing one weight, also moves some entries between
// backends that stayed. Measured at m = TableSize(DefaultTableSize, N), that
// excess is below 2% of the table for N <= 100 (about 1.5% at N = 100); it
// shrinks as m/N grows, to below 1% at m = 65537 for the same N.
//
// Cost: O(m log m) slot probes, plus about m*wmax/W rounds of N credit
// updates, which is O(m) for equal weights but O(m*N) when one backend is far
// heavier than all the others together. Nothing is allocated per step.
func Table(backends []Backend, m uint32) ([]uint32, error) {
	n := len(backends)
	if n == 0 {
		return nil, nil
	}
	if !IsPrime(m) || uint64(m) < uint64(n) {
		return nil, fmt.Errorf("table size %d for %d backends: must be a prime >= the backend count: %w", m, n, ErrTableSize)
	}

	bs := slices.Clone(backends)
	slices.SortFunc(bs, func(a, b Backend) int { return cmp.Compare(a.Key, b.Key) })
	ids := make(map[uint32]struct{}, n)
	for i, b := range bs {
		if i > 0 && bs[i-1].Key == b.Key {
			return nil, fmt.Errorf("backend key %q: %w", b.Key, ErrDuplicateBackend)
		}
		if _, dup := ids[b.ID]; dup {
			return nil, fmt.Errorf("backend id %d: %w", b.ID, ErrDuplicateBackend)
		}
		ids[b.ID] = struct{}{}
	}

	// pos[i] is the slot at backend i's next permutation index j, that is
	// (offset + j*skip) mod m, advanced by one addition per step instead of
	// materialising the m-long permutation.
	pos := make([]uint32, n)
	skip := make([]uint32, n)
	weight := make([]uint32, n)
	credit := make([]uint32, n)
	var wmax uint32
	for i, b := range bs {
		pos[i], skip[i] = permutation(b.Key, m)
		weight[i] = uint32(max(b.Weight, 1))
		wmax = max(wmax, weight[i])
	}

	// table holds backend index+1 while filling; 0 marks a free slot, since
	// any uint32 may be a valid backend ID.
	table := make([]uint32, m)
	mm := uint64(m)
	for filled := uint64(0); filled < mm; {
		for i := 0; i < n && filled < mm; i++ {
			credit[i] += weight[i]
			if credit[i] < wmax {
				continue
			}
			credit[i] -= wmax
			// Terminates: the permutation visits every slot and one is free.
			p, s := uint64(pos[i]), uint64(skip[i])
			for table[p] != 0 {
				if p += s; p >= mm {
					p -= mm
				}
			}
			table[p] = uint32(i) + 1
			if p += s; p >= mm {
				p -= mm
			}
			pos[i] = uint32(p)
			filled++
		}
	}

	for j, v := range table {
		table[j] = bs[v-1].ID
	}
	return table, nil
}
