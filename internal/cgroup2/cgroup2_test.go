package cgroup2

import "testing"

func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{
		`/tmp/plain`:        "/tmp/plain",
		`/tmp/a\040b`:       "/tmp/a b",
		`/tmp/tab\011x\134`: "/tmp/tab\tx\\",
		`/tmp/short\04`:     `/tmp/short\04`,
	} {
		if got := unescapeMountinfo(in); got != want {
			t.Errorf("unescapeMountinfo(%q): got %q, want %q", in, got, want)
		}
	}
}

func TestMountinfo(t *testing.T) {
	mounts, err := Mountinfo()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]string{}
	for _, m := range mounts {
		if m.MountPoint == "" || m.FSType == "" || m.SuperOptions == "" {
			t.Errorf("incomplete entry %+v", m)
		}
		found[m.MountPoint] = m.FSType
	}
	if _, ok := found["/"]; !ok {
		t.Errorf("no mount at /: %+v", mounts)
	}
	if fs := found["/proc"]; fs != "proc" {
		t.Errorf("mount at /proc: file system %q, want proc", fs)
	}
}
