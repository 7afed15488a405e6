package daemon_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vipd/vipd/client"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestTornJournalRecordWarns starts vipd over a state directory whose
// journal ends in a cut-off record (a crash in the middle of a save) and
// checks that vipd starts with the changes before it, and that its log
// says at WARN where the torn record began and how many bytes were cut.
func TestTornJournalRecordWarns(t *testing.T) {
	cfg := config(t)
	journal := filepath.Join(cfg.StateDir, "journal") // store's journal file
	size := func() int64 {
		t.Helper()
		fi, err := os.Stat(journal)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	upsert := func(r *running, name, vip string) {
		t.Helper()
		s := &vipdv1.Service{Name: name, Owner: "team-a", Vips: []string{vip}, Ports: []*vipdv1.Port{{Port: 80}},
			Backends: []*vipdv1.Backend{{Ip: "198.18.0.1"}}}
		if _, err := r.local.UpsertService(ctxT(t), s, 0); err != nil {
			t.Fatal(err)
		}
	}

	r := start(t, cfg, healthpb.HealthCheckResponse_SERVING)
	upsert(r, "first", "198.19.0.1")
	good := size() // the journal holds the first change, and maybe an earlier record
	upsert(r, "second", "198.19.0.2")
	whole := size()
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if whole <= good+1 {
		t.Fatalf("the second change did not go to the journal (size %d, then %d)", good, whole)
	}
	// Cut the second change's record short by one byte: it is torn.
	if err := os.Truncate(journal, whole-1); err != nil {
		t.Fatal(err)
	}

	r = start(t, cfg, healthpb.HealthCheckResponse_SERVING)
	want := fmt.Sprintf("[WARN]  vipd.store: journal: cutting off a torn last record, a change whose save never returned: path=%s offset=%d size=%d",
		journal, good, whole-1-good)
	if !strings.Contains(r.log.String(), want) {
		t.Fatalf("vipd's log does not say %q:\n%s", want, r.log)
	}
	if _, err := r.local.GetService(ctxT(t), "first"); err != nil {
		t.Errorf("the change before the torn record: %v", err)
	}
	if _, err := r.local.GetService(ctxT(t), "second"); !client.IsNotFound(err) {
		t.Errorf("the torn change: %v; want NotFound", err)
	}
	if got := size(); got != good {
		t.Errorf("journal is %d bytes after the start; want the torn record cut off, %d", got, good)
	}
}
