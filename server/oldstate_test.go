package server_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/grpc/codes"
)

// oldState returns a state dir that b1bd293, the last vipd before the
// control-character rule, wrote (see server/store/testdata/formats): its
// service default/ctl has labels and a zone with control characters.
func oldState(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{"state", "journal"} {
		data, err := os.ReadFile(filepath.Join("store", "testdata", "formats", "b1bd293-state-journal", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestOldStateAdmission: over a state an earlier vipd wrote, the admission
// policy applies to what a request writes, not to what was stored: the
// backends of a service with a control-character label can be changed,
// while a new label or zone with a control character is still refused.
func TestOldStateAdmission(t *testing.T) {
	in := start(t, config{stateDir: oldState(t)})
	<-in.ready

	resp, err := in.lb.UpdateBackends(ctxT(t), &vipdv1.UpdateBackendsRequest{
		Name:   "default/ctl",
		Upsert: []*vipdv1.Backend{{Ip: "198.18.3.11"}},
	})
	if err != nil {
		t.Fatalf("UpdateBackends of a service stored with a control-character label: %v", err)
	}
	if got := resp.Service.Labels["note"]; got != "tab\there, newline\nthere" {
		t.Errorf("label note is %q after UpdateBackends", got)
	}
	if n := len(resp.Service.Backends); n != 2 {
		t.Errorf("%d backends, want 2", n)
	}
	if applied, _ := in.dp.Applied(); applied["default/ctl"] == nil || len(applied["default/ctl"].Backends) != 2 {
		t.Errorf("dataplane has default/ctl as %+v, want it with 2 backends", applied["default/ctl"])
	}

	// New writes go through the policy.
	_, err = in.lb.UpdateBackends(ctxT(t), &vipdv1.UpdateBackendsRequest{
		Name:   "default/ctl",
		Upsert: []*vipdv1.Backend{{Ip: "198.18.3.12", Zone: "b\x00"}},
	})
	wantCode(t, err, codes.InvalidArgument)
	if diff := cmp.Diff([]string{"upsert[0].zone"}, fieldsOf(err)); diff != "" {
		t.Errorf("violated fields (-want +got):\n%s", diff)
	}
	_, err = in.lb.UpsertService(ctxT(t), &vipdv1.UpsertServiceRequest{Service: &vipdv1.Service{
		Name:   "default/new",
		Vips:   []string{"198.19.0.50"},
		Ports:  []*vipdv1.Port{{Port: 80}},
		Labels: map[string]string{"note": "a\tb"},
	}})
	wantCode(t, err, codes.InvalidArgument)
	if diff := cmp.Diff([]string{`service.labels["note"]`}, fieldsOf(err)); diff != "" {
		t.Errorf("violated fields (-want +got):\n%s", diff)
	}
	if _, err := in.lb.GetService(ctxT(t), &vipdv1.GetServiceRequest{Name: "default/new"}); err == nil {
		t.Errorf("the refused service was stored")
	}
}
