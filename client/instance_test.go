package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/testkit/testserver"
	"github.com/vipd/vipd/server"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestInstanceIDHeader: the client's header key is the one vipd sends,
// and the health watch's header names the vipd that Status reports.
func TestInstanceIDHeader(t *testing.T) {
	if client.InstanceIDHeader != server.InstanceIDHeader {
		t.Fatalf("client.InstanceIDHeader %q, server.InstanceIDHeader %q; want the same", client.InstanceIDHeader, server.InstanceIDHeader)
	}
	srv := testserver.Start(t)
	c := newClient(t, srv.Target())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := c.HealthClient().Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	md, err := stream.Header()
	if err != nil {
		t.Fatal(err)
	}
	if got := md.Get(client.InstanceIDHeader); len(got) != 1 || got[0] != st.GetInstanceId() || got[0] == "" {
		t.Fatalf("watch header %s: %q; want [%q] as Status says", client.InstanceIDHeader, got, st.GetInstanceId())
	}
}
