package store

import (
	"slices"
)

// historyLen bounds how many commits back a snapshot remembers (see
// ChangedSince), and historyNames how many names those may list in all:
// past either, the oldest are forgotten, and a reader that fell that far
// behind compares the snapshots in full, which costs about what catching
// up with so many changes would.
const (
	historyLen   = 64
	historyNames = 4096
)

// commitMark identifies the snapshot a commit made, and those that
// share its services (such as its WithLimits copies), by its address.
type commitMark struct{ _ byte } // not zero-size: those may share an address

// commit is one commit in a snapshot's history: its mark and the names of
// the services it touched (Txn.Changed).
type commit struct {
	mark  *commitMark
	names []string
}

// withCommit returns history h, which it leaves as it is, with c added
// as the newest. It keeps h's newest commit, the parent's mark, and then
// the older ones while c and the commits after the oldest stay within
// historyLen commits and historyNames names. ChangedSince lists the names
// of the commits after old's mark, never those of the mark itself, so the
// oldest commit keeps only its mark: a big commit's names are not kept
// once a later one is committed on top of it.
func withCommit(h []commit, c commit) []commit {
	if len(h) == 0 {
		return []commit{c}
	}
	// The parent's commit stays whatever c's size, so that ChangedSince
	// of the parent always answers.
	i, n := len(h)-1, len(c.names)
	for first := max(len(h)-historyLen, 0); i > first && n+len(h[i].names) <= historyNames; i-- {
		n += len(h[i].names)
	}
	out := make([]commit, 0, len(h)-i+1)
	out = append(append(out, h[i:]...), c)
	out[0].names = nil
	return out
}

// ChangedSince lists, sorted and without repeats, the names of the
// services that may differ between old and s, when s can tell without
// walking its services: when s was committed on top of old (or of a
// snapshot with the same services, such as old.WithLimits) by up to 64
// commits that touched up to 4,096 names in all, or by one commit of any
// size. Every name that old and s do not hold as the same Entry is
// listed: added, replaced (by any Put, even of the same spec) and deleted
// ones. A name that neither holds (put, then deleted again) may be listed
// too. It lists nothing when s is old or a copy of it.
//
// ok is false when s cannot tell: old is not an ancestor of s (a sibling
// committed on the same base, a descendant, a snapshot of another Load or
// Empty), or s remembers too little of what came since; the caller must
// then compare the two in full. It costs O(64 + n log n) for the n names
// listed, however many services s holds. The caller must not modify the
// slice.
func (s *Snapshot) ChangedSince(old *Snapshot) (names []string, ok bool) {
	if len(old.history) == 0 {
		return nil, false
	}
	mark := old.history[len(old.history)-1].mark
	i := slices.IndexFunc(s.history, func(c commit) bool { return c.mark == mark })
	if i < 0 {
		return nil, false
	}
	after := s.history[i+1:]
	if len(after) == 1 {
		return after[0].names, true
	}
	for _, c := range after {
		names = append(names, c.names...)
	}
	slices.Sort(names)
	return slices.Compact(names), true
}
