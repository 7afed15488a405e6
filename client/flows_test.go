package client_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/internal/testkit/testserver"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func webFlow(id uint64) dataplane.Flow {
	return dataplane.Flow{
		ID: id, Protocol: dataplane.TCP,
		Client:  netip.MustParseAddrPort("10.0.0.9:43512"),
		VIP:     netip.MustParseAddrPort("10.96.0.10:80"),
		Backend: netip.MustParseAddrPort("10.0.0.1:8080"),
	}
}

func TestFlowsAndExplain(t *testing.T) {
	srv := testserver.Start(t)
	// A short default deadline, which a stream must not get.
	c := newClient(t, srv.Target(), client.WithTimeout(200*time.Millisecond))
	ctx := context.Background()
	if _, err := c.UpsertService(ctx, web(), 0); err != nil {
		t.Fatal(err)
	}

	srv.Dataplane().SetFlows([]dataplane.Flow{webFlow(1), webFlow(2)}, nil)
	list, err := c.ListFlows(ctx, &vipdv1.FlowFilter{Service: "default/web"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetFlows()) != 1 || !list.GetTruncated() || list.GetFlows()[0].GetPortName() != "http" {
		t.Errorf("ListFlows with limit 1: %v", list)
	}

	stream, err := c.WatchFlows(ctx, &vipdv1.WatchFlowsRequest{Filter: &vipdv1.FlowFilter{Vip: "10.96.0.10"}})
	if err != nil {
		t.Fatal(err)
	}
	for srv.Flows().Subscribers() == 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	srv.Dataplane().Emit(dataplane.FlowEvent{Type: dataplane.FlowNew, Flow: webFlow(3)})
	m, err := stream.Recv()
	if err != nil {
		t.Fatalf("Recv after the unary deadline passed: %v", err)
	}
	if m.GetFlow().GetFlowId() != 3 || m.GetFlow().GetService() != "default/web" {
		t.Errorf("WatchFlows: got %v, want NEW flow 3 of default/web", m)
	}

	resp, err := c.Explain(ctx, &vipdv1.ExplainRequest{ClientIp: "10.0.0.9", Vip: "10.96.0.10", Port: 80})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetService() != "default/web" || len(resp.GetBackends()) != 1 || resp.GetBackends()[0].GetProbability() != 1 {
		t.Errorf("Explain: %v", resp)
	}
	_, err = c.Explain(ctx, &vipdv1.ExplainRequest{ClientIp: "10.0.0.9", Vip: "10.96.0.11", Port: 80})
	if !client.IsNotFound(err) {
		t.Errorf("Explain of an unclaimed VIP: %v, want NotFound", err)
	}
	_, err = c.Explain(ctx, &vipdv1.ExplainRequest{Vip: "10.96.0.10", Port: 80})
	if v := client.FieldViolations(err); status.Code(err) != codes.InvalidArgument || len(v) != 1 || v[0].GetField() != "client_ip" {
		t.Errorf("Explain without client_ip: %v, violations %v", err, v)
	}
}
