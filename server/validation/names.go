package validation

import (
	"fmt"
	"regexp"
	"strings"
)

// unsafeName says why name, made only of the characters nameChars
// allows, still may not name a service or an owner, or returns "" when it
// may. Names are command-line arguments (vipctl service get NAME), where
// "-" reads as standard input and a leading "-" as a flag, and they are
// slash-separated keys such as "default/web", where an empty, "." or ".."
// segment reads as a step through directories ("a/../b" would be "b").
func unsafeName(name string) string {
	if strings.HasPrefix(name, "-") {
		return `starts with "-", which reads as a command-line flag`
	}
	for seg := range strings.SplitSeq(name, "/") {
		switch seg {
		case "":
			return `has an empty segment: "/" may not start or end it, or come twice in a row`
		case ".", "..":
			return fmt.Sprintf("has a %q segment, which reads as a directory step", seg)
		}
	}
	return ""
}

// FileOwnerPrefix starts the owner of the services that one file of vipd's
// services directory (vipd run --services-dir) holds: the file web.yaml
// owns its services as "file:web.yaml". It is the one form of owner
// outside a name's characters.
const FileOwnerPrefix = "file:"

// fileNamePattern is what may follow FileOwnerPrefix: a file name of one
// segment, not hidden and not a flag (so never "." or "..").
var fileNamePattern = regexp.MustCompile(`^[a-z0-9_][a-z0-9._-]*$`)

// FileOwner is the owner of the services of the file named file (a base
// name) in the services directory.
func FileOwner(file string) string { return FileOwnerPrefix + file }

// Owner checks an owner that is looked up or may be stored already: Name's
// rules, or FileOwnerPrefix followed by a file name of [a-z0-9._-] that
// does not start with "." or "-" ("file:web.yaml"), 253 characters at most
// in all.
func Owner(owner, field string) Violations {
	rest, ok := strings.CutPrefix(owner, FileOwnerPrefix)
	if !ok {
		return Name(owner, field)
	}
	var v Violations
	switch {
	case len(owner) > MaxNameLength:
		v.add(field, "is %d characters long; at most %d are allowed", len(owner), MaxNameLength)
	case !fileNamePattern.MatchString(rest):
		v.add(field, "%q: after %q comes a file name of lowercase letters, digits and \"-._\" that does not start with \".\" or \"-\"", owner, FileOwnerPrefix)
	}
	return v
}

// NewOwner checks an owner that a write creates: NewName's rules, or
// Owner's for a file owner (which has no unsafe form left).
func NewOwner(owner, field string) Violations {
	if strings.HasPrefix(owner, FileOwnerPrefix) {
		return Owner(owner, field)
	}
	return NewName(owner, field)
}
