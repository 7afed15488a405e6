package store

import (
	"cmp"
	"slices"

	"github.com/vipd/vipd/internal/pmap"
)

// addrBucketBits sets the number of buckets of an addrIndex: 2^16, so that
// 1,100,000 addresses (100,000 services of one VIP and 10 backends each)
// make buckets of about 17 entries.
const addrBucketBits = 16

// addrEntry is one address's counts in an addrIndex bucket.
type addrEntry struct {
	k addrKey
	u addrUse
}

// addrIndex is a snapshot's address counts: a persistent map of buckets,
// each an immutable slice of the entries whose keys hash to it, sorted by
// key. A bucket costs 32 bytes an entry, where a persistent map of the
// entries themselves costs some 70 (a trie node and slot each), and a
// commit copies only the buckets of the addresses it changes.
type addrIndex struct {
	buckets pmap.Map[uint32, []addrEntry]
}

// bucketOf spreads keys over the buckets (Fibonacci hashing): addresses
// in use tend to differ in their low bits only.
func bucketOf(k addrKey) uint32 {
	const m = 0x9E3779B97F4A7C15
	return uint32(((k[0]*m ^ k[1]) * m) >> (64 - addrBucketBits))
}

func compareEntry(a, b addrEntry) int {
	if c := cmp.Compare(a.k[0], b.k[0]); c != 0 {
		return c
	}
	return cmp.Compare(a.k[1], b.k[1])
}

// get returns k's counts, zero when k is not in use.
func (x addrIndex) get(k addrKey) addrUse {
	b, _ := x.buckets.Get(bucketOf(k))
	if i, ok := slices.BinarySearchFunc(b, addrEntry{k: k}, compareEntry); ok {
		return b[i].u
	}
	return addrUse{}
}

// len is the number of addresses in use.
func (x addrIndex) len() int {
	n := 0
	for _, b := range x.buckets.All() {
		n += len(b)
	}
	return n
}

// with returns x with the counts of changes, a zero count removing its
// address. x is not modified.
func (x addrIndex) with(changes map[addrKey]addrUse) addrIndex {
	if len(changes) == 0 {
		return x
	}
	byBucket := map[uint32][]addrEntry{}
	for k, u := range changes {
		id := bucketOf(k)
		byBucket[id] = append(byBucket[id], addrEntry{k, u})
	}
	b := x.buckets.Builder()
	for id, ch := range byBucket {
		old, _ := b.Get(id)
		next := make([]addrEntry, 0, len(old)+len(ch))
		next = append(next, old...)
		for _, c := range ch {
			i, found := slices.BinarySearchFunc(next, c, compareEntry)
			switch {
			case c.u == (addrUse{}) && found:
				next = slices.Delete(next, i, i+1)
			case c.u == (addrUse{}):
			case found:
				next[i].u = c.u
			default:
				next = slices.Insert(next, i, c)
			}
		}
		if len(next) == 0 {
			b.Delete(id)
		} else {
			b.Set(id, slices.Clip(next))
		}
	}
	return addrIndex{b.Map()}
}

// buildAddrIndex returns the index of uses, one entry per use of an
// address, to be summed per address (or already summed). It takes uses
// over: their array is reordered and may become the index's. It orders
// them by bucket without a map, by a radix sort of two 8-bit passes (one
// pass straight into 2^16 buckets would scatter its writes so widely that
// it took longer than the rest of a load), and cuts the buckets from one
// array.
func buildAddrIndex(uses []addrEntry) addrIndex {
	const half = addrBucketBits / 2
	var start [1<<addrBucketBits + 1]int32
	var lo, hi [1<<half + 1]int32
	for _, e := range uses {
		id := bucketOf(e.k)
		start[id+1]++
		lo[id&(1<<half-1)+1]++
		hi[id>>half+1]++
	}
	for i := range 1 << addrBucketBits {
		start[i+1] += start[i]
	}
	for i := range 1 << half {
		lo[i+1] += lo[i]
		hi[i+1] += hi[i]
	}
	tmp := make([]addrEntry, len(uses))
	for _, e := range uses {
		id := bucketOf(e.k) & (1<<half - 1)
		tmp[lo[id]] = e
		lo[id]++
	}
	byBucket := uses
	for _, e := range tmp {
		id := bucketOf(e.k) >> half
		byBucket[hi[id]] = e
		hi[id]++
	}
	// Sum each bucket's uses per address, writing the entries to the
	// front of byBucket; end[id] is where bucket id's end up.
	var end [1 << addrBucketBits]int32
	out := int32(0)
	for id := range 1 << addrBucketBits {
		in := byBucket[start[id]:start[id+1]]
		slices.SortFunc(in, compareEntry)
		first := out
		for _, e := range in {
			if out > first && byBucket[out-1].k == e.k {
				byBucket[out-1].u.vips += e.u.vips
				byBucket[out-1].u.backends += e.u.backends
				byBucket[out-1].u.externals += e.u.externals
				continue
			}
			byBucket[out] = e
			out++
		}
		end[id] = out
	}
	// The buckets share one array: an exact one when many uses were of
	// the same addresses (backends of several services).
	all := byBucket[:out]
	if int(out) < len(byBucket)*3/4 {
		all = slices.Clone(all)
	}
	b := pmap.Map[uint32, []addrEntry]{}.Builder()
	first := int32(0)
	for id := range 1 << addrBucketBits {
		if end[id] > first {
			b.Set(uint32(id), all[first:end[id]:end[id]])
		}
		first = end[id]
	}
	return addrIndex{b.Map()}
}
