package validation

import (
	"regexp"
	"testing"
)

// TestNameCharsIsThePattern checks nameChars against the regular
// expression it replaces, on every byte alone and in names.
func TestNameCharsIsThePattern(t *testing.T) {
	pattern := regexp.MustCompile(`^[a-z0-9._/-]+$`)
	names := []string{"", "a", "default/web", "a\n", "\na", "A", "a b", "ä", "web-1.2_3/x", "-", "..", "a/b/c", "a\x00"}
	for c := range 256 {
		names = append(names, string([]byte{byte(c)}), "a"+string([]byte{byte(c)}), string([]byte{byte(c)})+"z")
	}
	for _, n := range names {
		if got, want := nameChars(n), pattern.MatchString(n); got != want {
			t.Errorf("nameChars(%q) = %v, the pattern says %v", n, got, want)
		}
	}
}
