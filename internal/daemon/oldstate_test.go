package daemon_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/vipd/vipd/client"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// TestStartsOnOldState starts vipd on the state directory of every earlier
// on-disk format (server/store/testdata/formats). Each was written by a
// vipd that accepted control characters in labels and zones, which the
// admission policy refuses today: vipd must start on it, serve the stored
// services as they were, and still refuse such a label in a new write.
func TestStartsOnOldState(t *testing.T) {
	formats := filepath.Join("..", "..", "server", "store", "testdata", "formats")
	for _, name := range []string{"e7561d2-state", "c62c36a-journal", "b1bd293-state-journal"} {
		t.Run(name, func(t *testing.T) {
			cfg := config(t)
			if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{"state", "journal"} {
				data, err := os.ReadFile(filepath.Join(formats, name, f))
				if os.IsNotExist(err) {
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(cfg.StateDir, f), data, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			r := start(t, cfg, healthpb.HealthCheckResponse_SERVING)

			st, err := r.local.Status(ctxT(t))
			if err != nil {
				t.Fatal(err)
			}
			if !st.Ready || st.Services != 2 || st.Backends != 5 {
				t.Errorf("status: ready %v, %d services, %d backends; want ready, 2 and 5", st.Ready, st.Services, st.Backends)
			}
			ctl, err := r.local.GetService(ctxT(t), "default/ctl")
			if err != nil {
				t.Fatal(err)
			}
			if got := ctl.Labels["note"]; got != "tab\there, newline\nthere" {
				t.Errorf("default/ctl's label note is %q", got)
			}
			if got := ctl.Backends[0].Zone; got != "zone-a\a" {
				t.Errorf("default/ctl's zone is %q", got)
			}

			// The admission policy is unchanged for new writes.
			bad := &vipdv1.Service{
				Name:   "default/new",
				Vips:   []string{"198.19.0.50"},
				Ports:  []*vipdv1.Port{{Port: 80}},
				Labels: map[string]string{"note": "a\tb"},
			}
			_, err = r.local.UpsertService(ctxT(t), bad, 0)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("upsert of a label with a control character: %v, want InvalidArgument", err)
			}
			fv := client.FieldViolations(err)
			if len(fv) != 1 || fv[0].GetField() != `service.labels["note"]` {
				t.Errorf("field violations %v, want one of service.labels[\"note\"]", fv)
			}
			if _, err := r.local.GetService(ctxT(t), "default/new"); status.Code(err) != codes.NotFound {
				t.Errorf("the rejected service was stored: %v", err)
			}
		})
	}
}
