package store

// SetJournalCompactAt sets the journal size that triggers a compaction,
// for tests, and returns a function that restores it.
func SetJournalCompactAt(n int64) (restore func()) {
	old := journalMinCompact
	journalMinCompact = n
	return func() { journalMinCompact = old }
}
