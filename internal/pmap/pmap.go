package pmap

import (
	"hash/maphash"
	"iter"
	"math/bits"
)

const (
	bitsPerLevel = 5
	fanout       = 1 << bitsPerLevel
	// maxShift is the last shift that still indexes by hash bits; below it
	// a node is a collision node that holds keys of equal hashes in a list.
	maxShift = 60
)

// seed is one per process: maps are never persisted or compared across
// processes, so their hashes need not be stable.
var seed = maphash.MakeSeed()

// Map is an immutable map from K to V. The zero Map is empty and ready to
// use. A Map is safe for concurrent use by any number of readers; "changing"
// it returns a new Map.
type Map[K comparable, V any] struct {
	root *node[K, V]
	n    int
}

type node[K comparable, V any] struct {
	// bitmap marks which of the 32 hash slots are present; slots holds them
	// in index order. A collision node (below maxShift) ignores it and
	// lists its entries.
	bitmap uint32
	slots  []slot[K, V]
	// edit is the Builder that created the node and may still change it in
	// place; nil for nodes of published Maps.
	edit *editToken
}

// slot is either a subtree (child != nil) or one entry.
type slot[K comparable, V any] struct {
	child *node[K, V]
	key   K
	val   V
}

type editToken struct{ _ byte }

func hash[K comparable](k K) uint64 { return maphash.Comparable(seed, k) }

// Len is the number of entries.
func (m Map[K, V]) Len() int { return m.n }

// Get returns the value of k.
func (m Map[K, V]) Get(k K) (V, bool) {
	h := hash(k)
	n := m.root
	for shift := uint(0); n != nil; shift += bitsPerLevel {
		if shift > maxShift {
			for i := range n.slots {
				if n.slots[i].key == k {
					return n.slots[i].val, true
				}
			}
			break
		}
		bit := uint32(1) << ((h >> shift) & (fanout - 1))
		if n.bitmap&bit == 0 {
			break
		}
		s := &n.slots[bits.OnesCount32(n.bitmap&(bit-1))]
		if s.child == nil {
			if s.key == k {
				return s.val, true
			}
			break
		}
		n = s.child
	}
	var zero V
	return zero, false
}

// Set returns m with k set to v.
func (m Map[K, V]) Set(k K, v V) Map[K, V] {
	root, added := set(m.root, nil, 0, hash(k), k, v)
	if added {
		return Map[K, V]{root: root, n: m.n + 1}
	}
	return Map[K, V]{root: root, n: m.n}
}

// Delete returns m without k.
func (m Map[K, V]) Delete(k K) Map[K, V] {
	root, removed := del(m.root, nil, 0, hash(k), k)
	if !removed {
		return m
	}
	return Map[K, V]{root: root, n: m.n - 1}
}

// All yields every entry once, in no particular order.
func (m Map[K, V]) All() iter.Seq2[K, V] {
	return func(yield func(K, V) bool) { walk(m.root, yield) }
}

func walk[K comparable, V any](n *node[K, V], yield func(K, V) bool) bool {
	if n == nil {
		return true
	}
	for i := range n.slots {
		s := &n.slots[i]
		if s.child != nil {
			if !walk(s.child, yield) {
				return false
			}
		} else if !yield(s.key, s.val) {
			return false
		}
	}
	return true
}

// writable returns n itself if edit may change it in place, else a copy
// that edit owns (with room for one more slot).
func writable[K comparable, V any](n *node[K, V], edit *editToken) *node[K, V] {
	if edit != nil && n.edit == edit {
		return n
	}
	c := &node[K, V]{bitmap: n.bitmap, edit: edit, slots: make([]slot[K, V], len(n.slots), len(n.slots)+1)}
	copy(c.slots, n.slots)
	return c
}

// grow returns slots one longer. A short one that has no room moves to an
// array of exactly that length: most nodes of a big map hold a few
// entries, and append's spare room in them would stay in the map (~8 bytes
// an entry once a Builder has loaded 100,000 of them); longer ones grow
// as append grows them, so that filling a node of 32 copies it ~6 times,
// not 32.
func grow[K comparable, V any](slots []slot[K, V]) []slot[K, V] {
	if len(slots) < cap(slots) || len(slots) >= exactGrowth {
		return append(slots, slot[K, V]{})
	}
	g := make([]slot[K, V], len(slots)+1)
	copy(g, slots)
	return g
}

// exactGrowth is the length up to which grow makes no spare room.
const exactGrowth = 8

// set returns n with k set to v, copying what edit does not own, and
// whether k is new.
func set[K comparable, V any](n *node[K, V], edit *editToken, shift uint, h uint64, k K, v V) (*node[K, V], bool) {
	if n == nil {
		n = &node[K, V]{edit: edit, slots: []slot[K, V]{{key: k, val: v}}}
		if shift <= maxShift {
			n.bitmap = 1 << ((h >> shift) & (fanout - 1))
		}
		return n, true
	}
	if shift > maxShift {
		for i := range n.slots {
			if n.slots[i].key == k {
				n = writable(n, edit)
				n.slots[i].val = v
				return n, false
			}
		}
		n = writable(n, edit)
		n.slots = append(n.slots, slot[K, V]{key: k, val: v})
		return n, true
	}
	bit := uint32(1) << ((h >> shift) & (fanout - 1))
	i := bits.OnesCount32(n.bitmap & (bit - 1))
	if n.bitmap&bit == 0 {
		n = writable(n, edit)
		n.bitmap |= bit
		n.slots = grow(n.slots)
		copy(n.slots[i+1:], n.slots[i:])
		n.slots[i] = slot[K, V]{key: k, val: v}
		return n, true
	}
	s := n.slots[i]
	switch {
	case s.child != nil:
		child, added := set(s.child, edit, shift+bitsPerLevel, h, k, v)
		if child == s.child {
			return n, added
		}
		n = writable(n, edit)
		n.slots[i].child = child
		return n, added
	case s.key == k:
		n = writable(n, edit)
		n.slots[i].val = v
		return n, false
	default:
		// Two keys share this slot's hash bits so far: push both down.
		child := pair(edit, shift+bitsPerLevel, hash(s.key), s, h, slot[K, V]{key: k, val: v})
		n = writable(n, edit)
		n.slots[i] = slot[K, V]{child: child}
		return n, true
	}
}

// pair returns a new subtree at shift that holds the entries a and b,
// whose keys hash to ha and hb.
func pair[K comparable, V any](edit *editToken, shift uint, ha uint64, a slot[K, V], hb uint64, b slot[K, V]) *node[K, V] {
	n := &node[K, V]{edit: edit}
	if shift > maxShift {
		n.slots = []slot[K, V]{a, b}
		return n
	}
	ia, ib := (ha>>shift)&(fanout-1), (hb>>shift)&(fanout-1)
	switch {
	case ia == ib:
		n.bitmap = 1 << ia
		n.slots = []slot[K, V]{{child: pair(edit, shift+bitsPerLevel, ha, a, hb, b)}}
	case ia < ib:
		n.bitmap = 1<<ia | 1<<ib
		n.slots = []slot[K, V]{a, b}
	default:
		n.bitmap = 1<<ia | 1<<ib
		n.slots = []slot[K, V]{b, a}
	}
	return n
}

// del returns n without k (nil when that leaves it empty), copying what
// edit does not own, and whether k was there.
func del[K comparable, V any](n *node[K, V], edit *editToken, shift uint, h uint64, k K) (*node[K, V], bool) {
	if n == nil {
		return nil, false
	}
	if shift > maxShift {
		for i := range n.slots {
			if n.slots[i].key == k {
				if len(n.slots) == 1 {
					return nil, true
				}
				n = writable(n, edit)
				n.slots = append(n.slots[:i], n.slots[i+1:]...)
				n.slots[len(n.slots):cap(n.slots)][0] = slot[K, V]{} // drop the reference
				return n, true
			}
		}
		return n, false
	}
	bit := uint32(1) << ((h >> shift) & (fanout - 1))
	if n.bitmap&bit == 0 {
		return n, false
	}
	i := bits.OnesCount32(n.bitmap & (bit - 1))
	s := n.slots[i]
	if s.child == nil {
		if s.key != k {
			return n, false
		}
		if len(n.slots) == 1 {
			return nil, true
		}
		n = writable(n, edit)
		n.bitmap &^= bit
		n.slots = append(n.slots[:i], n.slots[i+1:]...)
		n.slots[len(n.slots):cap(n.slots)][0] = slot[K, V]{}
		return n, true
	}
	child, removed := del(s.child, edit, shift+bitsPerLevel, h, k)
	if !removed {
		return n, false
	}
	switch {
	case child == nil:
		if len(n.slots) == 1 {
			return nil, true
		}
		n = writable(n, edit)
		n.bitmap &^= bit
		n.slots = append(n.slots[:i], n.slots[i+1:]...)
		n.slots[len(n.slots):cap(n.slots)][0] = slot[K, V]{}
	case len(child.slots) == 1 && child.slots[0].child == nil:
		// A subtree of one entry moves up into its parent's slot, so that
		// deletions leave no chains behind.
		n = writable(n, edit)
		n.slots[i] = child.slots[0]
	default:
		n = writable(n, edit)
		n.slots[i].child = child
	}
	return n, true
}

// Builder makes many changes to a Map cheaply: nodes it creates are
// changed in place by later changes, instead of being copied again. The
// Map it starts from is never changed. A Builder is used by one goroutine.
type Builder[K comparable, V any] struct {
	m    Map[K, V]
	edit *editToken
}

// Builder returns a Builder that starts from m.
func (m Map[K, V]) Builder() *Builder[K, V] {
	return &Builder[K, V]{m: m, edit: &editToken{}}
}

// Get returns the value of k in the Builder's current map.
func (b *Builder[K, V]) Get(k K) (V, bool) { return b.m.Get(k) }

// Len is the number of entries in the Builder's current map.
func (b *Builder[K, V]) Len() int { return b.m.n }

// Set sets k to v.
func (b *Builder[K, V]) Set(k K, v V) {
	root, added := set(b.m.root, b.edit, 0, hash(k), k, v)
	b.m.root = root
	if added {
		b.m.n++
	}
}

// Delete removes k.
func (b *Builder[K, V]) Delete(k K) {
	root, removed := del(b.m.root, b.edit, 0, hash(k), k)
	b.m.root = root
	if removed {
		b.m.n--
	}
}

// Map returns the built map. The Builder stays usable; its later changes
// copy the nodes that the returned Map shares, which never changes.
func (b *Builder[K, V]) Map() Map[K, V] {
	m := b.m
	b.edit = &editToken{}
	return m
}
