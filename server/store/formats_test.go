package store_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/store"
	"google.golang.org/protobuf/testing/protocmp"
)

// formatDirs are the state directories under testdata/formats, one per
// on-disk format an earlier vipd wrote (see testdata/formats/README.md).
var formatDirs = []string{"e7561d2-state", "c62c36a-journal", "b1bd293-state-journal"}

// copyFormat copies testdata/formats/name into a new state directory.
func copyFormat(t *testing.T, name string) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range store.StateFiles() {
		data, err := os.ReadFile(filepath.Join("testdata", "formats", name, f))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// formatServices are the services every directory under testdata/formats
// holds, normalized as today's vipd stores them.
func formatServices() []*vipdv1.Service {
	ready := vipdv1.BackendState_BACKEND_STATE_READY
	tcp, udp := vipdv1.Protocol_PROTOCOL_TCP, vipdv1.Protocol_PROTOCOL_UDP
	return []*vipdv1.Service{
		{
			Name:     "default/ctl",
			Owner:    "default",
			Vips:     []string{"198.19.0.30"},
			Ports:    []*vipdv1.Port{{Protocol: tcp, Port: 9000, TargetPort: 9000}},
			Backends: []*vipdv1.Backend{{Ip: "198.18.3.10", State: ready, Weight: 1, Zone: "zone-a\a"}},
			SessionAffinity: &vipdv1.SessionAffinityConfig{
				Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_NONE,
			},
			InternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
			// Not in the files: today's conversion fills it in.
			ExternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
			LoadBalancing:         vipdv1.LoadBalancing_LOAD_BALANCING_RANDOM,
			// Control characters, which the admission policy has refused
			// since 57ec416, and which the versions before it stored.
			Labels:     map[string]string{"app": "ctl", "note": "tab\there, newline\nthere", "key\x01": "bell"},
			Generation: 2,
		},
		{
			Name:  "default/web",
			Owner: "default",
			Vips:  []string{"198.19.0.10", "fd00:198:ff::10"},
			Ports: []*vipdv1.Port{
				{Name: "http", Protocol: tcp, Port: 80, TargetPort: 8080},
				{Name: "dns", Protocol: udp, Port: 53, TargetPort: 53},
			},
			Backends: []*vipdv1.Backend{
				{Ip: "198.18.1.10", State: ready, Weight: 1},
				{Ip: "198.18.1.11", State: ready, Weight: 2},
				{Ip: "198.18.1.12", State: ready, Weight: 3},
				{Ip: "fd00:198:1::10", State: ready, Weight: 1},
			},
			SessionAffinity: &vipdv1.SessionAffinityConfig{
				Mode:           vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP,
				TimeoutSeconds: 600,
			},
			InternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
			// Not in the files: today's conversion fills it in.
			ExternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
			LoadBalancing:         vipdv1.LoadBalancing_LOAD_BALANCING_RANDOM,
			Labels:                map[string]string{"app": "web"},
			Generation:            5,
		},
	}
}

func services(s *store.Snapshot) []*vipdv1.Service {
	var res []*vipdv1.Service
	for _, e := range s.List("") {
		res = append(res, e.Service())
	}
	return res
}

// TestLoadFormats loads the state directory of every earlier on-disk
// format with today's code: each must load, with every service as it was
// written, control characters included, and save and load again the same.
func TestLoadFormats(t *testing.T) {
	for _, name := range formatDirs {
		t.Run(name, func(t *testing.T) {
			d, err := store.OpenDir(copyFormat(t, name))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.Close() })
			s, err := d.Load()
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			// Five writes and a delete, each a revision.
			if s.Revision() != 6 {
				t.Errorf("revision %d, want 6", s.Revision())
			}
			if diff := cmp.Diff(formatServices(), services(s), protocmp.Transform()); diff != "" {
				t.Errorf("services (-want +got):\n%s", diff)
			}
			if e, ok := s.Get("default/ctl"); !ok || e.Dataplane.Backends[0].Zone != "zone-a\a" {
				t.Errorf("default/ctl's dataplane form lost the zone: %+v", e)
			}
			if s.BackendCount() != 5 {
				t.Errorf("%d backends, want 5", s.BackendCount())
			}

			// Today's code writes it in today's format, and reads that back.
			if err := d.Save(s); err != nil {
				t.Fatalf("Save: %v", err)
			}
			again, err := reopenAt(t, d).Load()
			if err != nil {
				t.Fatalf("Load after Save: %v", err)
			}
			sameSnapshot(t, s, again)
		})
	}
}

// reopenAt closes d and opens its directory again.
func reopenAt(t *testing.T, d *store.Dir, opts ...store.DirOption) *store.Dir {
	t.Helper()
	dir := filepath.Dir(d.Path())
	d.Close()
	d2, err := store.OpenDir(dir, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d2.Close() })
	return d2
}

// recordOffsets lists where each record of a journal starts.
func recordOffsets(t *testing.T, data []byte) []int {
	t.Helper()
	var offs []int
	for off := 0; off < len(data); {
		offs = append(offs, off)
		off += 12 + int(binary.LittleEndian.Uint32(data[off:]))
	}
	return offs
}

// TestTornJournalWarns: a torn last record, cut off at load, gets a WARN
// line that says where it was and how big.
func TestTornJournalWarns(t *testing.T) {
	dir := copyFormat(t, "b1bd293-state-journal")
	path := filepath.Join(dir, "journal")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	offs := recordOffsets(t, data)
	last := offs[len(offs)-1] // the record that deletes default/gone
	torn := data[:len(data)-3]
	if err := os.WriteFile(path, torn, 0o600); err != nil {
		t.Fatal(err)
	}

	var logs bytes.Buffer
	log := hclog.New(&hclog.LoggerOptions{Output: &logs, JSONFormat: true, Level: hclog.Trace})
	d, err := store.OpenDir(dir, store.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	s, err := d.Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if _, ok := s.Get("default/gone"); !ok || s.Revision() != 5 {
		t.Errorf("Load gave revision %d with default/gone %v; want the state before the torn delete", s.Revision(), ok)
	}
	if cut, _ := os.ReadFile(path); len(cut) != last {
		t.Errorf("journal is %d bytes after Load, want the %d of whole records", len(cut), last)
	}

	var warns []map[string]any
	sc := bufio.NewScanner(&logs)
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		if line["@level"] == "warn" {
			warns = append(warns, line)
		}
	}
	if len(warns) != 1 {
		t.Fatalf("%d WARN lines, want 1:\n%s", len(warns), logs.String())
	}
	w := warns[0]
	if w["offset"] != float64(last) || w["size"] != float64(len(torn)-last) || w["path"] != path {
		t.Errorf("WARN line %v, want offset %d, size %d and path %s", w, last, len(torn)-last, path)
	}

	// A journal that ends in a whole record logs nothing.
	logs.Reset()
	if _, err := reopenAt(t, d, store.WithLogger(log)).Load(); err != nil {
		t.Fatal(err)
	}
	if logs.Len() != 0 {
		t.Errorf("Load of a whole journal logged:\n%s", logs.String())
	}
}
