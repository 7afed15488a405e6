package store

import "path/filepath"

// LockPath is the file in the state directory dir that OpenDir locks
// (flock, exclusive) for as long as the Dir is open, so that other
// programs, such as vipd cleanup, can tell whether a vipd is using dir.
func LockPath(dir string) string { return filepath.Join(dir, lockFileName) }
