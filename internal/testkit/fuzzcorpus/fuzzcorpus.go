// Package fuzzcorpus keeps a fuzz target's committed seed corpus equal to
// the seeds its test code names: a test compares the files under
// testdata/fuzz/<target> with the seeds, or rewrites them when
// VIPD_WRITE_FUZZ_CORPUS=1. Seeds live in code, where they are reviewed;
// the files are what `go test -fuzz` and plain `go test` read.
package fuzzcorpus

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// WriteEnv is the environment variable that makes Check write the corpus
// instead of comparing it.
const WriteEnv = "VIPD_WRITE_FUZZ_CORPUS"

// MinSeeds is the fewest seeds a target may have.
const MinSeeds = 10

// Encode is a "go test fuzz v1" file for a target whose arguments are all
// []byte.
func Encode(args ...[]byte) []byte {
	var b bytes.Buffer
	b.WriteString("go test fuzz v1\n")
	for _, a := range args {
		fmt.Fprintf(&b, "[]byte(%q)\n", a)
	}
	return b.Bytes()
}

// Check fails t unless target has at least MinSeeds seeds and each seed
// (name → the target's []byte arguments) is in the file
// testdata/fuzz/<target>/<name> of the package under test, byte for byte.
// With WriteEnv=1 it writes the files instead.
func Check(t testing.TB, target string, seeds map[string][][]byte) {
	t.Helper()
	if len(seeds) < MinSeeds {
		t.Errorf("%s has %d seeds; want at least %d", target, len(seeds), MinSeeds)
	}
	dir := filepath.Join("testdata", "fuzz", target)
	write := os.Getenv(WriteEnv) == "1"
	if write {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(seeds)) {
		want := Encode(seeds[name]...)
		path := filepath.Join(dir, name)
		if write {
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Errorf("seed %s: %v (write the corpus with %s=1)", path, err, WriteEnv)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("seed %s differs from its value in the test (rewrite the corpus with %s=1)", path, WriteEnv)
		}
	}
}
