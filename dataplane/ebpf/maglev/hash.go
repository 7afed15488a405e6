package maglev

// The hashes below decide every table vipd has ever written, so they must
// never change silently: maglev_test.go pins their output. hash/maphash and
// the like are seeded per process and would remap all flows on restart.

const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

// Distinct seed prefixes make offset and skip two independent hashes of the
// key: the same key yields unrelated values for each.
const (
	offsetSeed = "vipd/maglev/offset\x00"
	skipSeed   = "vipd/maglev/skip\x00"
)

// hashKey returns FNV-1a 64 of seed followed by key, passed through the
// murmur3 64-bit finalizer. FNV-1a alone mixes the last bytes poorly, and
// backend keys often differ only there ("198.18.1.3:8080" vs
// "198.18.1.4:8080"); the finalizer spreads that difference over all bits
// before the value is reduced mod M.
func hashKey(seed, key string) uint64 {
	h := uint64(fnvOffset64)
	for i := 0; i < len(seed); i++ {
		h ^= uint64(seed[i])
		h *= fnvPrime64
	}
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= fnvPrime64
	}
	return fmix64(h)
}

// fmix64 is MurmurHash3's 64-bit finalizer, a bijection with full avalanche.
func fmix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// permutation returns the start (offset) and stride (skip) of key's
// preference list over a table of prime size m: entry j of the list is
// (offset + j*skip) mod m. Because m is prime and 1 <= skip < m, the list
// visits every slot exactly once.
func permutation(key string, m uint32) (offset, skip uint32) {
	offset = uint32(hashKey(offsetSeed, key) % uint64(m))
	skip = uint32(hashKey(skipSeed, key)%uint64(m-1)) + 1
	return offset, skip
}
