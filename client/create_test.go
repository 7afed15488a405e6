package client_test

import (
	"context"
	"strings"
	"testing"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/testkit/testserver"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// TestCreateService: CreateService creates a free name and never replaces
// a service: a name that exists, of any owner, is AlreadyExists and stays
// as it was, and so is a VIP:port another service holds.
func TestCreateService(t *testing.T) {
	c := newClient(t, testserver.Start(t).Target())
	ctx := context.Background()

	created, err := c.CreateService(ctx, web())
	if err != nil {
		t.Fatalf("CreateService: %v", err)
	}
	if created.GetGeneration() == 0 || created.GetBackends()[0].GetState() != vipdv1.BackendState_BACKEND_STATE_READY {
		t.Errorf("CreateService = %v; want it as stored, with a generation and defaults", created)
	}

	again := web()
	again.Backends = []*vipdv1.Backend{{Ip: "10.0.0.9"}}
	if _, err := c.CreateService(ctx, again); status.Code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("CreateService of an existing name: %v; want AlreadyExists", err)
	}
	other := web()
	other.Owner, other.Vips = "nomad", []string{"10.96.0.99"}
	if _, err := c.CreateService(ctx, other); status.Code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), "owner ctl") {
		t.Errorf("CreateService of a name another owner holds: %v; want AlreadyExists naming owner ctl", err)
	}
	if got, err := c.GetService(ctx, "default/web"); err != nil || !proto.Equal(got, created) {
		t.Errorf("after the refused creates GetService = %v, %v; want it unchanged: %v", got, err, created)
	}

	conflict := web()
	conflict.Name = "default/web2"
	if _, err := c.CreateService(ctx, conflict); status.Code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), "default/web") {
		t.Errorf("CreateService on a held VIP:port: %v; want AlreadyExists naming the holder", err)
	}
	if _, err := c.GetService(ctx, "default/web2"); !client.IsNotFound(err) {
		t.Errorf("GetService(default/web2) = %v; want NotFound", err)
	}

	// Deleted, the name is free again.
	if err := c.DeleteService(ctx, "default/web", 0); err != nil {
		t.Fatal(err)
	}
	if got, err := c.CreateService(ctx, again); err != nil || got.GetGeneration() <= created.GetGeneration() {
		t.Errorf("CreateService after the delete = %v, %v; want a new, larger generation than %d", got, err, created.GetGeneration())
	}
}
