// Package pmap is a persistent (immutable) hash map: every change returns a
// new Map that shares all but O(log32 n) nodes with the old one, which stays
// valid and unchanged. It lets the store commit one change to a state of
// 100,000 services in microseconds, without copying the state, while
// readers keep using older snapshots concurrently.
//
// It is a hash array mapped trie (HAMT): 32-way nodes indexed by 5 bits of a
// 64-bit hash at a time, with each node's slots packed by a bitmap. A
// Builder makes many changes in place on nodes it created itself, for bulk
// loads. Iteration order is unspecified; callers that need an order sort.
// It knows nothing about services.
package pmap
