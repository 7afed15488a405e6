package ebpf

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/hashicorp/go-hclog"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/internal/testkit/syncbuf"
)

// progIDs returns the kernel IDs of dp's programs, by name.
func progIDs(t *testing.T, dp *Dataplane) map[string]ebpf.ProgramID {
	t.Helper()
	out := map[string]ebpf.ProgramID{}
	for name, f := range programFields(&dp.objs.bpfPrograms) {
		id := programID(*f)
		if id == 0 {
			t.Fatalf("program %s has no ID", name)
		}
		out[name] = id
	}
	return out
}

// attachedProgIDs returns the IDs of the programs on the env's cgroup
// hooks and on its veths' tcx hooks.
func (e *dpEnv) attachedProgIDs() []ebpf.ProgramID {
	e.t.Helper()
	var out []ebpf.ProgramID
	fd, err := unix.Open(e.cgroup, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		e.t.Fatalf("open cgroup: %v", err)
	}
	defer unix.Close(fd)
	for _, a := range dpCgroupHooks {
		res, err := link.QueryPrograms(link.QueryOptions{Target: fd, Attach: a})
		if err != nil {
			e.t.Fatalf("query %v programs of the cgroup: %v", a, err)
		}
		for _, p := range res.Programs {
			out = append(out, p.ID)
		}
	}
	err = e.node.Do(func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if !strings.HasPrefix(l.Attrs().Name, "veth") {
				continue
			}
			for _, a := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
				res, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: a})
				if err != nil {
					return err
				}
				for _, p := range res.Programs {
					out = append(out, p.ID)
				}
			}
		}
		return nil
	})
	if err != nil {
		e.t.Fatalf("query tcx programs: %v", err)
	}
	return out
}

// expectAttachedOf fails unless every program attached to the env's hooks
// is one of dp's, and some are.
func (e *dpEnv) expectAttachedOf(what string, dp *Dataplane) {
	e.t.Helper()
	ids := progIDs(e.t, dp)
	attached := e.attachedProgIDs()
	if len(attached) == 0 {
		e.t.Fatalf("%s: no program attached", what)
	}
	for _, id := range attached {
		found := false
		for _, want := range ids {
			found = found || id == want
		}
		if !found {
			e.t.Errorf("%s: program %d is attached, which is not one of the dataplane's %v", what, id, ids)
		}
	}
}

// expectOwnMaps fails unless each of dp's programs uses only dp's maps.
func expectOwnMaps(t *testing.T, what string, dp *Dataplane) {
	t.Helper()
	own := map[ebpf.MapID]string{}
	for name, f := range mapFields(&dp.objs.bpfMaps) {
		info, err := (*f).Info()
		if err != nil {
			t.Fatalf("map %s info: %v", name, err)
		}
		id, _ := info.ID()
		own[id] = name
	}
	for name, f := range programFields(&dp.objs.bpfPrograms) {
		info, err := (*f).Info()
		if err != nil {
			t.Fatalf("program %s info: %v", name, err)
		}
		used, ok := info.MapIDs()
		if !ok || len(used) == 0 {
			t.Fatalf("program %s: no map IDs", name)
		}
		for _, id := range used {
			if _, ok := own[id]; !ok {
				t.Errorf("%s: program %s uses map %d, not one of the dataplane's", what, name, id)
			}
		}
	}
}

// progPins lists the program pins.
func (e *dpEnv) progPins() []string {
	e.t.Helper()
	entries, err := os.ReadDir(filepath.Join(e.bpffs, progDirName))
	if err != nil && !os.IsNotExist(err) {
		e.t.Fatalf("read program pins: %v", err)
	}
	var out []string
	for _, en := range entries {
		out = append(out, en.Name())
	}
	return out
}

// TestRestartReusesPinnedPrograms restarts the dataplane over an unchanged
// object and maps, which must reuse the programs the first start loaded
// (the same kernel programs, no load) while an established connection and
// new ones keep flowing; then over pins of another build, a resized map
// and no pins, each of which must load fresh programs that use the new
// maps, and attach them in place of the old ones.
func TestRestartReusesPinnedPrograms(t *testing.T) {
	e := newDPEnv(t, []string{"client", "be1", "be2"}, dpSmallMaps)
	a := e.service("test/a", dpVIPA, dataplane.TCP, dpReady("be1"), dpReady("be2"))
	gen := uint64(1)
	state := func() *dataplane.State {
		gen++
		return dpState(gen, nil, a)
	}
	// logs is the log of the last open.
	var logs *syncbuf.Buffer
	open := func() *Dataplane {
		logs = &syncbuf.Buffer{}
		return e.open(hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Debug}))
	}
	dp := open()
	if out := logs.String(); !strings.Contains(out, "loading programs") {
		t.Errorf("first start logged:\n%s\nwant %q", out, "loading programs")
	}
	e.apply(state())
	e.expectBackends(dpVIPA, "be1", "be2")
	first := progIDs(t, dp)
	if n := len(e.progPins()); n != len(first) {
		t.Fatalf("after the first start: %d program pins %v, want %d", n, e.progPins(), len(first))
	}
	ctx, cancel := context.WithTimeout(context.Background(), dpReplyTimeout)
	defer cancel()
	conn, err := e.pod("client").Dial(ctx, "tcp", dpVIPPort(dpVIPA))
	if err != nil {
		t.Fatalf("dial %s: %v", dpVIPA, err)
	}
	defer conn.Close()
	x := connRequest(t, conn, "before the restart")
	e.close()

	// Unchanged: the same programs, no load, and traffic flows throughout.
	dp = open()
	if out := logs.String(); !strings.Contains(out, "reusing pinned programs") || strings.Contains(out, "loading programs") {
		t.Errorf("restart over an unchanged object logged:\n%s\nwant %q and no load", out, "reusing pinned programs")
	}
	if got := progIDs(t, dp); !mapsEqual(got, first) {
		t.Errorf("restart over an unchanged object: programs %v, want the pinned ones %v", got, first)
	}
	expectOwnMaps(t, "reused", dp)
	if got := connRequest(t, conn, "after the restart, before the apply"); got != x {
		t.Fatalf("established connection moved from %s to %s across the restart", x, got)
	}
	e.apply(state())
	e.expectBackends(dpVIPA, "be1", "be2")
	e.expectAttachedOf("after reuse", dp)
	if got := connRequest(t, conn, "after the restart"); got != x {
		t.Fatalf("established connection moved from %s to %s across the restart", x, got)
	}
	e.close()

	// restartFresh restarts and expects fresh programs, not those of the
	// last start (last), loaded for why, using the new maps, pinned in
	// place of the old ones, and attached by the first apply. It returns
	// them.
	last := first
	restartFresh := func(what, why string) {
		t.Helper()
		e.expectBackends(dpVIPA, "be1", "be2")
		dp := open()
		if out := logs.String(); !strings.Contains(out, "loading programs") || !strings.Contains(out, why) {
			t.Errorf("%s: New logged:\n%s\nwant %q for %q", what, out, "loading programs", why)
		}
		got := progIDs(t, dp)
		for name, id := range got {
			if id == last[name] {
				t.Errorf("%s: program %s (ID %d) was reused", what, name, id)
			}
		}
		expectOwnMaps(t, what, dp)
		if got := connRequest(t, conn, what+", before the apply"); got != x {
			t.Fatalf("%s: established connection moved from %s to %s", what, x, got)
		}
		e.apply(state())
		e.expectBackends(dpVIPA, "be1", "be2")
		e.expectAttachedOf(what, dp)
		if pins := e.progPins(); len(pins) != len(got) {
			t.Errorf("%s: program pins %v, want only the %d of the new load", what, pins, len(got))
		}
		// The next start reuses what this one loaded.
		e.close()
		dp = open()
		if g := progIDs(t, dp); !mapsEqual(g, got) {
			t.Errorf("%s: the start after it did not reuse its programs: %v, want %v", what, g, got)
		}
		e.apply(state())
		e.expectBackends(dpVIPA, "be1", "be2")
		e.close()
		last = got
	}

	// Another build's pins: renamed to another fingerprint, as an upgrade
	// finds them. They must be replaced.
	for _, p := range e.progPins() {
		fp, name, _ := strings.Cut(p, "_")
		other := strings.Repeat("0", len(fp))
		if err := os.Rename(filepath.Join(e.bpffs, progDirName, p), filepath.Join(e.bpffs, progDirName, other+"_"+name)); err != nil {
			t.Fatalf("rename program pin: %v", err)
		}
	}
	restartFresh("another build's pins", "of this build is not pinned")

	// A replaced map of the same spec (so of the same fingerprint): its
	// pin is gone, and New creates a new one. The programs using the old
	// map must not survive it.
	if err := os.Remove(filepath.Join(e.bpffs, "vipd_affinity")); err != nil {
		t.Fatalf("unpin vipd_affinity: %v", err)
	}
	restartFresh("a replaced map", "does not use this start's map vipd_affinity")

	// A resized map: the fingerprint covers the map sizes too.
	e.cfg.Maps.Affinity *= 2
	restartFresh("a resized map", "of this build is not pinned")

	// No pins (removed, or left by a vipd that did not pin its programs).
	if err := removeProgramPins(e.bpffs); err != nil {
		t.Fatalf("remove program pins: %v", err)
	}
	restartFresh("no pins", "of this build is not pinned")
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// The fingerprint is a function of the object and the spec: the same for
// the same, another for another object or other map sizes.
func TestProgramFingerprint(t *testing.T) {
	spec, err := sizedSpec(DefaultMapSizes)
	if err != nil {
		t.Fatal(err)
	}
	fp := programFingerprint(_BpfBytes, spec)
	if len(fp) != progFingerprintLen || strings.ContainsAny(fp, "._/") {
		t.Fatalf("fingerprint %q: want %d hex digits", fp, progFingerprintLen)
	}
	again, err := sizedSpec(DefaultMapSizes)
	if err != nil {
		t.Fatal(err)
	}
	if got := programFingerprint(_BpfBytes, again); got != fp {
		t.Errorf("fingerprint of the same object and sizes: %s, then %s", fp, got)
	}
	other := append([]byte(nil), _BpfBytes...)
	other[len(other)-1] ^= 1
	if got := programFingerprint(other, spec); got == fp {
		t.Errorf("another object has the same fingerprint %s", fp)
	}
	sizes := DefaultMapSizes
	sizes.Affinity *= 2
	resized, err := sizedSpec(sizes)
	if err != nil {
		t.Fatal(err)
	}
	if got := programFingerprint(_BpfBytes, resized); got == fp {
		t.Errorf("other map sizes have the same fingerprint %s", fp)
	}
}
