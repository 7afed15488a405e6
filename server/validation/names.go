package validation

import (
	"fmt"
	"strings"
)

// unsafeName says why name, made only of the characters namePattern
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
