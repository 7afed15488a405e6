package server_test

import (
	"regexp"
	"testing"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
)

var instanceIDForm = regexp.MustCompile(`^[0-9a-f]{32}$`)

// healthInstance reads the instance ID header of a health Check and of a
// Watch stream's first answer, and fails unless both carry the same one.
func healthInstance(t *testing.T, in *instance) string {
	t.Helper()
	var md metadata.MD
	if _, err := in.health.Check(ctxT(t), &healthpb.HealthCheckRequest{}, grpc.Header(&md)); err != nil {
		t.Fatalf("health check: %v", err)
	}
	check := md.Get(server.InstanceIDHeader)
	stream, err := in.health.Watch(ctxT(t), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatalf("health watch: %v", err)
	}
	// The header comes with the stream's first answer.
	if _, err := stream.Recv(); err != nil {
		t.Fatalf("health watch: %v", err)
	}
	hdr, err := stream.Header()
	if err != nil {
		t.Fatalf("health watch header: %v", err)
	}
	watch := hdr.Get(server.InstanceIDHeader)
	if len(check) != 1 || len(watch) != 1 || check[0] != watch[0] {
		t.Fatalf("%s header: Check %q, Watch %q; want one and the same value", server.InstanceIDHeader, check, watch)
	}
	return watch[0]
}

func statusInstance(t *testing.T, in *instance) string {
	t.Helper()
	st, err := in.status.GetStatus(ctxT(t), &vipdv1.GetStatusRequest{})
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	return st.GetInstanceId()
}

// TestInstanceID: GetStatus's instance_id is 128 random bits in hex, the
// same for the life of a vipd and in its health answers' header, and
// another one after a restart, with the state kept or not.
func TestInstanceID(t *testing.T) {
	dir := t.TempDir()
	in := start(t, config{stateDir: dir})
	id := statusInstance(t, in)
	if !instanceIDForm.MatchString(id) {
		t.Fatalf("instance_id %q: want 32 lowercase hex digits", id)
	}
	upsert(t, in, web("a", "198.19.0.10", "198.18.1.10"))
	if again := statusInstance(t, in); again != id {
		t.Fatalf("instance_id changed within a run: %q, then %q", id, again)
	}
	if h := healthInstance(t, in); h != id {
		t.Fatalf("health header %q, GetStatus instance_id %q; want the same", h, id)
	}
	in.stop()

	seen := map[string]bool{id: true}
	for _, restart := range []struct {
		what     string
		stateDir string
	}{{"restart with its state", dir}, {"restart without state", ""}} {
		in := start(t, config{stateDir: restart.stateDir})
		got := statusInstance(t, in)
		if !instanceIDForm.MatchString(got) || seen[got] {
			t.Fatalf("%s: instance_id %q; want a new one (had %v)", restart.what, got, seen)
		}
		if h := healthInstance(t, in); h != got {
			t.Fatalf("%s: health header %q, GetStatus instance_id %q; want the same", restart.what, h, got)
		}
		seen[got] = true
		in.stop()
	}
}
