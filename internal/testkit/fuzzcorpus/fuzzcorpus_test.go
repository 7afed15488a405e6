package fuzzcorpus

import (
	"os"
	"path/filepath"
	"testing"
)

// recorder is a testing.TB that records failures instead of failing.
type recorder struct {
	testing.TB
	failed bool
}

func (r *recorder) Errorf(string, ...any) { r.failed = true }
func (r *recorder) Helper()               {}

func TestCheck(t *testing.T) {
	t.Chdir(t.TempDir())
	seeds := map[string][][]byte{}
	for _, n := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"} {
		seeds[n] = [][]byte{[]byte(n), []byte("x\n\"y\"")}
	}
	fails := func() bool {
		r := &recorder{TB: t}
		Check(r, "FuzzX", seeds)
		return r.failed
	}
	if !fails() {
		t.Fatal("a missing corpus passed")
	}
	t.Setenv(WriteEnv, "1")
	Check(t, "FuzzX", seeds)
	t.Setenv(WriteEnv, "")
	if fails() {
		t.Fatal("the corpus just written did not pass")
	}
	got, err := os.ReadFile(filepath.Join("testdata", "fuzz", "FuzzX", "a"))
	if want := "go test fuzz v1\n[]byte(\"a\")\n[]byte(\"x\\n\\\"y\\\"\")\n"; err != nil || string(got) != want {
		t.Fatalf("file a = %q, %v; want %q", got, err, want)
	}
	seeds["a"] = [][]byte{[]byte("changed")}
	if !fails() {
		t.Fatal("a changed seed passed")
	}
	delete(seeds, "a")
	if !fails() {
		t.Fatal("9 seeds passed")
	}
}
