package server_test

import (
	"context"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane/fake"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server"
	"github.com/vipd/vipd/server/reconcile"
	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
)

// TestStatusWarningsSources: GetStatus reports the warnings of every
// WithStatusWarnings source, in the order the options were given.
func TestStatusWarningsSources(t *testing.T) {
	dp := fake.New()
	rec := reconcile.New(hclog.NewNullLogger(), dp, nopPersister{}, store.Empty())
	source := func(checks ...string) func() []*vipdv1.StatusWarning {
		return func() []*vipdv1.StatusWarning {
			var out []*vipdv1.StatusWarning
			for _, c := range checks {
				out = append(out, &vipdv1.StatusWarning{Check: c})
			}
			return out
		}
	}
	api := server.NewAPI(hclog.NewNullLogger(), rec, dp.Name(), dp.Capabilities(), validation.Limits{}, "test",
		server.WithStatusWarnings(source("a", "b")), server.WithStatusWarnings(source()), server.WithStatusWarnings(source("c")))
	st, err := api.GetStatus(context.Background(), &vipdv1.GetStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range st.GetWarnings() {
		got = append(got, w.GetCheck())
	}
	if len(got) != 3 || got[0] != "a" || got[1] != "b" || got[2] != "c" {
		t.Fatalf("warnings %v, want [a b c]", got)
	}
}
