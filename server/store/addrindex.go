package store

import (
	"cmp"
	"iter"
	"slices"

	"github.com/vipd/vipd/internal/pmap"
)

// addrBucketBits sets the number of buckets of an addrIndex: 2^14, so that
// 1,100,000 addresses (100,000 services of one VIP and 10 distinct
// backends each) make buckets of about 67 entries (1.6 KB, which a commit
// that changes one of them copies). Every bucket costs the persistent map
// a node's share of some 180 bytes: at 2^16 buckets that was more than
// the entries themselves for the 100,000 or so addresses of 100,000
// services whose backends are shared, and a commit of one change copied
// no fewer bytes (a smaller bucket, a deeper map).
const addrBucketBits = 14

// addrEntry is one address's counts in an addrIndex bucket.
type addrEntry struct {
	k addrKey
	u addrUse
}

// addrIndex is a snapshot's address counts: a persistent map of buckets,
// each an immutable slice of the entries whose keys hash to it, sorted by
// key. A bucket costs 24 bytes an entry, where a persistent map of the
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

// manyChanges is the size of a change set from which with orders the
// changes by bucket with a counting sort (withMany) rather than a map of
// slices: a fixed cost of 256 KiB, against a growing slice per bucket
// touched.
const manyChanges = 1 << 12

// with returns x with the counts of changes, a zero count removing its
// address. x is not modified.
func (x addrIndex) with(changes map[addrKey]addrUse) addrIndex {
	if len(changes) == 0 {
		return x
	}
	if len(changes) >= manyChanges {
		return x.withMany(changes)
	}
	return x.withFew(changes)
}

// withFew is with for a change set of a few addresses: it copies only
// the buckets they fall in, found through a map.
func (x addrIndex) withFew(changes map[addrKey]addrUse) addrIndex {
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

// withMany is with for a big change set, such as the first sync of
// 100,000 services (1,100,000 addresses, most buckets touched). It orders
// the changes by bucket into one array with a counting sort, where with's
// map of slices grown by appending allocated some four times the changes'
// size (every bucket's slice doubling up to it), and merges each bucket's
// sorted changes into a new bucket of exactly its size. That garbage came
// at the end of a sync, after the collector's last cycle, and so added to
// vipd's peak memory one for one.
func (x addrIndex) withMany(changes map[addrKey]addrUse) addrIndex {
	start := new([1<<addrBucketBits + 1]int32)
	for k := range changes {
		start[bucketOf(k)+1]++
	}
	for i := range 1 << addrBucketBits {
		start[i+1] += start[i]
	}
	byBucket := make([]addrEntry, len(changes))
	next := new([1 << addrBucketBits]int32)
	copy(next[:], start[:])
	for k, u := range changes {
		id := bucketOf(k)
		byBucket[next[id]] = addrEntry{k, u}
		next[id]++
	}
	b := x.buckets.Builder()
	for id := range uint32(1 << addrBucketBits) {
		ch := byBucket[start[id]:start[id+1]]
		if len(ch) == 0 {
			continue
		}
		slices.SortFunc(ch, compareEntry)
		old, _ := b.Get(id)
		n := 0 // the merged bucket's size
		for i, j := 0, 0; i < len(old) || j < len(ch); {
			switch c := compareMerge(old, ch, i, j); {
			case c < 0:
				n, i = n+1, i+1
			case c > 0:
				if ch[j].u != (addrUse{}) {
					n++
				}
				j++
			default:
				if ch[j].u != (addrUse{}) {
					n++
				}
				i, j = i+1, j+1
			}
		}
		if n == 0 {
			b.Delete(id)
			continue
		}
		merged := make([]addrEntry, 0, n)
		for i, j := 0, 0; i < len(old) || j < len(ch); {
			switch c := compareMerge(old, ch, i, j); {
			case c < 0:
				merged = append(merged, old[i])
				i++
			case c > 0:
				if ch[j].u != (addrUse{}) {
					merged = append(merged, ch[j])
				}
				j++
			default:
				if ch[j].u != (addrUse{}) {
					merged = append(merged, ch[j])
				}
				i, j = i+1, j+1
			}
		}
		b.Set(id, merged)
	}
	return addrIndex{b.Map()}
}

// compareMerge orders old[i] against ch[j] in withMany's merge, an
// exhausted side coming last.
func compareMerge(old, ch []addrEntry, i, j int) int {
	switch {
	case i == len(old):
		return 1
	case j == len(ch):
		return -1
	}
	return compareEntry(old[i], ch[j])
}

// buildAddrIndex returns the index of uses, one entry per use of an
// address, to be summed per address (or already summed). It walks uses
// twice, so that the uses of a whole state are never a slice of their
// own: for 100,000 services × 10 backends that slice was 26 MB, and the
// radix sort's scratch copy of it another 26 MB, both at once while a
// restart loaded its state. The first walk counts the uses per bucket; the
// second scatters them, by the high half of the bits of their bucket, into
// the one array that becomes the index's; then each of those groups, small
// enough to stay in the cache, is ordered by the low half through a
// scratch array of the largest group's size. (One pass straight into
// every bucket would scatter its writes so widely that it took longer
// than the rest of a load.) It cuts the buckets from the one array.
func buildAddrIndex(uses iter.Seq[addrEntry]) addrIndex {
	const half = addrBucketBits / 2
	var start [1<<addrBucketBits + 1]int32
	var hi [1<<half + 1]int32
	for e := range uses {
		id := bucketOf(e.k)
		start[id+1]++
		hi[id>>half+1]++
	}
	for i := range 1 << addrBucketBits {
		start[i+1] += start[i]
	}
	widest := int32(0)
	for i := range 1 << half {
		widest = max(widest, hi[i+1])
		hi[i+1] += hi[i]
	}
	byBucket := make([]addrEntry, start[1<<addrBucketBits])
	at := hi
	for e := range uses {
		g := bucketOf(e.k) >> half
		byBucket[at[g]] = e
		at[g]++
	}
	// Within group g, bucket g<<half|l starts at start[g<<half|l]: a
	// counting sort by l, through tmp.
	tmp := make([]addrEntry, widest)
	for g := range int32(1 << half) {
		group := byBucket[hi[g]:hi[g+1]]
		if len(group) < 2 {
			continue
		}
		var lo [1 << half]int32
		for l := range int32(1 << half) {
			lo[l] = start[g<<half|l] - hi[g]
		}
		for _, e := range group {
			l := bucketOf(e.k) & (1<<half - 1)
			tmp[lo[l]] = e
			lo[l]++
		}
		copy(group, tmp[:len(group)])
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
