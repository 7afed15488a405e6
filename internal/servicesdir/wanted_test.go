package servicesdir

import "testing"

// TestWanted: the service files are *.yaml, *.yml and *.json, not hidden;
// the temporary files of atomic writers are none of them.
func TestWanted(t *testing.T) {
	for name, want := range map[string]bool{
		"web.yaml": true, "web.yml": true, "web.json": true, "a.b.yaml": true,
		".web.yaml": false, ".web.yaml.tmp": false, "web.yaml.tmp123": false, "web.yaml~": false,
		"web.YAML": false, "web": false, "notes.txt": false, ".#web.yaml": false,
	} {
		if got := wanted(name); got != want {
			t.Errorf("wanted(%q) = %v, want %v", name, got, want)
		}
	}
}
