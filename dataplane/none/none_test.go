package none_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/none"
)

func svc(name string, lb dataplane.LoadBalancing, gen uint64) *dataplane.Service {
	return &dataplane.Service{
		Name: name, Owner: "default", Generation: gen, LoadBalancing: lb,
		VIPs:     []netip.Addr{netip.MustParseAddr("198.19.0.1")},
		Ports:    []dataplane.Port{{Protocol: dataplane.TCP, Port: 80, TargetPort: 8080}},
		Backends: []dataplane.Backend{{IP: netip.MustParseAddr("198.18.0.1"), Weight: 1}},
	}
}

func names(set dataplane.ServiceSet) []string {
	var out []string
	if set == nil {
		return nil
	}
	for name := range set.All() {
		out = append(out, name)
	}
	return out
}

// TestKeepsOnlyTheLastState checks that Apply keeps the last successful
// State and nothing older, in either form a State comes in.
func TestKeepsOnlyTheLastState(t *testing.T) {
	ctx := context.Background()
	dp := none.New()
	if set, gen := dp.Applied(); set != nil || gen != 0 {
		t.Fatalf("Applied before any Apply = %v, %d; want nothing", names(set), gen)
	}
	services := map[string]*dataplane.Service{"a": svc("a", dataplane.LoadBalancingRandom, 1), "b": svc("b", dataplane.LoadBalancingMaglev, 1)}
	if err := dp.Apply(ctx, &dataplane.State{Generation: 1, Services: services}); err != nil {
		t.Fatal(err)
	}
	delete(services, "b") // the caller's map is not retained
	if set, gen := dp.Applied(); len(names(set)) != 2 || gen != 1 {
		t.Fatalf("Applied = %v, %d; want [a b], 1", names(set), gen)
	}
	next := dataplane.ServiceMap{"c": svc("c", dataplane.LoadBalancingRandom, 2)}
	if err := dp.Apply(ctx, &dataplane.State{Generation: 2, Set: next, Changed: []string{"a", "b", "c"}}); err != nil {
		t.Fatal(err)
	}
	if set, gen := dp.Applied(); len(names(set)) != 1 || names(set)[0] != "c" || gen != 2 {
		t.Fatalf("Applied = %v, %d; want [c], 2", names(set), gen)
	}
	if dp.Name() != none.Name || none.Name != "none" {
		t.Errorf("Name = %q", dp.Name())
	}
}

// TestApplyIsAllOrNothing checks that a State with a service the
// capabilities cannot honour fails with ErrUnsupported and leaves the
// applied one, on a full Apply and on a partial one, and that Apply fails
// after Close.
func TestApplyIsAllOrNothing(t *testing.T) {
	ctx := context.Background()
	dp := none.New()
	good := dataplane.ServiceMap{"a": svc("a", dataplane.LoadBalancingRandom, 1)}
	bad := svc("bad", dataplane.LoadBalancing(200), 2)
	if err := dp.Apply(ctx, &dataplane.State{Generation: 1, Services: map[string]*dataplane.Service{"bad": bad}}); !errors.Is(err, dataplane.ErrUnsupported) {
		t.Fatalf("full Apply of an unsupported service: %v, want ErrUnsupported", err)
	}
	if err := dp.Apply(ctx, &dataplane.State{Generation: 1, Set: good}); err != nil {
		t.Fatal(err)
	}
	withBad := dataplane.ServiceMap{"a": good["a"], "bad": bad}
	if err := dp.Apply(ctx, &dataplane.State{Generation: 2, Set: withBad, Changed: []string{"bad"}}); !errors.Is(err, dataplane.ErrUnsupported) {
		t.Fatalf("partial Apply of an unsupported service: %v, want ErrUnsupported", err)
	}
	if set, gen := dp.Applied(); len(names(set)) != 1 || gen != 1 {
		t.Fatalf("after failed Applies: %v, %d; want [a], 1", names(set), gen)
	}
	if err := dp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := dp.Apply(ctx, &dataplane.State{Generation: 3, Set: good}); err == nil {
		t.Fatal("Apply after Close succeeded")
	}
	if _, gen := dp.Applied(); gen != 1 {
		t.Errorf("Apply after Close moved the generation to %d", gen)
	}
}

// TestReportsNothing checks the flow source and explainer that let the
// daemon serve FlowService and Explain over a dataplane with no traffic.
func TestReportsNothing(t *testing.T) {
	dp := none.New()
	flows, err := dp.ListFlows(context.Background())
	if err != nil || len(flows) != 0 {
		t.Errorf("ListFlows = %v, %v; want none", flows, err)
	}
	ex, err := dp.ExplainFlow(context.Background(), dataplane.ExplainQuery{})
	if err != nil || ex != (dataplane.Explanation{}) {
		t.Errorf("ExplainFlow = %+v, %v; want an empty explanation", ex, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	err = dp.WatchFlows(ctx, func(dataplane.FlowEvent) { t.Error("an event from dataplane none") }, func(uint64) { t.Error("a loss from dataplane none") })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WatchFlows = %v, want ctx's error", err)
	}
}
