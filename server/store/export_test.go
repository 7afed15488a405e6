package store

// SetJournalCompactAt sets the journal size that triggers a compaction,
// for tests, and returns a function that restores it.
func SetJournalCompactAt(n int64) (restore func()) {
	old := journalMinCompact
	journalMinCompact = n
	return func() { journalMinCompact = old }
}

// Build is build, for tests: a snapshot as a state file of entries loads.
func Build(revision uint64, entries []*Entry) (*Snapshot, error) { return build(revision, entries) }

// KeptNames is how many names s's history keeps (see ChangedSince), for
// tests.
func KeptNames(s *Snapshot) int {
	n := 0
	for _, c := range s.history {
		n += len(c.names)
	}
	return n
}
